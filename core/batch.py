"""A job's batch bounds: the global batch it was tuned for, the largest it may train
at, and the per-worker range that fits a GPU (Pollux, OSDI'21, §4.1). One type from the
TrainingJob spec (``spec.batchSize``, ``maxBatchSize``, ``localBatchSize``) through the
allocators (:attr:`~rlsched.core.allocation.AllocJob.bounds`) to the goodput model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BatchBounds", "UNIT_BATCH"]


@dataclass(frozen=True, slots=True)
class BatchBounds:
    """The batch sizes a job may train at.

    ``init_batch``: ``M0``, the global batch its hyperparameters were tuned for (the
    efficiency reference; the optimizer never goes below it, §4.1). ``max_batch``: the
    largest global batch (default ``M0``: a fixed batch). ``min_local_batch``: the
    smallest per-replica share worth running (every replica gets at least this many
    samples per step). ``max_local_batch``: the largest micro-batch that fits a GPU
    (None: any); a larger share runs in ``s + 1 = ceil(ceil(M/K) / max_local_batch)``
    micro-batches, as ``rlsched.trainer.plan_batch`` splits it, unless ``accumulation``
    is False, when such a batch is infeasible."""

    init_batch: int
    max_batch: int | None = None
    min_local_batch: int = 1
    max_local_batch: int | None = None
    accumulation: bool = True

    def __post_init__(self) -> None:
        ints = [v for v in (self.init_batch, self.min_local_batch, self.max_batch, self.max_local_batch) if v is not None]
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in ints):
            raise ValueError(f"batch bounds must be whole numbers >= 1, got {self}")
        if self.max_batch is not None and self.max_batch < self.init_batch:
            raise ValueError(f"max_batch {self.max_batch} < init_batch {self.init_batch}")
        if self.max_local_batch is not None and self.max_local_batch < self.min_local_batch:
            raise ValueError(f"max_local_batch {self.max_local_batch} < min_local_batch {self.min_local_batch}")

    @property
    def largest(self) -> int:
        return self.init_batch if self.max_batch is None else self.max_batch

    @property
    def largest_local(self) -> int:
        """The largest per-replica micro-batch: ``max_local_batch``, else (no limit) the
        largest global batch."""
        return self.largest if self.max_local_batch is None else self.max_local_batch

    @property
    def reference_local_batch(self) -> float:
        """The per-GPU batch the throughput prior is stated at: ``M0`` within the
        per-GPU bounds."""
        hi = self.max_local_batch if self.max_local_batch is not None else self.init_batch
        return float(min(max(self.init_batch, self.min_local_batch), hi))

    def accumulation_steps(self, M, K):
        """``s`` for global batch ``M`` on ``K`` replicas: the trainer's
        ``ceil(ceil(M/K) / max_local_batch) − 1`` (0 without a per-GPU limit)."""
        M, K = np.asarray(M, dtype=np.int64), np.asarray(K, dtype=np.int64)
        if self.max_local_batch is None:
            return _int_or(np.zeros(np.broadcast(M, K).shape, dtype=np.int64))
        share = -(-M // K)
        return _int_or(np.maximum(-(-share // self.max_local_batch) - 1, 0))

    def batch_range(self, K):
        """``(lo, hi)``: the global batches ``optimize_batch`` considers on ``K``
        replicas, ``lo = max(M0, K·min_local)``, ``hi = max_batch`` (without
        accumulation also ``<= K·max_local``); none when ``lo > hi``."""
        K = np.asarray(K, dtype=np.int64)
        lo = np.maximum(self.init_batch, K * self.min_local_batch)
        hi = np.full(K.shape, self.largest, dtype=np.int64)
        if self.max_local_batch is not None and not self.accumulation:
            hi = np.minimum(hi, K * self.max_local_batch)
        return lo, hi

    def feasible(self, K, M):
        """Whether ``K`` replicas can train at global batch ``M`` (``M`` below ``M0``
        included: a batch the job may be given; the optimizer does not choose it)."""
        K, M = np.asarray(K, dtype=np.int64), np.asarray(M, dtype=np.int64)
        ok = (M >= K * self.min_local_batch) & (M <= self.largest) & (M >= 1)
        if self.max_local_batch is not None and not self.accumulation:
            ok &= M <= K * self.max_local_batch
        return ok


def _int_or(a):
    a = np.asarray(a)
    return int(a) if a.ndim == 0 else a


#: the batch bounds of a job without ``spec.batchSize``: a step time is recorded at one
#: sample-unit per GPU (the worker's own fixed batch)
UNIT_BATCH = BatchBounds(1)
