"""Scalings: hand cases and the bounds every scaling keeps."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.core import SCALINGS, ClusterState, JobView, Progress, Topology, make_scaling
from rlsched.core.heuristics import FairShare, FirstFit, Optimus

NAMES = ("none", "fs", "fcfs", "optimus", "beta")


def running(state, *jobs):
    for j in jobs:
        state.allocate_job(j, j.placement)
        state.running[j.id] = j
    return list(jobs)


def ej(jid, submit, workers, node=0, max_workers=8, min_workers=1, **kw):
    return JobView(jid, submit, workers=workers, min_workers=min_workers, max_workers=max_workers,
                   placement=[node] * workers, **kw)


def test_registry_has_every_scaling():
    assert set(NAMES) <= set(SCALINGS)


def test_fair_share_spreads_free_gpus():
    s = ClusterState(Topology.uniform(1, 8))
    jobs = running(s, ej("a", 0, 2), ej("b", 1, 1))  # 5 free -> targets 4 and 4
    assert FairShare.targets(jobs, 8) == {"a": 4, "b": 4}
    assert make_scaling("fs").decide(jobs, s) == {"a": 1, "b": 1}


def test_fair_share_takes_from_the_largest_only_when_needed():
    s = ClusterState(Topology.uniform(1, 8))
    jobs = running(s, ej("a", 0, 6), ej("b", 1, 2))  # full; fair is 4 / 4
    assert make_scaling("fs").decide(jobs, s) == {"a": -1, "b": 1}
    s2 = ClusterState(Topology.uniform(1, 8))
    jobs2 = running(s2, ej("a", 0, 6), ej("b", 1, 2, max_workers=2))  # b cannot grow
    assert make_scaling("fs").decide(jobs2, s2) == {}


def test_fcfs_gives_spare_to_the_earliest():
    s = ClusterState(Topology.uniform(1, 4))
    jobs = running(s, ej("late", 5, 1), ej("early", 1, 2))  # 1 GPU free
    assert make_scaling("fcfs").decide(jobs, s) == {"early": 1}
    s.release(0, 1)  # 2 free: both grow, one worker each at most
    assert make_scaling("fcfs").decide(jobs, s) == {"early": 1, "late": 1}


def test_optimus_marginal_gain():
    opt = Optimus(comm_overhead=0.02)
    # s(w) = 1 / (1/w + 0.02 (w - 1)): s(9) = 3.689, s(10) = 3.571 -> the 10th worker hurts
    s = ClusterState(Topology.uniform(2, 8))
    big = ej("big", 0, 10, max_workers=12, remaining=100.0)
    big.placement = [0] * 8 + [1] * 2
    small = ej("small", 1, 2, node=1, remaining=100.0)
    tiny = ej("tiny", 2, 2, node=1, remaining=1.0)
    jobs = running(s, big, small, tiny)  # 2 GPUs free on node 1
    assert opt.remaining_at(big, 9) < opt.remaining_at(big, 10)
    expected_gain = 100.0 * (1 - (1 / (1 / 2 + 0.02)) / (1 / (1 / 3 + 0.04)))
    assert opt.gain(small) == pytest.approx(expected_gain)
    # big gives one back (3 free now); small and tiny gain, small more
    assert opt.decide(jobs, s) == {"big": -1, "small": 1, "tiny": 1}
    s.allocate(1, 2)  # only big's freed GPU is left: the largest gain takes it
    assert opt.decide(jobs, s) == {"big": -1, "small": 1}


def test_beta_threshold():
    s = ClusterState(Topology.uniform(1, 8))
    slow = ej("slow", 0, 3, progress=Progress(history=[0.80, 0.8005]), beta=0.001)
    done = ej("done", 1, 1, progress=Progress(history=[0.9, 0.9]), beta=0.001)  # at min
    fast = ej("fast", 2, 2, progress=Progress(history=[0.5, 0.6]), beta=0.001)
    full = ej("full", 3, 2, max_workers=2, progress=Progress(history=[0.1, 0.3]))
    jobs = running(s, slow, done, fast, full)  # 8 GPUs all taken
    # fast gets the GPU slow gives back; nothing else is free
    assert make_scaling("beta").decide(jobs, s) == {"slow": -1, "fast": 1}
    fresh = ej("fresh", 4, 1)  # fewer than two evaluations: gain = inf, served first
    s2 = ClusterState(Topology.uniform(1, 8))
    jobs2 = running(s2, fast, fresh)  # 5 free
    assert make_scaling("beta").decide(jobs2, s2) == {"fast": 1, "fresh": 1}
    s2.allocate(0, 4)  # 1 free: the most-gaining (fresh, inf) takes it
    assert make_scaling("beta").decide(jobs2, s2) == {"fresh": 1}


def test_none_never_changes():
    s = ClusterState(Topology.uniform(1, 8))
    assert make_scaling("none").decide(running(s, ej("a", 0, 1)), s) == {}


@st.composite
def clusters(draw):
    nodes = draw(st.integers(1, 4))
    gpn = draw(st.sampled_from([2, 4, 8]))
    s = ClusterState(Topology.uniform(nodes, gpn))
    jobs = []
    for k in range(draw(st.integers(0, 6))):
        g = draw(st.integers(1, 2))
        lo = draw(st.integers(1, 3))
        hi = draw(st.integers(lo, 6))
        w = draw(st.integers(lo, hi))
        j = JobView(f"j{k}", float(draw(st.integers(0, 9))), gpus_per_worker=g, workers=w, min_workers=lo,
                    max_workers=hi, remaining=float(draw(st.integers(0, 500))),
                    progress=Progress(history=draw(st.lists(st.floats(0, 1), max_size=3))),
                    beta=draw(st.sampled_from([0.0, 0.01, 0.5])))
        plan = FirstFit().place(j, s)
        if plan is None:
            continue
        j.placement = plan
        s.allocate_job(j, plan)
        s.running[j.id] = j
        jobs.append(j)
    return s, jobs


@settings(max_examples=150, deadline=None)
@given(scene=clusters(), name=st.sampled_from(NAMES))
def test_scaling_bounds_and_capacity(scene, name):
    s, jobs = scene
    free_before = s.free.copy()
    out = make_scaling(name).decide(jobs, s)
    np.testing.assert_array_equal(s.free, free_before)  # decide() leaves the state alone
    by_id = {j.id: j for j in jobs}
    assert set(out) <= set(by_id)
    for jid, d in out.items():
        j = by_id[jid]
        assert d in (-1, 1)
        assert j.min_workers <= j.workers + d <= j.max_workers
    # applying -1 (last worker) then +1 never over-allocates
    for jid, d in out.items():
        if d < 0:
            j = by_id[jid]
            s.release(j.placement[-1], j.gpus_per_worker)
    for jid, d in out.items():
        if d > 0:
            j = by_id[jid]
            i = FirstFit().place(j, s, workers=1)
            assert i is not None, (name, out)
            s.allocate(i[0], j.gpus_per_worker)
