"""RLPTO on the goodput mechanism: its network as the goodput allocator's growth weight.

RLPTO (Lu et al., IEEE TPDS 34(12), 2023) gives GPUs back as a job converges; here it
enters as a weight, ``log weight = b · φ(job) + v · tanh(W o(job) + c)``: the promoted
growth weight plus a one-hidden-layer network over RLPTO's view of the job, trained by
evolution strategies (``rlsched train growth --form rlpto``). Non-clairvoyant, pure numpy;
a model that cannot be read leaves the promoted growth weight. The view: docs/design-notes.md.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from .allocation import AllocJob, AllocNode
from .growth_weight import LOGIT_BOUND, LearnedGrowthWeight, curve_pace, growth_features
from .nn import PolicyFileError, load_policy_file
from .ordering import POLLUX_THRESHOLD

__all__ = ["RLPTO_GOODPUT_FEATURES", "rlpto_views", "RLPTOGrowthWeight", "DEFAULT_RLPTO_WEIGHTS", "rlpto_goodput",
           "POLICY"]

log = logging.getLogger(__name__)

#: RLPTO's features on the goodput mechanism, in order (module docstring)
RLPTO_GOODPUT_FEATURES = ("m", "e", "c", "w", "r", "n", "q")
#: the policy name of its model files
POLICY = "rlpto-goodput"
#: where a promoted model lives (``rlsched models promote <run>``)
DEFAULT_RLPTO_WEIGHTS = Path(__file__).resolve().parent / "weights" / "rlpto-goodput.safetensors"


def rlpto_views(jobs: Sequence[AllocJob], nodes: Sequence[AllocNode]) -> dict[str, np.ndarray]:
    """Each job's :data:`RLPTO_GOODPUT_FEATURES` before a decision, by job id:

    ``m`` GPUs no job holds / all GPUs; ``e`` min(epochs, 100)/100; ``c`` the learning
    curve's pace (:func:`~rlsched.core.growth_weight.curve_pace`) / 2, in [−1, 1]; ``w``
    min(GPUs held, 16)/16; ``r`` the job's rank in attained service among the jobs
    holding GPUs, 0 the least, scaled to [0, 1] (1 for a job that holds none; ties by
    submit time, then id); ``n`` min(jobs holding none / all GPUs, 1); ``q``
    min(GPUs those jobs need to start / all GPUs, 2)/2."""
    total = max(sum(n.gpus for n in nodes), 1)
    held = sum(len(j.allocation) for j in jobs)
    waiting = [j for j in jobs if not j.allocation]
    running = sorted((j for j in jobs if j.allocation), key=lambda j: (j.attained_service, j.submit_time, j.id))
    rank = {j.id: (i / (len(running) - 1) if len(running) > 1 else 0.0) for i, j in enumerate(running)}
    m = min(max((total - held) / total, 0.0), 1.0)
    n = min(len(waiting) / total, 1.0)
    q = min(sum(max(j.min_replicas, 1) for j in waiting) / total, 2.0) / 2.0
    return {j.id: np.array([m, min(max(j.epoch, 0), 100) / 100.0, curve_pace(j.metrics, j.higher_is_better) / 2.0,
                            min(len(j.allocation), 16) / 16.0, rank.get(j.id, 1.0), n, q]) for j in jobs}


class RLPTOGrowthWeight:
    """``exp(b · φ(job) + v · tanh(W o(job) + c))`` (module docstring).

    ``params`` given (``base_coef`` (5,), ``w1`` (H, 7), ``b1`` (H,), ``w2`` (H,)):
    those (training evaluates candidates so). Else the model at ``path`` (default
    :data:`DEFAULT_RLPTO_WEIGHTS`); one that cannot be read falls back to the promoted
    growth weight (:class:`~rlsched.core.growth_weight.LearnedGrowthWeight`), with
    ``fallback_reason`` set. ``service_scale`` and ``hour`` are the units of ``φ``'s
    service and age (a faster clock divides both)."""

    def __init__(self, params: dict | None = None, *, path: str | Path | None = None,
                 service_scale: float = POLLUX_THRESHOLD, hour: float = 3600.0) -> None:
        self.path = None if params is not None else Path(path) if path is not None else DEFAULT_RLPTO_WEIGHTS
        self.fallback_reason: str | None = None
        self.metadata: dict = {}
        self._views: dict[str, np.ndarray] = {}
        if params is None:
            try:
                params, self.metadata = load_policy_file(self.path, policy=POLICY)
                missing = {"base_coef", "w1", "b1", "w2"} - set(params)
                if missing:
                    raise PolicyFileError(f"{self.path}: no tensor {', '.join(sorted(missing))}")
            except PolicyFileError as exc:
                base = LearnedGrowthWeight(service_scale=service_scale, hour=hour)
                self.fallback_reason = f"{exc}; growing by the promoted growth weight alone"
                params = {"base_coef": base.coef, "w1": np.zeros((1, len(RLPTO_GOODPUT_FEATURES))),
                          "b1": np.zeros(1), "w2": np.zeros(1)}
        self.base = LearnedGrowthWeight(np.asarray(params["base_coef"], dtype=float), service_scale=service_scale,
                                        hour=hour)
        self.w1 = np.asarray(params["w1"], dtype=float)
        self.b1 = np.asarray(params["b1"], dtype=float).reshape(-1)
        self.w2 = np.asarray(params["w2"], dtype=float).reshape(-1)
        h = self.w1.shape[0] if self.w1.ndim == 2 else -1
        if (self.w1.shape != (h, len(RLPTO_GOODPUT_FEATURES)) or self.b1.shape != (h,) or self.w2.shape != (h,)
                or not all(np.isfinite(a).all() for a in (self.w1, self.b1, self.w2))):
            raise ValueError(f"rlpto-goodput network: w1 must be (H, {len(RLPTO_GOODPUT_FEATURES)}), b1 and w2 (H,), "
                             f"all finite; got {self.w1.shape}, {self.b1.shape}, {self.w2.shape}")

    @property
    def service_scale(self) -> float:
        return self.base.service_scale

    @property
    def hour(self) -> float:
        return self.base.hour

    @staticmethod
    def size(hidden: int) -> int:
        """Trainable numbers of a network of ``hidden`` units (``W``, ``c``, ``v``)."""
        return hidden * (len(RLPTO_GOODPUT_FEATURES) + 2)

    @classmethod
    def from_vector(cls, theta, base_coef, hidden: int, **units) -> "RLPTOGrowthWeight":
        """The weight of the flat vector ``theta`` = ``W`` (row-major), ``c``, ``v``."""
        theta = np.asarray(theta, dtype=float).reshape(-1)
        k = len(RLPTO_GOODPUT_FEATURES)
        if theta.size != cls.size(hidden):
            raise ValueError(f"expected {cls.size(hidden)} numbers for {hidden} hidden units, got {theta.size}")
        return cls({"base_coef": base_coef, "w1": theta[:hidden * k].reshape(hidden, k),
                    "b1": theta[hidden * k:hidden * (k + 1)], "w2": theta[hidden * (k + 1):]}, **units)

    def __repr__(self) -> str:
        return (f"RLPTOGrowthWeight(hidden={self.w2.size}, base={np.round(self.base.coef, 4).tolist()}, "
                f"path={self.path}, fallback={self.fallback_reason is not None})")

    def prepare(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode]) -> None:
        self._views = rlpto_views(jobs, nodes)

    def weight(self, job: AllocJob) -> float:
        o = self._views.get(job.id)
        if o is None:
            raise KeyError(f"job {job.id!r} was not in the decision: call prepare(jobs, nodes) first")
        z = float(self.base.coef @ growth_features(job, self.base.service_scale, self.base.hour))
        z += float(self.w2 @ np.tanh(self.w1 @ o + self.b1))
        return math.exp(min(max(z, -LOGIT_BOUND), LOGIT_BOUND))


def rlpto_goodput(path: str | Path | None = None, *, hour: float = 3600.0, **options):
    """The ``goodput-rlpto`` allocator: :class:`~rlsched.core.goodput_allocator.GoodputAllocator`
    with ``options``, weighted by the RLPTO network at ``path`` (default: the promoted one);
    a model that cannot be read leaves the promoted growth weight, and the log says why."""
    from .goodput_allocator import GoodputAllocator

    alloc = GoodputAllocator(**options)
    alloc.growth = RLPTOGrowthWeight(path=path, service_scale=alloc.service_scale, hour=hour)
    if alloc.growth.fallback_reason:
        log.warning("allocator goodput-rlpto: %s", alloc.growth.fallback_reason)
    return alloc
