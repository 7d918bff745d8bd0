"""The Helm chart: lint, render, secure defaults, server-side dry-run and install into
the real API server, and the RBAC it grants (what is allowed and what is denied)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "rlsched"
ALL_FEATURES = [
    "metrics.serviceMonitor.enabled=true",
    "metrics.podMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
]
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def tools():
    """bin directory of the tools cache (helm, kubectl); missing tools fail the test."""
    from rlsched_dev.tools import find_tools

    bin_dir = find_tools()
    for t in ("helm", "kubectl"):
        assert (bin_dir / t).is_file(), f"{t} missing from {bin_dir}: run `make tools`"
    return bin_dir


@pytest.fixture(scope="module")
def render(tools):
    """``render(*set_pairs, namespace=..., release=...)`` -> list of rendered objects."""

    def _render(*sets: str, namespace: str = "rlsched-system", release: str = "rlsched",
                show_only: str | None = None) -> list[dict]:
        argv = [str(tools / "helm"), "template", release, str(CHART), "--namespace", namespace]
        for s in sets:
            argv += ["--set", s]
        if show_only:
            argv += ["--show-only", show_only]
        out = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stderr
        return [d for d in yaml.safe_load_all(out.stdout) if d]

    return _render


def _containers(obj: dict) -> list[dict]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
    return spec.get("containers", []) + spec.get("initContainers", [])


def _pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]


# ----------------------------------------------------------------------- no cluster
def test_crds_in_chart_equal_the_operators():
    for src in sorted((ROOT / "operator" / "crd").glob("*.yaml")):
        dst = CHART / "files" / "crds" / src.name
        assert dst.is_file(), f"{dst} missing: run `make chart-sync-crd`"
        assert list(yaml.safe_load_all(src.read_text())) == list(yaml.safe_load_all(dst.read_text())), \
            f"{dst} differs from {src}: run `make chart-sync-crd`"


def test_serving_requirements_have_no_torch_and_follow_the_pins():
    def pins(path: Path) -> dict[str, str]:
        out = {}
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                name, _, ver = line.partition("==")
                assert ver, f"{path}: {line!r} is not pinned with =="
                out[name.lower()] = ver
        return out

    serve = pins(ROOT / "deploy" / "docker" / "requirements-serve.txt")
    full = pins(ROOT / "requirements.txt")
    assert not {"torch", "matplotlib", "gymnasium", "pettingzoo"} & set(serve)
    for name, ver in serve.items():
        assert full.get(name) == ver, f"{name}=={ver} in requirements-serve.txt, {full.get(name)} in requirements.txt"
    for needed in ("numpy", "aiohttp", "kopf", "kubernetes", "kubernetes-asyncio", "prometheus-client", "safetensors"):
        assert needed in serve


@pytest.mark.parametrize("dockerfile", ["operator.Dockerfile", "scheduler.Dockerfile"])
def test_dockerfiles_install_no_dev_package_and_no_torch(dockerfile):
    """The serving images get neither the dev tooling (dev/, the rlsched-dev distribution)
    nor torch: not in the build context, not copied, not installed, and the build checks
    that neither is importable."""
    text = (ROOT / "deploy" / "docker" / dockerfile).read_text()
    code = re.sub(r"#.*", "", text)
    copied = [src.rstrip("/") for src in re.findall(r"^COPY\s+(?!--)(\S+)", code, re.M)]
    assert copied and not [c for c in copied if c == "dev" or c.startswith("dev/") or c == "."]
    ignore = [ln.strip() for ln in (ROOT / "deploy" / "docker" / f"{dockerfile}.dockerignore").read_text().splitlines()
              if ln.strip() and not ln.lstrip().startswith("#")]
    assert ignore[0] == "**" and not [p for p in ignore if p.lstrip("!").rstrip("/") == "dev"]
    installs = re.findall(r"pip install\s+([^\n&\\]*)", code)
    assert installs
    for args in installs:
        assert "dev" not in args.replace("--no-deps", "") and "torch" not in args, args
        assert "[" not in args, f"no extras in the serving images: {args}"
    serve = re.sub(r"#.*", "", (ROOT / "deploy" / "docker" / "requirements-serve.txt").read_text().lower())
    assert "rlsched" not in serve and "torch" not in serve
    for mod in ("torch", "rlsched_dev"):
        assert f"sys.exit(u.find_spec('{mod}') is not None)" in code, f"the build must check that {mod} is absent"


@pytest.mark.parametrize("dockerfile", ["operator.Dockerfile", "scheduler.Dockerfile"])
def test_dockerfiles_are_multistage_nonroot_without_torch(dockerfile):
    text = (ROOT / "deploy" / "docker" / dockerfile).read_text()
    froms = re.findall(r"^FROM\s+(\S+)(?:\s+AS\s+(\S+))?", text, re.M)
    assert len(froms) >= 2, "multi-stage build expected"
    final = text[text.rindex("\nFROM "):]
    assert re.search(r"^USER\s+65532:65532\s*$", final, re.M), "final stage must run as the non-root user"
    assert "COPY --from=build" in final and "pip install" not in final
    assert "--no-deps" in text and "requirements-serve.txt" in text
    assert "torch" not in re.sub(r"#.*", "", text).replace("find_spec('torch')", "")
    # every path the image copies from the context is let through by its .dockerignore
    ignore = (ROOT / "deploy" / "docker" / f"{dockerfile}.dockerignore").read_text().split()
    for src in re.findall(r"^COPY\s+(?!--)(\S+)", text, re.M):
        assert f"!{src}" in ignore or f"!{src.rstrip('/')}" in ignore, f"{src} is excluded by the .dockerignore"


def test_helm_lint(tools):
    for sets in ([], ALL_FEATURES + ["operator.watchNamespace=team-a", "operator.replicas=2"]):
        argv = [str(tools / "helm"), "lint", "--strict", str(CHART)]
        for s in sets:
            argv += ["--set", s]
        out = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "0 chart(s) failed" in out.stdout


def test_helm_refuses_replicas_without_peering(tools):
    out = subprocess.run([str(tools / "helm"), "template", "x", str(CHART), "--set", "operator.replicas=2",
                          "--set", "operator.peering.enabled=false"], capture_output=True, text=True)
    assert out.returncode != 0 and "peering" in out.stderr


@pytest.mark.parametrize("bad", ["scheduler.extender.polcy=das", "scheduler.extender.policy=magic",
                                 "operator.image.pullPolicy=Sometimes", "scheduler.extender.port=70000",
                                 "scheduler.schedulerName=Not_A_Name", "crds.instal=false",
                                 "operator.podSecurity.defaultLevel=strict"])
def test_values_schema_rejects_typos_and_bad_values(tools, bad):
    out = subprocess.run([str(tools / "helm"), "template", "x", str(CHART), "--set", bad],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "schema" in out.stderr, out.stderr


def test_secure_pod_defaults(render):
    objs = render(*ALL_FEATURES)
    pods = [o for o in objs if o["kind"] in ("Deployment", "Pod")]
    assert {o["kind"] for o in pods} == {"Deployment", "Pod"}  # the helm test pod is checked too
    for o in pods:
        psc = _pod_spec(o)["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0, o["metadata"]["name"]
        assert psc["seccompProfile"]["type"] == "RuntimeDefault"
        for c in _containers(o):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, c["name"]
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert sc["capabilities"]["drop"] == ["ALL"] and "add" not in sc["capabilities"], c["name"]
            assert "memory" in c["resources"]["limits"], c["name"]


def test_scheduler_profile_extender_and_lease(render):
    objs = render("scheduler.extender.port=9999")
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("scheduler-config"))
    conf = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    assert conf["kind"] == "KubeSchedulerConfiguration"
    assert [p["schedulerName"] for p in conf["profiles"]] == ["rlsched"]
    le = conf["leaderElection"]
    assert le["leaderElect"] is True and le["resourceName"] == "rlsched-scheduler" != "kube-scheduler"
    assert le["resourceNamespace"] == "rlsched-system"
    (ext,) = conf["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:9999"
    assert ext["filterVerb"] == "filter" and ext["prioritizeVerb"] == "prioritize"
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is True
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-scheduler"))
    containers = {c["name"]: c for c in _pod_spec(dep)["containers"]}
    assert set(containers) == {"kube-scheduler", "extender", "metrics-relay"}
    args = containers["extender"]["args"]
    assert "--host=127.0.0.1" in args and "--port=9999" in args
    assert "ports" not in containers["extender"]  # nothing but loopback
    relay = containers["metrics-relay"]["command"]
    assert "--upstream=http://127.0.0.1:9999" in relay and "--listen=0.0.0.0:8889" in relay
    assert {"--max-connections=2048", "--header-timeout=10", "--idle-timeout=10"} <= set(relay)
    assert containers["metrics-relay"]["resources"]["limits"]["memory"] == "64Mi"
    assert "metrics-relay.py" in cm["data"]
    assert any(a.startswith("--config=") for a in containers["kube-scheduler"]["command"])
    # a config change rolls the pods
    other = render("scheduler.extender.port=9998")
    dep2 = next(o for o in other if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-scheduler"))
    assert dep["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != \
        dep2["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def _scheduler_conf(objs: list[dict]) -> dict:
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("scheduler-config"))
    return yaml.safe_load(cm["data"]["scheduler-config.yaml"])


def test_scheduler_client_limit_and_nodes_to_score(render, tools):
    """The chart's recommended kube-scheduler client limit and percentageOfNodesToScore
    (values.yaml, measured by bench/scheduling.py) reach the KubeSchedulerConfiguration;
    they can be overridden, or left to kube-scheduler's defaults with null."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["scheduler"]["kubeScheduler"]
    rec = values["clientConnection"]
    # above kube-scheduler's default (50/100), which would cap binds at ~50 pods/s
    assert rec["qps"] > 50 and rec["burst"] >= rec["qps"]
    assert 0 < values["percentageOfNodesToScore"] < 42  # below the adaptive 42 % at 1,000 nodes
    conf = _scheduler_conf(render())
    assert conf["clientConnection"] == {"qps": rec["qps"], "burst": rec["burst"]}
    assert conf["percentageOfNodesToScore"] == values["percentageOfNodesToScore"]
    conf = _scheduler_conf(render("scheduler.kubeScheduler.clientConnection.qps=120",
                                  "scheduler.kubeScheduler.clientConnection.burst=240",
                                  "scheduler.kubeScheduler.percentageOfNodesToScore=25"))
    assert conf["clientConnection"] == {"qps": 120, "burst": 240}
    assert conf["percentageOfNodesToScore"] == 25
    conf = _scheduler_conf(render("scheduler.kubeScheduler.clientConnection.qps=null",
                                  "scheduler.kubeScheduler.clientConnection.burst=null",
                                  "scheduler.kubeScheduler.percentageOfNodesToScore=null"))
    assert "clientConnection" not in conf and "percentageOfNodesToScore" not in conf
    bad = {"scheduler.kubeScheduler.clientConnection.burst=10": "must be >= qps",
           "scheduler.kubeScheduler.clientConnection.qps=0": "qps",
           "scheduler.kubeScheduler.percentageOfNodesToScore=101": "percentageOfNodesToScore",
           "scheduler.kubeScheduler.clientConnection.qbs=10": "qbs"}
    for setting, word in bad.items():
        out = subprocess.run([str(tools / "helm"), "template", "x", str(CHART), "--set", setting],
                             capture_output=True, text=True, check=False)
        assert out.returncode != 0 and word in out.stderr, (setting, out.stderr)


def test_extender_probes_ask_the_extender_not_the_relay(render, tmp_path):
    """The extender binds 127.0.0.1, which the kubelet's httpGet cannot reach; its probes
    are exec probes in its own container that GET the extender on loopback. Run here
    against a stand-in extender on the rendered port."""
    import http.server
    import socket
    import sys
    import threading

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dep = next(o for o in render(f"scheduler.extender.port={port}")
               if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-scheduler"))
    ext = next(c for c in _pod_spec(dep)["containers"] if c["name"] == "extender")
    probes = {"/healthz": ext["livenessProbe"], "/readyz": ext["readinessProbe"]}
    for path, probe in probes.items():
        assert "httpGet" not in probe and "tcpSocket" not in probe
        cmd = probe["exec"]["command"]
        assert cmd[:4] == ["python", "-I", "-S", "-c"] and cmd[-1] == path
        assert f"127.0.0.1\", {port}" in cmd[4]
        assert probe["timeoutSeconds"] >= 5

    class Extender(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(503 if self.path == "/readyz" else 200)
            self.end_headers()

        def log_message(self, *args):
            pass

    def run(path):
        cmd = probes[path]["exec"]["command"]
        return subprocess.run([sys.executable, *cmd[1:]], capture_output=True, text=True, timeout=30)

    srv = http.server.HTTPServer(("127.0.0.1", port), Extender)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        ok, unready = run("/healthz"), run("/readyz")
    finally:
        srv.shutdown()
        srv.server_close()
    assert ok.returncode == 0, ok.stderr
    assert unready.returncode == 1 and "extender /readyz: HTTP 503" in unready.stderr
    down = run("/healthz")
    assert down.returncode == 1 and "extender /healthz:" in down.stderr and "Traceback" not in down.stderr


def test_crds_rendered_with_keep_policy_and_switchable(render):
    crds = [o for o in render() if o["kind"] == "CustomResourceDefinition"]
    names = {c["metadata"]["name"] for c in crds}
    assert names == {"trainingjobs.rlsched.dev", "trainingqueues.rlsched.dev", "kopfpeerings.kopf.dev",
                     "clusterkopfpeerings.kopf.dev"}
    for c in crds:
        assert c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not [o for o in render("crds.install=false") if o["kind"] == "CustomResourceDefinition"]
    no_keep = [o for o in render("crds.keep=false") if o["kind"] == "CustomResourceDefinition"]
    assert all("helm.sh/resource-policy" not in (c["metadata"].get("annotations") or {}) for c in no_keep)


def test_trainer_policy_rendered_from_the_one_file(render):
    """The chart renders files/policies/trainer-status.yaml (what the tests and the dev
    demo apply as is), named after the release, switchable; it holds the contract's names
    and the progress fields it checks exist in the CRD."""
    from rlsched.core import contract

    src = [d for d in yaml.safe_load_all((CHART / "files/policies/trainer-status.yaml").read_text()) if d]
    assert [(d["kind"], d["metadata"]["name"]) for d in src] == [
        ("ValidatingAdmissionPolicy", contract.TRAINER_STATUS_POLICY),
        ("ValidatingAdmissionPolicyBinding", contract.TRAINER_STATUS_POLICY)]
    policy, binding = src
    assert binding["spec"] == {"policyName": contract.TRAINER_STATUS_POLICY, "validationActions": ["Deny"]}
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == \
        ([contract.GROUP], [f"{contract.PLURAL}/status"], ["UPDATE"])
    assert policy["spec"]["failurePolicy"] == "Fail"
    (cond,) = policy["spec"]["matchConditions"]
    assert f"'{contract.TRAINER_ACCOUNT_SUFFIX}'" in cond["expression"]
    # the account the job's template names, which the CRD does not let change
    assert "oldObject.spec.template.spec.serviceAccountName" in cond["expression"]
    crd = yaml.safe_load((CHART / "files/crds/trainingjob.yaml").read_text())
    pod = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["template"]
    rules = pod["properties"]["spec"]["x-kubernetes-validations"]
    assert any("oldSelf.serviceAccountName" in r["rule"] for r in rules)
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    checked = " ".join(v["expression"] for v in policy["spec"]["validations"])
    for field in re.findall(r"variables\.progress\.(\w+)", checked):
        assert field in status["progress"]["properties"], field

    objs = [o for o in render(release="team-a") if o["metadata"]["name"].endswith("-trainer-status")]
    vap = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    vapb = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    assert [o["metadata"]["name"] for o in vap + vapb] == ["team-a-rlsched-trainer-status"] * 2
    assert vap[0]["spec"] == policy["spec"]
    assert vapb[0]["spec"] == {**binding["spec"], "policyName": "team-a-rlsched-trainer-status"}
    assert vap[0]["metadata"]["labels"]["app.kubernetes.io/instance"] == "team-a"
    assert not [o for o in render("trainerPolicy.enabled=false") if o["kind"].startswith("ValidatingAdmissionPolicy")
                and o["metadata"]["name"].endswith("-trainer-status")]


def test_priority_policy_rendered_from_the_one_file(render):
    """The chart renders files/policies/priority-guard.yaml (what the tests apply as is),
    named after the release, switchable on its own; it guards creates and updates of
    trainingjobs (not their status) with the contract's verb, queue resource and
    annotation, and the field it reads exists in the CRD."""
    from rlsched.core import contract

    src = [d for d in yaml.safe_load_all((CHART / "files/policies/priority-guard.yaml").read_text()) if d]
    assert [(d["kind"], d["metadata"]["name"]) for d in src] == [
        ("ValidatingAdmissionPolicy", "rlsched-priority-guard"),
        ("ValidatingAdmissionPolicyBinding", "rlsched-priority-guard")]
    policy, binding = src
    assert binding["spec"] == {"policyName": "rlsched-priority-guard", "validationActions": ["Deny"]}
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], sorted(rule["operations"])) == \
        ([contract.GROUP], [contract.PLURAL], ["CREATE", "UPDATE"])
    assert policy["spec"]["failurePolicy"] == "Fail"
    (check,) = policy["spec"]["validations"]
    assert check["reason"] == "Forbidden"
    cel = " ".join(v["expression"] for v in policy["spec"]["variables"])
    assert f"authorizer.group('{contract.GROUP}').resource('{contract.QUEUE_PLURAL}')" in cel
    assert f".check('{contract.VERB_RAISE_PRIORITY}').allowed()" in cel
    assert f"'{contract.ANNOTATION_PRIORITY_REQUESTS}'" in cel
    crd = yaml.safe_load((CHART / "files/crds/trainingjob.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert "queueName" in spec and "highest" in spec["priority"]["properties"]["class"]["enum"]

    objs = render(release="team-a")
    vap = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"
           and o["metadata"]["name"].endswith("-priority-guard")]
    vapb = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"
            and o["metadata"]["name"].endswith("-priority-guard")]
    assert [o["metadata"]["name"] for o in vap + vapb] == ["team-a-rlsched-priority-guard"] * 2
    assert vap[0]["spec"] == policy["spec"]
    assert vapb[0]["spec"] == {**binding["spec"], "policyName": "team-a-rlsched-priority-guard"}
    assert vap[0]["metadata"]["labels"]["app.kubernetes.io/instance"] == "team-a"
    off = [o["metadata"]["name"] for o in render("priorityPolicy.enabled=false")
           if o["kind"].startswith("ValidatingAdmissionPolicy")]
    assert off == ["rlsched-trainer-status"] * 2  # the trainer policy stays


def test_helm_assumes_the_kubernetes_version_of_its_client_go(tools, tmp_path):
    """tools/build.sh stamps helm's default Kubernetes version as helm's Makefile does
    (client-go v0.X -> v1.X); unstamped, helm assumes v1.20 and refuses this chart
    (kubeVersion >= 1.30) without --kube-version."""
    gomod = (ROOT / "tools" / "helm" / "go.mod").read_text()
    minor = re.search(r"^\s*k8s\.io/client-go v0\.(\d+)\.", gomod, re.M).group(1)
    chart = tmp_path / "caps"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: caps\nversion: 0.1.0\n")
    (chart / "templates" / "caps.yaml").write_text("kubeVersion: {{ .Capabilities.KubeVersion.Version }}\n")
    out = subprocess.run([str(tools / "helm"), "template", str(chart)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["kubeVersion"] == f"v1.{minor}.0"
    version = subprocess.run([str(tools / "helm"), "version", "--short"], capture_output=True, text=True, check=False)
    assert version.returncode == 0 and version.stdout.startswith(re.search(r"helm\.sh/helm/v3 (v\S+)", gomod).group(1))
    # the chart renders and lints with helm's default, no --kube-version anywhere
    out = subprocess.run([str(tools / "helm"), "template", "r", str(CHART)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert "kubeVersion" not in out.stderr
    lint = subprocess.run([str(tools / "helm"), "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False)
    assert lint.returncode == 0 and "0 chart(s) failed" in lint.stdout, lint.stdout + lint.stderr


def test_namespaced_operator_gets_rolebinding_not_clusterrolebinding(render):
    objs = render("operator.watchNamespace=team-a")
    jobs_bindings = [o for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")
                     and o["metadata"]["name"].endswith("operator-jobs")]
    assert [(b["kind"], b["metadata"].get("namespace")) for b in jobs_bindings] == [("RoleBinding", "team-a")]
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator"))
    assert "--namespace=team-a" in _pod_spec(dep)["containers"][0]["args"]
    # the operator writes its forecast ConfigMap into the namespace it watches
    forecast = [o for o in objs if o["kind"] in ("Role", "RoleBinding") and o["metadata"]["name"].endswith("-forecast")]
    assert {o["metadata"]["namespace"] for o in forecast} == {"team-a"}
    forecast = [o for o in render() if o["kind"] == "Role" and o["metadata"]["name"].endswith("-forecast")]
    assert [o["metadata"]["namespace"] for o in forecast] == ["default"]


def test_operator_pod_security_flags(render):
    def args(*sets):
        dep = next(o for o in render(*sets) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator"))
        return _pod_spec(dep)["containers"][0]["args"]

    default = args()
    assert "--pod-security-level=baseline" in default and "--allow-secret-mounts" not in default
    changed = args("operator.podSecurity.defaultLevel=restricted", "operator.podSecurity.allowSecretMounts=true")
    assert "--pod-security-level=restricted" in changed and "--allow-secret-mounts" in changed
    # the operator reads the level label of a job's namespace
    role = next(o for o in render() if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("operator-cluster"))
    assert any("namespaces" in r["resources"] and {"get", "list"} <= set(r["verbs"]) for r in role["rules"])


def test_operator_serves_the_served_allocator(render):
    """The chart's default is core/served.py's policy, a heuristic is one allocator,
    and every value the schema allows is one the operator's CLI takes."""
    from rlsched.core.live_allocation import make_live_allocator
    from rlsched.core.served import SERVED

    def allocator(*sets):
        dep = next(o for o in render(*sets) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator"))
        (flag,) = [a for a in _pod_spec(dep)["containers"][0]["args"] if a.startswith("--allocator=")]
        return flag.split("=", 1)[1]

    assert allocator() == SERVED.allocator == "goodput-rlpto@adaptive=0.8,room_rounds=30"
    assert allocator("operator.allocator=fifo/das/rlpto+nobackfill") == "fifo/das/rlpto+nobackfill"
    value = allocator("operator.allocator=goodput@restart_delay=10")
    assert make_live_allocator(value).restart_delay == 10.0


def test_the_operator_decides_as_the_protocol_measured(render):
    """The chart's operator decides on events at least the engines' gap apart and on
    their interval (the cadence the served policy was chosen under); a null interval
    gives the CLI's every cycle."""
    from rlsched.cli import build_parser
    from rlsched.core.decision_clock import DecisionClock
    from rlsched.sim.engine import SimConfig

    def flags(*sets):
        dep = next(o for o in render(*sets) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator"))
        args = _pod_spec(dep)["containers"][0]["args"]
        return {a.split("=", 1)[0]: float(a.split("=", 1)[1]) for a in args if a.startswith("--decision-")}

    clock, engine = DecisionClock(), SimConfig()
    assert flags() == {"--decision-gap": clock.gap, "--decision-interval": clock.interval}
    dep = next(o for o in render() if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator"))
    args = build_parser("operator").parse_args(_pod_spec(dep)["containers"][0]["args"])  # the operator's own CLI
    assert (args.decision_gap, args.decision_interval) == (clock.gap, clock.interval)
    assert (clock.gap, clock.interval) == (engine.decision_gap, engine.scaling_interval)
    assert flags("operator.decisionGapSeconds=5", "operator.decisionIntervalSeconds=60") == {
        "--decision-gap": 5.0, "--decision-interval": 60.0}
    assert flags("operator.decisionIntervalSeconds=null") == {}


def test_the_schema_admits_every_live_allocator_and_nothing_else():
    """Core's live allocators with options, and any ordering/placement[/scaling]."""
    import rlsched.sim.allocators  # noqa: F401  (registers the peers: none may pass the schema)
    from rlsched.core.policy import allocator_names

    schema = json.loads((CHART / "values.schema.json").read_text())
    pattern = schema["properties"]["operator"]["properties"]["allocator"]["pattern"]
    live = allocator_names(live=True)
    for name in live:
        assert re.fullmatch(pattern, name), name
    for name in live:
        assert re.fullmatch(pattern, f"{name}@restart_delay=10,p=0.5"), name
    for name in ("tiresias/topology+backfill", "fifo/bestfit/beta", "srtf/das+nobackfill"):  # gang allocators
        assert re.fullmatch(pattern, name), name
    for bad in ("none", "", "goodput-nope", "fifo", "goodput@p", "goodput-learned@", "fifo/", "fifo/bestfit+fill",
                *set(allocator_names()) - set(live)):
        assert not re.fullmatch(pattern, bad), bad


def test_operator_min_run_time_flag(render):
    def flag(*sets):
        dep = next(o for o in render(*sets) if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-operator"))
        (f,) = [a for a in _pod_spec(dep)["containers"][0]["args"] if a.startswith("--min-run-time=")]
        return float(f.split("=", 1)[1])

    assert flag() == 0.0 and flag("operator.minRunSeconds=300") == 300.0


def test_topology_levels_reach_the_extender_and_the_operator_alike(render):
    from rlsched.core.contract import DEFAULT_TOPOLOGY_LEVELS, parse_topology_levels

    def flags(*sets):
        out = {}
        for o in render(*sets):
            if o["kind"] == "Deployment":
                for c in _pod_spec(o)["containers"]:
                    for a in c.get("args") or []:
                        if a.startswith("--topology-levels="):
                            out[c["name"]] = parse_topology_levels(a.split("=", 1)[1])
        return out

    default = flags()
    assert set(default) == {"extender", "operator"} and set(default.values()) == {DEFAULT_TOPOLOGY_LEVELS}
    custom = flags("topology.levels={fabric.topograph.run/tier-1,kubernetes.io/hostname}")
    assert set(custom.values()) == {("fabric.topograph.run/tier-1", "kubernetes.io/hostname")}


def test_gpu_types_reach_the_operator_as_its_map(render):
    from rlsched.core.contract import parse_gpu_types

    def flags(*sets):
        (op,) = render(*sets, show_only="templates/operator-deployment.yaml")
        args = [a for c in _pod_spec(op)["containers"] for a in c.get("args") or []]
        return [parse_gpu_types(a.split("=", 1)[1]) for a in args if a.startswith("--gpu-types=")]

    assert flags() == []  # none: each product is its own type
    assert flags("gpuTypes.Tesla-T4=aws", "gpuTypes.NVIDIA-A100-SXM4-40GB=dgx-ext") == [
        {"Tesla-T4": "aws", "NVIDIA-A100-SXM4-40GB": "dgx-ext"}]


def test_helm_test_pod_script_compiles(render):
    (pod,) = render(show_only="templates/tests/test-metrics.yaml")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    script = pod["spec"]["containers"][0]["args"][0]
    compile(script, "helm-test", "exec")
    assert "rlsched_operator_" in script and "rlsched_extender_" in script


# ----------------------------------------------------------------------- cluster
def _kubectl(tools: Path, kubeconfig: Path, *args: str, stdin: str | None = None, check: bool = True):
    out = subprocess.run([str(tools / "kubectl"), f"--kubeconfig={kubeconfig}", *args], input=stdin,
                         capture_output=True, text=True, check=False, timeout=120)
    if check:
        assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stdout}{out.stderr}"
    return out


@pytest.fixture
def release_ns(kube_cluster, tools):
    name = f"rlsched-t-{uuid.uuid4().hex[:6]}"
    _kubectl(tools, kube_cluster.kubeconfig, "create", "namespace", name)
    yield name
    _kubectl(tools, kube_cluster.kubeconfig, "delete", "namespace", name, "--wait=false", check=False)


@pytest.mark.k8s
def test_server_side_dry_run_of_every_object(kube_cluster, tools, render, release_ns):
    objs = [o for o in render("operator.forecastNamespace=" + release_ns, *ALL_FEATURES, namespace=release_ns)
            if o["kind"] not in MONITORING_KINDS]  # prometheus-operator CRDs are not in this cluster
    kinds = {o["kind"] for o in objs}
    assert {"CustomResourceDefinition", "Deployment", "ConfigMap", "Service", "ServiceAccount", "ClusterRole",
            "ClusterRoleBinding", "Role", "RoleBinding", "Pod"} <= kinds
    docs = "\n---\n".join(yaml.safe_dump(o) for o in objs)
    out = _kubectl(tools, kube_cluster.kubeconfig, "apply", "--dry-run=server", "--server-side",
                   "--field-manager=rlsched-test", "--force-conflicts", "-f", "-", stdin=docs)
    applied = [ln for ln in out.stdout.splitlines() if "serverside-applied" in ln or "configured" in ln
               or "created" in ln or "unchanged" in ln]
    assert len(applied) == len(objs), out.stdout


def _crd_owner(kubeconfig: Path, tools: Path) -> tuple[bool, str | None]:
    out = _kubectl(tools, kubeconfig, "get", "crd", "trainingjobs.rlsched.dev", "-o", "json", check=False)
    if out.returncode != 0:
        return False, None
    ann = json.loads(out.stdout)["metadata"].get("annotations") or {}
    return True, ann.get("meta.helm.sh/release-name")


def _can(tools, kubeconfig, sa: str, *args: str) -> bool:
    out = _kubectl(tools, kubeconfig, "auth", "can-i", f"--as={sa}", *args, check=False)
    assert out.stdout.strip() in ("yes", "no"), out.stdout + out.stderr
    return out.stdout.strip() == "yes"


@pytest.fixture(scope="module")
def release(kube_cluster, tools):
    """The chart installed (``helm install --wait``) into a fresh namespace of the real
    API server. Its own namespace, scheduler name and lease, so that it never acts beside
    the cluster's real rlsched release (kind in CI); image overrides come from
    RLSCHED_HELM_SET="k=v,k=v" (the e2e workflow points them at the images it loaded)."""
    kc = Path(kube_cluster.kubeconfig)
    helm = [str(tools / "helm"), f"--kubeconfig={kc}"]
    ns = f"chart-t-{uuid.uuid4().hex[:6]}"  # no "rlsched" in it: objects are <release>-rlsched-*
    _kubectl(tools, kc, "create", "namespace", ns)
    exists, owner = _crd_owner(kc, tools)
    crds = ("trainingjobs.rlsched.dev", "trainingqueues.rlsched.dev", "kopfpeerings.kopf.dev",
            "clusterkopfpeerings.kopf.dev")
    if exists and owner is None:
        # applied with kubectl by another suite: let this release adopt them (docs/deploy.md)
        _kubectl(tools, kc, "annotate", "--overwrite", "crd", *crds, f"meta.helm.sh/release-name={ns}",
                 f"meta.helm.sh/release-namespace={ns}", check=False)
        _kubectl(tools, kc, "label", "--overwrite", "crd", *crds, "app.kubernetes.io/managed-by=Helm", check=False)
    own_crds = not exists or owner is None
    sched = f"rlsched-{ns[-6:]}"
    sets = ["--set", f"crds.install={str(own_crds).lower()}", "--set", f"operator.forecastNamespace={ns}",
            "--set", f"operator.watchNamespace={ns}", "--set", f"scheduler.schedulerName={sched}"]
    if os.environ.get("RLSCHED_HELM_SET"):
        sets += ["--set", os.environ["RLSCHED_HELM_SET"]]
    out = subprocess.run([*helm, "install", ns, str(CHART), "-n", ns, *sets, "--wait", "--timeout", "180s"],
                         capture_output=True, text=True, timeout=240)
    if out.returncode != 0:  # say why, for the tests that report it
        diag = _kubectl(tools, kc, "get", "pods,events", "-n", ns, "-o", "wide", check=False)
        out = subprocess.CompletedProcess(out.args, out.returncode, out.stdout,
                                          out.stderr + "\n" + diag.stdout + diag.stderr)
    info = {"name": ns, "namespace": ns, "scheduler_name": sched, "lease": f"{sched}-scheduler", "helm": helm,
            "sets": sets, "own_crds": own_crds, "kubeconfig": kc, "install": out}
    try:
        yield info
    finally:
        subprocess.run([*helm, "uninstall", ns, "-n", ns, "--wait", "--timeout", "120s"],
                       capture_output=True, text=True, timeout=180)
        _kubectl(tools, kc, "delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.k8s
def test_install_succeeds_with_notes_and_available_deployments(release, tools):
    out = release["install"]
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"schedulerName: {release['scheduler_name']}" in out.stdout  # NOTES.txt
    assert f"helm test {release['name']}" in out.stdout
    deps = json.loads(_kubectl(tools, release["kubeconfig"], "get", "deployments", "-n", release["namespace"],
                               "-o", "json").stdout)["items"]
    name = release["name"]
    assert {d["metadata"]["name"] for d in deps} == {f"{name}-rlsched-operator", f"{name}-rlsched-scheduler"}
    for d in deps:
        assert d["status"].get("availableReplicas") == d["spec"]["replicas"] == 1, d["metadata"]["name"]


@pytest.mark.k8s
def test_rbac_allows_what_is_needed_and_denies_the_rest(release, tools):
    assert release["install"].returncode == 0, release["install"].stderr
    kc, name, rns = release["kubeconfig"], release["name"], release["namespace"]
    op = f"system:serviceaccount:{rns}:{name}-rlsched-operator"
    sch = f"system:serviceaccount:{rns}:{name}-rlsched-scheduler"
    ns = ("-n", rns)
    allowed = [
        (op, "create", "pods", *ns),
        (op, "delete", "pods", *ns),
        (op, "patch", "trainingjobs.rlsched.dev", "--subresource=status", *ns),
        (op, "create", "roles.rbac.authorization.k8s.io", *ns),
        (op, "create", "rolebindings.rbac.authorization.k8s.io", *ns),
        (op, "create", "serviceaccounts", *ns),
        (op, "patch", "kopfpeerings.kopf.dev", *ns),
        (op, "list", "nodes"),
        (op, "list", "pods", "--all-namespaces"),
        (op, "get", f"namespaces/{rns}"),
        (op, "list", "namespaces"),
        (op, "list", "trainingqueues.rlsched.dev"),
        (op, "patch", "trainingqueues.rlsched.dev", "--subresource=status"),
        (op, "update", "configmaps/rlsched-forecast", *ns),
        (sch, "create", "pods", "--subresource=binding", "-n", "default"),
        (sch, "list", "nodes"),
        (sch, "watch", "pods", "--all-namespaces"),
        (sch, "update", f"leases.coordination.k8s.io/{release['lease']}", *ns),
        (sch, "get", "configmaps/extension-apiserver-authentication", "-n", "kube-system"),
    ]
    denied = [
        # a namespaced operator writes nothing outside its namespace
        (op, "create", "pods", "-n", "default"),
        (op, "patch", "trainingjobs.rlsched.dev", "--subresource=status", "-n", "default"),
        (op, "create", "rolebindings.rbac.authorization.k8s.io", "-n", "default"),
        (op, "patch", "clusterkopfpeerings.kopf.dev"),
        (op, "patch", "trainingqueues.rlsched.dev"),
        (op, "create", "trainingqueues.rlsched.dev"),
        (op, "get", "secrets", *ns),
        (op, "delete", "nodes"),
        (op, "create", "clusterroles.rbac.authorization.k8s.io"),
        (op, "update", "configmaps/other", *ns),
        (op, "create", "deployments.apps", *ns),
        (sch, "create", "pods", "-n", "default"),
        (sch, "get", "secrets", "-n", "default"),
        (sch, "update", "leases.coordination.k8s.io/someone-elses", *ns),
        (sch, "update", "nodes"),
    ]
    wrong = [f"{sa.rsplit(':', 1)[1]} cannot {' '.join(a)}" for sa, *a in allowed if not _can(tools, kc, sa, *a)]
    wrong += [f"{sa.rsplit(':', 1)[1]} may {' '.join(a)}" for sa, *a in denied if _can(tools, kc, sa, *a)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.k8s
def test_real_kube_scheduler_runs_on_chart_config_with_chart_rbac(release, tools, tmp_path, kube_cluster):
    """The chart's KubeSchedulerConfiguration, run by the real kube-scheduler binary as
    the chart's ServiceAccount (impersonation): it validates, takes its own lease and
    binds a GPU pod of its profile, with no RBAC denial in its log."""
    import signal
    import socket
    import ssl
    import time
    import urllib.request

    assert release["install"].returncode == 0, release["install"].stderr
    kc, rns = release["kubeconfig"], release["namespace"]
    # on a real cluster (kind) the release's own scheduler pod would compete for the lease
    _kubectl(tools, kc, "scale", "deployment", f"{release['name']}-rlsched-scheduler", "-n", rns, "--replicas=0")
    cm = json.loads(_kubectl(tools, kc, "get", "configmap", f"{release['name']}-rlsched-scheduler-config",
                             "-n", rns, "-o", "json").stdout)
    imp = yaml.safe_load(Path(kc).read_text())
    for u in imp["users"]:
        u["user"]["as"] = f"system:serviceaccount:{rns}:{release['name']}-rlsched-scheduler"
    imp_path = tmp_path / "as-scheduler.kubeconfig"
    imp_path.write_text(yaml.safe_dump(imp))
    conf = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    # in-cluster config in the chart; its client limit (qps/burst) is kept and validated
    conf.setdefault("clientConnection", {})["kubeconfig"] = str(imp_path)
    assert conf["clientConnection"]["qps"] > 50
    conf_path = tmp_path / "scheduler-config.yaml"
    conf_path.write_text(yaml.safe_dump(conf))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "kube-scheduler.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(tools / "kube-scheduler"), f"--config={conf_path}",
                                 f"--authentication-kubeconfig={imp_path}", f"--authorization-kubeconfig={imp_path}",
                                 "--bind-address=127.0.0.1", f"--secure-port={port}", f"--cert-dir={tmp_path / 'certs'}"],
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    pod = f"probe-{uuid.uuid4().hex[:6]}"
    try:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE

        def healthy() -> bool:
            try:
                return urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx, timeout=2).status == 200
            except OSError:
                return False

        deadline = time.monotonic() + 60
        while not healthy():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "kube-scheduler not healthy:\n" + log.read_text()[-3000:]
            time.sleep(0.5)
        deadline = time.monotonic() + 60
        while True:
            out = _kubectl(tools, kc, "get", "lease", release["lease"], "-n", rns, "-o", "json", check=False)
            holder = json.loads(out.stdout)["spec"].get("holderIdentity", "") if out.returncode == 0 else ""
            if holder.startswith(socket.gethostname()):
                break
            assert time.monotonic() < deadline, "lease never taken:\n" + log.read_text()[-3000:]
            time.sleep(0.5)
        manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod, "namespace": rns},
                    "spec": {"schedulerName": release["scheduler_name"], "terminationGracePeriodSeconds": 0,
                             "containers": [{"name": "w", "image": "registry.invalid/w",
                                             "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        _kubectl(tools, kc, "apply", "-f", "-", stdin=json.dumps(manifest))
        deadline = time.monotonic() + 60
        while True:
            node = _kubectl(tools, kc, "get", "pod", pod, "-n", rns, "-o", "jsonpath={.spec.nodeName}").stdout
            if node:
                break
            assert time.monotonic() < deadline, "pod never bound:\n" + log.read_text()[-3000:]
            time.sleep(0.5)
        assert node in kube_cluster.node_names  # a GPU node (only kwok GPU nodes have nvidia.com/gpu)
    finally:
        _kubectl(tools, kc, "delete", "pod", pod, "-n", rns, "--wait=false", check=False)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    text = log.read_text()
    denied = [ln for ln in text.splitlines() if "forbidden" in ln.lower()]
    assert not denied, "RBAC denials:\n" + "\n".join(denied[:20])


@pytest.mark.k8s
def test_upgrade_then_uninstall_keeps_crds(release, tools):
    assert release["install"].returncode == 0, release["install"].stderr
    kc, helm, name, rns = release["kubeconfig"], release["helm"], release["name"], release["namespace"]
    out = subprocess.run([*helm, "upgrade", name, str(CHART), "-n", rns, *release["sets"],
                          "--set", "scheduler.extender.weight=7", "--set", "commonLabels.rlsched-test=upgraded"],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    cm = json.loads(_kubectl(tools, kc, "get", "configmap", f"{name}-rlsched-scheduler-config", "-n", rns,
                             "-o", "json").stdout)
    assert yaml.safe_load(cm["data"]["scheduler-config.yaml"])["extenders"][0]["weight"] == 7
    if release["own_crds"]:  # CRDs in templates/: the upgrade reached them too
        crd = json.loads(_kubectl(tools, kc, "get", "crd", "trainingjobs.rlsched.dev", "-o", "json").stdout)
        assert crd["metadata"]["labels"].get("rlsched-test") == "upgraded"
    out = subprocess.run([*helm, "uninstall", name, "-n", rns, "--wait", "--timeout", "120s"],
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert _crd_owner(kc, tools)[0], "the CRD (and every TrainingJob) must survive helm uninstall"
    left = _kubectl(tools, kc, "get", "clusterroles,clusterrolebindings", "-o", "name").stdout
    assert name not in left, "cluster-scoped objects left behind"


def test_wheel_carries_what_the_images_serve(tmp_path):
    """The images install the package non-editable (``pip install --no-deps .``): the
    wheel must carry the CRDs and the default model files, or the serving images would
    silently fall back to heuristics."""
    import shutil
    import sys
    import zipfile

    # build from a copy of what the Dockerfiles COPY (links kept, as COPY keeps them), so
    # no build/ lands in the checkout; plus dev/, which the wheel must leave out anyway
    src = tmp_path / "src"
    src.mkdir()
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    for d in ("rlsched", "core", "sim", "extender", "operator", "models", "dev"):
        shutil.copytree(ROOT / d, src / d, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "runs"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = (tmp_path / "dist").glob("rlsched-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "rlsched/operator/crd/trainingjob.yaml" in names
    assert "rlsched/operator/crd/trainingqueue.yaml" in names
    assert "rlsched/operator/__main__.py" in names and "rlsched/extender/cli.py" in names
    for weights in sorted((ROOT / "core" / "weights").glob("*")):
        assert f"rlsched/core/weights/{weights.name}" in names, f"{weights.name} missing from the wheel"
    assert not [n for n in names if n.startswith(("rlsched_dev/", "rlsched/dev/"))], "the dev tooling must not be in the wheel"
    assert not [n for n in names if n.startswith(("rlsched/tests/", "tests/", "dev/"))]
