"""A two-queue demotion threshold that follows the workload, learnt online.

Tiresias (Gu et al., NSDI'19, §3.2 and §4) sets its queue thresholds from the
distribution of past jobs' attained service. :class:`ServiceThreshold` learns that
distribution from what a live scheduler sees: the attained GPU-seconds of the jobs that
have left the allocator's view (completed, failed or deleted), with the jobs still there
as censored observations (Kaplan & Meier, 1958); the threshold is a quantile of it, and
a fixed prior until enough jobs have left. Never clairvoyant.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Sequence

import numpy as np

from .allocation import AllocJob

__all__ = ["service_quantile", "ServiceThreshold"]


def service_quantile(finished: Sequence[float], q: float, prior: float, min_jobs: int,
                     running: Sequence[float] = ()) -> float:
    """The ``q``-quantile of the service (GPU-seconds) jobs need: the smallest service
    of a job that left (``finished``) at which the Kaplan–Meier estimate of its CDF
    reaches ``q``, the jobs still there (``running``: what they attained so far) counted
    as censored, so that the long jobs not yet finished are not left out; ``prior`` while
    fewer than ``min_jobs`` jobs with service have left. Where the estimate never
    reaches ``q``, the largest service seen, or ``prior`` if larger."""
    ends = np.asarray(finished, dtype=float)
    ends = ends[ends > 0]
    if len(ends) < max(min_jobs, 1):
        return float(prior)
    seen = np.asarray(running, dtype=float)
    seen = seen[seen > 0]
    values = np.concatenate([ends, seen])
    ended = np.concatenate([np.ones(len(ends), bool), np.zeros(len(seen), bool)])
    order = np.lexsort((~ended, values))  # by service; at a tie a job that ended first
    values, ended = values[order], ended[order]
    at_risk = len(values) - np.arange(len(values))
    cdf = 1.0 - np.cumprod(np.where(ended, 1.0 - 1.0 / at_risk, 1.0))
    hit = np.flatnonzero(ended & (cdf >= q - 1e-12))
    return float(values[hit[0]]) if len(hit) else max(float(prior), float(values[-1]))


class ServiceThreshold:
    """The demotion threshold of one run, from the jobs it was shown call by call.

    A job shown at one call and absent at the next has left; its service is what it had
    attained plus the GPUs it held times the time between the two calls (it ran at most
    until the second). The ``window`` most recent are kept; the jobs shown are the
    censored ones (:func:`service_quantile`)."""

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
        self._ends = np.zeros(0)  # ``finished`` as an array
        self.value = self.prior

    def update(self, jobs: Sequence[AllocJob], now: float) -> float:
        """Fold in the jobs that left since the last call; the threshold now."""
        elapsed = 0.0 if self._then is None else max(now - self._then, 0.0)
        shown = {j.id: (max(j.attained_service, 0.0), len(j.allocation)) for j in jobs}
        left = [s + k * elapsed for jid, (s, k) in self._shown.items() if jid not in shown]
        if left:
            self.finished.extend(left)
            self._ends = np.fromiter(self.finished, float, len(self.finished))
        self._shown, self._then = shown, now
        if len(self.finished) >= self.min_jobs:
            running = np.fromiter((s for s, _ in shown.values()), float, len(shown))
            self.value = service_quantile(self._ends, self.q, self.prior, self.min_jobs, running)
        return self.value
