"""core.lifecycle: the verdict on a generation's worker exits, with exact answers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlsched.core.lifecycle import FAIL, NONE, RESTART, SUCCEED, WorkerState, backoff_s, judge


def w(index, phase="Running", code=None, gen=0, stopping=False, disrupted=False):
    return WorkerState(name=f"j-worker-{index}", index=index, generation=gen, phase=phase, exit_code=code,
                       stopping=stopping, disrupted=disrupted)


def test_chief_exit_zero_succeeds_the_job_even_with_workers_running():
    v = judge([w(0, "Succeeded", 0), w(1), w(2)], generation=0, target=3, running=True)
    assert (v.action, v.reason, v.worker, v.count) == (SUCCEED, "ChiefSucceeded", "j-worker-0", False)


def test_a_worker_done_before_the_chief_is_not_an_event():
    v = judge([w(0), w(1, "Succeeded", 0)], generation=0, target=2, running=True)
    assert v.action == NONE


def test_all_workers_policy_waits_for_every_worker():
    ws = [w(0, "Succeeded", 0), w(1)]
    assert judge(ws, generation=0, target=2, running=True, success_policy="AllWorkers").action == NONE
    ws[1] = w(1, "Succeeded", 0)
    v = judge(ws, generation=0, target=2, running=True, success_policy="AllWorkers")
    assert (v.action, v.reason) == (SUCCEED, "AllWorkersSucceeded")


def test_failure_restarts_with_backoff_until_the_limit_then_fails_with_the_exit_code():
    ws = [w(0), w(1, "Failed", 3)]  # generation 0
    v = judge([w(0, gen=4), w(1, "Failed", 3, gen=4)], generation=4, target=2, running=True, failures=0, backoff_limit=2)
    assert (v.action, v.count, v.failures, v.exit_code, v.backoff_s) == (RESTART, True, 1, 3, 10.0)
    assert "exited with code 3" in v.message and "failure 1 of backoffLimit 2" in v.message
    v = judge([w(0, gen=4), w(1, "Failed", 3, gen=4)], generation=4, target=2, running=True, failures=1, backoff_limit=2)
    assert (v.action, v.failures, v.backoff_s) == (RESTART, 2, 20.0)
    v = judge([w(0, gen=4), w(1, "Failed", 3, gen=4)], generation=4, target=2, running=True, failures=2, backoff_limit=2)
    assert (v.action, v.reason, v.failures, v.exit_code) == (FAIL, "BackoffLimitExceeded", 3, 3)
    assert "code 3" in v.message
    assert ws  # the same workers, judged at another generation, are old: nothing
    assert judge(ws, generation=5, target=2, running=False).action == NONE


def test_backoff_limit_zero_fails_on_the_first_failure():
    v = judge([w(0, "Failed", 1)], generation=0, target=1, running=True, backoff_limit=0)
    assert (v.action, v.failures) == (FAIL, 1)


def test_intentional_stops_and_old_generations_are_never_counted():
    ws = [
        w(0, "Failed", 143, gen=2),  # an old generation's worker, SIGTERMed by a rescale
        w(1, "Failed", 1, gen=2),  # an old generation's worker that crashed while stopping
        w(0, "Failed", 143, gen=3, stopping=True),  # being stopped by the operator
        w(1, "Succeeded", 0, gen=3, stopping=True),
    ]
    v = judge(ws, generation=3, target=2, running=False)
    assert v.action == NONE and v.failures == 0


def test_eviction_restarts_without_counting():
    v = judge([w(0), w(1, "Failed", 137, disrupted=True)], generation=0, target=2, running=True, failures=4)
    assert (v.action, v.reason, v.count, v.failures) == (RESTART, "WorkerDisrupted", False, 4)


def test_a_lost_worker_restarts_a_started_generation_but_not_one_being_created():
    ws = [w(0), w(1, stopping=True)]  # worker 1 deleted by someone else
    v = judge(ws, generation=0, target=3, running=True)
    assert (v.action, v.reason, v.count) == (RESTART, "WorkerLost", False)
    assert judge(ws, generation=0, target=3, running=False).action == NONE


def test_sigterm_not_sent_by_rlsched_is_a_failure():
    v = judge([w(0, "Failed", 143)], generation=0, target=1, running=True)
    assert v.action == RESTART and v.count and "not sent by rlsched" in v.message


def test_failure_outranks_a_success_in_the_same_cycle():
    v = judge([w(0, "Succeeded", 0), w(1, "Failed", 2)], generation=0, target=2, running=True)
    assert v.action == RESTART and v.count


def test_unknown_success_policy_is_refused():
    with pytest.raises(ValueError, match="success policy"):
        judge([], generation=0, target=1, running=False, success_policy="Any")


def test_backoff_doubles_from_ten_seconds_up_to_six_minutes():
    assert [backoff_s(n) for n in range(0, 8)] == [0.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 360.0]
    assert backoff_s(10_000) == 360.0


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
                          st.sampled_from([None, 0, 1, 143]), st.integers(0, 2), st.booleans()), max_size=8),
       st.integers(0, 2), st.integers(0, 5), st.integers(0, 5))
def test_only_current_unstopped_workers_decide_and_failures_never_decrease(raw, gen, failures, limit):
    ws = [w(i, ph, c if ph in ("Succeeded", "Failed") else None, g, stop) for i, ph, c, g, stop in raw]
    v = judge(ws, generation=gen, target=4, running=False, failures=failures, backoff_limit=limit)
    assert v.failures == failures + (1 if v.count else 0)
    relevant = [x for x in ws if x.generation == gen and not x.stopping]
    if not any(x.finished for x in relevant):
        assert v.action == NONE
    if v.action == FAIL:
        assert v.failures > limit
