"""The Pod Security Standards check (core/podsecurity.py): one case per control that can
fail, on every container kind, the allowed values that must pass, rlsched's Secrets
rule, malformed input, and properties over generated pod specs."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsched.core.contract import (
    ANNOTATION_APPARMOR_PREFIX,
    POD_SECURITY_BASELINE,
    POD_SECURITY_LEVELS,
    POD_SECURITY_PRIVILEGED,
    POD_SECURITY_RESTRICTED,
    ShapeError,
)
from rlsched.core.podsecurity import (
    BASELINE_CAPABILITIES,
    RESTRICTED_VOLUME_TYPES,
    RULE_SECRETS,
    SAFE_SYSCTLS,
    SELINUX_TYPES,
    Violation,
    check_pod_spec,
    check_template,
    parse_level,
    secret_references,
)

BASE, RESTR, PRIV = POD_SECURITY_BASELINE, POD_SECURITY_RESTRICTED, POD_SECURITY_PRIVILEGED
W = "spec.template.spec"
C0 = f"{W}.containers[0]"
SC0 = f"{C0}.securityContext"
PSC = f"{W}.securityContext"
KINDS = ("containers", "initContainers", "ephemeralContainers")


def restricted_pod() -> dict:
    """A worker pod spec that meets the restricted level: an init container and a
    container, both hardened; an emptyDir volume."""
    hardened = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    return {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [{"name": "fetch", "image": "x", "securityContext": copy.deepcopy(hardened)}],
        "containers": [{"name": "train", "image": "x", "securityContext": copy.deepcopy(hardened),
                        "ports": [{"containerPort": 8080}]}],
        "volumes": [{"name": "scratch", "emptyDir": {}}],
    }


def with_(spec: dict, path: str, value) -> dict:
    """A copy of ``spec`` with ``value`` set at the dotted ``path`` (``containers.0.x``);
    missing objects and list entries on the way are created."""
    out = copy.deepcopy(spec)
    keys = [int(k) if k.isdigit() else k for k in path.split(".")]
    node = out
    for k, nxt in zip(keys, keys[1:]):
        if isinstance(k, int):
            while len(node) <= k:
                node.append({"name": f"c{len(node)}", "image": "x"})
        elif not isinstance(node.get(k), (dict, list)):
            node[k] = [] if isinstance(nxt, int) else {}
        node = node[k]
    if isinstance(keys[-1], int):
        while len(node) <= keys[-1]:
            node.append(None)
    node[keys[-1]] = value
    return out


def ephemeral(spec: dict) -> dict:
    """``spec`` with a hardened ephemeral container too."""
    out = copy.deepcopy(spec)
    out["ephemeralContainers"] = [copy.deepcopy(out["containers"][0]) | {"name": "debug"}]
    return out


def found(spec, level, **kw) -> list[tuple[str, str, str]]:
    return [(v.level, v.control, v.path) for v in check_pod_spec(spec, level, **kw)]


# ----------------------------------------------------------------------------- levels
def test_the_compliant_pod_passes_every_level():
    for level in POD_SECURITY_LEVELS:
        assert check_pod_spec(restricted_pod(), level) == []
        assert check_pod_spec(ephemeral(restricted_pod()), level) == []


def test_a_minimal_pod_meets_baseline_not_restricted():
    pod = {"containers": [{"name": "train", "image": "x"}]}
    assert check_pod_spec(pod, BASE) == []
    assert {(v.control, v.path) for v in check_pod_spec(pod, RESTR)} == {
        ("Running as Non-root", f"{SC0}.runAsNonRoot"),
        ("Privilege Escalation", f"{SC0}.allowPrivilegeEscalation"),
        ("Seccomp", f"{SC0}.seccompProfile.type"),
        ("Capabilities", f"{SC0}.capabilities.drop"),
    }


@pytest.mark.parametrize("value", ["Baseline", "", " baseline", None, 1, "enforce"])
def test_unknown_level_is_a_shape_error(value):
    with pytest.raises(ShapeError, match="pod security level"):
        parse_level(value)
    with pytest.raises(ShapeError):
        check_pod_spec(restricted_pod(), value)


def test_levels_parse():
    assert [parse_level(v) for v in POD_SECURITY_LEVELS] == list(POD_SECURITY_LEVELS)


def test_violation_reads_level_message_and_path():
    (v,) = check_pod_spec({"containers": [{}], "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, BASE)
    assert str(v) == "baseline: hostPath volumes are forbidden (spec.template.spec.volumes[0].hostPath)"
    assert (v.level, v.control) == (BASE, "HostPath Volumes")


def test_where_prefixes_the_paths():
    spec = with_(restricted_pod(), "hostPID", True)
    assert found(spec, BASE, where="spec") == [(BASE, "Host Namespaces", "spec.hostPID")]


def test_allowed_value_lists_are_the_standards():
    """Written out again from https://kubernetes.io/docs/concepts/security/pod-security-standards/
    so that a slip in one list fails here."""
    assert BASELINE_CAPABILITIES == {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                                     "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
    assert SAFE_SYSCTLS == {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                            "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
                            "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                            "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
    assert SELINUX_TYPES == {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
    assert set(RESTRICTED_VOLUME_TYPES) == {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                            "persistentVolumeClaim", "projected", "secret"}


# ----------------------------------------------------------------------------- baseline, one case per control
BASELINE_CASES = [
    # (id, dotted field, bad value, control, reported path)
    ("hostprocess-pod", "securityContext.windowsOptions.hostProcess", True, "HostProcess",
     f"{PSC}.windowsOptions.hostProcess"),
    ("hostprocess-container", "containers.0.securityContext.windowsOptions.hostProcess", True, "HostProcess",
     f"{SC0}.windowsOptions.hostProcess"),
    ("hostprocess-init", "initContainers.0.securityContext.windowsOptions.hostProcess", True, "HostProcess",
     f"{W}.initContainers[0].securityContext.windowsOptions.hostProcess"),
    ("host-network", "hostNetwork", True, "Host Namespaces", f"{W}.hostNetwork"),
    ("host-pid", "hostPID", True, "Host Namespaces", f"{W}.hostPID"),
    ("host-ipc", "hostIPC", True, "Host Namespaces", f"{W}.hostIPC"),
    ("privileged-container", "containers.0.securityContext.privileged", True, "Privileged Containers",
     f"{SC0}.privileged"),
    ("privileged-init", "initContainers.0.securityContext.privileged", True, "Privileged Containers",
     f"{W}.initContainers[0].securityContext.privileged"),
    ("capability-sys-admin", "containers.0.securityContext.capabilities.add", ["SYS_ADMIN"], "Capabilities",
     f"{SC0}.capabilities.add[0]"),
    ("capability-prefixed", "initContainers.0.securityContext.capabilities.add", ["CAP_CHOWN"], "Capabilities",
     f"{W}.initContainers[0].securityContext.capabilities.add[0]"),
    ("host-path", "volumes.0.hostPath", {"path": "/"}, "HostPath Volumes", f"{W}.volumes[0].hostPath"),
    ("host-port", "containers.0.ports.0.hostPort", 8080, "Host Ports", f"{C0}.ports[0].hostPort"),
    ("host-port-init", "initContainers.0.ports", [{"containerPort": 80, "hostPort": 80}], "Host Ports",
     f"{W}.initContainers[0].ports[0].hostPort"),
    ("probe-http-host", "containers.0.livenessProbe", {"httpGet": {"host": "10.0.0.1", "port": 80}},
     "Host Probes / Lifecycle Hooks", f"{C0}.livenessProbe.httpGet.host"),
    ("probe-tcp-host", "containers.0.readinessProbe", {"tcpSocket": {"host": "metadata", "port": 80}},
     "Host Probes / Lifecycle Hooks", f"{C0}.readinessProbe.tcpSocket.host"),
    ("startup-probe-host", "initContainers.0.startupProbe", {"httpGet": {"host": "x", "port": 1}},
     "Host Probes / Lifecycle Hooks", f"{W}.initContainers[0].startupProbe.httpGet.host"),
    ("hook-host", "containers.0.lifecycle", {"preStop": {"httpGet": {"host": "169.254.169.254", "port": 80}}},
     "Host Probes / Lifecycle Hooks", f"{C0}.lifecycle.preStop.httpGet.host"),
    ("hook-tcp-host", "containers.0.lifecycle", {"postStart": {"tcpSocket": {"host": "x", "port": 1}}},
     "Host Probes / Lifecycle Hooks", f"{C0}.lifecycle.postStart.tcpSocket.host"),
    ("apparmor-pod", "securityContext.appArmorProfile", {"type": "Unconfined"}, "AppArmor",
     f"{PSC}.appArmorProfile.type"),
    ("apparmor-container", "containers.0.securityContext.appArmorProfile", {"type": "Unconfined"}, "AppArmor",
     f"{SC0}.appArmorProfile.type"),
    ("selinux-type", "securityContext.seLinuxOptions", {"type": "spc_t"}, "SELinux", f"{PSC}.seLinuxOptions.type"),
    ("selinux-user", "containers.0.securityContext.seLinuxOptions", {"user": "system_u"}, "SELinux",
     f"{SC0}.seLinuxOptions.user"),
    ("selinux-role", "initContainers.0.securityContext.seLinuxOptions", {"role": "sysadm_r"}, "SELinux",
     f"{W}.initContainers[0].securityContext.seLinuxOptions.role"),
    ("proc-mount", "containers.0.securityContext.procMount", "Unmasked", "/proc Mount Type", f"{SC0}.procMount"),
    ("seccomp-unconfined-pod", "securityContext.seccompProfile", {"type": "Unconfined"}, "Seccomp",
     f"{PSC}.seccompProfile.type"),
    ("seccomp-unconfined-container", "containers.0.securityContext.seccompProfile", {"type": "Unconfined"}, "Seccomp",
     f"{SC0}.seccompProfile.type"),
    ("sysctl-unsafe", "securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}], "Sysctls",
     f"{PSC}.sysctls[0].name"),
]


@pytest.mark.parametrize("field, value, control, path", [c[1:] for c in BASELINE_CASES],
                         ids=[c[0] for c in BASELINE_CASES])
def test_each_baseline_control_fails_once_at_baseline_and_restricted(field, value, control, path):
    spec = with_(restricted_pod(), field, value)
    assert found(spec, BASE) == [(BASE, control, path)]
    assert found(spec, RESTR) == [(BASE, control, path)]  # restricted adds no second report
    assert check_pod_spec(spec, PRIV) == []


@pytest.mark.parametrize("control, field", [
    ("HostProcess", "securityContext.windowsOptions.hostProcess"),
    ("Privileged Containers", "securityContext.privileged"),
    ("Capabilities", "securityContext.capabilities.add"),
    ("/proc Mount Type", "securityContext.procMount"),
    ("Host Ports", "ports"),
])
def test_ephemeral_containers_are_checked(control, field):
    value = {"securityContext.capabilities.add": ["NET_ADMIN"], "securityContext.procMount": "Unmasked",
             "ports": [{"containerPort": 1, "hostPort": 1}]}.get(field, True)
    spec = with_(ephemeral(restricted_pod()), f"ephemeralContainers.0.{field}", value)
    (v,) = check_pod_spec(spec, BASE)
    assert v.control == control and v.path.startswith(f"{W}.ephemeralContainers[0].")


def test_apparmor_annotation():
    ann = {ANNOTATION_APPARMOR_PREFIX + "train": "unconfined", "other": "x"}
    assert found(restricted_pod(), BASE, annotations=ann) == [
        (BASE, "AppArmor", f"spec.template.metadata.annotations[{ANNOTATION_APPARMOR_PREFIX + 'train'!r}]")]
    ok = {ANNOTATION_APPARMOR_PREFIX + "a": "runtime/default", ANNOTATION_APPARMOR_PREFIX + "b": "localhost/k8s"}
    assert check_pod_spec(restricted_pod(), RESTR, annotations=ok) == []


def test_every_disallowed_capability_is_named():
    spec = with_(restricted_pod(), "containers.0.securityContext.capabilities.add", ["SYS_ADMIN", "CHOWN", "NET_RAW"])
    assert [v.message for v in check_pod_spec(spec, BASE)] == [
        "adding capability 'SYS_ADMIN' is forbidden", "adding capability 'NET_RAW' is forbidden"]


def test_host_path_with_other_problems_lists_them_all():
    """The exploit of issue 12: privileged, hostPath /, a Secret volume."""
    spec = {"containers": [{"name": "t", "image": "x", "securityContext": {"privileged": True},
                            "volumeMounts": [{"name": "root", "mountPath": "/host"}]}],
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}, {"name": "s", "secret": {"secretName": "db"}}]}
    assert [str(v) for v in check_pod_spec(spec, BASE)] == [
        f"baseline: privileged containers are forbidden ({SC0}.privileged)",
        f"baseline: hostPath volumes are forbidden ({W}.volumes[0].hostPath)",
    ]
    assert [str(v) for v in secret_references(spec)] == [
        f"rlsched: mounting Secret 'db' is refused ({W}.volumes[1].secret)"]


# ----------------------------------------------------------------------------- allowed values pass
@pytest.mark.parametrize("field, value", [
    ("hostNetwork", False),
    ("securityContext.windowsOptions", {"hostProcess": False, "runAsUserName": "x"}),
    ("containers.0.securityContext.privileged", False),
    ("containers.0.ports.0.hostPort", 0),
    ("containers.0.livenessProbe", {"httpGet": {"host": "", "port": 80, "path": "/healthz"}}),
    ("containers.0.readinessProbe", {"exec": {"command": ["true"]}}),
    ("securityContext.appArmorProfile", {"type": "RuntimeDefault"}),
    ("containers.0.securityContext.appArmorProfile", {"type": "Localhost", "localhostProfile": "k8s-train"}),
    ("securityContext.seLinuxOptions", {"type": "container_t", "level": "s0:c123,c456"}),
    ("containers.0.securityContext.seLinuxOptions", {"type": "", "user": "", "role": ""}),
    ("containers.0.securityContext.procMount", "Default"),
    ("containers.0.securityContext.seccompProfile", {"type": "Localhost", "localhostProfile": "p.json"}),
    ("containers.0.securityContext.capabilities.add", ["NET_BIND_SERVICE"]),
    ("containers.0.securityContext.runAsUser", 1000),
    ("securityContext.runAsUser", 65534),
    ("securityContext.sysctls", [{"name": n, "value": "1"} for n in sorted(SAFE_SYSCTLS)]),
])
def test_allowed_values_pass_restricted(field, value):
    assert check_pod_spec(with_(restricted_pod(), field, value), RESTR) == []


@pytest.mark.parametrize("cap", sorted(BASELINE_CAPABILITIES))
def test_baseline_capabilities_pass_baseline(cap):
    spec = with_({"containers": [{}]}, "containers.0.securityContext.capabilities.add", [cap])
    assert check_pod_spec(spec, BASE) == []


@pytest.mark.parametrize("kind", sorted(SELINUX_TYPES - {""}))
def test_selinux_types_pass(kind):
    assert check_pod_spec(with_(restricted_pod(), "securityContext.seLinuxOptions.type", kind), RESTR) == []


@pytest.mark.parametrize("kind", RESTRICTED_VOLUME_TYPES)
def test_restricted_volume_types_pass(kind):
    assert check_pod_spec(with_(restricted_pod(), "volumes.0", {"name": "v", kind: {}}), RESTR) == []


def test_container_level_settings_stand_in_for_the_pod_level():
    spec = restricted_pod()
    del spec["securityContext"]
    for c in spec["initContainers"] + spec["containers"]:
        c["securityContext"] |= {"runAsNonRoot": True, "seccompProfile": {"type": "Localhost", "localhostProfile": "x"}}
    assert check_pod_spec(spec, RESTR) == []


def test_windows_pods_skip_the_linux_only_restricted_controls():
    spec = {"os": {"name": "windows"}, "securityContext": {"runAsNonRoot": True},
            "containers": [{"name": "t", "image": "x"}]}
    assert check_pod_spec(spec, RESTR) == []
    spec["os"]["name"] = "linux"
    assert {v.control for v in check_pod_spec(spec, RESTR)} == {"Privilege Escalation", "Seccomp", "Capabilities"}


def test_windows_pods_still_may_not_use_host_process():
    spec = with_({"os": {"name": "windows"}, "containers": [{}]}, "securityContext.windowsOptions.hostProcess", True)
    assert [v.control for v in check_pod_spec(spec, BASE)] == ["HostProcess"]


# ----------------------------------------------------------------------------- restricted, one case per control
RESTRICTED_CASES = [
    ("volume-nfs", "volumes.0", {"name": "v", "nfs": {"server": "s", "path": "/"}}, "Volume Types",
     f"{W}.volumes[0].nfs"),
    ("volume-git", "volumes.1", {"name": "g", "gitRepo": {"repository": "r"}}, "Volume Types", f"{W}.volumes[1].gitRepo"),
    ("volume-none", "volumes.0", {"name": "v"}, "Volume Types", f"{W}.volumes[0]"),
    ("escalation-unset", "containers.0.securityContext.allowPrivilegeEscalation", None, "Privilege Escalation",
     f"{SC0}.allowPrivilegeEscalation"),
    ("escalation-true", "initContainers.0.securityContext.allowPrivilegeEscalation", True, "Privilege Escalation",
     f"{W}.initContainers[0].securityContext.allowPrivilegeEscalation"),
    ("non-root-pod-false", "securityContext.runAsNonRoot", False, "Running as Non-root", f"{PSC}.runAsNonRoot"),
    ("non-root-container-false", "containers.0.securityContext.runAsNonRoot", False, "Running as Non-root",
     f"{SC0}.runAsNonRoot"),
    ("run-as-root-pod", "securityContext.runAsUser", 0, "Running as Non-root user", f"{PSC}.runAsUser"),
    ("run-as-root-container", "containers.0.securityContext.runAsUser", 0, "Running as Non-root user",
     f"{SC0}.runAsUser"),
    ("run-as-root-init", "initContainers.0.securityContext.runAsUser", 0, "Running as Non-root user",
     f"{W}.initContainers[0].securityContext.runAsUser"),
    ("drop-not-all", "containers.0.securityContext.capabilities.drop", ["NET_RAW"], "Capabilities",
     f"{SC0}.capabilities.drop"),
    ("add-chown", "containers.0.securityContext.capabilities.add", ["CHOWN"], "Capabilities",
     f"{SC0}.capabilities.add[0]"),
]


@pytest.mark.parametrize("field, value, control, path", [c[1:] for c in RESTRICTED_CASES],
                         ids=[c[0] for c in RESTRICTED_CASES])
def test_each_restricted_control_fails_only_at_restricted(field, value, control, path):
    spec = with_(restricted_pod(), field, value)
    assert found(spec, RESTR) == [(RESTR, control, path)]
    assert check_pod_spec(spec, BASE) == []


def test_run_as_non_root_needs_the_pod_or_every_container():
    spec = restricted_pod()
    del spec["securityContext"]["runAsNonRoot"]
    spec["containers"][0]["securityContext"]["runAsNonRoot"] = True
    assert found(spec, RESTR) == [
        (RESTR, "Running as Non-root", f"{W}.initContainers[0].securityContext.runAsNonRoot")]


def test_seccomp_needs_the_pod_or_every_container():
    spec = restricted_pod()
    del spec["securityContext"]["seccompProfile"]
    spec["initContainers"][0]["securityContext"]["seccompProfile"] = {"type": "RuntimeDefault"}
    assert found(spec, RESTR) == [(RESTR, "Seccomp", f"{SC0}.seccompProfile.type")]


def test_ephemeral_containers_are_held_to_restricted():
    spec = ephemeral(restricted_pod())
    spec["ephemeralContainers"][0]["securityContext"] = {}
    assert {p for _, _, p in found(spec, RESTR)} == {
        f"{W}.ephemeralContainers[0].securityContext.allowPrivilegeEscalation",
        f"{W}.ephemeralContainers[0].securityContext.capabilities.drop",
    }


def test_a_capability_outside_baseline_is_reported_once_at_restricted():
    spec = with_(restricted_pod(), "containers.0.securityContext.capabilities.add", ["SYS_ADMIN"])
    assert found(spec, RESTR) == [(BASE, "Capabilities", f"{SC0}.capabilities.add[0]")]


# ----------------------------------------------------------------------------- Secrets (rlsched's rule)
@pytest.mark.parametrize("field, value, path, name", [
    ("volumes.1", {"name": "s", "secret": {"secretName": "db-creds"}}, f"{W}.volumes[1].secret", "db-creds"),
    ("volumes.1", {"name": "p", "projected": {"sources": [{"configMap": {"name": "c"}}, {"secret": {"name": "tls"}}]}},
     f"{W}.volumes[1].projected.sources[1].secret", "tls"),
    ("containers.0.env", [{"name": "A", "value": "1"}, {"name": "K", "valueFrom": {"secretKeyRef": {"name": "api",
                                                                                                  "key": "k"}}}],
     f"{C0}.env[1].valueFrom.secretKeyRef", "api"),
    ("initContainers.0.envFrom", [{"secretRef": {"name": "all"}}], f"{W}.initContainers[0].envFrom[0].secretRef", "all"),
    ("ephemeralContainers.0.envFrom", [{"configMapRef": {"name": "c"}}, {"secretRef": {"name": "e"}}],
     f"{W}.ephemeralContainers[0].envFrom[1].secretRef", "e"),
])
def test_each_way_of_reading_a_secret_is_refused(field, value, path, name):
    spec = with_(ephemeral(restricted_pod()), field, value)
    (v,) = secret_references(spec)
    assert (v.level, v.control, v.path) == (RULE_SECRETS, "Secrets", path)
    assert repr(name) in v.message
    assert check_pod_spec(spec, RESTR) == []  # the standard allows them; only rlsched's rule refuses


def test_no_secret_no_refusal():
    spec = with_(restricted_pod(), "volumes.1", {"name": "p", "projected": {"sources": [
        {"configMap": {"name": "c"}}, {"downwardAPI": {"items": []}}, {"serviceAccountToken": {"path": "t"}}]}})
    spec["containers"][0]["env"] = [{"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    spec["containers"][0]["envFrom"] = [{"configMapRef": {"name": "c"}}]
    assert secret_references(spec) == []


def test_a_secret_without_a_name_is_still_refused():
    spec = with_(restricted_pod(), "volumes.0", {"name": "s", "secret": {}})
    assert [v.message for v in secret_references(spec)] == ["mounting a Secret is refused"]


# ----------------------------------------------------------------------------- malformed input fails closed
@pytest.mark.parametrize("field, value, path", [
    ("securityContext", "root", PSC),
    ("containers", {"name": "t"}, f"{W}.containers"),
    ("containers.1", "t", f"{W}.containers[1]"),
    ("containers.0.securityContext", ["privileged"], SC0),
    ("containers.0.securityContext.privileged", "true", f"{SC0}.privileged"),
    ("containers.0.securityContext.capabilities.add", "SYS_ADMIN", f"{SC0}.capabilities.add"),
    ("containers.0.securityContext.capabilities.add", [7], f"{SC0}.capabilities.add[0]"),
    ("containers.0.ports.0.hostPort", "80", f"{C0}.ports[0].hostPort"),
    ("containers.0.ports.0.hostPort", True, f"{C0}.ports[0].hostPort"),
    ("hostNetwork", 1, f"{W}.hostNetwork"),
    ("volumes", {"root": {"hostPath": "/"}}, f"{W}.volumes"),
    ("securityContext.sysctls", [{"name": 5}], f"{PSC}.sysctls[0].name"),
    ("securityContext.seccompProfile", "Unconfined", f"{PSC}.seccompProfile"),
    ("containers.0.lifecycle", [], f"{C0}.lifecycle"),
    ("os", "windows", f"{W}.os"),
])
def test_a_field_of_the_wrong_type_is_a_violation(field, value, path):
    spec = with_(restricted_pod(), field, value)
    for level in (BASE, RESTR):
        shapes = [v for v in check_pod_spec(spec, level) if v.control == "Shape"]
        assert [(v.level, v.path) for v in shapes] == [(level, path)], level
        assert shapes[0].message.startswith("expected ")


def test_malformed_secret_references_fail_closed():
    spec = with_(restricted_pod(), "containers.0.env", [{"name": "A", "valueFrom": {"secretKeyRef": "db"}}])
    assert [(v.control, v.path) for v in secret_references(spec)] == [
        ("Shape", f"{C0}.env[0].valueFrom.secretKeyRef")]
    spec = with_(restricted_pod(), "volumes", "all")
    assert [(v.level, v.control) for v in secret_references(spec)] == [(RULE_SECRETS, "Shape")]


def test_non_object_pod_specs_raise_shape_error():
    for bad in (None, [], "spec", 3):
        with pytest.raises(ShapeError, match="expected an object"):
            check_pod_spec(bad, BASE)
        with pytest.raises(ShapeError, match="expected an object"):
            secret_references(bad)
    with pytest.raises(ShapeError, match="spec.template: expected an object"):
        check_template("x", BASE)


def test_check_template_reads_annotations_and_spec():
    tpl = {"metadata": {"annotations": {ANNOTATION_APPARMOR_PREFIX + "t": "unconfined"}},
           "spec": with_(restricted_pod(), "hostIPC", True)}
    assert [v.control for v in check_template(tpl, BASE)] == ["Host Namespaces", "AppArmor"]
    assert check_template(tpl, PRIV) == []
    bad = {"metadata": "x", "spec": restricted_pod()}
    assert [(v.control, v.path) for v in check_template(bad, RESTR)] == [("Shape", "spec.template.metadata")]
    assert [v.path for v in check_template({"spec": {"containers": [{}]}, "metadata": {"annotations": []}}, BASE)] == [
        "spec.template.metadata.annotations"]


# ----------------------------------------------------------------------------- properties
FIELDS = [
    "securityContext", "containers", "initContainers", "ephemeralContainers", "volumes", "hostNetwork", "hostPID",
    "hostIPC", "privileged", "capabilities", "add", "drop", "ports", "hostPort", "windowsOptions", "hostProcess",
    "seLinuxOptions", "type", "user", "role", "procMount", "seccompProfile", "appArmorProfile", "sysctls", "name",
    "runAsNonRoot", "runAsUser", "allowPrivilegeEscalation", "hostPath", "secret", "projected", "sources", "env",
    "envFrom", "valueFrom", "secretKeyRef", "secretRef", "livenessProbe", "httpGet", "tcpSocket", "host",
    "lifecycle", "preStop", "os", "nfs", "emptyDir",
]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2, 70000), st.floats(allow_nan=True),
                    st.sampled_from(["", "ALL", "SYS_ADMIN", "Unconfined", "RuntimeDefault", "windows", "/", "0"]),
                    st.text(max_size=8))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(FIELDS), st.text(max_size=6)), inner, max_size=5)), max_leaves=40)
POD_SPECS = st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=8)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=POD_SPECS, annotations=st.one_of(st.none(), JSON))
def test_any_json_pod_spec_gives_violations_never_an_exception(spec, annotations):
    by_level = {level: check_pod_spec(spec, level, annotations=annotations) for level in POD_SECURITY_LEVELS}
    assert by_level[PRIV] == []
    for vs in by_level.values():
        assert all(isinstance(v, Violation) and (v.path.startswith(W) or v.path.startswith("spec.template.metadata"))
                   for v in vs)
        assert len(vs) == len(set(vs))
    # restricted holds everything baseline does, and more
    assert {(v.control, v.path) for v in by_level[BASE]} <= {(v.control, v.path) for v in by_level[RESTR]}
    assert all(v.level == RULE_SECRETS for v in secret_references(spec))


CONTAINER = st.fixed_dictionaries({
    "name": st.text(min_size=1, max_size=5), "image": st.just("x"),
    "securityContext": st.fixed_dictionaries(
        {"allowPrivilegeEscalation": st.just(False),
         "capabilities": st.fixed_dictionaries({"drop": st.lists(st.sampled_from(["NET_RAW", "SYS_ADMIN"]), max_size=2)
                                                .map(lambda d: d + ["ALL"]),
                                                "add": st.lists(st.just("NET_BIND_SERVICE"), max_size=1)})},
        optional={"runAsUser": st.integers(1, 2**31), "privileged": st.just(False), "procMount": st.just("Default"),
                  "seccompProfile": st.fixed_dictionaries({"type": st.sampled_from(["RuntimeDefault", "Localhost"])}),
                  "seLinuxOptions": st.fixed_dictionaries({"type": st.sampled_from(sorted(SELINUX_TYPES))})}),
}, optional={"ports": st.lists(st.fixed_dictionaries({"containerPort": st.integers(1, 65535),
                                                      "hostPort": st.just(0)}), max_size=2)})
COMPLIANT = st.fixed_dictionaries({
    "securityContext": st.fixed_dictionaries(
        {"runAsNonRoot": st.just(True), "seccompProfile": st.fixed_dictionaries({"type": st.just("RuntimeDefault")})},
        optional={"sysctls": st.lists(st.sampled_from(sorted(SAFE_SYSCTLS)).map(lambda n: {"name": n, "value": "1"})),
                  "runAsUser": st.integers(1, 2**31), "hostNetwork": st.just(False)}),
    "containers": st.lists(CONTAINER, min_size=1, max_size=3),
}, optional={"initContainers": st.lists(CONTAINER, max_size=2), "ephemeralContainers": st.lists(CONTAINER, max_size=1),
             "volumes": st.lists(st.sampled_from(RESTRICTED_VOLUME_TYPES).filter(lambda k: k not in ("secret", "projected"))
                                 .map(lambda k: {"name": "v", k: {}}), max_size=4)})
BREAKS = st.sampled_from([c[1:] for c in BASELINE_CASES + RESTRICTED_CASES])


@settings(max_examples=200, deadline=None)
@given(spec=COMPLIANT)
def test_generated_compliant_pods_pass_every_level(spec):
    for level in POD_SECURITY_LEVELS:
        assert check_pod_spec(spec, level) == []
    assert secret_references(spec) == []


@settings(max_examples=200, deadline=None)
@given(spec=COMPLIANT, brk=BREAKS)
def test_breaking_one_control_of_a_compliant_pod_is_found_at_that_path(spec, brk):
    field, value, control, path = brk
    bad = with_(spec, field, value)
    assert (control, path) in {(v.control, v.path) for v in check_pod_spec(bad, RESTR)}
