"""Nodes for GPU counts already decided: keep what need not move, pack the rest.

Allocators that decide counts first (the goodput allocator, the benchmark's peers) place
with :func:`keep_or_pack`: a job whose count is unchanged keeps its nodes, since a
changed node list costs a restart; the others go on as few nodes as possible.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from .allocation import AllocJob, AllocNode, AllocationError, FreeNodes

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
    some GPU models or whose replicas ask for CPU or memory (on nodes that count them:
    ``AllocNode.cpu_milli``/``memory_mib``), on the nodes with room for them, then the
    rest. Raises :class:`AllocationError` when the counts exceed the cluster's GPUs, or
    when a limited job's nodes cannot hold its count — unless ``partial``, when it gets
    what they hold (fewer replicas, possibly none: the caller decides what to make of it)."""
    free = {n.index: n.gpus for n in nodes}
    total = sum(free.values())
    asked = sum(count for _, count in demand)
    if asked > total:
        raise AllocationError(f"{asked} GPUs asked of a cluster of {total}")
    node_of = {n.index: n for n in nodes}
    cpu = {n.index: n.cpu_milli for n in nodes}
    mem = {n.index: n.memory_mib for n in nodes}
    allowed = {job.id: ok for job, _ in demand if (ok := job.allowed_nodes(nodes)) is not None}
    # jobs limited to some GPU models, asking for CPU or memory, or whose workers hold
    # several GPUs: placed node by node
    limited = {job.id for job, _ in demand if job.id in allowed or job.node_by_node}

    def book(job: AllocJob, i: int, n: int) -> None:
        if cpu[i] is not None:
            cpu[i] -= n * job.cpu_milli
        if mem[i] is not None:
            mem[i] -= n * job.memory_mib

    out: dict[str, tuple[int, ...]] = {}
    moving: list[tuple[bool, int, int, AllocJob]] = []
    for rank, (job, count) in enumerate(demand):
        held = Counter(job.allocation)
        if len(job.allocation) == count and all(i in free and job.fits(node_of[i], free[i], cpu[i], mem[i]) >= n
                                                for i, n in held.items()):
            for i, n in held.items():
                free[i] -= n
                book(job, i, n)
            out[job.id] = tuple(job.allocation)
        else:
            moving.append((job.id not in limited, -count, rank, job))
    left = FreeNodes(free)
    for _, neg, _, job in sorted(moving, key=lambda m: m[:3]):
        count = -neg
        if job.id in limited:
            ok = allowed.get(job.id, free.keys())
            whole = count - count % max(job.replica_group, 1)  # whole workers: each on one node
            where = left.take_upto(whole, {i: job.fits(node_of[i], left.free[i], cpu[i], mem[i]) for i in ok})
            if len(where) < count and not partial:
                raise AllocationError(f"job {job.id}: the nodes it may run on hold {len(where)} of its {count} "
                                      f"GPUs (GPU model, CPU and memory)")
            for i, n in Counter(where).items():
                book(job, i, n)
        else:
            where = left.take(count)
            if where is None:  # without limits the counts fit in total, so there is always room
                raise AllocationError(f"job {job.id}: no room for {count} GPUs (free {left.free})")
        out[job.id] = where
    return out
