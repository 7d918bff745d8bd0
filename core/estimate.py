"""Non-clairvoyant run-time estimates: the remaining time a live operator can know.

:func:`estimate_remaining` combines the user's estimate (where the spec gives one) with
the job's reported progress (epochs of ``maxEpochs``, time run) into one number, the
same rule wherever a :class:`~rlsched.core.cluster.JobView` is built; ``0`` means
unknown and sorts after every known duration (:func:`duration_key`).
The rule and its reasons: docs/design-notes.md.
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
