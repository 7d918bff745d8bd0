"""The twin check on the real control plane: seven seeded TrainingJobs through the live
operator, extender, kube-scheduler and kwok with the replay trainer, and through the
simulator; admissions, preemption victims, scaling decisions and JCTs must agree
within the tolerances of :class:`rlsched_dev.twin.Tolerances` (docs/twin.md).

The simulated side runs the scaling policy through core's ``ScalingPlanner``
(``sim_scaling="planner"``), as the operator does; the engine as it is on this branch
calls the policy directly every interval and acts before the first evaluation, which
the report shows (``other_mode``) and which the engine's own planner integration (issue
13 item 1) removes."""

from __future__ import annotations

import json

import pytest

from rlsched_dev.twin import TwinConfig, render_markdown, twin_check

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(420)]


def test_twin_check_live_matches_simulated(kube_cluster, launch_extender, tmp_path):
    cfg = TwinConfig(jobs=7, seed=1, sim_scaling="planner")
    with launch_extender(kube_cluster, tmp_path / "extender.log"):
        report = twin_check(cfg, kube_cluster, tmp_path / "live", extender=False)
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2, default=str))
    print(render_markdown(report))  # shown when the test fails
    assert report["preemptions"]["live"], "the highest-class job must preempt someone live"
    assert report["scaling"]["live_steps"] > 0
    assert report["admissions"]["matched"] == report["admissions"]["sim"] == report["admissions"]["live"]
    assert report["ok"], render_markdown(report)
