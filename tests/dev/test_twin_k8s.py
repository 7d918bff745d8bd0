"""The twin check on the real control plane: seven seeded TrainingJobs through the live
operator, extender, kube-scheduler and kwok with the replay trainer, and through the
simulator with the operator's policies (the engine plans through core's
``ScalingPlanner`` and ``Admission``, as the operator does); admissions, preemption
victims, scaling decisions and JCTs must agree within the tolerances of
:class:`rlsched_dev.twin.Tolerances` (docs/twin.md).

Seed 9 of seven jobs has what the check is about: scale-ups, give-backs of converging
jobs, early β stops and one ``highest`` job that preempts (asserted on the simulated
side in tests/dev/test_twin.py). The allocator-mode checks run the operator's
``--allocator`` with the served default (core/served.py: goodput-rlpto, the goodput
allocator with RLPTO's network as its growth weight): ``allocator_scenario`` (multi-worker
resizes, shrink-to-admit), ``batch_scenario`` (resizes that change a job's global
batch size) and ``mixed_scenario`` on a cluster of two GPU types (a job that lands on
the slow type and moves to the fast one)."""

from __future__ import annotations

import json

import pytest

from rlsched.core.served import SERVED
from rlsched_dev.twin import TwinConfig, render_markdown, twin_check

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(420)]


def test_twin_check_live_matches_simulated(kube_cluster, launch_extender, tmp_path):
    cfg = TwinConfig(jobs=7, seed=9)
    with launch_extender(kube_cluster, tmp_path / "extender.log"):
        report = twin_check(cfg, kube_cluster, tmp_path / "live", extender=False)
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2, default=str))
    print(render_markdown(report))  # shown when the test fails
    assert report["preemptions"]["live"], "the highest-class job must preempt someone live"
    steps = [d for v in report["scaling"]["jobs"].values() for d, _ in v["live"]]
    assert 1 in steps and -1 in steps, "live, jobs must scale up and give workers back"
    assert report["admissions"]["matched"] == report["admissions"]["sim"] == report["admissions"]["live"]
    assert report["ok"], render_markdown(report)


def test_twin_check_allocator_mode(kube_cluster, launch_extender, tmp_path):
    """The operator's served allocator against the engine run by the same core
    object: a job started on all 32 GPUs in one decision, shrunk by 8 workers to admit
    a second, grown back by 8 when that one ends, shrunk again for a third."""
    from rlsched_dev.twin import allocator_scenario

    cfg = TwinConfig(jobs=3, seed=1, allocator=SERVED.allocator)
    with launch_extender(kube_cluster, tmp_path / "extender.log"):
        report = twin_check(cfg, kube_cluster, tmp_path / "live", extender=False, jobs=allocator_scenario())
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2, default=str))
    print(render_markdown(report))  # shown when the test fails
    live = report["scaling"]["jobs"]["al-a"]["live"]
    assert any(d <= -2 for d, _ in live) and any(d >= 2 for d, _ in live), live  # several workers at once
    first = next(d for d in report["live_log"] if d["kind"] == "admit" and d["job"] == "al-a")
    assert first["workers"] == 16
    assert report["ok"], render_markdown(report)


def test_twin_check_batch_size_change(kube_cluster, launch_extender, tmp_path):
    """A resize that changes a job's global batch (issue 25): the operator's goodput
    allocator (the served default) against the engine run by the same core object, on a job with
    ``batchSize`` 64 and ``maxBatchSize`` 2048 whose trainer reports step times at its
    batch and a gradient noise scale (``batch_scenario``). Live, the batch is what the
    new generation's pods carry in the worker contract (``RLSCHED_GLOBAL_BATCH_SIZE``),
    read by the replay trainer, which trains and reports at it."""
    from rlsched_dev.twin import batch_scenario

    cfg = TwinConfig(jobs=2, seed=1, allocator=SERVED.allocator)
    with launch_extender(kube_cluster, tmp_path / "extender.log"):
        report = twin_check(cfg, kube_cluster, tmp_path / "live", extender=False, jobs=batch_scenario())
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2, default=str))
    print(render_markdown(report))  # shown when the test fails
    row = report["batch"]["jobs"]["bs-a"]
    assert len(set(row["live"])) > 1 and report["batch"]["changed_live"] == ["bs-a"], row  # changed live
    assert row["live"] == row["sim"], row
    # the operator's resize events name the batches the pods then carried
    named = [d["batch"] for d in sorted(report["live_log"], key=lambda d: d["t"])
             if d["job"] == "bs-a" and d["kind"] == "scale"]
    assert named == row["live"][1:], (named, row)
    assert report["ok"], render_markdown(report)


def test_twin_check_on_a_cluster_of_two_gpu_types(kube_cluster, launch_extender, tmp_path):
    """The served allocator on the 32 A100s and two nodes of 4 T4s (``t4_nodes``),
    against the engine with the same GPU types: a job that lands on the T4s while the
    A100s are busy moves there once they free up, as it does live (``mixed_scenario``)."""
    from rlsched_dev.twin import mixed_scenario

    cfg = TwinConfig(jobs=2, seed=1, allocator=SERVED.allocator, t4_nodes=2)
    with launch_extender(kube_cluster, tmp_path / "extender.log"):
        report = twin_check(cfg, kube_cluster, tmp_path / "live", extender=False, jobs=mixed_scenario())
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2, default=str))
    print(render_markdown(report))  # shown when the test fails
    for side in ("sim_log", "live_log"):  # the same on both sides
        log = sorted(report[side], key=lambda d: d["t"])
        first = {d["job"]: d for d in log if d["kind"] == "admit"}
        assert all(n.startswith("kwok-gpu-") for n in first["mx-a"]["nodes"]), (side, first)  # on the A100s
        assert all(n.startswith("twin-t4-") for n in first["mx-b"]["nodes"]), (side, first)  # on the T4s
        moves = [d for d in log if d["job"] == "mx-b" and d["kind"] == "scale"]
        assert [d["delta"] for d in moves] == [0], (side, moves)  # then a new generation at its size
    assert [d["gpu_type"] for d in report["sim_log"] if d["kind"] == "scale"] == ["A100"]  # the engine says where
    assert report["ok"], render_markdown(report)
