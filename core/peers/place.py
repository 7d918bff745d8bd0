"""Placement shared by the peers: keep what need not move, pack the rest.

Both peers decide GPU *counts* first and nodes second. The engine charges a restart
whenever a job's node list changes, so a job whose count is unchanged keeps its nodes
exactly; every other job is placed on as few nodes as possible
(:func:`rlsched.core.allocation.packed`), largest first, on the GPUs the kept jobs
leave free.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from ..allocation import AllocJob, AllocNode, AllocationError, FreeNodes

__all__ = ["keep_or_pack"]


def keep_or_pack(demand: Sequence[tuple[AllocJob, int]], nodes: Sequence[AllocNode]) -> dict[str, tuple[int, ...]]:
    """Node of each replica for each ``(job, count)`` of ``demand`` (counts >= 1 whose
    sum the cluster's GPUs hold; ``demand`` in the policy's priority order).

    A job keeps :attr:`AllocJob.allocation` when it holds exactly ``count`` GPUs on
    known nodes that still have room for them (taken in ``demand`` order, so a current
    allocation that over-commits a node, which a correct engine never reports, loses
    to the jobs before it and is re-placed). The others are packed largest first
    (ties: ``demand`` order) on the GPUs left. Raises :class:`AllocationError` when the
    counts exceed the cluster's GPUs."""
    free = {n.index: n.gpus for n in nodes}
    total = sum(free.values())
    asked = sum(count for _, count in demand)
    if asked > total:
        raise AllocationError(f"{asked} GPUs asked of a cluster of {total}")
    out: dict[str, tuple[int, ...]] = {}
    moving: list[tuple[int, int, AllocJob]] = []
    for rank, (job, count) in enumerate(demand):
        held = Counter(job.allocation)
        if len(job.allocation) == count and all(i in free and free[i] >= n for i, n in held.items()):
            for i, n in held.items():
                free[i] -= n
            out[job.id] = tuple(job.allocation)
        else:
            moving.append((count, rank, job))
    left = FreeNodes(free)
    for count, _, job in sorted(moving, key=lambda m: (-m[0], m[1])):
        where = left.take(count)
        if where is None:  # the counts fit in total, so there is always room
            raise AllocationError(f"job {job.id}: no room for {count} GPUs (free {free})")
        out[job.id] = where
    return out
