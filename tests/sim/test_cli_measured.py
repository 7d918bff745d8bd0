"""`rlsched sim` on measured workloads: the interval engine under allocation policies."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlsched.cli import main

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("RLSCHED_DATA_DIR") or REPO.parent / "shared" / "data")
pytestmark = pytest.mark.skipif(not (DATA / "pollux-osdi21").is_dir(), reason=f"no Pollux data under {DATA}")


def test_compare_our_policies_on_a_published_workload(tmp_path):
    rc = main(["sim", "compare", "--trace", "pollux:workloads-0.5/workload-2", "--data-dir", str(DATA),
               "--policies", "fifo/firstfit,tiresias/topology", "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    rows = json.loads((tmp_path / "compare.json").read_text())
    assert [r["policy"] for r in rows] == ["fifo/firstfit", "tiresias/topology"]
    for r in rows:
        m = r["metrics"]
        assert m["jobs_completed"] == 80 and m["config"]["nodes"] == 16 and m["config"]["interval"] == 60
        assert not r["clairvoyant"]
    assert (tmp_path / "jct_cdf.png").exists()


def test_run_on_a_larger_cluster_and_a_generated_workload(tmp_path):
    out = {}
    for cluster in ("16x4", "32x4"):
        rc = main(["sim", "run", "--trace", "pollux-gen:seed=11,jobs=40", "--data-dir", str(DATA), "--cluster", cluster,
                   "--allocator", "fifo/bestfit", "--out", str(tmp_path / cluster), "--quiet"])
        assert rc == 0
        out[cluster] = json.loads((tmp_path / cluster / "metrics.json").read_text())
    assert out["32x4"]["config"]["nodes"] == 32 and out["32x4"]["total_gpus"] == 128
    assert out["32x4"]["jct_mean"] <= out["16x4"]["jct_mean"]


def test_mismatched_policies_are_clear_errors(tmp_path, capsys):
    assert main(["sim", "compare", "--trace", "pollux:workloads/workload-1", "--data-dir", str(DATA),
                 "--policies", "fifo", "--out", str(tmp_path), "--quiet"]) == 2
    assert "or an allocation policy" in capsys.readouterr().err
    assert main(["sim", "compare", "--trace", "synthetic:small,jobs=10", "--policies", "tiresias-2q",
                 "--out", str(tmp_path), "--quiet"]) == 2
    assert main(["sim", "run", "--trace", "pollux:workloads/workload-1", "--data-dir", str(DATA),
                 "--allocator", "nope", "--out", str(tmp_path), "--quiet"]) == 2
    assert "unknown allocation policy 'nope'" in capsys.readouterr().err


def test_elastic_scaling_on_measured_jobs_reacts_to_the_real_curves(tmp_path):
    """fifo/bestfit with core's planner and the β rule: jobs are resized on their
    reported validation curves (rescales happen) and every job still completes."""
    res = {}
    for pol in ("fifo/bestfit", "fifo/bestfit/beta"):
        out = tmp_path / pol.replace("/", "-")
        assert main(["sim", "run", "--trace", "pollux:workloads-0.5/workload-6", "--data-dir", str(DATA),
                     "--allocator", pol, "--out", str(out), "--quiet"]) == 0
        res[pol] = json.loads((out / "metrics.json").read_text())
    assert res["fifo/bestfit/beta"]["jobs_completed"] == 80
    assert res["fifo/bestfit/beta"]["rescales_total"] > res["fifo/bestfit"]["rescales_total"]


def test_an_allocation_policy_takes_its_options_on_the_interval_engine_too():
    """``name@key=value`` builds the allocator with those options, as the operator's
    ``--allocator`` and the event engine do; an unknown option is refused."""
    from rlsched.sim.allocators import make_allocator

    assert make_allocator("goodput@threshold=3600").threshold == 3600.0
    assert make_allocator("goodput").threshold != 3600.0
    with pytest.raises(TypeError):
        make_allocator("goodput@no_such_option=1")
