"""A dry run of the e2e workflow (``.github/workflows/e2e.yml``) on this machine: no
Docker and no kind here, so the steps that need neither are run against the local
control plane (or checked by the tools they call) to prove that the commands the
workflow runs exist, parse and match the chart and tests/conftest.py's kind mode.

* the ``helm install`` step's command, its env substituted, rendered by ``helm template``
  and applied with ``kubectl apply --dry-run=server`` into a fresh namespace (helm's own
  ``--dry-run=server`` refuses objects another release owns, e.g. the CRDs and, on kind,
  the real release's cluster-scoped objects), then the step's ``kubectl get pods``;
* the suite step: its ``kubectl scale -l``/``kubectl wait`` selector names exactly the
  operator Deployment (rendered, and run for real on replica-0 copies of the
  Deployments), ``RLSCHED_RELEASE`` names the release whose scheduler pod carries the
  extender sidecar conftest port-forwards to, ``RLSCHED_HELM_SET``'s keys are values
  the chart (and its schema) takes, ``make -n test PYTEST_ARGS=...`` parses, and the
  suite it selects is not empty, k8s-marked wherever it uses the cluster, and skips
  exactly the ``runner_side`` tests in kind mode (collected with a probe plugin) and
  none locally;
* every ``uses:`` is pinned to a version, the kind node image to a digest of the
  Kubernetes minor the tools and the chart's kube-scheduler have, and every ``run:``
  passes ``bash -n``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "e2e.yml"
CHART = ROOT / "deploy" / "helm" / "rlsched"
FAKE_SHA = "0123456789abcdef0123456789abcdef01234567"
#: what tests/conftest.py (_in_cluster_extender) selects in $RLSCHED_RELEASE's namespace
SCHEDULER_POD = "app.kubernetes.io/instance={release},app.kubernetes.io/component=scheduler"


# ----------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def tools():
    """bin directory of the tools cache (helm, kubectl); missing tools fail the test."""
    from rlsched_dev.tools import find_tools

    bin_dir = find_tools()
    for t in ("helm", "kubectl", "kube-apiserver"):
        assert (bin_dir / t).is_file(), f"{t} missing from {bin_dir}: run `make tools`"
    return bin_dir


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _steps(wf: dict) -> list[dict]:
    return [s for job in wf["jobs"].values() for s in job["steps"]]


def _step(wf: dict, name: str) -> dict:
    found = [s for s in _steps(wf) if s.get("name") == name]
    assert len(found) == 1, f"want one step named {name!r} in {WORKFLOW.name}, found {len(found)}"
    return found[0]


def _expr(value: str) -> str:
    """``value`` with the workflow's ``${{ github.sha }}`` as GitHub substitutes it."""
    def sub(m: re.Match) -> str:
        assert m.group(1) == "github.sha", f"no dry-run value for ${{{{ {m.group(1)} }}}}"
        return FAKE_SHA

    return re.sub(r"\$\{\{\s*([^}]+?)\s*\}\}", sub, str(value))


def _env(wf: dict, step: dict, **override: str) -> dict[str, str]:
    """The step's environment: workflow, job and step ``env``, then ``override``."""
    env: dict[str, str] = {k: _expr(v) for k, v in (wf.get("env") or {}).items()}
    for job in wf["jobs"].values():
        if step in job["steps"]:
            env.update({k: _expr(v) for k, v in (job.get("env") or {}).items()})
    env.update({k: _expr(v) for k, v in (step.get("env") or {}).items()})
    env.update(override)
    return env


def _commands(script: str, env: dict[str, str]) -> list[list[str]]:
    """The simple commands of a ``run:`` script, continuation lines joined, ``$VAR`` and
    ``${VAR}`` of ``env`` expanded (others kept), split as the shell would; an
    ``export K=V`` line also adds K to ``env`` for the lines after it."""
    out = []
    for line in script.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        line = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: env.get(m.group(1), m.group(0)), line)
        argv = shlex.split(line, comments=True)
        if argv[:1] == ["export"]:
            for kv in argv[1:]:
                k, _, v = kv.partition("=")
                env[k] = v
        out.append(argv)
    return out


def _command(cmds: list[list[str]], *head: str) -> list[str]:
    found = [c for c in cmds if tuple(c[:len(head)]) == head]
    assert len(found) == 1, f"want one `{' '.join(head)}` command, found {found}"
    return found[0]


def _opt(argv: list[str], *names: str) -> str | None:
    """The value of the option ``names`` in ``argv`` (``--x v`` or ``--x=v``)."""
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a[len(n) + 1:]
    return None


def _sets(argv: list[str]) -> dict[str, str]:
    """``--set k=v`` of a helm command line (``--set a=1,b=2`` too)."""
    out = {}
    for i, a in enumerate(argv):
        if a == "--set":
            for kv in argv[i + 1].split(","):
                k, _, v = kv.partition("=")
                out[k] = v
    return out


def _selector(sel: str | None) -> dict[str, str]:
    assert sel, "no label selector"
    pairs = [p.split("=", 1) for p in sel.split(",")]
    assert all(len(p) == 2 and p[0] and "!" not in p[0] for p in pairs), f"not an equality selector: {sel}"
    return dict(pairs)


def _matches(labels: dict | None, sel: dict[str, str]) -> bool:
    return all((labels or {}).get(k) == v for k, v in sel.items())


def _run(argv: list[str], stdin: str | None = None, timeout: float = 240, env: dict | None = None):
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env, check=False)


def _helm_template(tools: Path, install: list[str]) -> tuple[str, list[dict]]:
    """``helm install ARGS`` run as ``helm template ARGS`` (same flags: helm template
    takes every install flag); its manifest text and objects."""
    assert install[:2] == ["helm", "install"], install
    out = _run([str(tools / "helm"), "template", *install[2:]])
    assert out.returncode == 0, f"helm template {' '.join(install[2:])}:\n{out.stderr}"
    return out.stdout, [d for d in yaml.safe_load_all(out.stdout) if d]


def _containers(obj: dict) -> list[str]:
    return [c["name"] for c in obj["spec"]["template"]["spec"]["containers"]]


def _pod_labels(obj: dict) -> dict:
    if obj["kind"] == "Pod":
        return obj["metadata"].get("labels") or {}
    return ((obj.get("spec") or {}).get("template") or {}).get("metadata", {}).get("labels") or {}


@pytest.fixture(scope="module")
def install_step(workflow) -> dict:
    return _step(workflow, "helm install")


@pytest.fixture(scope="module")
def suite_step(workflow) -> dict:
    steps = [s for s in _steps(workflow) if "make test" in (s.get("run") or "")]
    assert len(steps) == 1, "want one step running `make test`"
    return steps[0]


def _install(workflow, install_step, namespace: str | None = None) -> list[str]:
    env = _env(workflow, install_step, **({"NAMESPACE": namespace} if namespace else {}))
    return _command(_commands(install_step["run"], env), "helm", "install")


def _suite(workflow, suite_step, namespace: str | None = None) -> list[list[str]]:
    env = _env(workflow, suite_step, **({"NAMESPACE": namespace} if namespace else {}))
    return _commands(suite_step["run"], env)


def _exported(cmds: list[list[str]], name: str) -> str:
    vals = [kv.split("=", 1)[1] for c in cmds if c[:1] == ["export"] for kv in c[1:] if kv.startswith(name + "=")]
    assert len(vals) == 1, f"want one `export {name}=...`, found {vals}"
    return vals[0]


def _pytest_args(workflow, suite_step) -> tuple[list[str], str]:
    """The suite step's ``make`` command line and its PYTEST_ARGS."""
    (make,) = [c for c in _suite(workflow, suite_step) if c[:1] == ["make"]]
    assert make[1] == "test", make
    return make, dict(a.split("=", 1) for a in make[2:])["PYTEST_ARGS"]


def _kubectl(tools: Path, kubeconfig: Path, argv: list[str], stdin: str | None = None):
    assert argv[0] == "kubectl", argv
    return _run([str(tools / "kubectl"), f"--kubeconfig={kubeconfig}", *argv[1:]], stdin=stdin)


@pytest.fixture
def fresh_ns(kube_cluster, tools):
    name = f"e2e-dry-{uuid.uuid4().hex[:6]}"
    out = _kubectl(tools, kube_cluster.kubeconfig, ["kubectl", "create", "namespace", name])
    assert out.returncode == 0, out.stderr
    yield name
    _kubectl(tools, kube_cluster.kubeconfig, ["kubectl", "delete", "namespace", name, "--wait=false"])


# ----------------------------------------------------------------------- (a) helm install
@pytest.mark.k8s
def test_helm_install_step_dry_runs_on_the_api_server(kube_cluster, tools, workflow, install_step, fresh_ns):
    install = _install(workflow, install_step, fresh_ns)
    assert (ROOT / install[3]).resolve() == CHART.resolve(), install
    assert _opt(install, "--namespace", "-n") == fresh_ns
    text, objs = _helm_template(tools, install)
    assert {"Deployment", "CustomResourceDefinition", "ConfigMap", "ServiceAccount"} <= {o["kind"] for o in objs}
    # every object carries its namespace (some live in kube-system or default): no -n
    out = _kubectl(tools, kube_cluster.kubeconfig,
                   ["kubectl", "apply", "--dry-run=server", "--server-side", "--force-conflicts",
                    "--field-manager=rlsched-e2e-dry-run", "-f", "-"], stdin=text)
    assert out.returncode == 0, out.stdout + out.stderr
    applied = [ln for ln in out.stdout.splitlines() if "(server dry run)" in ln]
    assert len(applied) == len(objs), out.stdout
    # the images are the ones the workflow built and loaded into kind, never pulled
    tag = _env(workflow, install_step)["IMAGE_TAG"]
    assert tag == f"e2e-{FAKE_SHA}"
    ours = [c for o in objs if o["kind"] == "Deployment" for c in o["spec"]["template"]["spec"]["containers"]
            if c["name"] in ("operator", "extender", "metrics-relay")]
    assert len(ours) == 3 and all(c["image"].endswith(f":{tag}") and c["imagePullPolicy"] == "Never"
                                  for c in ours), ours
    sets = _sets(install)
    assert sets["operator.image.repository"] == "rlsched-operator"
    assert sets["scheduler.extender.image.repository"] == "rlsched-scheduler"
    # the rest of the step runs as it is
    for cmd in _commands(install_step["run"], _env(workflow, install_step, NAMESPACE=fresh_ns)):
        if cmd[0] == "kubectl":
            out = _kubectl(tools, kube_cluster.kubeconfig, cmd)
            assert out.returncode == 0, f"{cmd}: {out.stderr}"
        else:
            assert cmd[:2] == ["helm", "install"], f"unexpected command in the helm install step: {cmd}"


def test_helm_test_step_tests_the_installed_release(workflow, install_step):
    install = _install(workflow, install_step)
    step = _step(workflow, "helm test")
    (test,) = _commands(step["run"], _env(workflow, step))
    assert test[:3] == ["helm", "test", install[2]]
    assert _opt(test, "--namespace", "-n") == _opt(install, "--namespace", "-n")


# ----------------------------------------------------------------------- (b) suite step
def test_suite_step_scales_exactly_the_operator_and_names_the_extender_release(
        tools, workflow, install_step, suite_step):
    install = _install(workflow, install_step)
    release, ns = install[2], _opt(install, "--namespace", "-n")
    _, objs = _helm_template(tools, install)
    cmds = _suite(workflow, suite_step)
    scale = _command(cmds, "kubectl", "-n", ns, "scale")
    assert scale[4] == "deployment" and _opt(scale, "--replicas") == "0", scale
    sel = _selector(_opt(scale, "-l", "--selector"))
    deps = [o for o in objs if o["kind"] == "Deployment" and _matches(o["metadata"].get("labels"), sel)]
    operator = [o for o in objs if o["kind"] == "Deployment" and _containers(o) == ["operator"]]
    assert len(operator) == 1 and deps == operator, [d["metadata"]["name"] for d in deps]
    # waiting for its pod to go: the same selector matches the operator's pods and no other
    wait = _command(cmds, "kubectl", "-n", ns, "wait")
    assert _opt(wait, "--for") == "delete" and "pod" in wait[4:], wait
    assert _selector(_opt(wait, "-l", "--selector")) == sel
    pods = [o for o in objs if o["kind"] in ("Pod", "Deployment") and _matches(_pod_labels(o), sel)]
    assert pods == deps, [o["metadata"]["name"] for o in pods]
    # RLSCHED_RELEASE: conftest's kind mode port-forwards to the extender sidecar of this
    # release's scheduler pod, on the port the chart's kube-scheduler calls
    r_ns, _, r_name = _exported(cmds, "RLSCHED_RELEASE").partition("/")
    assert (r_ns, r_name) == (ns, release)
    psel = _selector(SCHEDULER_POD.format(release=release))
    (sched,) = [o for o in objs if o["kind"] == "Deployment" and _matches(_pod_labels(o), psel)]
    ext = next(c for c in sched["spec"]["template"]["spec"]["containers"] if c["name"] == "extender")
    port = next(a.split("=", 1)[1] for a in ext["args"] if a.startswith("--port="))
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-scheduler-config"))
    conf = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    assert [e["urlPrefix"] for e in conf["extenders"]] == [f"http://127.0.0.1:{port}"]
    assert [p["schedulerName"] for p in conf["profiles"]] == ["rlsched"]  # what the tests' pods ask for


@pytest.mark.k8s
def test_suite_step_kubectl_commands_run_on_the_api_server(kube_cluster, tools, workflow, install_step,
                                                          suite_step, fresh_ns):
    """Every kubectl command of the suite step, run for real in a fresh namespace holding
    the rendered chart's Deployments scaled to 0 (no pod starts)."""
    _, objs = _helm_template(tools, _install(workflow, install_step, fresh_ns))
    deps = [o for o in objs if o["kind"] == "Deployment"]
    for d in deps:
        d["spec"]["replicas"] = 0
    out = _kubectl(tools, kube_cluster.kubeconfig, ["kubectl", "apply", "-n", fresh_ns, "-f", "-"],
                   stdin="\n---\n".join(yaml.safe_dump(d) for d in deps))
    assert out.returncode == 0, out.stderr
    kubectl = [c for c in _suite(workflow, suite_step, fresh_ns) if c[0] == "kubectl"]
    assert kubectl, "the suite step runs no kubectl command"
    operator = [d["metadata"]["name"] for d in deps if _containers(d) == ["operator"]]
    assert len(operator) == 1, operator
    for cmd in kubectl:
        out = _kubectl(tools, kube_cluster.kubeconfig, cmd)
        assert out.returncode == 0, f"{cmd}: {out.stdout}{out.stderr}"
        if "scale" in cmd:
            scaled = [ln.split()[0] for ln in out.stdout.splitlines() if ln.strip()]
            assert scaled == [f"deployment.apps/{operator[0]}"], out.stdout


# ----------------------------------------------------------------------- (c) RLSCHED_HELM_SET
def test_rlsched_helm_set_keys_are_chart_values_and_agree_with_the_install(
        tools, workflow, install_step, suite_step):
    install = _install(workflow, install_step)
    helm_set = _exported(_suite(workflow, suite_step), "RLSCHED_HELM_SET")
    pairs = dict(kv.split("=", 1) for kv in helm_set.split(","))
    assert pairs, "RLSCHED_HELM_SET is empty"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in pairs:
        node = values
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"RLSCHED_HELM_SET: {key} is not in values.yaml"
            node = node[part]
    # the same images as the release the workflow installed
    assert {k: v for k, v in _sets(install).items() if k in pairs} == pairs
    # and the chart's schema takes them (tests/deploy/test_chart.py installs with them)
    out = _run([str(tools / "helm"), "template", "rlsched", str(CHART), "--set", helm_set])
    assert out.returncode == 0, out.stderr


# ----------------------------------------------------------------------- (d) make test, the k8s suite
def test_make_test_line_parses(workflow, suite_step):
    make, args = _pytest_args(workflow, suite_step)
    out = _run(["make", "-n", *make[1:]], timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert any(ln.strip().endswith(f"-m pytest {args}") for ln in out.stdout.splitlines()), out.stdout


_PROBE = '''
import json, os, pytest


def _reason(mark):
    return (mark.args[0] if mark.args else mark.kwargs.get("reason")) if mark else None


@pytest.hookimpl(hookwrapper=True)
def pytest_collection_modifyitems(session, config, items):
    every = {it.nodeid: {"kube": "kube_cluster" in getattr(it, "fixturenames", ()),
                         "k8s": it.get_closest_marker("k8s") is not None} for it in items}
    yield
    selected = {it.nodeid: {"runner_side": _reason(it.get_closest_marker("runner_side")),
                            "skips": [_reason(m) or "" for m in it.iter_markers("skip")]} for it in items}
    with open(os.environ["E2E_PROBE_OUT"], "w") as f:
        json.dump({"all": every, "selected": selected}, f)
'''


def _collect(tmp_path: Path, args: list[str], kubeconfig: Path | None) -> dict:
    """``pytest --collect-only ARGS`` in a subprocess with the probe plugin: every
    collected item (uses kube_cluster? k8s?) and, of the selected ones, the runner_side
    reason and the skip reasons once tests/conftest.py's hook has run. Collecting
    starts no cluster."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "e2e_probe.py").write_text(_PROBE)
    env = {k: v for k, v in os.environ.items() if k not in ("RLSCHED_KUBECONFIG", "PYTEST_ADDOPTS")}
    if kubeconfig is not None:
        env["RLSCHED_KUBECONFIG"] = str(kubeconfig)
    env["E2E_PROBE_OUT"] = str(tmp_path / "probe.json")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    out = _run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "e2e_probe",
                "-p", "no:cacheprovider", *args], timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads((tmp_path / "probe.json").read_text())


@pytest.mark.k8s
def test_k8s_selection_in_kind_mode_skips_exactly_the_runner_side_tests(kube_cluster, workflow, suite_step,
                                                                        tmp_path):
    _, pytest_args = _pytest_args(workflow, suite_step)
    args = shlex.split(pytest_args)
    kind = _collect(tmp_path / "kind", args, kube_cluster.kubeconfig)
    sel = kind["selected"]
    assert sel, f"`pytest {pytest_args}` selects no test"
    assert all(kind["all"][n]["k8s"] for n in sel)
    unmarked = [n for n, i in kind["all"].items() if i["kube"] and not i["k8s"]]
    assert not unmarked, "tests using kube_cluster without pytest.mark.k8s:\n" + "\n".join(unmarked)
    wrong = []
    for n, i in sel.items():
        hook = [r for r in i["skips"] if r.startswith("runner_side")]
        if i["runner_side"] is None:
            if hook:
                wrong.append(f"{n}: skipped but not runner_side: {hook}")
        elif not i["runner_side"].strip():
            wrong.append(f"{n}: runner_side without a reason")
        elif len(hook) != 1 or i["runner_side"] not in hook[0]:
            wrong.append(f"{n}: runner_side ({i['runner_side']}) but skips {i['skips']}")
    assert not wrong, "\n".join(wrong)
    runner = sorted(n for n, i in sel.items() if i["runner_side"] is not None)
    assert runner and len(runner) < len(sel), "kind mode would run all or none of the k8s tests"
    # locally the same files lose nothing: every test collected, none skipped by the hook
    files = sorted({n.split("::")[0] for n in runner})
    local = _collect(tmp_path / "local", files, None)
    assert set(local["selected"]) == {n for n in kind["all"] if n.split("::")[0] in files}
    skipped = [n for n, i in local["selected"].items() if any(r.startswith("runner_side") for r in i["skips"])]
    assert not skipped, f"skipped on the local control plane: {skipped}"


# ----------------------------------------------------------------------- (e) pins and syntax
def test_actions_and_images_are_pinned(workflow):
    uses = [s["uses"] for s in _steps(workflow) if "uses" in s]
    assert uses
    pinned = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@(v\d+\.\d+\.\d+|[0-9a-f]{40})$")
    assert [u for u in uses if not pinned.match(u)] == [], "actions not pinned to a version"
    env = workflow["env"]
    assert re.fullmatch(r"v\d+\.\d+\.\d+", env["KIND_VERSION"]), env["KIND_VERSION"]
    assert re.fullmatch(r"kindest/node:v\d+\.\d+\.\d+@sha256:[0-9a-f]{64}", env["KIND_NODE_IMAGE"])


def test_kind_node_is_the_kubernetes_minor_of_the_tools_and_the_chart(tools, workflow):
    kind = re.search(r":v(\d+)\.(\d+)\.", workflow["env"]["KIND_NODE_IMAGE"]).groups()
    out = _run([str(tools / "kube-apiserver"), "--version"], timeout=60)
    local = re.search(r"v(\d+)\.(\d+)\.", out.stdout).groups()
    chart = yaml.safe_load((CHART / "values.yaml").read_text())["scheduler"]["kubeScheduler"]["image"]["tag"]
    assert kind == local == re.match(r"v(\d+)\.(\d+)\.", chart).groups(), (kind, local, chart)


def test_every_run_script_passes_bash_n(workflow, tmp_path):
    scripts = [(s.get("name") or s["run"].splitlines()[0], s["run"]) for s in _steps(workflow) if "run" in s]
    assert scripts
    bad = []
    for i, (name, script) in enumerate(scripts):
        path = tmp_path / f"step-{i}.sh"
        # GitHub substitutes ${{ ... }} before the shell sees the script
        path.write_text(re.sub(r"\$\{\{[^}]*\}\}", "EXPR", script))
        out = _run(["bash", "-n", str(path)], timeout=30)
        if out.returncode != 0:
            bad.append(f"{name}: {out.stderr}")
    assert not bad, "\n".join(bad)
