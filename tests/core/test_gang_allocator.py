"""Our ordering + placement as an allocation policy (core/gang_allocator.py)."""

from __future__ import annotations

import numpy as np

from rlsched.core import make_ordering, make_placement
from rlsched.core.allocation import AllocJob, AllocNode, AppLimits, check_allocations
from rlsched.core.gang_allocator import GangAllocator

LIM = AppLimits(init_batch_size=128, max_batch_size=4096, min_local_bsz=32, max_local_bsz=1024)
NODES = [AllocNode(i, 4) for i in range(2)]


def job(jid, t, replicas, allocation=()):
    return AllocJob(id=jid, submit_time=t, application="cifar10", age=0.0, attained_service=0.0, num_restarts=0,
                    allocation=tuple(allocation), target_replicas=replicas, target_batch_size=128 * replicas,
                    min_replicas=1, max_replicas=16, limits=LIM)


def gang(order="fifo", place="bestfit", backfill=True):
    rng = np.random.default_rng(0)
    return GangAllocator(make_ordering(order, rng=rng), make_placement(place, rng=rng), backfill=backfill)


def test_running_jobs_keep_their_nodes_and_the_queue_starts_in_order():
    jobs = [job("run", 0, 3, (1, 1, 1)), job("a", 1, 4), job("b", 2, 1)]
    out = gang(place="firstfit").allocate(jobs, NODES, 60.0)
    check_allocations(jobs, NODES, out)
    assert out["run"].nodes == (1, 1, 1)
    assert sorted(out["a"].nodes) == [0, 0, 0, 0]
    assert out["b"].nodes == (1,)  # the last free GPU


def test_backfill_or_head_of_line_blocking():
    jobs = [job("run", 0, 6, (0, 0, 0, 0, 1, 1)), job("big", 1, 4), job("small", 2, 1)]
    assert set(gang(backfill=True).allocate(jobs, NODES, 0.0)) == {"run", "small"}
    assert set(gang(backfill=False).allocate(jobs, NODES, 0.0)) == {"run"}
