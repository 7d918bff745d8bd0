"""The end-to-end scheduling benchmark (bench/scheduling.py): pure parts, and a tiny
run on its own real control plane (every pod of every burst bound, the JSON's
must-show keys present). Throughput itself is the benchmark's to report."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench_module(name: str):
    """bench/ holds scripts, not an installed package: load ``bench/<name>.py`` by path."""
    spec = importlib.util.spec_from_file_location(f"rlsched_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


scheduling = _bench_module("scheduling")


def test_settings_name_the_client_limits_compared():
    rec = scheduling.chart_recommendation()
    assert rec["qps"] > 50 and rec["burst"] >= rec["qps"]
    stock, rl = scheduling.tunings("default", rec)
    assert stock.describe() == rl.describe() == {"qps": 50.0, "burst": 100,
                                                 "percentageOfNodesToScore": "adaptive"}
    stock, rl = scheduling.tunings("raised", rec)
    assert (stock.qps, stock.burst) == (rl.qps, rl.burst) == (500, 1000)
    stock, rl = scheduling.tunings("recommended", rec)
    assert (stock.qps, stock.burst, stock.percentage_of_nodes_to_score) == (rec["qps"], rec["burst"], None)
    assert rl.percentage_of_nodes_to_score == rec["percentageOfNodesToScore"]
    stock, rl = scheduling.tunings("custom:200:400:", rec)
    assert (rl.qps, rl.burst, rl.percentage_of_nodes_to_score) == (200, 400, None)
    for bad in ("fast", "custom:1:2", "custom:x:1:1", "custom:100:50:10"):
        with pytest.raises(ValueError):
            scheduling.tunings(bad, rec)


def test_cpu_seconds_of_this_process_and_of_none():
    import os

    assert scheduling.cpu_seconds(os.getpid()) > 0
    assert scheduling.cpu_seconds(None) is None


def test_summary_pairs_ratios_per_repeat():
    B = scheduling.Burst
    bursts = [B("raised", 0, "stock", 10, pods_per_s=100.0), B("raised", 0, "rlsched", 10, pods_per_s=50.0),
              B("raised", 1, "rlsched", 10, pods_per_s=90.0), B("raised", 1, "stock", 10, pods_per_s=100.0)]
    out = scheduling.summarize(bursts, ["raised"], 2)["raised"]
    assert out["ratios"] == [0.5, 0.9] and out["ratio"] == 0.7
    assert out["stock"]["pods_per_s_median"] == 100.0


@pytest.mark.k8s
@pytest.mark.runner_side("starts its own LocalCluster and its extender, and reads their processes' CPU time")
def test_tiny_run_binds_every_pod_and_writes_the_must_show_keys(tmp_path):
    out = tmp_path / "scheduling.json"
    rc = scheduling.main(["--nodes", "12", "--gpus-per-node", "4", "--pods", "30", "--repeats", "2",
                          "--settings", "default,raised", "--out", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["nodes_ready"]["nodes"] == 12
    assert isinstance(report["ratio_default_limit"], float) and isinstance(report["ratio_raised_limit"], float)
    assert len(report["bursts"]) == 2 * 2 * 2
    for b in report["bursts"]:
        assert b["bound"] == b["pods"] == 30, b
        assert b["pods_per_s"] > 0 and b["cpu_s"]["kube-apiserver"] > 0
        sched = "rlsched-scheduler" if b["scheduler"] == "rlsched" else "kube-scheduler"
        assert b["cpu_s"][sched] > 0
    # the rlsched profile called the extender, the stock one did not need it
    rl = [b for b in report["bursts"] if b["scheduler"] == "rlsched"]
    assert all(b["cpu_s"]["extender"] > 0 for b in rl)
    # repeats alternate which scheduler goes first
    firsts = [report["bursts"][i]["scheduler"] for i in (0, 2)]
    assert firsts == ["stock", "rlsched"]
