"""A two-queue demotion threshold that follows the workload, learnt online.

Tiresias (Gu et al., NSDI'19, §3.2 and §4) sets its queue thresholds from the
distribution of past jobs' attained service. :class:`ServiceThreshold` learns that
distribution from what a live scheduler sees: the attained GPU-seconds of the jobs that
have left the allocator's view (completed, failed or deleted); the threshold is a
quantile of it, and a fixed prior until enough jobs have left. Never clairvoyant.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

from .allocation import AllocJob

__all__ = ["service_quantile", "ServiceThreshold"]


def service_quantile(finished: Sequence[float], q: float, prior: float, min_jobs: int) -> float:
    """The ``q``-quantile of ``finished`` (GPU-seconds of the jobs that left; the
    smallest value whose empirical CDF reaches ``q``), or ``prior`` while fewer than
    ``min_jobs`` of them had any service."""
    served = sorted(s for s in finished if s > 0)
    if not served or len(served) < min_jobs:
        return float(prior)
    return float(served[min(max(math.ceil(q * len(served)) - 1, 0), len(served) - 1)])


class ServiceThreshold:
    """The demotion threshold of one run, from the jobs it was shown call by call.

    A job shown at one call and absent at the next has left; its service is what it had
    attained plus the GPUs it held times the time between the two calls (it ran at most
    until the second). The ``window`` most recent are kept."""

    def __init__(self, q: float, prior: float, *, min_jobs: int = 20, window: int = 1000) -> None:
        if not (0 < q <= 1):
            raise ValueError(f"the demotion quantile must be in (0, 1], got {q}")
        if not (math.isfinite(prior) and prior > 0):
            raise ValueError(f"the prior threshold must be > 0 GPU-seconds, got {prior}")
        if min_jobs < 1 or window < min_jobs:
            raise ValueError(f"need 1 <= min_jobs <= window, got min_jobs={min_jobs}, window={window}")
        self.q, self.prior, self.min_jobs = float(q), float(prior), int(min_jobs)
        self.finished: deque[float] = deque(maxlen=int(window))
        self._shown: dict[str, tuple[float, int]] = {}
        self._then: float | None = None
        self.value = self.prior

    def update(self, jobs: Sequence[AllocJob], now: float) -> float:
        """Fold in the jobs that left since the last call; the threshold now."""
        elapsed = 0.0 if self._then is None else max(now - self._then, 0.0)
        shown = {j.id: (max(j.attained_service, 0.0), len(j.allocation)) for j in jobs}
        left = [s + k * elapsed for jid, (s, k) in self._shown.items() if jid not in shown]
        if left:
            self.finished.extend(left)
            self.value = service_quantile(self.finished, self.q, self.prior, self.min_jobs)
        self._shown, self._then = shown, now
        return self.value
