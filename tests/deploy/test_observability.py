"""The PromQL the chart ships — every Grafana dashboard query, every alert and
recording rule — returns data from a real Prometheus (Debian's package) scraping a
real extender and a real operator working against the real control plane.

The expressions are parsed out of the chart (files/dashboards/rlsched.json and the
PrometheusRule rendered by ``helm template``), so the test checks the queries actually
shipped. A missing /usr/bin/prometheus fails the tests: ``make test`` installs it.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from rlsched.demo import prometheus_config, shipped_rules

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "rlsched"
PROMETHEUS = Path("/usr/bin/prometheus")
PROMTOOL = Path("/usr/bin/promtool")
RATE_INTERVAL = "2m"  # what Grafana's $__rate_interval stands for in these queries
# a trailing comparison with a literal: the alert's threshold
THRESHOLD = re.compile(r"^(?P<lhs>.*?)\s*(?:>=|<=|==|!=|>|<)\s*-?[0-9.]+(?:e[-+]?[0-9]+)?\s*$", re.S | re.I)


def _dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads((CHART / "files" / "dashboards" / "rlsched.json").read_text())
    out = []
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            out.append((f"{panel['title']} [{t['refId']}]", t["expr"]))
    return out


def _helm() -> Path:
    from rlsched.devcluster import find_tools

    helm = find_tools() / "helm"
    assert helm.is_file(), f"helm missing from {helm.parent}: run `make tools`"
    return helm


def _require_prometheus() -> None:
    assert PROMETHEUS.is_file() and os.access(PROMETHEUS, os.X_OK), \
        f"{PROMETHEUS} is missing: run `make prometheus` (apt-get install prometheus)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def _post(url: str, body: bytes) -> int:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _ok(url: str) -> bool:
    try:
        _get(url, 2.0)
        return True
    except OSError:
        return False


def _wait(check, timeout: float, what: str, procs=()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name, p, log in procs:
            if p.poll() is not None:
                raise AssertionError(f"{name} exited with {p.returncode}:\n{Path(log).read_text()[-3000:]}")
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _query(base: str, q: str) -> list[dict]:
    body = json.loads(_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q})))
    assert body["status"] == "success", f"{q}: {body}"
    return body["data"]["result"]


def _finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(r["value"][1])) for r in result)


# ----------------------------------------------------------------------- the stack
@pytest.fixture(scope="module")
def stack(kube_cluster, tmp_path_factory):
    """Extender + operator + fake trainer + Prometheus, with TrainingJobs admitted,
    scaled and a few bad extender requests answered; yields the Prometheus URL."""
    from kubernetes import client

    _require_prometheus()
    helm = _helm()
    work = tmp_path_factory.mktemp("observability")
    kc = str(kube_cluster.kubeconfig)
    core = client.CoreV1Api(kube_cluster.api_client())
    custom = client.CustomObjectsApi(kube_cluster.api_client())
    ns = f"obs-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"metadata": {"name": ns}})
    procs: list[tuple[str, subprocess.Popen, Path]] = []

    def spawn(name: str, argv: list[str]) -> None:
        log = work / f"{name}.log"
        with open(log, "wb") as fh:
            p = subprocess.Popen(argv, cwd=work, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
        procs.append((name, p, log))

    cli = [sys.executable, "-m", "rlsched.cli"]
    try:
        # the operator's CRDs (idempotent: another suite may have installed them)
        crds = subprocess.run([*cli, "operator", "crd", "--peering"], capture_output=True, text=True, check=True).stdout
        ext_api = client.ApiextensionsV1Api(kube_cluster.api_client())
        for doc in yaml.safe_load_all(crds):
            if doc:
                try:
                    ext_api.create_custom_resource_definition(doc)
                except client.exceptions.ApiException as exc:
                    assert exc.status == 409, exc
        _wait(lambda: any(c.type == "Established" and c.status == "True" for c in
                          ext_api.read_custom_resource_definition("trainingjobs.rlsched.dev").status.conditions or []),
              30, "the TrainingJob CRD")

        # a corrupt model file: DAS falls back to its default parameters (fallback metric)
        bad_model = work / "corrupt.safetensors"
        bad_model.write_bytes(b"\x00not a safetensors file")
        ext_port, relay_port, op_port, prom_port = _free_port(), _free_port(), _free_port(), _free_port()
        spawn("extender", [*cli, "extender", "serve", "--host", "127.0.0.1", "--port", str(ext_port),
                           "--kubeconfig", kc, "--model", str(bad_model)])
        # the chart's metrics relay: Prometheus scrapes the extender through it, as in-cluster
        spawn("metrics-relay", [sys.executable, str(CHART / "files" / "metrics-relay.py"),
                                f"--listen=127.0.0.1:{relay_port}", f"--upstream=http://127.0.0.1:{ext_port}"])
        spawn("operator", [*cli, "operator", "run", "--kubeconfig", kc, "--namespace", ns,
                           "--metrics-port", str(op_port), "--cycle", "1", "--grace-period", "0",
                           "--patience", "2"])
        spawn("fake-trainer", [*cli, "operator", "fake-trainer", "--kubeconfig", kc, "--namespace", ns,
                               "--epoch-seconds", "0.5", "--seed", "3"])
        rules = shipped_rules(helm)
        (work / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        cfg = prometheus_config({"rlsched-extender": f"127.0.0.1:{relay_port}",
                                 "rlsched-operator": f"127.0.0.1:{op_port}"},
                                scrape_interval_s=1, rule_files=["rules.yaml"])
        (work / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        spawn("prometheus", [str(PROMETHEUS), f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                             "--log.level=warn"])
        prom = f"http://127.0.0.1:{prom_port}"
        ext = f"http://127.0.0.1:{ext_port}"
        _wait(lambda: _ok(f"{ext}/readyz"), 60, "extender /readyz", procs)
        _wait(lambda: _ok(f"http://127.0.0.1:{relay_port}/readyz"), 30, "relayed /readyz", procs)
        _wait(lambda: _ok(f"http://127.0.0.1:{op_port}/metrics"), 60, "operator /metrics", procs)
        _wait(lambda: _ok(f"{prom}/-/ready"), 60, "Prometheus /-/ready", procs)

        # TrainingJobs: an elastic one (scaling decisions) and an urgent gang
        def tj(name: str, lo: int, hi: int, cls: str) -> dict:
            return {"apiVersion": "rlsched.dev/v1alpha1", "kind": "TrainingJob",
                    "metadata": {"name": name, "namespace": ns},
                    "spec": {"minWorkers": lo, "maxWorkers": hi, "gpusPerWorker": 1, "beta": 0.001,
                             "maxEpochs": 200, "dataSize": 2000, "priority": {"class": cls},
                             "template": {"spec": {"containers": [{"name": "t", "image": "registry.invalid/t"}]}}}}

        for body in (tj("elastic", 1, 3, "normal"), tj("gang", 2, 2, "urgent")):
            custom.create_namespaced_custom_object("rlsched.dev", "v1alpha1", ns, "trainingjobs", body)

        # scheduler traffic shaped as kube-scheduler sends it (nodeCacheCapable), and bad requests
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "probe-0", "namespace": ns, "uid": str(uuid.uuid4()),
                            "labels": {"rlsched.dev/job": "probe"}},
               "spec": {"schedulerName": "rlsched", "containers": [
                   {"name": "w", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"},
                                                            "requests": {"nvidia.com/gpu": "1"}}}]}}
        huge = json.loads(json.dumps(pod))
        huge["metadata"]["name"] = "probe-huge"
        huge["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "64"}, "requests": {"nvidia.com/gpu": "64"}}
        def traffic() -> None:
            for p in (pod, huge):
                args = json.dumps({"Pod": p, "Nodes": None, "NodeNames": list(kube_cluster.node_names)}).encode()
                for verb in ("filter", "prioritize"):
                    for _ in range(5):
                        assert _post(f"{ext}/{verb}", args) == 200
            for bad in (b"{not json", b'{"Pod": 3, "NodeNames": "x"}', b"[]"):
                assert _post(f"{ext}/filter", bad) == 400

        # labelled series appear with their first sample: rate() needs traffic on both
        # sides of a scrape, so send it in waves a few scrapes apart
        for _ in range(3):
            traffic()
            time.sleep(2.5)

        def operator_ready() -> bool:
            text = _get(f"http://127.0.0.1:{op_port}/metrics").decode()
            return ("rlsched_operator_admission_wait_seconds_count 0.0" not in text
                    and "rlsched_operator_scaling_decisions_total{" in text)

        _wait(operator_ready, 120, "the operator to admit a job and make a scaling decision", procs)

        # Prometheus has scraped all of it (two samples after the events, for rate())
        def scraped() -> bool:
            return all(_query(prom, q) for q in (
                "rlsched_extender_errors_total", "rlsched_operator_scaling_decisions_total",
                "rlsched_extender_filtered_nodes_total", "rlsched_extender_policy_fallbacks_total",
                "rlsched_operator_admission_wait_seconds_count > 0"))

        _wait(scraped, 60, "Prometheus to scrape the events", procs)

        # one more admission, surely after Prometheus's first samples (histogram rates)
        def admitted() -> float:
            res = _query(prom, "sum(rlsched_operator_admission_wait_seconds_count)")
            return float(res[0]["value"][1]) if res else 0.0

        before = admitted()
        custom.create_namespaced_custom_object("rlsched.dev", "v1alpha1", ns, "trainingjobs", tj("late", 1, 1, "normal"))
        _wait(lambda: admitted() > before, 90, "the late job's admission in Prometheus", procs)
        time.sleep(3)
        yield {"prometheus": prom, "rules": rules, "relay": f"http://127.0.0.1:{relay_port}"}
    finally:
        # delete the jobs while the operator still runs (it may hold finalizers on them)
        try:
            custom.delete_collection_namespaced_custom_object("rlsched.dev", "v1alpha1", ns, "trainingjobs")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and custom.list_namespaced_custom_object(
                    "rlsched.dev", "v1alpha1", ns, "trainingjobs")["items"]:
                time.sleep(0.5)
            for body in custom.list_namespaced_custom_object("rlsched.dev", "v1alpha1", ns, "trainingjobs")["items"]:
                custom.patch_namespaced_custom_object("rlsched.dev", "v1alpha1", ns, "trainingjobs",
                                                      body["metadata"]["name"], {"metadata": {"finalizers": None}})
        except client.exceptions.ApiException:
            pass  # the CRD may never have been installed
        for name, p, _ in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for name, p, _ in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        core.delete_namespace(ns)


# ----------------------------------------------------------------------- tests
def test_dashboard_in_configmap_is_the_shipped_file(tmp_path):
    helm = _helm()
    out = subprocess.run([str(helm), "template", "r", str(CHART), "--kube-version", "v1.35.0",
                          "--show-only", "templates/dashboard-configmap.yaml"],
                         capture_output=True, text=True, check=True).stdout
    cm = yaml.safe_load(out)
    assert json.loads(cm["data"]["rlsched.json"]) == json.loads((CHART / "files/dashboards/rlsched.json").read_text())
    assert len(_dashboard_queries()) >= 15


def test_promtool_accepts_the_shipped_rules(tmp_path):
    assert PROMTOOL.is_file(), f"{PROMTOOL} is missing: run `make prometheus` (apt-get install prometheus)"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(shipped_rules(_helm()), sort_keys=False))
    out = subprocess.run([str(PROMTOOL), "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"SUCCESS: \d+ rules found", out.stdout)


@pytest.mark.k8s
def test_metrics_relay_passes_only_read_endpoints(stack):
    relay = stack["relay"]
    assert b"rlsched_extender_request_duration_seconds" in _get(f"{relay}/metrics")
    assert _get(f"{relay}/healthz") == b"ok"
    for path in ("/filter", "/prioritize", "/debug/pods/a/b"):
        with pytest.raises(urllib.error.HTTPError) as err:
            _get(f"{relay}{path}")
        assert err.value.code == 404
    assert _post(f"{relay}/filter", b"{}") == 501  # no POST at all


@pytest.mark.k8s
def test_harness_sees_missing_metrics(stack):
    assert _query(stack["prometheus"], "rlsched_extender_no_such_metric_total") == []


@pytest.mark.k8s
@pytest.mark.parametrize("title,expr", _dashboard_queries(), ids=[t for t, _ in _dashboard_queries()])
def test_dashboard_query_returns_data(stack, title, expr):
    q = expr.replace("$__rate_interval", RATE_INTERVAL)
    assert "$" not in q, f"unsubstituted Grafana variable in {q}"
    res = _query(stack["prometheus"], q)
    assert res, f"{title}: no data for {q}"
    assert _finite(res), f"{title}: only NaN/Inf for {q}: {res}"


@pytest.mark.k8s
def test_every_rule_returns_data(stack):
    """Recording rules: the expression; alerts: the signal left of the threshold."""
    prom = stack["prometheus"]
    rules = [r for g in stack["rules"]["groups"] for r in g["rules"]]
    assert {r.get("alert") for r in rules} >= {"RlschedExtenderErrors", "RlschedExtenderSlow",
                                               "RlschedQueueWaitHigh", "RlschedPolicyFallback"}
    failures = []
    for rule in rules:
        name = rule.get("alert") or rule.get("record")
        expr = rule["expr"].strip()
        _query(prom, expr)  # the whole expression evaluates
        if "alert" in rule:
            m = THRESHOLD.match(expr)
            assert m, f"alert {name}: expected `<signal> <op> <threshold>`, got {expr}"
            expr = m.group("lhs")
        res = _query(prom, expr)
        if not res or not _finite(res):
            failures.append(f"{name}: {expr} -> {res}")
    assert not failures, "\n".join(failures)


@pytest.mark.k8s
def test_prometheus_evaluates_every_shipped_rule(stack):
    prom = stack["prometheus"]
    want = {r.get("alert") or r.get("record") for g in stack["rules"]["groups"] for r in g["rules"]}

    def evaluated():
        groups = json.loads(_get(f"{prom}/api/v1/rules"))["data"]["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        return rules if set(rules) == want and all(r.get("lastEvaluation", "").startswith("20") and
                                                 not r["lastEvaluation"].startswith("0001") for r in rules.values()) else None

    rules = _wait(evaluated, 30, "Prometheus to evaluate every rule")
    bad = {n: r.get("lastError") for n, r in rules.items() if r["health"] != "ok"}
    assert not bad, bad
