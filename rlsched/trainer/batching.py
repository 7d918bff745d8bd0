"""The global batch the scheduler asks for, split over the generation's workers.

Every worker takes ``B // W`` or one more of each global batch of ``B`` samples
(``RLSCHED_GLOBAL_BATCH_SIZE``), in the same number of micro-batches with gradient
accumulation under a per-worker limit; with each micro-batch's summed loss scaled by
:func:`loss_scale` ``= W / B`` the gradient is the mean over the global batch, whatever
the shares. Details: docs/trainer.md, docs/design-notes.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from rlsched.core.contract import ENV_BATCH_SIZE, ENV_MICRO_BATCH_LIMIT

from .contract import env_int
from .errors import BatchSizeError

__all__ = ["BatchPlan", "plan_batch", "split_evenly", "loss_scale", "global_batch_size", "micro_batch_limit"]


def split_evenly(total: int, parts: int) -> tuple[int, ...]:
    """``total`` items in ``parts`` contiguous shares as equal as possible: the first
    ``total mod parts`` shares hold one more."""
    if parts < 1:
        raise BatchSizeError(f"cannot split into {parts} parts")
    if total < 0:
        raise BatchSizeError(f"cannot split {total} items")
    q, r = divmod(total, parts)
    return tuple(q + 1 if i < r else q for i in range(parts))


def loss_scale(global_count: int, world_size: int) -> float:
    """The factor for a micro-batch's summed per-sample loss so that DDP's averaged
    gradient is the mean over the ``global_count`` samples of the step: ``W / B``."""
    if global_count < 1 or world_size < 1:
        raise BatchSizeError(f"no loss scale for {global_count} samples over {world_size} workers")
    return world_size / global_count


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """How one global batch is split: per rank its share (samples per step) and the
    number of micro-batches (gradient-accumulation steps) every rank runs."""

    global_batch: int
    world_size: int
    shares: tuple[int, ...]
    accumulation_steps: int
    micro_batch_limit: int | None = None

    @property
    def per_worker(self) -> int:
        """The largest share (what one worker must process per step)."""
        return max(self.shares)

    @property
    def even(self) -> bool:
        """Whether the global batch divides evenly over the workers."""
        return len(set(self.shares)) == 1

    def share(self, rank: int) -> int:
        return self.shares[rank]

    def micro_batches(self, rank: int, count: int | None = None) -> tuple[int, ...]:
        """Sizes of rank ``rank``'s micro-batches for a share of ``count`` samples
        (default: its full share), at most ``micro_batch_limit`` each."""
        n = self.shares[rank] if count is None else count
        return split_evenly(n, self.accumulation_steps)


def plan_batch(global_batch: int, world_size: int, micro_batch_limit: int | None = None,
               environ: Mapping[str, str] | None = None) -> BatchPlan:
    """Split ``global_batch`` over ``world_size`` workers; with a micro-batch limit
    (``micro_batch_limit``, else the scheduler's: :func:`micro_batch_limit`), derive the
    gradient-accumulation steps. :class:`BatchSizeError` when the global batch is
    smaller than the world size (a worker would never have a sample)."""
    if micro_batch_limit is None:
        micro_batch_limit = env_int(
            ENV_MICRO_BATCH_LIMIT, default=None, minimum=1, error=BatchSizeError, environ=environ)
    if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
        raise BatchSizeError(f"global batch size must be a whole number >= 1, got {global_batch!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise BatchSizeError(f"world size must be a whole number >= 1, got {world_size!r}")
    if global_batch < world_size:
        raise BatchSizeError(f"global batch size {global_batch} is smaller than the {world_size} workers")
    if micro_batch_limit is not None and (isinstance(micro_batch_limit, bool) or micro_batch_limit < 1):
        raise BatchSizeError(f"micro-batch limit must be >= 1, got {micro_batch_limit!r}")
    shares = split_evenly(global_batch, world_size)
    steps = 1 if micro_batch_limit is None else math.ceil(shares[0] / micro_batch_limit)
    return BatchPlan(global_batch, world_size, shares, steps, micro_batch_limit)


def global_batch_size(default: int, environ: Mapping[str, str] | None = None) -> int:
    """The global batch the scheduler asks for (``RLSCHED_GLOBAL_BATCH_SIZE``), else the
    script's ``default``."""
    return env_int(ENV_BATCH_SIZE, default=default, minimum=1, error=BatchSizeError, environ=environ)


def micro_batch_limit(default: int | None = None, environ: Mapping[str, str] | None = None) -> int | None:
    """The most samples one process takes in one pass: the scheduler's
    (``RLSCHED_MICRO_BATCH_LIMIT``), else the script's ``default`` (None: no limit)."""
    return env_int(ENV_MICRO_BATCH_LIMIT, default=default, minimum=1, error=BatchSizeError, environ=environ)
