"""When an allocation policy decides: on events, at most every ``gap``, and on an interval.

A job that arrives or a GPU that frees is acted on at once, not at the next interval
tick; a burst of such events within ``gap`` seconds makes one decision at its end; and
the policy also decides every ``interval`` to act on what jobs reported since. The
operator and both simulator engines ask this one rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DecisionClock"]


@dataclass(frozen=True)
class DecisionClock:
    """``gap``: least seconds between two decisions taken on events (0: every event
    time); ``interval``: seconds after which a decision is taken with no event."""

    gap: float = 30.0
    interval: float = 300.0

    def __post_init__(self) -> None:
        if not (self.gap >= 0 and self.interval > 0) or math.isnan(self.interval):
            raise ValueError(f"a decision clock needs gap >= 0 and interval > 0, got {self.gap}, {self.interval}")

    def next_due(self, last: float | None, now: float, changed: bool) -> float:
        """When the next decision is due, seen at ``now`` after the decision at ``last``
        (``None``: none yet) with (``changed``) or without an event since: ``<= now``
        means decide now."""
        if last is None:
            return now
        if changed:
            return max(now, last + self.gap)
        return last + self.interval
