"""The judgement of a stopped worker's exit, of a checkpoint failure and of the batch a
generation reports (core/lifecycle.py, core/contract.py)."""

import pytest

from rlsched.core.contract import EXIT_CHECKPOINT, judge_batch
from rlsched.core.lifecycle import RESTART, WorkerState, judge, judge_stop


def stopped(code, *, gen=1, phase="Failed", stopping=True):
    return WorkerState("j-worker-0", 0, gen, phase, exit_code=code, stopping=stopping)


@pytest.mark.parametrize("code, clean, reason", [
    (0, True, "StoppedCleanly"), (143, True, "StoppedCleanly"), (1, False, "ExitAfterStop"),
    (137, False, "ExitAfterStop"), (EXIT_CHECKPOINT, False, "CheckpointNotSaved")])
def test_an_ended_generations_exit_after_sigterm(code, clean, reason):
    v = judge_stop(stopped(code, phase="Succeeded" if code == 0 else "Failed"), generation=2, active=True)
    assert (v.clean, v.reason, v.exit_code, v.generation, v.worker) == (clean, reason, code, 1, "j-worker-0")
    assert "not counted" in v.message or clean
    if code == EXIT_CHECKPOINT:
        assert "checkpoint could not be saved" in v.message


def test_what_is_not_an_agreed_stop():
    # the running generation's worker deleted by someone else: judge() reads a disruption
    assert judge_stop(stopped(1, gen=2), generation=2, active=True) is None
    # ... but once the job has finished, its last generation's stop is judged
    assert judge_stop(stopped(1, gen=2), generation=2, active=False).clean is False
    assert judge_stop(stopped(None, phase="Running"), generation=2, active=True) is None  # still running
    assert judge_stop(stopped(-1), generation=2, active=True) is None  # never ran
    assert judge_stop(stopped(1, stopping=False), generation=2, active=True) is None


def test_checkpoint_exit_in_a_running_generation_is_a_counted_failure_naming_the_checkpoint():
    w = WorkerState("j-worker-1", 1, 3, "Failed", exit_code=EXIT_CHECKPOINT)
    v = judge([w], generation=3, target=2, running=True, failures=0, backoff_limit=6)
    assert (v.action, v.reason, v.count, v.failures, v.exit_code) == (RESTART, "CheckpointFailed", True, 1, 74)
    assert "checkpoint is unusable" in v.message
    v = judge([w], generation=3, target=2, running=True, failures=0, backoff_limit=6, checkpoint="/ckpt/j")
    assert "exited with code 74 (its checkpoint in /ckpt/j is unusable" in v.message
    v = judge([w], generation=3, target=2, running=True, failures=6, backoff_limit=6)
    assert v.reason == "BackoffLimitExceeded" and "checkpoint" in v.message


def test_batch_the_generation_reports_against_the_batch_set():
    assert judge_batch(96, {"generation": 2, "globalBatchSize": 96}, 2).followed is True
    off = judge_batch(96, {"generation": 2, "globalBatchSize": 32}, 2)
    assert off.followed is False and "reports global batch 32, rlsched set 96" in off.message
    assert judge_batch(96, {"generation": 1, "globalBatchSize": 32}, 2) is None  # an older generation's report
    assert judge_batch(None, {"generation": 2, "globalBatchSize": 32}, 2) is None  # no batch set
    assert judge_batch(96, {"generation": 2}, 2) is None
    assert judge_batch(96, {"generation": 2, "globalBatchSize": 96.0}, 2).followed is True
