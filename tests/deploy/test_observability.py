"""The PromQL the chart ships — every Grafana dashboard query, every alert and
recording rule — returns data from the live demo's Prometheus (Debian's package)
scraping the real extender and the real operator on the real control plane.

The expressions are parsed out of the chart (files/dashboards/rlsched.json and the
PrometheusRule rendered by ``helm template``), so the test checks the queries actually
shipped. A missing ``prometheus`` (looked up on PATH) fails the tests: ``make test``
installs it.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
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

from rlsched_dev.demo import prometheus_config, shipped_rules

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "rlsched"
RATE_INTERVAL = "2m"  # what Grafana's $__rate_interval stands for in these queries
# the tests of the `stack` fixture are skipped against a kind cluster (tests/conftest.py)
LIVE_DEMO = ("the live demo spawns the extender, the operator and Prometheus on the test machine "
             "and points the local rlsched profile at that extender")
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
    from rlsched_dev.tools import find_tools

    helm = find_tools() / "helm"
    assert helm.is_file(), f"helm missing from {helm.parent}: run `make tools`"
    return helm


def _program(name: str) -> str:
    """``name`` (prometheus, promtool) on PATH; fails the test when it is missing."""
    exe = shutil.which(name)
    assert exe is not None and os.access(exe, os.X_OK), \
        f"{name} is missing from PATH: run `make prometheus` (apt-get install prometheus)"
    return exe


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
    """The live demo (:class:`rlsched_dev.demo.Demo`) on the session's cluster: extender
    (scraped through the chart's metrics relay), operator, fake trainer and Prometheus
    with the chart's rules; a short run of trace-drawn TrainingJobs, plus the paths a
    healthy run never takes (bad requests, an unplaceable pod, a corrupt model file).
    Yields the demo's Prometheus URL and what it loaded."""
    import io

    from rich.console import Console

    from rlsched_dev.demo import Demo, DemoOptions

    prometheus = _program("prometheus")
    _helm()
    work = tmp_path_factory.mktemp("demo")
    bad_model = work / "corrupt.safetensors"  # the extender falls back to DAS defaults
    bad_model.write_bytes(b"\x00not a safetensors file")
    opts = DemoOptions(duration_s=30, jobs=6, trace="synthetic:small", seed=2, out=work / "out",
                       state_dir=work / "state", epoch_s=0.5, cycle_s=1, scrape_interval_s=1,
                       namespace=f"obs-{uuid.uuid4().hex[:6]}", extender_model=str(bad_model),
                       chart=CHART, prometheus=prometheus,
                       # the old admission + scaling defaults as one allocator: a 30 s run of 6
                       # small jobs that all fit at once gives the goodput allocator (the demo's
                       # default) nothing to resize or stop, and every rule here needs a scaling
                       # decision and a preemption to have data (goodput's live decisions:
                       # tests/operator/test_k8s_goodput.py, the twin)
                       allocator="fifo/das/rlpto+nobackfill")
    demo = Demo(opts, Console(file=io.StringIO(), width=150))
    try:
        demo.start(env=kube_cluster)
        ext, prom = demo.extender_url, demo.prom_url
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "probe-0", "namespace": opts.namespace, "uid": str(uuid.uuid4()),
                            "labels": {"rlsched.dev/job": "probe"}},
               "spec": {"schedulerName": "rlsched", "containers": [
                   {"name": "w", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"},
                                                            "requests": {"nvidia.com/gpu": "1"}}}]}}
        huge = json.loads(json.dumps(pod))
        huge["metadata"]["name"] = "probe-huge"
        huge["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "64"},
                                                      "requests": {"nvidia.com/gpu": "64"}}

        def traffic() -> None:
            # shaped as kube-scheduler sends it (nodeCacheCapable), then malformed bodies
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
        summary = demo.run()

        def operator_ready() -> bool:
            text = _get(f"{demo.operator_url}/metrics").decode()
            return ("rlsched_operator_admission_wait_seconds_count 0.0" not in text
                    and "rlsched_operator_scaling_decisions_total{" in text)

        _wait(operator_ready, 90, "the operator to admit a job and make a scaling decision")

        def scraped() -> bool:
            return all(_query(prom, q) for q in (
                "rlsched_extender_errors_total", "rlsched_operator_scaling_decisions_total",
                "rlsched_extender_filtered_nodes_total", "rlsched_extender_policy_fallbacks_total",
                "rlsched_operator_admission_wait_seconds_count > 0"))

        _wait(scraped, 60, "Prometheus to scrape the events")
        time.sleep(3)
        rules = yaml.safe_load((opts.state_dir / "prometheus" / "rules.yaml").read_text())
        yield {"prometheus": prom, "rules": rules, "relay": demo.relay_url, "summary": summary, "opts": opts}
    finally:
        demo.stop()


# ----------------------------------------------------------------------- tests
def test_dashboard_in_configmap_is_the_shipped_file(tmp_path):
    helm = _helm()
    out = subprocess.run([str(helm), "template", "r", str(CHART),
                          "--show-only", "templates/dashboard-configmap.yaml"],
                         capture_output=True, text=True, check=True).stdout
    cm = yaml.safe_load(out)
    assert json.loads(cm["data"]["rlsched.json"]) == json.loads((CHART / "files/dashboards/rlsched.json").read_text())
    assert len(_dashboard_queries()) >= 15


def test_promtool_accepts_the_shipped_rules(tmp_path):
    promtool = _program("promtool")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(shipped_rules(_helm(), CHART), sort_keys=False))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"SUCCESS: \d+ rules found", out.stdout)


@pytest.mark.k8s
@pytest.mark.runner_side(LIVE_DEMO)
def test_metrics_relay_passes_only_read_endpoints(stack):
    relay = stack["relay"]
    assert b"rlsched_extender_request_duration_seconds" in _get(f"{relay}/metrics")
    assert _get(f"{relay}/healthz") == b"ok"
    for path in ("/filter", "/prioritize", "/debug/pods/a/b"):
        with pytest.raises(urllib.error.HTTPError) as err:
            _get(f"{relay}{path}")
        assert err.value.code == 404
    assert _post(f"{relay}/filter", b"{}") == 405  # no POST at all (Allow: GET, HEAD)


@pytest.mark.k8s
@pytest.mark.runner_side(LIVE_DEMO)
def test_demo_run_submitted_admitted_and_wrote_its_outputs(stack):
    s, opts = stack["summary"], stack["opts"]
    assert s["submitted"] == s["planned"] >= 1
    assert any(r["wait_s"] is not None for r in s["jobs"]), "no job was admitted"
    assert {p.name for p in opts.out.iterdir()} >= {"summary.json", "jobs.json", "jct.png", "utilization.png",
                                                     "accuracy.png"}
    assert json.loads((opts.out / "summary.json").read_text())["submitted"] == s["submitted"]


@pytest.mark.k8s
@pytest.mark.runner_side(LIVE_DEMO)
def test_harness_sees_missing_metrics(stack):
    assert _query(stack["prometheus"], "rlsched_extender_no_such_metric_total") == []


@pytest.mark.k8s
@pytest.mark.runner_side(LIVE_DEMO)
@pytest.mark.parametrize("title,expr", _dashboard_queries(), ids=[t for t, _ in _dashboard_queries()])
def test_dashboard_query_returns_data(stack, title, expr):
    q = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$queue", ".*")  # the queue variable's All
    assert "$" not in q, f"unsubstituted Grafana variable in {q}"
    res = _query(stack["prometheus"], q)
    assert res, f"{title}: no data for {q}"
    assert _finite(res), f"{title}: only NaN/Inf for {q}: {res}"


@pytest.mark.k8s
@pytest.mark.runner_side(LIVE_DEMO)
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
@pytest.mark.runner_side(LIVE_DEMO)
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
