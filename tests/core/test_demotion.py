"""The adaptive demotion threshold (core/demotion.py): exact quantiles of the service of
the jobs that left, learnt call by call from what the allocator is shown, never from an
oracle; the goodput allocator's order follows it, and its default is unchanged."""

from dataclasses import replace

import pytest

from rlsched.core.demotion import ServiceThreshold, service_quantile
from rlsched.core.goodput_allocator import GoodputAllocator
from rlsched.core.live_allocation import make_live_allocator
from rlsched.core.ordering import POLLUX_THRESHOLD
from rlsched.sim import evaluate as ev

from .test_goodput_allocator import decide, make_job, nodes_of


class Forbidden:
    def __getattribute__(self, name):
        raise AssertionError(f"the demotion threshold read the oracle's {name}")


@pytest.mark.parametrize("q, want", [(0.1, 100.0), (0.5, 300.0), (0.8, 400.0), (0.81, 500.0), (1.0, 500.0)])
def test_the_threshold_is_the_quantile_of_the_finished_jobs_service(q, want):
    """Five jobs that had service (one that never ran counts for nothing): the smallest
    value whose empirical CDF reaches q."""
    assert service_quantile([500.0, 100.0, 0.0, 400.0, 200.0, 300.0], q, 7.0, 5) == want


def test_the_prior_holds_until_enough_jobs_had_service():
    assert service_quantile([500.0, 100.0, 0.0, 400.0, 200.0, 300.0], 0.5, 7.0, 6) == 7.0
    assert service_quantile([], 0.5, 7.0, 1) == 7.0


def test_the_jobs_still_there_count_as_censored():
    """Kaplan-Meier: 100 ends (1 of 3 at risk: CDF 1/3), 150 is still running, 200 ends
    (1 of 1 at risk: CDF 1). The median is 200, not the 100 of the jobs that ended
    alone; where the CDF never reaches q, the largest service seen or the prior."""
    assert service_quantile([100.0, 200.0], 0.5, 7.0, 2) == 100.0
    assert service_quantile([100.0, 200.0], 0.5, 7.0, 2, running=[150.0, 0.0]) == 200.0
    assert service_quantile([100.0], 0.9, 7.0, 1, running=[150.0, 300.0]) == 300.0
    assert service_quantile([100.0], 0.9, 1000.0, 1, running=[150.0, 300.0]) == 1000.0


def test_it_learns_the_service_of_the_jobs_that_leave_between_calls():
    """a (100 GPU-s, 2 GPUs) and b (50, waiting) leave between t=0 and t=10: they ran at
    most until t=10, 120 and 50, with c (310) still there: CDF 1/3 at 50, 2/3 at 120;
    c leaves between t=10 (310, 1 GPU) and t=40: 340."""
    th = ServiceThreshold(0.5, 1000.0, min_jobs=2)
    a = make_job("a", attained=100.0, alloc=(0, 0))
    b = make_job("b", attained=50.0)
    c = make_job("c", attained=300.0, alloc=(1,))
    assert th.update([a, b, c], 0.0) == 1000.0
    assert th.update([replace(c, attained_service=310.0)], 10.0) == 120.0
    assert sorted(th.finished) == [50.0, 120.0]
    assert th.update([], 40.0) == 120.0
    assert sorted(th.finished) == [50.0, 120.0, 340.0]


def test_it_reads_no_oracle():
    jobs = [make_job("a", attained=100.0, alloc=(0, 0)), make_job("b", attained=50.0),
            make_job("c", attained=300.0, alloc=(1,))]
    spied = [replace(j, oracle=Forbidden()) for j in jobs]
    plain, watched = ServiceThreshold(0.5, 1000.0, min_jobs=1), ServiceThreshold(0.5, 1000.0, min_jobs=1)
    for t, k in ((0.0, 3), (10.0, 1), (20.0, 0)):
        assert plain.update(jobs[:k], t) == watched.update(spied[:k], t)
    alloc = GoodputAllocator(adaptive=0.5, adaptive_jobs=1)
    for t, k in ((0.0, 3), (10.0, 1), (20.0, 0)):
        decide(spied[:k] + [replace(make_job("new", submit=5.0), oracle=Forbidden())], nodes_of(2, 2), alloc, now=t)
    assert alloc.queue_threshold == plain.value == 120.0


def test_the_allocator_demotes_at_the_learnt_threshold_and_not_by_default():
    """Two jobs leave after 100 and 300 GPU-s while an old job holds 200: at q = 0.3 the
    threshold is 100, so the old job yields its one GPU to a newcomer; at the default
    (16 GPU-hours) it keeps it."""
    old = make_job("old", submit=0.0, attained=200.0, alloc=(0,), max_replicas=1)
    new = make_job("new", submit=9.0, max_replicas=1)
    gone = [make_job("x", attained=100.0), make_job("y", attained=300.0)]
    adaptive, fixed = GoodputAllocator(adaptive=0.3, adaptive_jobs=2), GoodputAllocator()
    for a in (adaptive, fixed):
        decide(gone + [old], nodes_of(1), a, now=0.0)
    assert adaptive.queue_threshold == fixed.queue_threshold == POLLUX_THRESHOLD  # nobody left yet
    assert {k: a.replicas for k, a in decide([old, new], nodes_of(1), adaptive, now=10.0).items()} == {"old": 0, "new": 1}
    assert {k: a.replicas for k, a in decide([old, new], nodes_of(1), fixed, now=10.0).items()} == {"old": 1, "new": 0}
    assert adaptive.queue_threshold == 100.0 and fixed.queue_threshold == POLLUX_THRESHOLD
    assert fixed.demotion is None and fixed.threshold == POLLUX_THRESHOLD


def test_named_as_an_option_and_runnable_on_every_suite():
    a = make_live_allocator("goodput@adaptive=0.8,adaptive_jobs=5")
    assert (a.demotion.q, a.demotion.min_jobs, a.queue_threshold) == (0.8, 5, POLLUX_THRESHOLD)
    for suite in ("alibaba", "synthetic", "pollux"):
        [pol] = ev.check_pool(["goodput-rlpto@adaptive=0.8/das"], ev.SUITES[suite])
        assert pol.allocator == "goodput-rlpto@adaptive=0.8" and pol.placement == "das"
    for bad in ({"adaptive": 1.5}, {"adaptive": -0.1}, {"adaptive": 0.5, "adaptive_jobs": 0}):
        with pytest.raises(ValueError):
            GoodputAllocator(**bad)
