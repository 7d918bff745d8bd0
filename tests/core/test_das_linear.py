"""Issue 15: the DAS agents made linear decide as before.

The fit of a job comes from the state's incremental FitIndex, the transformer runs only
when its logits break a tie, and the placement smooths on the topology's quotient
graph. Each is held equal to the slow path it replaced (``tests/oracles/das_reference.py``,
the code as it was) on seeded random states and queues.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.core import ClusterState, JobView, NodeSpec, Topology
from das_reference import (
    ReferenceDASAgentPlacement,
    ReferenceDASOrdering,
    _fits_now,
    _job_features,
    _rack_first_fill,
    _select_window,
)
from rlsched.core.das import QuotientSmoother, TopologyKernel
from rlsched.core.das_agent import (
    DASAgentPlacement,
    DASOrdering,
    fits_now,
    job_features,
    rack_first_fill,
    rwgp_smoother,
    select_window,
)
from rlsched.core.placement import worker_slots

MODELS = ("A100", "V100", "T4")


def _topology(rng: np.random.Generator, n: int = 40, cliques: bool = False) -> Topology:
    nodes = []
    for i in range(n):
        rack = int(rng.integers(0, max(n // 6, 1)))
        nodes.append(NodeSpec(
            name=f"n{i:03d}", gpus=int(rng.choice([1, 2, 4, 8])), gpu_model=str(rng.choice(MODELS)),
            rack=f"r{rack}", block=f"b{rack % 2}", clique=f"c{i // 3}" if cliques and i % 5 else "",
            cpu_milli=int(rng.choice([16_000, 64_000, 96_000])), memory_mib=int(rng.choice([65_536, 262_144])),
        ))
    return Topology(nodes)


def _job(rng: np.random.Generator, k: int, t: float = 0.0) -> JobView:
    workers = int(rng.choice([1, 1, 1, 2, 3, 4]))
    return JobView(
        f"j{k:03d}", submit_time=float(rng.integers(0, 50)) if t == 0.0 else t,
        gpus_per_worker=int(rng.choice([1, 1, 2, 4, 8])), workers=workers, min_workers=1, max_workers=max(workers, 1),
        gpu_models=frozenset(rng.choice(MODELS, size=int(rng.integers(1, 3)), replace=False).tolist()) if rng.random() < 0.3 else None,
        cpu_milli=int(rng.choice([0, 4_000, 12_000, 30_000])), memory_mib=int(rng.choice([0, 16_384, 98_304])),
        priority=float(rng.choice([0.0, 0.0, 1.0])), queue=str(rng.choice(["normal", "normal", "urgent", "interrupt"])),
        est_runtime=float(rng.choice([0.0, 600.0, 3600.0])), remaining=float(rng.choice([0.0, 300.0, 7200.0])),
    )


def _load(st: ClusterState, rng: np.random.Generator, frac: float) -> list[tuple]:
    """Allocate random workers until about ``frac`` of the GPUs are used; returns them."""
    held = []
    for _ in range(4 * len(st.free)):
        if st.utilization() >= frac:
            break
        i = int(rng.integers(0, len(st.free)))
        g = int(rng.integers(1, 3))
        if st.free[i] >= g:
            c, m = int(rng.choice([0, 8_000])), int(rng.choice([0, 32_768]))
            st.allocate(i, g, c, m)
            held.append((i, g, c, m))
    return held


# ------------------------------------------------------------------ FitIndex
@pytest.mark.parametrize("seed", range(4))
def test_fit_index_equals_worker_slots_through_allocations_and_releases(seed):
    rng = np.random.default_rng(seed)
    st = ClusterState(_topology(rng, 30))
    jobs = [_job(rng, k) for k in range(25)]
    idx = st.fit_index()
    held: list[tuple] = []
    for step in range(400):
        if held and rng.random() < 0.45:
            i, g, c, m = held.pop(int(rng.integers(0, len(held))))
            st.release(i, g, c, m)
        else:
            i = int(rng.integers(0, len(st.free)))
            g = int(rng.integers(1, 4))
            if st.free[i] >= g:
                c, m = int(rng.choice([0, 8_000, 40_000])), int(rng.choice([0, 32_768]))
                st.allocate(i, g, c, m)
                held.append((i, g, c, m))
        if step % 7 == 0:  # read a few shapes now and then: rows catch up from the log
            for j in jobs[: 1 + step % len(jobs)]:
                slots = worker_slots(j, st)
                assert np.array_equal(idx.slots(j), slots)
                assert idx.total(j) == int(slots.sum())
                assert fits_now(j, st) == _fits_now(j, st)
                got = idx.slots_if_fit(j, j.workers)
                assert (got is None) != _fits_now(j, st)
                assert got is None or np.array_equal(got, slots)


def test_fit_index_catches_up_after_the_change_log_was_dropped():
    rng = np.random.default_rng(7)
    st = ClusterState(_topology(rng, 12))
    job = JobView("a", 0.0, gpus_per_worker=1, workers=3, cpu_milli=4_000)
    assert st.fit_index().total(job) == int(worker_slots(job, st).sum())
    mark = st.mutations
    for _ in range(5000):  # far more changes than the log keeps
        st.allocate(0, 1)
        st.release(0, 1)
    st.allocate(1, 1)
    assert st.touched_since(mark) is None
    assert np.array_equal(st.fit_index().slots(job), worker_slots(job, st))
    # a change of many nodes at once goes through numpy
    for i in range(len(st.free)):
        if st.free[i] > 0:
            st.allocate(i, 1)
    assert np.array_equal(st.fit_index().slots(job), worker_slots(job, st))


def test_fit_index_refresh_reads_arrays_written_directly():
    st = ClusterState(Topology.uniform(4, 8))
    job = JobView("a", 0.0, gpus_per_worker=4, workers=1)
    idx = st.fit_index()
    assert idx.total(job) == 8
    st.free[:] = 3  # not through allocate/release: the index must be told
    idx.refresh()
    assert idx.total(job) == 0 and not idx.fits(job)


# ------------------------------------------------------------------ smoother
@pytest.mark.parametrize("cliques", [False, True])
@pytest.mark.parametrize("lam,noise", [(0.5, 1.0), (0.9, 0.01), (0.3, 0.2)])
def test_quotient_smoother_equals_the_dense_rwgp_smoother(cliques, lam, noise):
    rng = np.random.default_rng(3)
    topo = _topology(rng, 50, cliques=cliques)
    dense = rwgp_smoother(topo, lam, noise)
    q = QuotientSmoother(TopologyKernel(topo, lam), noise)
    np.testing.assert_allclose(q.matrix(), dense, atol=1e-12)
    for _ in range(5):
        a = rng.normal(size=len(topo))
        np.testing.assert_allclose(q.apply(a), dense @ a, atol=1e-12)


def test_quotient_smoother_needs_noise():
    with pytest.raises(ValueError, match="noise"):
        QuotientSmoother(TopologyKernel(Topology.uniform(2, 8), 0.5), 0.0)


# ------------------------------------------------------------------ ordering
def _queue(rng, n, t0=100.0):
    jobs = [_job(rng, k) for k in range(n)]
    for k, j in enumerate(jobs):
        j.submit_time = float(rng.integers(0, 40))  # ties on submit time: ids break them
    return jobs


@pytest.mark.parametrize("seed", range(12))
def test_das_ordering_ranks_as_the_reference(seed):
    rng = np.random.default_rng(seed)
    st = ClusterState(_topology(rng, 24), time=60.0)
    _load(st, rng, float(rng.choice([0.3, 0.7, 0.95])))
    new, ref = DASOrdering(), ReferenceDASOrdering()
    for mode in ("mixed", "oldest", "shortest"):
        new.window_select = ref.window_select = mode
        for n in (1, 2, 5, 16, 17, 40):
            pending = _queue(rng, n)
            rng.shuffle(pending)
            assert [j.id for j in new.rank(pending, st)] == [j.id for j in ref.rank(pending, st)]
            assert [j.id for j in select_window(pending, st, 16, mode)] == [j.id for j in _select_window(pending, st, 16, mode)]
            for j in pending[:5]:
                assert np.array_equal(job_features(j, st), _job_features(j, st))


def test_the_transformer_runs_only_to_break_ties(monkeypatch):
    from rlsched.core import das_agent

    calls = []
    real = das_agent.das_logits
    monkeypatch.setattr(das_agent, "das_logits", lambda *a, **k: calls.append(1) or real(*a, **k))
    st = ClusterState(Topology.uniform(2, 8), time=10.0)
    order = DASOrdering()
    one = [JobView("a", 0.0)]
    assert order.rank(one, st) == one and not calls  # one pending job: no forward pass
    two = [JobView("a", 0.0), JobView("b", 1.0, gpus_per_worker=8, workers=3)]  # only "a" fits
    assert [j.id for j in order.rank(two, st)] == ["a", "b"] and not calls  # fit breaks the tie
    both = [JobView("a", 0.0), JobView("b", 1.0)]
    order.rank(both, st)
    assert len(calls) == 1
    order.rank(both, st)  # the same inputs at the same instant: remembered
    assert len(calls) == 1


# ------------------------------------------------------------------ placement
@pytest.mark.parametrize("seed", range(10))
def test_das_agent_placement_places_as_the_reference(seed):
    rng = np.random.default_rng(200 + seed)
    st = ClusterState(_topology(rng, 48, cliques=seed % 2 == 1))
    new, ref = DASAgentPlacement(), ReferenceDASAgentPlacement()
    for _ in range(6):
        _load(st, rng, float(rng.uniform(0.2, 0.95)))
        for k in range(10):
            job = _job(rng, k)
            np.testing.assert_allclose(new.node_scores(job, st), ref.node_scores(job, st), atol=1e-10)
            for w in (None, 1, 2, 5):
                assert new.place(job, st, w) == ref.place(job, st, w)
            cand = np.arange(len(st.free))
            np.testing.assert_allclose(new.score(job, cand, st), ref.score(job, cand, st), atol=1e-10)
        # some capacity comes back
        for i in rng.choice(len(st.free), size=len(st.free) // 3, replace=False):
            used = int(st.total[i] - st.free[i])
            if used:
                st.release(int(i), used)


@pytest.mark.parametrize("seed", range(6))
def test_rack_first_fill_fills_as_the_reference(seed):
    rng = np.random.default_rng(300 + seed)
    st = ClusterState(_topology(rng, 40))
    _load(st, rng, 0.6)
    for k in range(30):
        job = _job(rng, k)
        # coarse scores make ties across racks and inside them
        scores = np.round(rng.normal(size=len(st.free)), 1)
        for w in (None, 0, 1, 2, 7):
            assert rack_first_fill(job, st, scores, w) == _rack_first_fill(job, st, scores, w)


def test_placement_on_a_cluster_above_the_smoothing_limit_skips_smoothing():
    st = ClusterState(Topology.uniform(6, 8, racks=2))
    small = DASAgentPlacement(max_smooth_nodes=4)
    ref = ReferenceDASAgentPlacement(max_smooth_nodes=4)
    job = JobView("a", 0.0, gpus_per_worker=2, workers=3)
    np.testing.assert_allclose(small.node_scores(job, st), ref.node_scores(job, st), atol=1e-12)
    assert small.place(job, st) == ref.place(job, st)
