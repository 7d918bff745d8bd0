"""`rlsched sim run` / `rlsched sim compare` end to end (in-process)."""

from __future__ import annotations

import json
from pathlib import Path

from rlsched.cli import main

DATA = Path(__file__).parent / "data"
REQUIRED = {
    "jct_mean", "jct_p50", "jct_p95", "jct_p99", "wait_mean", "slowdown_mean",
    "makespan", "fee_total", "gpu_util_mean", "jobs_completed",
}


def _run(tmp_path, name, seed, trace="synthetic:small,jobs=40,nodes=4", extra=()):
    out = tmp_path / name
    rc = main(["sim", "run", "--trace", trace, "--ordering", "sjf", "--placement", "bestfit",
               "--seed", str(seed), "--out", str(out), "--quiet", *extra])
    return rc, out / "metrics.json"


def test_run_writes_metrics(tmp_path):
    rc, path = _run(tmp_path, "a", 1)
    assert rc == 0
    m = json.loads(path.read_text())
    assert REQUIRED <= set(m)
    assert m["jobs_completed"] == 40
    assert m["config"]["ordering"] == "sjf" and m["config"]["seed"] == 1
    assert 0 < m["gpu_util_mean"] <= 1
    assert m["jct_p50"] <= m["jct_p95"] <= m["jct_p99"]


def test_run_is_byte_identical_per_seed(tmp_path):
    _, a = _run(tmp_path, "a", 5)
    _, b = _run(tmp_path, "b", 5)
    _, c = _run(tmp_path, "c", 6)
    assert a.read_bytes() == b.read_bytes()
    ma, mc = json.loads(a.read_text()), json.loads(c.read_text())
    assert ma["jct_mean"] != mc["jct_mean"]


def test_run_with_scaling(tmp_path):
    from rlsched.core import SCALINGS, make_scaling

    make_scaling("none")  # loads the built-in policies
    name = "beta" if "beta" in SCALINGS else "none"
    rc, path = _run(tmp_path, "s", 1, extra=("--scaling", name, "--scaling-interval", "120"))
    assert rc == 0
    assert json.loads(path.read_text())["jobs_completed"] == 40


def test_run_bad_input_exit_code(tmp_path, capsys):
    rc, _ = _run(tmp_path, "bad", 1, trace="alibaba2023:bad", extra=("--data-dir", str(DATA)))
    assert rc == 2
    assert "openb_pod_list_bad.csv:3" in capsys.readouterr().err
    rc, path = _run(tmp_path, "skip", 1, trace="alibaba2023:bad", extra=("--data-dir", str(DATA), "--skip-bad"))
    assert rc == 0
    m = json.loads(path.read_text())
    assert m["jobs_skipped"] == 2 and m["skipped"] == {"malformed": 2}


def test_run_reports_unfittable(tmp_path):
    rc, path = _run(tmp_path, "u", 1, trace="alibaba2023:huge", extra=("--data-dir", str(DATA)))
    assert rc == 0
    m = json.loads(path.read_text())
    # pod-1 asks 8 T4 GPUs (the only T4 node has 4); pod-3 asks 500 CPUs (nodes have <= 96)
    assert m["jobs_unfittable"] == 2 and m["unfittable_ids"] == ["pod-1", "pod-3"]
    assert m["jobs_completed"] == 2


def test_trace_without_cluster(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("uniform: {nodes: 2, gpus_per_node: 8, racks: 1}\n")
    out = tmp_path / "ph"
    trace = f"philly:{DATA / 'philly_cluster_job_log.json'}"
    assert main(["sim", "run", "--trace", trace, "--ordering", "fifo", "--placement", "firstfit",
                 "--seed", "0", "--out", str(out), "--quiet"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["config"]["nodes"] == 64 and m["jobs_completed"] == 2
    assert "trace has no cluster" in capsys.readouterr().err
    assert main(["sim", "run", "--trace", trace, "--ordering", "fifo", "--placement", "firstfit",
                 "--seed", "0", "--out", str(out), "--quiet", "--cluster", str(cluster)]) == 0
    m = json.loads((out / "metrics.json").read_text())
    # application_1: 2 workers x 4 GPUs, 600 s; on one rack of 8-GPU nodes the ideal is
    # one node, where first fit puts both workers: no slowdown
    assert m["config"]["nodes"] == 2 and m["slowdown_mean"] == 1.0


def test_compare(tmp_path, capsys):
    out = tmp_path / "cmp"
    rc = main(["sim", "compare", "--trace", "synthetic:small,jobs=30,nodes=4", "--policies",
               "fifo/firstfit,sjf/bestfit", "--seed", "2", "--out", str(out), "--quiet"])
    assert rc == 0
    rows = json.loads((out / "compare.json").read_text())
    assert [r["policy"] for r in rows] == ["fifo/firstfit", "sjf/bestfit"]
    assert all(REQUIRED <= set(r["metrics"]) for r in rows)
    assert (out / "jct_cdf.png").stat().st_size > 1000
    assert (out / "utilization_queue.png").stat().st_size > 1000
    assert "sjf/bestfit" in capsys.readouterr().out
    assert main(["sim", "compare", "--trace", "synthetic:small", "--policies", "fifo", "--seed", "1",
                 "--out", str(out), "--quiet"]) == 2


def test_clairvoyant_runs_are_marked_and_labelled(tmp_path, capsys):
    """Every metrics/compare JSON says whether the policies saw true run times; the
    printouts label clairvoyant rows; SJF with no estimates is FIFO, clairvoyant it is not."""
    rc, path = _run(tmp_path, "nc", 1)
    m = json.loads(path.read_text())
    assert rc == 0 and m["clairvoyant"] is False and m["config"]["clairvoyant"] is False
    assert "(clairvoyant reference)" not in capsys.readouterr().out
    rc, path = _run(tmp_path, "cv", 1, extra=("--clairvoyant",))
    mc = json.loads(path.read_text())
    assert rc == 0 and mc["clairvoyant"] is True and mc["config"]["clairvoyant"] is True
    assert "(clairvoyant reference)" in capsys.readouterr().out
    assert mc["jct_mean"] != m["jct_mean"]

    out = tmp_path / "cmp"
    rc = main(["sim", "compare", "--trace", "synthetic:small,jobs=30,nodes=4", "--policies", "fifo/firstfit,sjf/firstfit",
               "--clairvoyant-reference", "sjf/firstfit", "--seed", "2", "--out", str(out), "--quiet"])
    assert rc == 0
    rows = json.loads((out / "compare.json").read_text())
    assert [(r["policy"], r["clairvoyant"], r["metrics"]["clairvoyant"]) for r in rows] == [
        ("fifo/firstfit", False, False), ("sjf/firstfit", False, False), ("sjf/firstfit", True, True)]
    # no job of this trace tells its run time: SJF keeps FIFO's order
    assert rows[1]["metrics"]["jct_mean"] == rows[0]["metrics"]["jct_mean"] != rows[2]["metrics"]["jct_mean"]
    printed = capsys.readouterr().out
    assert "sjf/firstfit (clairvoyant reference)" in printed and "not a baseline" in printed
    rc = main(["sim", "compare", "--trace", "synthetic:small,jobs=30,nodes=4", "--policies", "fifo/firstfit",
               "--clairvoyant", "--seed", "2", "--out", str(out), "--quiet"])
    assert rc == 0 and [r["clairvoyant"] for r in json.loads((out / "compare.json").read_text())] == [True]


def _preemption_trace(tmp_path, klass="highest"):
    p = tmp_path / "preempt.yaml"
    p.write_text(
        "cluster:\n  uniform: {nodes: 1, gpus_per_node: 8}\n"
        "jobs:\n"
        "  - {id: A, submit_time: 0, gpus_per_worker: 8, duration: 100}\n"
        f"  - {{id: B, submit_time: 10, gpus_per_worker: 8, duration: 20, priority_class: {klass}}}\n"
    )
    return str(p)


def test_run_preemption_flags(tmp_path):
    """A (100 s) runs from 0; highest-class B (20 s) arrives at 10 and preempts it:
    B 10-30, A resumes at 30 with --restart-cost 5 -> ends 30 + 5 + 90 = 125; JCT mean
    (125 + 20) / 2 = 72.5 (a decision at every event: --decision-gap 0). With the default
    gap of 30 s, B waits for the decision at 30 (B 30-50) and A for the one at 60: A ends
    60 + 5 + 70 = 135, JCT mean (135 + 40) / 2. With --no-preemption: A 0-100, B 100-120, mean (100 + 110) / 2."""
    trace = _preemption_trace(tmp_path)
    rc, path = _run(tmp_path, "p", 0, trace=trace, extra=("--restart-cost", "5", "--decision-gap", "0"))
    m = json.loads(path.read_text())
    assert rc == 0 and m["config"]["preemption"] is True
    assert (m["preemptions_total"], m["jct_mean"]) == (1, 72.5)
    rc, path = _run(tmp_path, "g", 0, trace=trace, extra=("--restart-cost", "5"))
    m = json.loads(path.read_text())
    assert rc == 0 and m["config"]["decision_gap"] == 30.0
    assert (m["preemptions_total"], m["jct_mean"]) == (1, 87.5)
    rc, path = _run(tmp_path, "n", 0, trace=trace, extra=("--restart-cost", "5", "--no-preemption"))
    m = json.loads(path.read_text())
    assert rc == 0 and m["config"]["preemption"] is False
    assert (m["preemptions_total"], m["jct_mean"]) == (0, 105.0)


def test_run_bad_priority_class(tmp_path, capsys):
    rc, _ = _run(tmp_path, "bad", 0, trace=_preemption_trace(tmp_path, klass="vip"))
    assert rc == 2
    assert "priority_class" in capsys.readouterr().err
