"""core.estimate: the non-clairvoyant remaining-time rule, hand-computed."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlsched.core import ClusterState, JobView, Progress, Topology, make_ordering
from rlsched.core.estimate import duration_key, estimate_remaining
from rlsched.core.planning import TrainingSpec


@pytest.mark.parametrize(
    "estimate,ran,epoch,max_epochs,want",
    [
        (0.0, 0.0, 0, 0, 0.0),  # nothing known
        (3600.0, 0.0, 0, 100, 3600.0),  # not started: the user's estimate
        (3600.0, 600.0, 0, 100, 3000.0),  # no epoch yet: estimate less time run
        (3600.0, 3600.0, 0, 100, 0.0),  # outran its estimate, no epoch: unknown
        (3600.0, 5000.0, 0, 100, 0.0),
        # 10 of 30 epochs in 1200 s: 120 s per epoch, 20 left -> 2400 s; no estimate
        (0.0, 1200.0, 10, 30, 2400.0),
        # ... and an estimate of 2000 s: 800 s left by it, the smaller
        (2000.0, 1200.0, 10, 30, 800.0),
        # ... an estimate of 9000 s: 7800 s by it, 2400 s by progress
        (9000.0, 1200.0, 10, 30, 2400.0),
        # outran the estimate: progress alone (5 epochs left at 100 s)
        (1000.0, 2500.0, 25, 30, 500.0),
        (0.0, 1200.0, 30, 30, 0.0),  # at the cap: nothing left to estimate
        (0.0, 0.0, 3, 30, 0.0),  # epochs reported but no time run (a bad report)
        (-5.0, 100.0, 0, 0, 0.0),  # a negative estimate is none
        (math.inf, 100.0, 0, 0, 0.0),  # so is an infinite one
    ],
)
def test_estimate_remaining_hand_computed(estimate, ran, epoch, max_epochs, want):
    assert estimate_remaining(estimate, ran, epoch, max_epochs) == pytest.approx(want)


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.integers(0, 200), st.integers(0, 200))
def test_estimate_is_never_negative_and_never_above_either_bound(estimate, ran, epoch, max_epochs):
    r = estimate_remaining(estimate, ran, epoch, max_epochs)
    assert r >= 0 and math.isfinite(r)
    if estimate > ran:
        assert r <= estimate - ran + 1e-6
    if 1 <= epoch < max_epochs and ran > 0:
        assert r <= (max_epochs - epoch) * ran / epoch * (1 + 1e-12)


def test_duration_key_puts_unknown_last():
    assert sorted([0.0, 5.0, -1.0, 2.0], key=duration_key) == [2.0, 5.0, 0.0, -1.0]


def test_sjf_srtf_rank_unknown_durations_last_fifo_among_them():
    st_ = ClusterState(Topology.uniform(1, 8))
    jobs = [JobView("u1", 0.0), JobView("k9", 1.0, est_runtime=900.0), JobView("u2", 2.0),
            JobView("k1", 3.0, est_runtime=100.0)]
    for name in ("sjf", "srtf"):
        assert [j.id for j in make_ordering(name).rank(jobs, st_)] == ["k1", "k9", "u1", "u2"], name
    srtf = make_ordering("srtf")
    # an unknown remaining time never preempts; a known one beats an unknown
    assert not srtf.preempts(jobs[0], jobs[1], st_) and srtf.preempts(jobs[1], jobs[0], st_)
    assert not srtf.preempts(jobs[0], jobs[2], st_)


def test_the_operators_views_use_the_same_rule():
    """TrainingSpec.view (what the operator's planning builds) fills ``remaining``
    from the spec's estimate, the reported epochs and the time run."""
    spec = TrainingSpec(min_workers=1, max_workers=4, max_epochs=30, estimated_runtime=2000.0)
    v = spec.view("ns/a", submit_time=0.0, workers=2, priority=0.0, ran=1200.0,
                  progress=Progress(epoch=10, history=[0.1] * 10))
    assert (v.est_runtime, v.remaining) == (2000.0, pytest.approx(800.0))
    pending = spec.view("ns/a", submit_time=0.0, workers=1, priority=0.0)
    assert (pending.est_runtime, pending.remaining) == (2000.0, 2000.0)
    bare = TrainingSpec(min_workers=1, max_workers=1, max_epochs=30)
    v = bare.view("ns/b", submit_time=0.0, workers=1, priority=0.0, ran=1200.0, progress=Progress(epoch=10))
    assert (v.est_runtime, v.remaining) == (0.0, pytest.approx(2400.0))
