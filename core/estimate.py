"""Non-clairvoyant run-time estimates: the remaining time a live operator can know.

Policies never see a job's true run time (``../shared/DESIGN.md``). What a
live operator knows of how long a job still needs is

* the user's estimate of its run time, only where the job spec gives one
  (TrainingJob ``spec.estimatedRuntime``; a trace job's estimate), and
* the job's reported progress: ``epoch`` evaluations done out of at most
  ``maxEpochs``, and how long the job has run (``ran``, seconds it has held its
  workers, summed over its runs, restart pauses included).

:func:`estimate_remaining` turns these into one number, the same rule wherever a
:class:`~rlsched.core.cluster.JobView` is built — by the simulator
(``rlsched.sim.engine``) and by the planning layer the operator runs
(:meth:`~rlsched.core.planning.TrainingSpec.view`)::

    by_user     = estimate − ran                          if estimate > ran
    by_progress = (max_epochs − epoch) × ran / epoch      if 1 <= epoch < max_epochs
    remaining   = min(by_user, by_progress)   both known
                = the one known               one known
                = 0 (unknown)                 neither

``by_progress`` is the epochs left to the cap at the observed mean seconds per epoch;
the cap is an upper bound (a job whose accuracy converges, RLPTO's β stop, ends
earlier), so when the user's estimate is also there the smaller of the two is taken —
the earliest the job can be expected to end by either account. An estimate the job has
already outrun says nothing any more. Worker changes are not modelled: the mean
seconds per epoch averages over every size the job ran at.

``0`` means *unknown*, the convention of ``JobView.remaining`` and
``JobView.est_runtime``; orderings that sort by a duration put unknown durations
after every known one (:func:`duration_key`): a job nobody can estimate is treated as
long, as batch schedulers treat a job without a time limit.
"""

from __future__ import annotations

import math

__all__ = ["estimate_remaining", "duration_key"]


def estimate_remaining(estimate: float, ran: float, epoch: float, max_epochs: int) -> float:
    """Seconds the job still needs by the rule of the module docstring; 0 = unknown.

    ``estimate``: the user's run-time estimate in seconds (0 or less: none);
    ``ran``: seconds the job has run so far; ``epoch``: epochs done (evaluations
    reported, or the scale-invariant epochs when the trainer reports them);
    ``max_epochs``: the spec's cap on them (0: the job reports no epochs)."""
    ran = max(float(ran), 0.0) if math.isfinite(ran) else 0.0
    by_user = estimate - ran if estimate > 0 and math.isfinite(estimate) and estimate > ran else None
    by_progress = None
    if 1 <= epoch < max_epochs and ran > 0:
        by_progress = (max_epochs - epoch) * ran / epoch
    if by_user is not None and by_progress is not None:
        return min(by_user, by_progress)
    if by_user is not None:
        return by_user
    if by_progress is not None:
        return by_progress
    return 0.0


def duration_key(seconds: float) -> tuple[int, float]:
    """Sort key of a duration where ``0`` (or less) means unknown: known durations
    ascending, then every unknown one (ties among those left to the caller's next key)."""
    return (0, seconds) if seconds > 0 else (1, 0.0)
