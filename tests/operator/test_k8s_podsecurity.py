"""Pod security of TrainingJobs (issue 12, item 8): creating a TrainingJob must not be
more powerful than creating a pod.

On the real control plane: the exploit of the issue (privileged container, hostPath
``/``, a Secret) is refused in an unlabelled namespace before it takes a GPU, and admitted
where the namespace and the operator allow it; a restricted namespace refuses a root
container. The check agrees with the API server's own Pod Security Admission on a
corpus of pods (server-side dry run). Without a control plane: which level applies, and
the gate when the namespaces cannot be read.
"""

from __future__ import annotations

import copy
import uuid

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rlsched.core.contract import GROUP as G
from rlsched.core.contract import (
    LABEL_ALLOW_SECRET_MOUNTS,
    LABEL_POD_SECURITY_ENFORCE,
    POD_SECURITY_BASELINE,
    POD_SECURITY_PRIVILEGED,
    POD_SECURITY_RESTRICTED,
)
from rlsched.core.contract import PLURAL as P
from rlsched.core.contract import VERSION as V

#: the operator's old admission defaults as one allocator: FIFO, DAS placement, no backfill
FIFO = "fifo/das+nobackfill"
from rlsched.core.podsecurity import check_pod_spec

BASE, RESTR, PRIV = POD_SECURITY_BASELINE, POD_SECURITY_RESTRICTED, POD_SECURITY_PRIVILEGED

HARDENED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def restricted_template() -> dict:
    return {"spec": {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "train", "image": "registry.example/rlsched/trainer:test",
                        "securityContext": copy.deepcopy(HARDENED)}],
    }}


def exploit_template() -> dict:
    """What the issue reproduced: a privileged pod with the node's / and a Secret mounted."""
    return {"spec": {
        "containers": [{"name": "train", "image": "registry.example/rlsched/trainer:test",
                        "securityContext": {"privileged": True},
                        "volumeMounts": [{"name": "host", "mountPath": "/host"},
                                         {"name": "creds", "mountPath": "/creds"}]}],
        "volumes": [{"name": "host", "hostPath": {"path": "/"}},
                    {"name": "creds", "secret": {"secretName": "db-credentials"}}],
    }}


def label(kapi, ns, labels):
    kapi.core.patch_namespace(ns, {"metadata": {"labels": labels}})


# ----------------------------------------------------------------------------- the operator, end to end
@pytest.mark.k8s
@pytest.mark.timeout(300)
def test_exploit_is_refused_in_an_unlabelled_namespace_and_takes_no_gpu(kapi, ns, tj, run_operator, wait_until):
    with run_operator(ns, allocator=FIFO):  # defaults: baseline, Secrets refused
        tj(ns, "evil", 1, gpus=1, template=exploit_template())
        tj(ns, "fine", 1, gpus=1)  # a plain job beside it is admitted as usual
        wait_until(lambda: kapi.status(ns, "evil").get("phase") == "Failed", 60, "evil Failed")
        st = kapi.status(ns, "evil")
        assert st["reason"] == "PodSecurity"
        for needle in ("pod security level baseline", "privileged containers are forbidden",
                       "spec.template.spec.containers[0].securityContext.privileged",
                       "hostPath volumes are forbidden (spec.template.spec.volumes[0].hostPath)",
                       "rlsched: mounting Secret 'db-credentials' is refused (spec.template.spec.volumes[1].secret)"):
            assert needle in st["message"], needle
        (cond,) = [c for c in st["conditions"] if c["type"] == "Valid"]
        assert (cond["status"], cond["reason"], cond["message"]) == ("False", "PodSecurity", st["message"])
        wait_until(lambda: kapi.events(ns, "evil", "PodSecurity"), 20, "PodSecurity event")
        (ev,) = kapi.events(ns, "evil", "PodSecurity")
        assert ev.type == "Warning" and "hostPath volumes are forbidden" in ev.message
        wait_until(lambda: kapi.status(ns, "fine").get("phase") in ("Starting", "Running"), 60, "fine admitted")
        # never admitted: no GPU promised, no pod, no trainer account
        assert "admittedTime" not in st and not kapi.events(ns, "evil", "Admitted")
        assert kapi.pods(ns, "evil", terminating=True) == []
        assert [a.metadata.name for a in kapi.core.list_namespaced_service_account(ns).items
                if a.metadata.name.startswith("evil")] == []


@pytest.mark.k8s
@pytest.mark.timeout(300)
def test_exploit_is_admitted_where_namespace_and_operator_allow_it(kapi, ns, tj, run_operator, wait_until):
    label(kapi, ns, {LABEL_POD_SECURITY_ENFORCE: PRIV})
    with run_operator(ns, allocator=FIFO, allow_secret_mounts=True):
        tj(ns, "trusted", 1, gpus=1, template=exploit_template())
        wait_until(lambda: kapi.status(ns, "trusted").get("phase") in ("Starting", "Running"), 60, "admitted")
        (pod,) = wait_until(lambda: kapi.pods(ns, "trusted", terminating=True), 30, "worker pod")
        assert pod.spec.containers[0].security_context.privileged is True
        assert pod.spec.volumes[0].host_path.path == "/" and pod.spec.volumes[1].secret.secret_name == "db-credentials"


@pytest.mark.k8s
@pytest.mark.timeout(300)
def test_secret_label_on_the_namespace_allows_secrets_but_not_the_rest(kapi, ns, tj, run_operator, wait_until):
    label(kapi, ns, {LABEL_ALLOW_SECRET_MOUNTS: "true"})
    with run_operator(ns, allocator=FIFO):
        tpl = restricted_template()
        tpl["spec"]["containers"][0]["env"] = [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "t",
                                                                                              "key": "k"}}}]
        tj(ns, "secret-ok", 1, gpus=1, template=tpl)
        tj(ns, "hostpath", 1, gpus=1, template={"spec": {
            "containers": [{"name": "t", "image": "x"}], "volumes": [{"name": "h", "hostPath": {"path": "/etc"}}]}})
        wait_until(lambda: kapi.status(ns, "secret-ok").get("phase") in ("Starting", "Running"), 60, "admitted")
        wait_until(lambda: kapi.status(ns, "hostpath").get("phase") == "Failed", 60, "hostpath Failed")
        assert "rlsched:" not in kapi.status(ns, "hostpath")["message"]


@pytest.mark.k8s
@pytest.mark.timeout(300)
def test_restricted_namespace_refuses_a_root_container(kapi, ns, tj, run_operator, wait_until):
    label(kapi, ns, {LABEL_POD_SECURITY_ENFORCE: RESTR})
    with run_operator(ns, allocator=FIFO, pod_security_level=PRIV):  # the namespace's label wins over the default
        root = restricted_template()
        root["spec"]["containers"][0]["securityContext"]["runAsUser"] = 0
        tj(ns, "root", 1, gpus=1, template=root)
        tj(ns, "nonroot", 1, gpus=1, template=restricted_template())
        wait_until(lambda: kapi.status(ns, "root").get("phase") == "Failed", 60, "root Failed")
        st = kapi.status(ns, "root")
        assert st["reason"] == "PodSecurity"
        assert (f"pod security level restricted (namespace label {LABEL_POD_SECURITY_ENFORCE}=restricted)"
                in st["message"])
        assert ("restricted: runAsUser 0 (root) is forbidden "
                "(spec.template.spec.containers[0].securityContext.runAsUser)") in st["message"]
        wait_until(lambda: kapi.status(ns, "nonroot").get("phase") in ("Starting", "Running"), 60, "nonroot admitted")
        assert kapi.pods(ns, "root", terminating=True) == []
        # and the API server's own admission let it in (the phase can be read a moment
        # before the list shows the pod the operator created)
        wait_until(lambda: len(kapi.pods(ns, "nonroot", terminating=True)) == 1, 30, "nonroot's worker created")


@pytest.mark.k8s
@pytest.mark.timeout(300)
def test_editing_the_template_of_a_running_job_fails_it(kapi, ns, tj, run_operator, wait_until):
    """Admission checked the template; a later edit must not smuggle in what it refused
    (the operator creates new workers from the template as it scales)."""
    with run_operator(ns, allocator=FIFO):
        tj(ns, "edited", 1, 2, gpus=1)
        wait_until(lambda: kapi.status(ns, "edited").get("phase") in ("Starting", "Running"), 60, "admitted")
        kapi.custom.patch_namespaced_custom_object(G, V, ns, P, "edited", {"spec": {"template": exploit_template()}})
        wait_until(lambda: kapi.status(ns, "edited").get("phase") == "Failed", 60, "edited Failed")
        assert kapi.status(ns, "edited")["reason"] == "PodSecurity"
        wait_until(lambda: not kapi.pods(ns, "edited"),
                   30, "workers deleted")


# ----------------------------------------------------------------------------- the check agrees with the API server's
def _pod(**spec) -> dict:
    base = {"containers": [{"name": "train", "image": "registry.example/x:1", "securityContext": copy.deepcopy(HARDENED)}],
            "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}}
    for key, value in spec.items():
        if key.startswith("c_"):  # a field of the container's securityContext (None: remove)
            sc = base["containers"][0]["securityContext"]
            sc.pop(key[2:], None) if value is None else sc.__setitem__(key[2:], value)
        elif key.startswith("p_"):  # a field of the pod's securityContext (None: remove)
            sc = base["securityContext"]
            sc.pop(key[2:], None) if value is None else sc.__setitem__(key[2:], value)
        elif key.startswith("k_"):  # a field of the container
            base["containers"][0][key[2:]] = value
        else:
            base[key] = value
    return base


#: valid pods (the API server's validation passes), each meant to pass or break one control
CORPUS = {
    "compliant": _pod(),
    "minimal": {"containers": [{"name": "train", "image": "registry.example/x:1"}]},
    "host-network": _pod(hostNetwork=True),
    "host-pid": _pod(hostPID=True),
    "host-ipc": _pod(hostIPC=True),
    "privileged": _pod(c_privileged=True, c_allowPrivilegeEscalation=True),
    "cap-sys-admin": _pod(c_capabilities={"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
    "cap-chown": _pod(c_capabilities={"drop": ["ALL"], "add": ["CHOWN"]}),
    "cap-net-bind": _pod(c_capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}),
    "no-drop-all": _pod(c_capabilities={"drop": ["NET_RAW"]}),
    "host-path": _pod(volumes=[{"name": "h", "hostPath": {"path": "/"}}]),
    "host-port": _pod(k_ports=[{"containerPort": 8080, "hostPort": 8080}]),
    "host-port-zero": _pod(k_ports=[{"containerPort": 8080, "hostPort": 0}]),
    "probe-host": _pod(k_livenessProbe={"httpGet": {"host": "10.0.0.1", "port": 80}}),
    "hook-host": _pod(k_lifecycle={"preStop": {"httpGet": {"host": "169.254.169.254", "port": 80}}}),
    "probe-no-host": _pod(k_readinessProbe={"tcpSocket": {"port": 80}}),
    "apparmor-unconfined": _pod(p_appArmorProfile={"type": "Unconfined"}),
    "apparmor-localhost": _pod(c_appArmorProfile={"type": "Localhost", "localhostProfile": "k8s-train"}),
    "selinux-spc": _pod(p_seLinuxOptions={"type": "spc_t"}),
    "selinux-user": _pod(c_seLinuxOptions={"user": "system_u"}),
    "selinux-container-t": _pod(p_seLinuxOptions={"type": "container_t", "level": "s0:c1,c2"}),
    "seccomp-unconfined": _pod(p_seccompProfile={"type": "Unconfined"}),
    "seccomp-missing": _pod(p_seccompProfile=None),
    "seccomp-on-container": _pod(p_seccompProfile=None, c_seccompProfile={"type": "RuntimeDefault"}),
    "sysctl-unsafe": _pod(p_sysctls=[{"name": "kernel.msgmax", "value": "65536"}]),
    "sysctl-safe": _pod(p_sysctls=[{"name": "net.ipv4.tcp_syncookies", "value": "1"},
                                   {"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]),
    "escalation-unset": _pod(c_allowPrivilegeEscalation=None),
    "non-root-missing": _pod(p_runAsNonRoot=None, p_runAsUser=None),
    "non-root-on-container": _pod(p_runAsNonRoot=None, c_runAsNonRoot=True),
    "root-user": _pod(c_runAsUser=0),
    "volume-nfs": _pod(volumes=[{"name": "n", "nfs": {"server": "nfs.example", "path": "/data"}}]),
    "volume-allowed": _pod(volumes=[{"name": "e", "emptyDir": {}}, {"name": "c", "configMap": {"name": "c"}},
                                    {"name": "s", "secret": {"secretName": "s"}},
                                    {"name": "p", "persistentVolumeClaim": {"claimName": "p"}}]),
    # user namespaces: Pod Security Admission relaxes the non-root controls; rlsched does not
    "userns-root": _pod(hostUsers=False, c_runAsUser=0, p_runAsNonRoot=None),
    "windows": {"os": {"name": "windows"}, "securityContext": {"runAsNonRoot": True},
                "containers": [{"name": "train", "image": "registry.example/x:1"}]},
}
#: where the operator is knowingly stricter than Pod Security Admission (docs/deploy.md)
STRICTER = {"userns-root": {BASE: True, RESTR: False}}


def _admitted_by_the_api_server(kapi, ns, spec) -> bool:
    try:
        kapi.core.create_namespaced_pod(ns, {"apiVersion": "v1", "kind": "Pod",
                                             "metadata": {"name": "psa-probe"}, "spec": spec}, dry_run="All")
        return True
    except ApiException as exc:
        assert exc.status == 403 and "violates PodSecurity" in exc.body, exc.body  # not a validation error
        return False


@pytest.mark.k8s
@pytest.mark.timeout(300)
def test_verdicts_agree_with_pod_security_admission(kapi, wait_until):
    """Every pod of the corpus, server-side dry run in a namespace labelled baseline and
    one labelled restricted: the API server admits it exactly when the check finds
    nothing, except where the operator is knowingly stricter (and only stricter)."""
    made = {}
    for level in (BASE, RESTR):
        made[level] = f"psa-{level}-{uuid.uuid4().hex[:6]}"
        kapi.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
            name=made[level], labels={LABEL_POD_SECURITY_ENFORCE: level})))
    try:
        for name in made.values():  # pod admission needs the default ServiceAccount
            wait_until(lambda: [a for a in kapi.core.list_namespaced_service_account(name).items
                                if a.metadata.name == "default"], 60, f"default ServiceAccount in {name}")
        disagree = {}
        for case, spec in sorted(CORPUS.items()):
            ours = {level: check_pod_spec(spec, level, where="spec") == [] for level in made}
            theirs = {level: _admitted_by_the_api_server(kapi, ns, spec) for level, ns in made.items()}
            if ours != theirs:
                disagree[case] = (ours, theirs, [str(v) for v in check_pod_spec(spec, RESTR, where="spec")])
        assert {case: d[0] for case, d in disagree.items()} == STRICTER, disagree
        assert all(d[1] == {BASE: True, RESTR: True} for d in disagree.values())
    finally:
        for name in made.values():
            kapi.core.delete_namespace(name)


def test_the_corpus_covers_every_outcome():
    verdicts = {(check_pod_spec(s, BASE) == [], check_pod_spec(s, RESTR) == []) for s in CORPUS.values()}
    assert verdicts == {(True, True), (True, False), (False, False)}


# ----------------------------------------------------------------------------- which level applies (pure)
def _cfg(**kw):
    from rlsched.operator.controller import OperatorConfig

    return OperatorConfig(**kw)


def _ns(labels=None):
    return {"metadata": {"name": "team", "labels": labels or {}}}


def _job(template, phase="Queued", generation=1, namespace="team"):
    return {"metadata": {"name": "j", "namespace": namespace, "uid": "u-1", "generation": generation},
            "spec": {"minWorkers": 1, "maxWorkers": 1, "template": template}, "status": {"phase": phase}}


def test_effective_level_is_the_label_else_the_default():
    from rlsched.operator.podsecurity import effective_level

    assert effective_level(_ns(), BASE)[0] == BASE
    assert effective_level(None, RESTR)[0] == RESTR
    assert effective_level(_ns({LABEL_POD_SECURITY_ENFORCE: PRIV}), RESTR)[0] == PRIV
    assert effective_level(_ns({LABEL_POD_SECURITY_ENFORCE: RESTR}), PRIV)[0] == RESTR
    level, why = effective_level(_ns({LABEL_POD_SECURITY_ENFORCE: "strict"}), PRIV)
    assert level == RESTR and "'strict' is not a level" in why  # as Pod Security Admission reads it
    assert effective_level({"metadata": {"labels": "garbage"}}, BASE)[0] == BASE


def test_secrets_need_the_flag_or_the_namespace_label():
    from rlsched.operator.podsecurity import check_job, secrets_allowed

    assert not secrets_allowed(_ns(), _cfg())
    assert secrets_allowed(_ns(), _cfg(allow_secret_mounts=True))
    assert secrets_allowed(_ns({LABEL_ALLOW_SECRET_MOUNTS: "true"}), _cfg())
    assert not secrets_allowed(_ns({LABEL_ALLOW_SECRET_MOUNTS: "yes"}), _cfg())
    tpl = restricted_template()
    tpl["spec"]["containers"][0]["envFrom"] = [{"secretRef": {"name": "s"}}]
    refused = check_job(_job(tpl), _ns(), _cfg())
    assert [v.path for v in refused.violations] == ["spec.template.spec.containers[0].envFrom[0].secretRef"]
    assert "--allow-secret-mounts" in refused.message() and LABEL_ALLOW_SECRET_MOUNTS in refused.message()
    assert check_job(_job(tpl), _ns({LABEL_ALLOW_SECRET_MOUNTS: "true"}), _cfg()).ok


def test_the_message_lists_at_most_twenty_violations():
    from rlsched.operator.podsecurity import check_job

    tpl = {"spec": {"containers": [{"name": f"c{i}", "image": "x", "securityContext": {"privileged": True}}
                                   for i in range(25)]}}
    result = check_job(_job(tpl), None, _cfg())
    assert len(result.violations) == 25 and result.message().endswith("; and 5 more")
    assert "the operator's default" in result.message()


def test_a_bad_default_level_is_refused_at_start_up():
    from rlsched.core.contract import ShapeError
    from rlsched.operator.podsecurity import PodSecurityGate

    with pytest.raises(ShapeError):
        PodSecurityGate(None, None, _cfg(pod_security_level="Baseline"))


# ----------------------------------------------------------------------------- the gate
async def _controller(**kw):
    """A Controller against ``kw['server']`` (the real API server, or a closed port)."""
    from kubernetes_asyncio import client as aclient
    from prometheus_client import CollectorRegistry

    from rlsched.operator.controller import Controller, OperatorConfig
    from rlsched.operator.handlers import make_api_client
    from rlsched.operator.metrics import OperatorMetrics

    kubeconfig = kw.pop("kubeconfig", None)
    if kubeconfig:
        api = await make_api_client(kubeconfig)
    else:
        conf = aclient.Configuration(host="http://127.0.0.1:9")  # discard port: nothing listens
        api = aclient.ApiClient(conf)
    cfg = OperatorConfig(kubeconfig=kubeconfig, metrics_port=None, forecast_interval_s=0, **kw)
    return Controller(cfg, api, OperatorMetrics(CollectorRegistry())), api


async def test_unreadable_namespaces_fall_back_to_the_default_and_hold_what_it_refuses():
    ctl, api = await _controller()
    try:
        gate = ctl.pod_security
        assert await gate.check(_job(restricted_template()), 1) is None  # passes the default: goes on
        refusal = await gate.check(_job(exploit_template()), 1)
        assert refusal is not None and not refusal.final  # held in the queue, not failed
        assert "could not be read" in refusal.message
    finally:
        await api.close()


async def test_running_jobs_are_checked_again_only_when_their_spec_changed():
    ctl, api = await _controller(pod_security_level=RESTR)
    try:
        gate = ctl.pod_security
        bad = exploit_template()
        # admitted before this operator started and never edited (generation 1): left alone,
        # without reading namespaces
        assert await gate.check(_job(bad, "Running", generation=1), 1) is None
        assert await gate.check(_job(bad, "Starting", generation=1), 2) is None
        # its spec was edited since (generation 2): checked again
        assert await gate.check(_job(bad, "Running", generation=2), 3) is not None
        # finished jobs are not the gate's
        assert await gate.check(_job(bad, "Succeeded", generation=5), 3) is None
        # a Queued job is checked every cycle; what passed stays passed for that generation
        ok = restricted_template()
        assert await gate.check(_job(ok, "Queued", generation=3), 4) is None
        gate.config.pod_security_level = PRIV  # a policy change does not re-check running jobs ...
        assert await gate.check(_job(ok, "Running", generation=3), 5) is None
        # ... an edit does, under the policy of now
        privileged = {"spec": {"containers": [{"name": "t", "image": "x", "securityContext": {"privileged": True}}]}}
        assert await gate.check(_job(privileged, "Running", generation=4), 6) is None
        assert await gate.check(_job(bad, "Running", generation=5), 7) is not None  # its Secret
    finally:
        await api.close()


@pytest.mark.k8s
@pytest.mark.timeout(300)
async def test_cluster_wide_gate_reads_each_namespace_label(kube_cluster, kapi, wait_until):
    names = {}
    for level in (PRIV, RESTR, None):
        name = f"gate-{uuid.uuid4().hex[:6]}"
        labels = {LABEL_POD_SECURITY_ENFORCE: level} if level else {}
        kapi.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels=labels)))
        names[level] = name
    ctl, api = await _controller(kubeconfig=str(kube_cluster.kubeconfig), allow_secret_mounts=True)
    try:
        assert ctl.config.namespace is None
        verdicts = {level: await ctl.pod_security.check(_job(exploit_template(), namespace=ns), 1)
                    for level, ns in names.items()}
        assert verdicts[PRIV] is None
        assert verdicts[RESTR].final and "level restricted" in verdicts[RESTR].message
        assert verdicts[None].final and "level baseline (the operator's default" in verdicts[None].message
        # the job's namespace is missing from the list (deleted meanwhile): the default applies
        gone = await ctl.pod_security.check(_job(exploit_template(), namespace="no-such-namespace"), 1)
        assert gone.final and "level baseline" in gone.message
    finally:
        await api.close()
        for ns in names.values():
            kapi.core.delete_namespace(ns)
