"""The job lifecycle by its workers' exits: success, failure with backoff, restarts.

Only the current generation's workers are judged (:func:`judge`: success by
``successPolicy``, failure counted against ``backoffLimit``, a disruption restarting at
once); the workers the operator stopped are judged apart and never counted
(:func:`judge_stop`: a clean or an unclean stop). Pure: the operator translates pods
into :class:`WorkerState`. The rules and crash safety: docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .contract import EXIT_CHECKPOINT, EXIT_SIGTERM, SUCCESS_POLICIES

__all__ = ["WorkerState", "Verdict", "judge", "backoff_s", "BACKOFF_BASE_S", "BACKOFF_CAP_S",
           "NONE", "SUCCEED", "FAIL", "RESTART", "StopVerdict", "judge_stop", "CLEAN_STOP_EXITS"]

#: batch/v1 Job's pod-failure backoff: 10 s, doubled per failure, at most 6 minutes
BACKOFF_BASE_S = 10.0
BACKOFF_CAP_S = 360.0

NONE, SUCCEED, FAIL, RESTART = "none", "succeed", "fail", "restart"
#: the exits of a worker stopped with SIGTERM that are clean: saved and exited, or ended
#: by the signal
CLEAN_STOP_EXITS = (0, EXIT_SIGTERM)


@dataclass(frozen=True, slots=True)
class WorkerState:
    """What the lifecycle reads of one worker pod."""

    name: str
    index: int
    generation: int
    #: the pod phase: Pending, Running, Succeeded, Failed (Unknown counts as running)
    phase: str
    #: the worker container's exit code once it terminated
    exit_code: int | None = None
    #: the operator asked it to stop (the pod has a deletionTimestamp)
    stopping: bool = False
    #: someone else evicted or preempted it (condition DisruptionTarget)
    disrupted: bool = False
    #: the number of workers of the generation it was created for (None: unknown)
    gang_size: int | None = None

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def succeeded(self) -> bool:
        return self.phase == "Succeeded" and self.exit_code in (None, 0)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the lifecycle asks for; ``count`` says whether it is a failure counted
    against the backoff limit, ``failures`` the count after it."""

    action: str = NONE
    reason: str = ""
    message: str = ""
    worker: str | None = None
    exit_code: int | None = None
    count: bool = False
    failures: int = 0
    backoff_s: float = 0.0


def backoff_s(failures: int, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S) -> float:
    """Delay before the generation after the ``failures``-th failure starts:
    ``base * 2**(failures-1)``, at most ``cap`` (0 before any failure)."""
    if failures <= 0:
        return 0.0
    return min(cap, base * 2.0 ** min(failures - 1, 32))


def judge(
    workers: Iterable[WorkerState],
    *,
    generation: int,
    target: int,
    running: bool,
    success_policy: str = "Chief",
    failures: int = 0,
    backoff_limit: int = 6,
    checkpoint: str | None = None,
) -> Verdict:
    """The verdict on the current ``generation`` of a job that should have ``target``
    workers. ``running``: the generation had started (every worker was created and the
    job is Running), so a worker gone without an exit is a disruption; while the gang
    is still being created a missing worker is only not created yet. ``checkpoint``:
    the job's checkpoint directory, named in the message of an exit 74."""
    if success_policy not in SUCCESS_POLICIES:
        raise ValueError(f"success policy {success_policy!r} is not one of {SUCCESS_POLICIES}")
    current = {w.index: w for w in workers if w.generation == generation and not w.stopping}
    # a failure outranks a success seen in the same cycle: the job did not finish cleanly
    for i in sorted(current):
        w = current[i]
        if w.phase != "Failed" or w.succeeded:
            continue
        code = w.exit_code
        if w.disrupted:
            return Verdict(RESTART, "WorkerDisrupted",
                           f"worker {w.name} was evicted (exit code {code}); generation {generation} restarts",
                           worker=w.name, exit_code=code, failures=failures)
        n = failures + 1
        what = f"worker {w.name} exited with code {code}" if code is not None else f"worker {w.name} failed"
        if code == EXIT_SIGTERM:
            what += " (SIGTERM, not sent by rlsched)"
        elif code == EXIT_CHECKPOINT:
            where = f" in {checkpoint}" if checkpoint else ""
            what += (f" (its checkpoint{where} is unusable: the directory is missing or not writable, or the "
                     "checkpoint is missing, of an unknown format or fails its checksum; see the worker's log)")
        if n > backoff_limit:
            return Verdict(FAIL, "BackoffLimitExceeded",
                           f"{what}; {n} unexpected failures, more than backoffLimit {backoff_limit}",
                           worker=w.name, exit_code=code, count=True, failures=n)
        wait = backoff_s(n)
        return Verdict(RESTART, "CheckpointFailed" if code == EXIT_CHECKPOINT else "WorkerFailed",
                       f"{what}; failure {n} of backoffLimit {backoff_limit}, generation {generation + 1} "
                       f"starts in {wait:.0f}s", worker=w.name, exit_code=code, count=True, failures=n,
                       backoff_s=wait)
    chief = current.get(0)
    if success_policy == "Chief" and chief is not None and chief.succeeded:
        return Verdict(SUCCEED, "ChiefSucceeded", f"worker {chief.name} (the chief) exited 0",
                       worker=chief.name, exit_code=0, failures=failures)
    if success_policy == "AllWorkers" and target > 0 and all(
            i in current and current[i].succeeded for i in range(target)):
        return Verdict(SUCCEED, "AllWorkersSucceeded", f"all {target} workers exited 0", exit_code=0,
                       failures=failures)
    if running:
        # the generation's own size (its pods say how many they were created for): a
        # target that changed without a new generation is a rescale, not a loss
        sizes = [w.gang_size for w in current.values() if w.gang_size]
        size = max(sizes) if sizes else target
        gone = [i for i in range(size) if i not in current]
        if gone:
            return Verdict(RESTART, "WorkerLost",
                           f"worker {gone[0]} of generation {generation} is gone without an exit; "
                           f"generation {generation + 1} starts", failures=failures)
    return Verdict(failures=failures)


@dataclass(frozen=True, slots=True)
class StopVerdict:
    """How a worker the operator stopped with SIGTERM exited: ``clean`` (0 or 143) or
    not; never counted against the backoff limit."""

    clean: bool
    reason: str
    message: str
    worker: str
    exit_code: int
    generation: int


def judge_stop(w: WorkerState, *, generation: int, active: bool) -> StopVerdict | None:
    """The exit of ``w`` if it is a worker stopped with the agreed SIGTERM and it has
    exited: being deleted, of an ended generation (below ``generation``) or of a job no
    longer ``active`` (finished). The caller passes only workers deleted with a grace
    period (the operator lets go of those it deletes at once: already exited, or
    killed). None for anything else: a worker still running, one of the running
    generation deleted by someone else (:func:`judge` reads that as a disruption), one
    that left no exit code."""
    if not (w.stopping and w.finished) or (active and w.generation == generation):
        return None
    code = 0 if w.exit_code is None and w.phase == "Succeeded" else w.exit_code
    if code is None or code < 0:
        return None
    if code in CLEAN_STOP_EXITS:
        return StopVerdict(True, "StoppedCleanly", f"worker {w.name} of generation {w.generation} exited {code} "
                           f"after the SIGTERM stop", w.name, code, w.generation)
    if code == EXIT_CHECKPOINT:
        why = "its checkpoint could not be saved (exit code 74); the next generation resumes from an older one"
    elif code == 137:
        why = "it was killed after the grace period (exit code 137): its checkpoint may not be saved"
    else:
        why = f"it exited with code {code}: its checkpoint may not be saved"
    return StopVerdict(False, "CheckpointNotSaved" if code == EXIT_CHECKPOINT else "ExitAfterStop",
                       f"worker {w.name} of generation {w.generation} was stopped with SIGTERM and {why}; "
                       f"not counted as a failure", w.name, code, w.generation)
