"""bench/hetero_decision_time.py: inputs on the scaled mix keep each running job whole
on nodes of its own type, and every job gets a new id."""

from __future__ import annotations

import numpy as np

from rlsched.core.allocation import AllocJob
from rlsched.core.batch import BatchBounds
from rlsched.sim.measured import CLUSTERS


def _job(jid: str, allocation: tuple[int, ...]) -> AllocJob:
    return AllocJob(id=jid, submit_time=0.0, application="cifar10", age=100.0, attained_service=0.0, num_restarts=0,
                    allocation=allocation, target_replicas=1, target_batch_size=128, min_replicas=1,
                    max_replicas=8, bounds=BatchBounds(128, 4096, 32, 1024), batch_size=128 if allocation else 0)


def test_inputs_keep_each_running_job_on_its_own_type(bench_module):
    bench = bench_module("hetero_decision_time")
    cluster = CLUSTERS["sia-64"]  # nodes 0-5: 4 x aws, 6-7: 8 x dgx-ext, 8-10: 8 x rtx
    snap = [_job("t4", (0, 0)), _job("a100", (6,) * 8), _job("wait", ())]
    jobs, nodes, now = bench.build_inputs([snap], cluster, 2, 7, np.random.default_rng(0))
    assert len(nodes) == 22 and sum(n.gpus for n in nodes) == 128 and now == 100.0
    assert len({j.id for j in jobs}) == 7
    for j in jobs:
        kind = {"t4": "aws", "a100": "dgx-ext"}.get(j.id.split("#")[0])
        if kind is None:
            assert not j.allocation
        else:  # whole, on one node of its type
            assert not j.allocation or {nodes[i].gpu_type for i in j.allocation} == {kind}
    held = [j for j in jobs if j.id.startswith("a100") and j.allocation]
    assert len(held) == 2 and len({j.allocation[0] for j in held}) == 2


def test_a_steady_decision_sees_one_more_report_of_each_running_job(bench_module):
    from rlsched.core.allocation import ProfileSample

    bench = bench_module("hetero_decision_time")
    sample = ProfileSample(1, 2, 64, 0.5, 0.1, gpu_type="aws")
    running = _job("run", (0, 0))
    running.profile = (sample,)
    waiting = _job("wait", ())
    waiting.profile = (sample,)
    again = bench.reported_once_more([running, waiting], 2)
    assert again[0].profile[:1] == (sample,) and len(again[0].profile) == 2
    assert again[0].profile[1].step_time == 0.5 * 1.002 and again[0].profile[1].gpu_type == "aws"
    assert again[1].profile == (sample,) and again[1] is not waiting
    assert running.profile == (sample,)  # the inputs are not changed
