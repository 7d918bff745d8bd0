"""An elastic sampler: one global order per epoch, consumed in global batches, resumable
at any world size.

One permutation per epoch seeded by ``seed + epoch``, consumed in global batches, rank
``r`` taking the ``r``-th share of each; the only state is the position, so a new
generation at another world size goes on without repeating or skipping a sample:
AdaptDL's ``ElasticSampler`` scheme (Qiao et al., OSDI'21) on a global order. Pure
Python. Usage: docs/trainer.md, docs/design-notes.md.
"""

from __future__ import annotations

import math
import random
from array import array
from dataclasses import dataclass
from typing import Iterator

from .batching import BatchPlan, BatchSizeError, loss_scale, split_evenly

__all__ = ["Step", "ElasticSampler", "epoch_order"]


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool = True) -> array:
    """The global order of ``range(size)`` for ``epoch``: a permutation seeded by
    ``seed + epoch`` (identity without ``shuffle``)."""
    order = array("q", range(size))
    if shuffle:
        random.Random(seed + epoch).shuffle(order)
    return order


@dataclass(frozen=True, slots=True)
class Step:
    """One global batch as rank ``rank`` sees it."""

    epoch: int
    #: positions ``[start, end)`` of the epoch's global order this step consumes
    start: int
    end: int
    rank: int
    world_size: int
    #: this rank's sample indices (its contiguous share of the global batch)
    indices: tuple[int, ...]
    #: the same indices cut into the plan's micro-batches (gradient accumulation)
    micro_batches: tuple[tuple[int, ...], ...]

    @property
    def global_size(self) -> int:
        """Samples of the whole step over all ranks (the last step of an epoch may be short)."""
        return self.end - self.start

    @property
    def shares(self) -> tuple[int, ...]:
        """Every rank's number of samples in this step."""
        return split_evenly(self.global_size, self.world_size)

    @property
    def loss_scale(self) -> float:
        """Multiply each micro-batch's summed per-sample loss by this (``W / B``)."""
        return loss_scale(self.global_size, self.world_size)


class ElasticSampler:
    """Rank ``rank``'s share of every global batch of ``plan`` over a dataset of
    ``size`` samples; :meth:`steps` from any position of any epoch.

    ``drop_last``: skip an epoch's final global batch when it is short (its samples
    are then not consumed in that epoch)."""

    def __init__(self, size: int, plan: BatchPlan, rank: int, *, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False) -> None:
        if size < 1:
            raise BatchSizeError(f"dataset size must be >= 1, got {size}")
        if not 0 <= rank < plan.world_size:
            raise BatchSizeError(f"rank {rank} outside 0..{plan.world_size - 1}")
        self.size, self.plan, self.rank = size, plan, rank
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last

    def steps_left(self, consumed: int = 0) -> int:
        """Steps from position ``consumed`` to the end of an epoch."""
        left = max(0, self.size - consumed)
        b = self.plan.global_batch
        return left // b if self.drop_last else math.ceil(left / b)

    def epoch_samples(self) -> int:
        """Samples an epoch consumes (all of them unless ``drop_last``)."""
        return self.steps_left(0) * self.plan.global_batch if self.drop_last else self.size

    def steps(self, epoch: int, consumed: int = 0) -> Iterator[Step]:
        """The steps of ``epoch`` from position ``consumed`` (samples of the epoch's
        global order already consumed, by any world size) to the end of the epoch."""
        if not 0 <= consumed <= self.size:
            raise BatchSizeError(f"position {consumed} outside the epoch's 0..{self.size} samples")
        order = epoch_order(self.size, self.seed, epoch, self.shuffle)
        plan, rank, w = self.plan, self.rank, self.plan.world_size
        pos = consumed
        while pos < self.size:
            count = min(plan.global_batch, self.size - pos)
            if count < plan.global_batch and self.drop_last:
                return
            shares = plan.shares if count == plan.global_batch else split_evenly(count, w)
            first = pos + sum(shares[:rank])
            mine = tuple(order[first : first + shares[rank]])
            cuts, micro, at = plan.micro_batches(rank, len(mine)), [], 0
            for n in cuts:
                micro.append(mine[at : at + n])
                at += n
            yield Step(epoch, pos, pos + count, rank, w, mine, tuple(micro))
            pos += count

    def __len__(self) -> int:
        return self.steps_left(0)
