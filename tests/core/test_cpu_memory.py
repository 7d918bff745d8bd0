"""CPU and memory, counted as kube-scheduler counts them (issue 25 item 1: one job model
carries GPU model, CPU, memory and gang size, so admission respects them everywhere).

What a worker asks for (:func:`~rlsched.core.contract.pod_requests`), what a node offers
(:func:`~rlsched.core.contract.node_shape`), and the two ways a live decision uses them:
gang admission's unfittable check and the allocator's placement and ceilings."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.core import ClusterState, Topology, make_ordering
from dataclasses import replace

from rlsched.core.allocation import AllocJob, AllocNode, AllocationError, Allocation, check_allocations
from rlsched.core.batch import BatchBounds
from rlsched.core.contract import ShapeError, node_shape, pod_requests
from rlsched.core.goodput_allocator import GoodputAllocator, within_room
from rlsched.core.live_allocation import LiveAllocation
from rlsched.core.packing import keep_or_pack
from rlsched.core.planning import Admission, TrainingSpec

from .views import view



# --------------------------------------------------------------------------- contract
def _pod(containers, inits=(), overhead=None):
    spec = {"containers": [{"resources": r} for r in containers]}
    if inits:
        spec["initContainers"] = [dict(i) for i in inits]
    if overhead:
        spec["overhead"] = overhead
    return {"spec": spec}


def test_pod_requests_sum_containers_and_round_up():
    p = _pod([{"requests": {"cpu": "250m", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": 2}},
              {"limits": {"cpu": "1.5", "memory": "1G"}}])  # a limit alone is the request
    r = pod_requests(p)
    assert (r.gpus, r.cpu_milli, r.memory_mib) == (2, 1750, 1024 + 954)  # 1G = 953.67 MiB, rounded up


def test_pod_requests_init_containers_by_their_peak_sidecars_beside_overhead_added():
    p = _pod([{"requests": {"cpu": "1", "memory": "100Mi"}}],
             inits=[{"resources": {"requests": {"cpu": "4"}}},
                    {"restartPolicy": "Always", "resources": {"requests": {"memory": "50Mi"}}}],
             overhead={"cpu": "10m", "memory": "1Mi"})
    r = pod_requests(p)
    assert (r.cpu_milli, r.memory_mib) == (4000 + 10, 150 + 1)


def test_pod_requests_nothing_asked_is_zero_and_bad_quantities_raise():
    assert pod_requests(_pod([{}])).cpu_milli == 0
    with pytest.raises(ShapeError, match="cpu"):
        pod_requests(_pod([{"requests": {"cpu": "lots"}}]))
    with pytest.raises(ShapeError, match="negative"):
        pod_requests(_pod([{"requests": {"memory": "-1Gi"}}]))


def test_node_shape_reads_allocatable_cpu_and_memory_rounded_down():
    n = {"metadata": {"name": "a"}, "status": {"allocatable": {"cpu": "7900m", "memory": "31.5Gi", "nvidia.com/gpu": "4"},
                                               "capacity": {"cpu": "8", "memory": "32Gi"}}}
    s = node_shape(n)
    assert (s.gpus, s.cpu_milli, s.memory_mib) == (4, 7900, 32256)
    bare = node_shape({"metadata": {"name": "b"}, "status": {"capacity": {"cpu": "2"}}})
    assert (bare.cpu_milli, bare.memory_mib) == (2000, 0)  # none reported: kube-scheduler fits nothing there


# --------------------------------------------------------------------------- gang admission
def test_gang_admission_reports_a_gang_unfittable_by_cpu():
    topo = Topology.from_labels([(f"n{i}", {}, 8, 16_000, 65_536) for i in range(2)])
    state = ClusterState(topo)
    adm = Admission(make_ordering("fifo"))
    heavy = TrainingSpec(min_workers=3, max_workers=3, cpu_milli=10_000)  # one per node by CPU: 2 fit
    light = TrainingSpec(min_workers=3, max_workers=3, cpu_milli=5_000)  # three per node
    waiting = [s.view(k, submit_time=t, workers=s.min_workers, priority=0.0) for k, s, t in
               (("heavy", heavy, 0.0), ("light", light, 1.0))]
    plan = adm.plan(waiting, [], state)
    assert "heavy" in plan.unfittable and "light" not in plan.unfittable
    assert "10000m CPU" in plan.unfittable["heavy"] and "the cluster has 2" in plan.unfittable["heavy"]


# --------------------------------------------------------------------------- allocator
def _job(jid, lo=1, hi=8, cpu=0, mem=0, allocation=()):
    lim = BatchBounds(lo, hi, 1, 1)
    return AllocJob(id=jid, submit_time=0.0, application=jid, age=100.0, attained_service=0.0, num_restarts=0,
                    allocation=tuple(allocation), target_replicas=lo, target_batch_size=lo, min_replicas=lo,
                    max_replicas=hi, bounds=lim, cpu_milli=cpu, memory_mib=mem, grad_sqr=0.0, grad_var=1.0)


NODES = [AllocNode(0, 4, "a", "A100", 8_000, 32_768), AllocNode(1, 4, "b", "A100", 2_000, 32_768)]


def test_keep_or_pack_puts_a_cpu_heavy_job_only_where_its_cpu_fits():
    heavy, light = _job("heavy", cpu=2_000), _job("light")
    where = keep_or_pack([(light, 4), (heavy, 3)], NODES)
    assert where["heavy"] == (0, 0, 0)  # placed first, where its CPU fits: node 1's 2 cores hold one
    assert where["light"] == (1, 1, 1, 1)
    with pytest.raises(AllocationError, match="CPU and memory"):
        keep_or_pack([(_job("x", cpu=3_000), 3), (_job("y", cpu=3_000), 2)], NODES)  # 8 cores hold two
    part = keep_or_pack([(_job("x", cpu=3_000), 2), (_job("y", cpu=3_000), 2)], NODES, partial=True)
    assert len(part["x"]) == 2 and part["y"] == ()


def test_keep_or_pack_moves_a_job_whose_node_no_longer_has_its_memory():
    stay = _job("stay", mem=20_000, allocation=(0,))
    ahead = _job("ahead", mem=20_000)
    where = keep_or_pack([(ahead, 1), (stay, 1)], [AllocNode(0, 4, "a", "", None, 32_768),
                                                   AllocNode(1, 4, "b", "", None, 32_768)])
    assert where["stay"] == (0,)  # kept: the job ahead of it is placed after the kept ones
    crowded = keep_or_pack([(_job("k1", mem=20_000, allocation=(0,)), 1), (_job("k2", mem=20_000, allocation=(0,)), 1)],
                           [AllocNode(0, 4, "a", "", None, 32_768), AllocNode(1, 4, "b", "", None, 32_768)])
    assert crowded["k1"] == (0,) and crowded["k2"] == (1,)  # the second no longer fits node 0's memory


def test_check_allocations_rejects_cpu_over_a_node():
    j = _job("j", cpu=3_000)
    check_allocations([j], NODES, {"j": Allocation((0, 0))})
    with pytest.raises(AllocationError, match="CPU"):
        check_allocations([j], NODES, {"j": Allocation((1,))})


def test_within_room_caps_growth_at_what_cpu_lets_the_nodes_hold():
    (capped,) = within_room([_job("j", hi=8, cpu=3_000)], NODES)
    assert capped.max_replicas == 2
    free = _job("free", hi=8)
    assert within_room([free], NODES)[0] is free


def test_goodput_allocator_never_gives_more_than_cpu_and_memory_hold():
    jobs = [_job("a", hi=8, cpu=3_000), _job("b", hi=8, mem=20_000), _job("c", hi=8)]
    out = GoodputAllocator().allocate(jobs, NODES, 0.0)
    check_allocations(jobs, NODES, out)  # raises on a node over its CPU or memory
    assert out["a"].replicas <= 2 and out["b"].replicas <= 2
    assert sum(a.replicas for a in out.values()) == 8  # the GPUs left go to the job without limits


def test_live_plan_counts_worker_cpu_and_says_why_a_job_cannot_run():
    alloc = LiveAllocation(GoodputAllocator())
    wide = view(id="ns/wide", submit_time=0.0, min_workers=1, max_workers=8, gpus_per_worker=2, cpu_milli=5_000)
    huge = view(id="ns/huge", submit_time=1.0, min_workers=1, max_workers=1, gpus_per_worker=1, cpu_milli=9_000)
    plan = alloc.plan([wide, huge], {0: 4, 1: 4}, 10.0, offers={0: (8_000, 32_768), 1: (2_000, 32_768)})
    assert plan.start["ns/wide"].workers == 1  # 2 GPUs at 2,500m each: node 0 holds one worker, node 1 none
    assert plan.waiting["ns/huge"].reason == "Unfittable"
    assert "9000m CPU" in plan.waiting["ns/huge"].message
    plain = alloc.plan([wide], {0: 4, 1: 4}, 10.0)  # CPU not counted: every GPU
    assert plain.start["ns/wide"].workers == 4


# --------------------------------------------------------------------------- whole workers
def test_a_worker_of_several_gpus_is_placed_whole_on_one_node():
    """A job of 4-GPU workers on nodes with 3 + 3 + 4 GPUs free: one worker fits (the
    4-GPU node), not two, although 10 GPUs are free — the allocator must not count
    GPUs a worker cannot use (live, its pods would wait at kube-scheduler)."""
    nodes = [AllocNode(0, 3), AllocNode(1, 3), AllocNode(2, 4)]
    quad = replace(_job("quad", lo=4, hi=8), replica_group=4)
    assert [quad.room_on(n) for n in nodes] == [0, 0, 4]
    assert keep_or_pack([(quad, 4)], nodes)["quad"] == (2, 2, 2, 2)
    with pytest.raises(AllocationError, match="hold 4 of its 8"):
        keep_or_pack([(quad, 8)], nodes)
    with pytest.raises(AllocationError, match="whole workers"):
        check_allocations([quad], nodes, {"quad": Allocation((0, 0, 1, 1))})
    out = GoodputAllocator().allocate([quad, _job("one", hi=8)], nodes, 0.0)
    check_allocations([quad, _job("one", hi=8)], nodes, out)
    assert out["quad"].nodes == (2, 2, 2, 2) and out["one"].replicas == 6


def test_live_plan_starts_whole_workers_only():
    alloc = LiveAllocation(GoodputAllocator())
    quad = view(id="ns/quad", submit_time=0.0, min_workers=1, max_workers=4, gpus_per_worker=4)
    plan = alloc.plan([quad], {0: 3, 1: 3, 2: 6}, 10.0)
    assert plan.start["ns/quad"].workers == 1  # the 6-GPU node holds one 4-GPU worker; 3 + 3 hold none


def test_why_a_job_waits_counts_its_own_worker_size():
    """Two waiting jobs of the same GPU model, CPU and memory but 1- and 4-GPU workers on
    nodes of 3 GPUs each: the 1-GPU job is ranked behind, the 4-GPU one can never fit
    (the room the reason counts is per worker size, not shared between them)."""
    alloc = LiveAllocation(GoodputAllocator())
    big = view(id="ns/big", submit_time=0.0, min_workers=2, max_workers=2, gpus_per_worker=3)
    one = view(id="ns/one", submit_time=1.0, min_workers=1, max_workers=1, gpus_per_worker=1)
    quad = view(id="ns/quad", submit_time=2.0, min_workers=1, max_workers=1, gpus_per_worker=4)
    plan = alloc.plan([big, one, quad], {0: 3, 1: 3}, 10.0)
    assert plan.start["ns/big"].workers == 2
    assert plan.waiting["ns/one"].reason == "Ranked"
    assert plan.waiting["ns/quad"].reason == "Unfittable"


def test_movable_room_is_the_free_room_plus_what_movable_jobs_hold():
    from rlsched.core.live_allocation import movable_room

    state = ClusterState(Topology.from_labels([(f"n{i}", {}, 8, 16_000, 65_536) for i in range(2)]))
    state.allocate(0, 4, 6_000, 10_000)  # a job that may move: 2 workers of 2 GPUs on node 0
    state.allocate(1, 8, 1_000, 1_000)  # one that may not (not in ``held``)
    capacity, offers = movable_room(state, [((0, 0), 2, 3_000, 5_000)])
    assert capacity == {0: 8, 1: 0}
    assert offers == {0: (16_000, 65_536), 1: (15_000, 64_536)}
