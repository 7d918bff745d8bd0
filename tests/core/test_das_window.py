"""The DAS agents' window of pending jobs (core.das_agent.select_window)."""

from __future__ import annotations

import pytest

from rlsched.core import ClusterState, JobView, Topology
from rlsched.core.das_agent import DASOrdering, select_window


def _state(gpus_free: int = 8) -> ClusterState:
    st = ClusterState(Topology.uniform(1, 8))
    if gpus_free < 8:
        st.allocate(0, 8 - gpus_free)
    return st


def _jobs(n: int) -> list[JobView]:
    # job k arrives at k; run time falls with k, so the newest jobs are the shortest
    return [JobView(f"j{k:02d}", float(k), est_runtime=1000.0 - k) for k in range(n)]


def test_oldest_window_is_the_fifo_head():
    jobs = _jobs(10)[::-1]
    assert [j.id for j in select_window(jobs, _state(), 4, "oldest")] == ["j00", "j01", "j02", "j03"]


def test_mixed_window_is_half_oldest_half_shortest_listed_oldest_first():
    jobs = _jobs(20)
    got = [j.id for j in select_window(jobs[::-1], _state(), 6, "mixed")]
    assert got == ["j00", "j01", "j02", "j17", "j18", "j19"]
    # an odd window gives the extra slot to the oldest jobs
    assert [j.id for j in select_window(jobs, _state(), 5, "mixed")] == ["j00", "j01", "j02", "j18", "j19"]
    # a queue no longer than the window is the whole queue, oldest first
    assert [j.id for j in select_window(jobs[:4][::-1], _state(), 6, "mixed")] == ["j00", "j01", "j02", "j03"]


def test_mixed_window_prefers_short_jobs_that_fit_now():
    jobs = _jobs(10)
    # the shortest job asks for more GPUs than are free: it yields its slot
    jobs[9] = JobView("j09", 9.0, gpus_per_worker=4, est_runtime=1.0)
    got = [j.id for j in select_window(jobs, _state(gpus_free=2), 4, "mixed")]
    assert got == ["j00", "j01", "j07", "j08"]


def test_unknown_window_mode_is_an_error():
    with pytest.raises(ValueError, match="window_select"):
        select_window(_jobs(3), _state(), 2, "newest")


def test_das_ordering_ranks_every_pending_job_exactly_once(tmp_path):
    # the fallback (no weights) keeps FIFO; with weights, the window comes first and
    # the jobs outside it follow in FIFO order, none lost or repeated
    from rlsched.core.das_agent import DEFAULT_WEIGHTS

    order = DASOrdering(DEFAULT_WEIGHTS)
    jobs = _jobs(40)[::-1]
    ranked = order.rank(jobs, _state())
    assert sorted(j.id for j in ranked) == sorted(j.id for j in jobs)
    assert len(ranked) == len(jobs)


def test_shortest_window_is_the_shortest_jobs_listed_oldest_first():
    jobs = _jobs(20)
    assert [j.id for j in select_window(jobs[::-1], _state(), 4, "shortest")] == ["j16", "j17", "j18", "j19"]
