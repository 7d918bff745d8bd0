"""A learned growth weight for the goodput allocator: RLPTO's idea as a falling marginal goodput.

:class:`LearnedGrowthWeight` replaces the allocator's service weight by
``exp(w · φ(job))`` over what the job reported, its learning curve among it, learned on
training seeds (``rlsched train growth``): a converging job's marginal goodput counts for
less (RLPTO, Lu et al., TPDS 2023), never a stop. ``w = (−1, 0, 0, 0, 0)`` is the
service weight exactly. Pure numpy; a model that cannot be read leaves the service
weight. Details: docs/design-notes.md.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from .allocation import AllocJob
from .nn import PolicyFileError, load_policy_file
from .ordering import POLLUX_THRESHOLD

__all__ = ["GROWTH_FEATURES", "DEFAULT_COEF", "growth_features", "LearnedGrowthWeight", "DEFAULT_WEIGHTS",
           "learned_goodput"]

log = logging.getLogger(__name__)

#: the features, in order (see :func:`growth_features`)
GROWTH_FEATURES = ("service", "age", "restarts", "epochs", "curve")
#: the service weight's coefficients (the ``goodput`` allocator's): ``(1 + A/θ)^−1`` of attained service
DEFAULT_COEF = np.array([-1.0, 0.0, 0.0, 0.0, 0.0])
#: where the promoted model lives (``rlsched models promote <run>``)
DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "growth.safetensors"
#: epochs over which the recent pace of the learning curve is measured
CURVE_WINDOW = 3
#: bound on ``w · φ``: a weight between e^−8 and e^8
LOGIT_BOUND = 8.0


def curve_pace(metrics, higher_is_better: bool, window: int = CURVE_WINDOW) -> float:
    """How fast the job's metric still moves: its mean change per epoch over the last
    ``window`` epochs, in the direction of better, over its mean change per epoch since
    the first epoch, clipped to [−2, 2]. About 1 while the curve keeps its pace, near 0
    where it has flattened, below 0 where it got worse. 1 (no evidence of convergence)
    before three epochs are reported, or when the metric has not moved at all."""
    m = [x for x in map(float, metrics) if math.isfinite(x)]  # a few numbers: plain floats
    if len(m) < 3:
        return 1.0
    sign = 1.0 if higher_is_better else -1.0
    k = min(window, len(m) - 1)
    recent = sign * (m[-1] - m[-1 - k]) / k
    overall = abs(m[-1] - m[0]) / (len(m) - 1)
    if overall <= 1e-12:
        return 1.0
    return min(max(recent / overall, -2.0), 2.0)


def growth_features(job: AllocJob, service_scale: float = POLLUX_THRESHOLD, hour: float = 3600.0) -> np.ndarray:
    """``φ(job)``: log(1 + attained GPU-seconds / ``service_scale``), log(1 + age in
    hours of ``hour`` seconds), log(1 + restarts), log(1 + epochs completed), and the pace
    of its learning curve (:func:`curve_pace`). What a live operator knows; nothing else
    is read."""
    return np.array([
        math.log1p(max(job.attained_service, 0.0) / service_scale),
        math.log1p(max(job.age, 0.0) / hour),
        math.log1p(max(job.num_restarts, 0)),
        math.log1p(max(job.epoch, 0)),
        curve_pace(job.metrics, job.higher_is_better),
    ])


class LearnedGrowthWeight:
    """``exp(w · φ(job))`` (module docstring), from ``coef`` or an exported model file.

    ``coef`` given: those coefficients (training evaluates candidates so). Else the model
    at ``path`` (default :data:`DEFAULT_WEIGHTS`); one that cannot be read falls back to
    :data:`DEFAULT_COEF`, the ``goodput`` allocator's service weight, with ``fallback_reason`` set.

    ``service_scale`` (GPU-seconds) and ``hour`` (seconds) are the units of the service
    and age features: a clock that runs ``k`` times faster than the one the model was
    trained on (the twin check's compressed time) divides both by ``k``."""

    def __init__(self, coef=None, *, path: str | Path | None = None,
                 service_scale: float = POLLUX_THRESHOLD, hour: float = 3600.0) -> None:
        if not (math.isfinite(service_scale) and service_scale > 0):
            raise ValueError(f"service_scale must be > 0 GPU-seconds, got {service_scale}")
        if not (math.isfinite(hour) and hour > 0):
            raise ValueError(f"hour must be > 0 seconds, got {hour}")
        self.service_scale, self.hour = float(service_scale), float(hour)
        self.path = None if coef is not None else Path(path) if path is not None else DEFAULT_WEIGHTS
        self.fallback_reason: str | None = None
        self.metadata: dict = {}
        if coef is None:
            try:
                weights, meta = load_policy_file(self.path, policy="growth")
                coef = weights.get("coef")
                if coef is None:
                    raise PolicyFileError(f"{self.path}: no tensor 'coef'")
                self.metadata = meta
            except PolicyFileError as exc:
                self.fallback_reason = f"{exc}; growing by attained service alone (the goodput allocator's weight)"
                coef = DEFAULT_COEF
        coef = np.asarray(coef, dtype=float).reshape(-1)
        if coef.shape != (len(GROWTH_FEATURES),) or not np.isfinite(coef).all():
            raise ValueError(f"growth coefficients must be {len(GROWTH_FEATURES)} finite numbers "
                             f"({', '.join(GROWTH_FEATURES)}), got {coef.tolist()}")
        self.coef = coef

    def __repr__(self) -> str:
        return (f"LearnedGrowthWeight(coef={np.round(self.coef, 4).tolist()}, path={self.path}, "
                f"fallback={self.fallback_reason is not None})")

    def prepare(self, jobs, nodes) -> None:
        """Nothing to prepare: every feature is the job's own."""

    def weight(self, job: AllocJob) -> float:
        z = float(self.coef @ growth_features(job, self.service_scale, self.hour))
        return math.exp(min(max(z, -LOGIT_BOUND), LOGIT_BOUND))


def learned_goodput(path: str | Path | None = None, *, hour: float = 3600.0, **options):
    """The ``goodput-learned`` allocator: :class:`~rlsched.core.goodput_allocator.GoodputAllocator`
    with ``options``, weighted by the model at ``path`` (default: the promoted one); a
    model that cannot be read leaves the service weight, and the log says why. The
    weight's service feature is in the allocator's ``service_scale`` (its ``threshold``
    unless given), its age feature in hours of ``hour`` seconds, so that a compressed
    clock scales them with the allocator's other time constants."""
    from .goodput_allocator import GoodputAllocator

    alloc = GoodputAllocator(**options)
    alloc.growth = LearnedGrowthWeight(path=path, service_scale=alloc.service_scale, hour=hour)
    if alloc.growth.fallback_reason:
        log.warning("allocator goodput-learned: %s", alloc.growth.fallback_reason)
    return alloc
