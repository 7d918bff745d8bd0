"""Placement shared by the peers: keep what need not move, pack the rest.

Both peers decide GPU *counts* first and nodes second. The engine charges a restart
whenever a job's node list changes, so a job whose count is unchanged keeps its nodes
exactly; every other job is placed on as few nodes as possible
(:func:`rlsched.core.allocation.packed`), largest first, on the GPUs the kept jobs
leave free. A job that allows only some GPU models (``AllocJob.gpu_models``) keeps or
gets only nodes of those models, and is placed before the jobs that may go anywhere.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from ..allocation import AllocJob, AllocNode, AllocationError, FreeNodes

__all__ = ["keep_or_pack"]


def keep_or_pack(demand: Sequence[tuple[AllocJob, int]], nodes: Sequence[AllocNode], *,
                 partial: bool = False) -> dict[str, tuple[int, ...]]:
    """Node of each replica for each ``(job, count)`` of ``demand`` (counts >= 1 whose
    sum the cluster's GPUs hold; ``demand`` in the policy's priority order).

    A job keeps :attr:`AllocJob.allocation` when it holds exactly ``count`` GPUs on
    known nodes it may run on that still have room for them (taken in ``demand`` order,
    so a current allocation that over-commits a node, which a correct engine never
    reports, loses to the jobs before it and is re-placed). The others are packed
    largest first (ties: ``demand`` order) on the GPUs left: first the jobs limited to
    some GPU models, on the nodes of those models, then the rest. Raises
    :class:`AllocationError` when the counts exceed the cluster's GPUs, or when a
    limited job's nodes cannot hold its count — unless ``partial``, when it gets what
    they hold (fewer replicas, possibly none: the caller decides what to make of it)."""
    free = {n.index: n.gpus for n in nodes}
    total = sum(free.values())
    asked = sum(count for _, count in demand)
    if asked > total:
        raise AllocationError(f"{asked} GPUs asked of a cluster of {total}")
    allowed = {job.id: ok for job, _ in demand if (ok := job.allowed_nodes(nodes)) is not None}
    out: dict[str, tuple[int, ...]] = {}
    moving: list[tuple[bool, int, int, AllocJob]] = []
    for rank, (job, count) in enumerate(demand):
        held = Counter(job.allocation)
        ok = allowed.get(job.id)
        if len(job.allocation) == count and all(i in free and free[i] >= n and (ok is None or i in ok)
                                                for i, n in held.items()):
            for i, n in held.items():
                free[i] -= n
            out[job.id] = tuple(job.allocation)
        else:
            moving.append((job.id not in allowed, -count, rank, job))
    left = FreeNodes(free)
    for _, neg, _, job in sorted(moving, key=lambda m: m[:3]):
        count, ok = -neg, allowed.get(job.id)
        where = left.take(count, ok)
        if where is None and partial and ok is not None:
            where = left.take(left.most(ok), ok)
        if where is None:  # without model limits the counts fit in total, so there is always room
            raise AllocationError(f"job {job.id}: no room for {count} GPUs (free {left.free})")
        out[job.id] = where
    return out
