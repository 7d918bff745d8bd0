"""Placements on hand-placed tiny clusters, and properties over random ones."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.core import PLACEMENTS, ClusterState, JobView, NodeSpec, Topology, make_placement
from rlsched.core.heuristics import FGD, TopologyPacking
from rlsched.core.placement import feasible_mask, worker_slots

NAMES = ("firstfit", "bestfit", "loadbalance", "random", "topology", "fgd")


def state_with_free(topo, free):
    s = ClusterState(topo)
    for i, f in enumerate(free):
        s.allocate(i, int(s.total[i]) - f)
    return s


@pytest.fixture
def small():
    # 4 nodes x 4 GPUs, 2 racks: nodes 0,1 in rack-0, nodes 2,3 in rack-1; free 3 1 4 2
    return state_with_free(Topology.uniform(4, 4, racks=2), [3, 1, 4, 2])


def job(workers=1, gpus=1, **kw):
    return JobView("j", 0.0, gpus_per_worker=gpus, workers=workers, max_workers=max(workers, 1), **kw)


def test_registry_has_every_placement():
    assert set(NAMES) <= set(PLACEMENTS)


@pytest.mark.parametrize(
    "name, gpus, workers, expected",
    [
        ("firstfit", 2, 1, [0]),
        ("firstfit", 1, 3, [0, 0, 0]),
        ("firstfit", 2, 3, [0, 2, 2]),
        ("bestfit", 1, 1, [1]),
        ("bestfit", 2, 1, [3]),
        ("bestfit", 1, 3, [1, 3, 3]),
        ("loadbalance", 1, 1, [2]),
        ("loadbalance", 1, 2, [2, 0]),  # node 2 drops to 3 free, ties go to the lowest index
        ("loadbalance", 2, 2, [2, 0]),
    ],
)
def test_fit_placements_by_hand(small, name, gpus, workers, expected):
    assert make_placement(name).place(job(workers, gpus), small) == expected


def test_gang_that_does_not_fit_is_none(small):
    for name in NAMES:
        assert make_placement(name).place(job(3, 3), small) is None, name  # only 2 nodes have 3+
        assert make_placement(name).place(job(11, 1), small) is None, name  # 10 GPUs free


def test_zero_workers_is_empty(small):
    for name in NAMES:
        assert make_placement(name).place(job(1), small, workers=0) == []


def test_model_constraint():
    topo = Topology(
        [NodeSpec("t4-a", 4, "T4"), NodeSpec("v-a", 2, "V100"), NodeSpec("t4-b", 8, "T4"), NodeSpec("v-b", 8, "V100")]
    )
    s = ClusterState(topo)
    j = job(2, 2, gpu_models=frozenset({"V100"}))
    assert make_placement("firstfit").place(j, s) == [1, 3]
    assert make_placement("bestfit").place(j, s) == [1, 3]
    assert make_placement("loadbalance").place(j, s) == [3, 3]
    assert make_placement("topology").place(j, s) == [3, 3]
    for name in NAMES:
        p = make_placement(name).place(j, s)
        assert p is not None and set(p) <= {1, 3}, name
        sc = make_placement(name).score(j, [0, 1, 2, 3], s)
        assert np.isneginf(sc[[0, 2]]).all() and np.isfinite(sc[[1, 3]]).all(), name


def test_cpu_constraint_steers_away_from_the_index_choice():
    s = ClusterState(Topology.uniform(3, 8))
    s.allocate(0, 0, cpu_milli=90_000)  # node 0: GPUs free but only 6 CPUs left
    j = job(1, 1, cpu_milli=8_000)
    assert make_placement("firstfit").place(j, s) == [1]
    assert make_placement("bestfit").place(j, s) == [1]
    assert np.isneginf(make_placement("firstfit").score(j, [0, 1], s)[0])


@pytest.fixture
def racks():
    # 8 nodes x 4 GPUs; racks {0,1} {2,3} {4,5} {6,7}; blocks {0..3} {4..7}
    return state_with_free(Topology.uniform(8, 4, racks=4, blocks=2), [1, 4, 3, 2, 4, 3, 4, 4])


@pytest.mark.parametrize(
    "workers, expected",
    [
        (1, [0]),  # tightest node that holds the gang
        (2, [3, 3]),
        (3, [2, 2, 2]),
        (4, [1, 1, 1, 1]),
        (5, [1, 1, 1, 1, 0]),  # no node holds 5: the tightest rack that does (rack-0, 5 free)
        (6, [4, 4, 4, 4, 5, 5]),  # racks with >= 6: rack-2 (7) and rack-3 (8) -> rack-2
        (9, [1, 1, 1, 1, 0, 2, 2, 2, 3]),  # no rack: block-0 (10 free), rack by rack
    ],
)
def test_topology_packing_by_hand(racks, workers, expected):
    assert TopologyPacking().place(job(workers), racks) == expected


def test_topology_grows_near_own_workers(racks):
    # a job with a worker on node 5 (rack-2): node 5 has 3 free -> stays on one node
    assert TopologyPacking().place(job(3, placement=[5]), racks) == [5, 5, 5]
    # 5 more: node 5 (3) then the rest of rack-2 (node 4)
    assert TopologyPacking().place(job(5, placement=[5]), racks) == [5, 5, 5, 4, 4]
    # workers in two racks of block-1: its own nodes 4 and 6 first (4 + 4), then the
    # tightest rack of block-1 that holds one more: rack-2 (node 5: 3 free)
    assert TopologyPacking().place(job(9, placement=[4, 6]), racks) == [4] * 4 + [6] * 4 + [5]
    sc = TopologyPacking().score(job(2, placement=[5]), list(range(8)), racks)
    assert int(np.argmax(sc)) == 5  # same node beats the same rack beats elsewhere
    assert sc[4] > sc[6] > sc[0]


def test_topology_score_prefers_where_the_gang_fits(racks):
    sc = TopologyPacking().score(job(4), list(range(8)), racks)
    # node 1 holds all 4 workers (tightest such node); node 0 only fits in rack-0
    assert int(np.argmax(sc)) == 1
    assert sc[1] > sc[0]


def test_fgd_by_hand(racks):
    # workload: half 1-GPU, half 4-GPU tasks. F(f) for a node with f free whole GPUs:
    # the 4-GPU class cannot use f < 4 GPUs, so F(f) = 0.5 * 1000 f for f < 4, 0 for f = 4.
    fgd = FGD(workload=[(1, 0.5), (4, 0.5)])
    delta = fgd.delta(job(1), racks, np.arange(8))
    np.testing.assert_allclose(delta, [-500, 1500, -500, -500, 1500, -500, 1500, 1500])
    # worker 1 -> node 0 (1 -> 0); then nodes 2 and 3 both -500, node 3 is tighter
    assert fgd.place(job(3), racks) == [0, 3, 3]
    assert int(np.argmax(fgd.score(job(1), list(range(8)), racks))) == 0


def test_fgd_learns_workload_from_pending(racks):
    racks.pending = [job(4, 4)] * 3
    # learned from pending 4-GPU gangs: keep whole free nodes whole -> node 0 (1 free)
    assert FGD().target(job(1), racks).pairs() == [(1.0, 1 / 13), (4.0, 12 / 13)]
    assert FGD().place(job(1), racks) == [0]


def test_bad_input(small):
    with pytest.raises(ValueError):
        make_placement("firstfit").place(job(1), small, workers=-1)
    with pytest.raises(IndexError):
        make_placement("bestfit").score(job(1), [7], small)


# ---------------------------------------------------------------- properties

@st.composite
def scenes(draw):
    n = draw(st.integers(1, 7))
    caps = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=n, max_size=n))
    models = draw(st.lists(st.sampled_from(["A100", "T4"]), min_size=n, max_size=n))
    racks = draw(st.integers(1, n))
    nodes = [
        NodeSpec(f"n{i}", caps[i], models[i], rack=f"r{i * racks // n}", block=f"b{i * racks // n // 2}",
                 cpu_milli=32_000)
        for i in range(n)
    ]
    s = ClusterState(Topology(nodes))
    for i in range(n):
        s.allocate(i, draw(st.integers(0, caps[i])), cpu_milli=draw(st.sampled_from([0, 8_000, 30_000])))
    j = JobView(
        "j", 0.0,
        gpus_per_worker=draw(st.integers(1, 4)),
        workers=draw(st.integers(1, 5)),
        max_workers=8,
        gpu_models=draw(st.sampled_from([None, frozenset({"A100"}), frozenset({"T4", "A100"})])),
        cpu_milli=draw(st.sampled_from([0, 4_000])),
    )
    if draw(st.booleans()):
        busy = np.flatnonzero(s.free < s.total)
        if len(busy):
            j.placement = [int(x) for x in draw(st.lists(st.sampled_from(busy.tolist()), min_size=1, max_size=3))]
    return s, j


def snapshot(s):
    return (s.free.copy(), s.cpu_free.copy(), s.mem_free.copy(), s.rack_free.copy(), s.free_gpus)


@settings(max_examples=120, deadline=None)
@given(scene=scenes(), name=st.sampled_from(NAMES), seed=st.integers(0, 3))
def test_placement_properties(scene, name, seed):
    s, j = scene
    p = make_placement(name, rng=np.random.default_rng(seed))
    before = snapshot(s)
    plan = p.place(j, s)
    after = snapshot(s)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    slots = worker_slots(j, s)
    if plan is None:
        assert slots.sum() < j.workers
    else:
        assert len(plan) == j.workers
        counts = np.bincount(plan, minlength=len(s.free))
        assert (counts <= slots).all()  # never a node lacking GPUs, CPU or an allowed model
        s.allocate_job(j, plan)  # and the state accepts it
    cands = list(range(len(s.free)))
    sc = p.score(j, cands, s)
    feasible = feasible_mask(j, s)
    assert (np.isneginf(sc) == ~feasible).all()
    assert np.isfinite(sc[feasible]).all()


@settings(max_examples=60, deadline=None)
@given(scene=scenes(), name=st.sampled_from(NAMES))
def test_place_fails_only_when_capacity_is_short(scene, name):
    s, j = scene
    plan = make_placement(name).place(j, s)
    assert (plan is None) == (worker_slots(j, s).sum() < j.workers)


def test_fgd_counts_cpu_stranding():
    # node 0: 4 GPUs, plenty of CPU; node 1: 2 GPUs but 10 CPUs left. Jobs want 1 GPU + 8 CPUs.
    s = ClusterState(Topology.uniform(2, 4))
    s.allocate(1, 2, cpu_milli=86_000)
    j = job(1, 1, cpu_milli=8_000)
    s.pending = [job(1, 1, cpu_milli=8_000)] * 3
    # on node 1 the job leaves 1 GPU with 2 CPUs: useless to the workload -> +1000 milli
    np.testing.assert_allclose(FGD().delta(j, s, np.array([0, 1])), [0.0, 1000.0])
    assert FGD().place(j, s) == [0]
    assert make_placement("bestfit").place(j, s) == [1]
