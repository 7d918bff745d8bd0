"""ClusterState's free-capacity index agrees with a brute-force scan."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.core import ClusterState, JobView, NodeSpec, PlacementError, Topology
from rlsched.core.topology import Level


def _topo(gpus, models):
    return Topology(
        [NodeSpec(f"n{i}", g, m, rack=f"r{i // 2}", block=f"b{i // 4}") for i, (g, m) in enumerate(zip(gpus, models))]
    )


def _brute(state, gpus, models, key):
    ok = [i for i in range(len(state.free)) if state.fits(i, gpus, models)]
    if not ok:
        return None
    return min(ok, key=lambda i: key(i))


ops = st.lists(st.tuples(st.integers(0, 7), st.integers(0, 8), st.booleans()), max_size=60)


@settings(max_examples=150, deadline=None)
@given(
    caps=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=8),
    model_pick=st.lists(st.sampled_from(["A100", "T4"]), min_size=8, max_size=8),
    ops=ops,
    req=st.integers(0, 8),
    allow=st.sampled_from([None, frozenset({"A100"}), frozenset({"T4"}), frozenset({"X"})]),
)
def test_index_matches_scan(caps, model_pick, ops, req, allow):
    state = ClusterState(_topo(caps, model_pick[: len(caps)]))
    for node, g, take in ops:
        node %= len(caps)
        try:
            (state.allocate if take else state.release)(node, g)
        except PlacementError:
            pass
    assert (state.free >= 0).all() and (state.free <= state.total).all()
    assert state.free_gpus == int(state.free.sum())
    assert list(state.rack_free) == [int(state.free[state.rack_of == r].sum()) for r in range(len(state.rack_free))]
    assert state.first_fit(req, allow) == _brute(state, req, allow, lambda i: i)
    assert state.best_fit(req, allow) == _brute(state, req, allow, lambda i: (state.free[i], i))
    assert state.worst_fit(req, allow) == _brute(state, req, allow, lambda i: (-state.free[i], i))
    assert list(state.candidates(req, allow)) == [i for i in range(len(caps)) if state.fits(i, req, allow)]


def test_allocate_rejects_double_allocation_and_job_is_atomic():
    state = ClusterState(Topology.uniform(2, gpus_per_node=4))
    job = JobView("j", 0.0, gpus_per_worker=3, workers=2, max_workers=2)
    with pytest.raises(PlacementError):
        state.allocate_job(job, [0, 0])  # second worker needs 3 more GPUs on node 0
    assert list(state.free) == [4, 4]  # nothing leaked from the failed gang
    state.allocate_job(job, [0, 1])
    assert list(state.free) == [1, 1]
    with pytest.raises(PlacementError):
        state.release(0, 4)


def test_span_levels_follow_the_tree():
    t = Topology(
        [
            NodeSpec("a", 8, rack="r0", block="b0", nvlink_domain_size=4),
            NodeSpec("b", 8, rack="r0", block="b0"),
            NodeSpec("c", 8, rack="r1", block="b0"),
            NodeSpec("d", 8, rack="r2", block="b1"),
            NodeSpec("e", 8, rack="r3", block="b1", clique="c1"),
            NodeSpec("f", 8, rack="r4", block="b2", clique="c1"),
        ]
    )
    assert t.span_level({0: 4}) == Level.NVLINK
    assert t.span_level({0: 8}) == Level.NODE  # two NVLink islands of 4
    assert t.span_level({1: 8}) == Level.NVLINK
    assert t.span_level({0: 1, 1: 1}) == Level.RACK
    assert t.span_level({0: 1, 2: 1}) == Level.BLOCK
    assert t.span_level({0: 1, 3: 1}) == Level.CLUSTER
    assert t.span_level({4: 8, 5: 8}) == Level.NVLINK  # multi-node NVLink clique
    assert t.bandwidth.at(Level.NVLINK) > t.bandwidth.at(Level.NODE) > t.bandwidth.at(Level.RACK)


def test_topology_round_trips_and_rejects_bad_descriptions():
    t = Topology.uniform(8, gpus_per_node=4, racks=4, blocks=2)
    assert Topology.from_dict(t.to_dict()).to_dict() == t.to_dict()
    assert [n.block for n in t.nodes] == ["block-0"] * 4 + ["block-1"] * 4
    with pytest.raises(ValueError, match="unknown keys"):
        Topology.from_dict({"nodes": [{"name": "x", "gpus": 1, "gpu": 2}]})
    with pytest.raises(ValueError, match="duplicate"):
        Topology([NodeSpec("x", 1), NodeSpec("x", 2)])
    with pytest.raises(ValueError):
        Topology.uniform(2, racks=3)


def test_from_labels_isolates_unlabelled_nodes():
    from rlsched.core import node_labels

    t = Topology.uniform(4, gpus_per_node=8, racks=2)
    rebuilt = Topology.from_labels([(n.name, node_labels(n), n.gpus) for n in t.nodes] + [("bare", {}, 2)])
    assert [(n.rack, n.block) for n in rebuilt.nodes[:4]] == [(n.rack, n.block) for n in t.nodes]
    assert rebuilt.pair_level(0, 1) == Level.RACK
    assert rebuilt.pair_level(0, 4) == Level.CLUSTER  # no labels: never looks close


def test_jobview_validates():
    with pytest.raises(ValueError, match="min_workers"):
        JobView("j", 0.0, min_workers=3, max_workers=2)
    with pytest.raises(ValueError, match="queue"):
        JobView("j", 0.0, queue="vip")
    assert np.isinf(JobView("j", 0.0).progress.gain)
