"""Our orderings and placements as an allocation policy.

:class:`GangAllocator` runs an :class:`~rlsched.core.policy.Ordering` and a
:class:`~rlsched.core.policy.Placement` — the objects the operator and the extender
serve — under the allocation interface (:mod:`rlsched.core.allocation`), so they can be
measured on the interval engine beside the peers: each job runs its requested GPUs
(``target_replicas``) at its requested batch size, started gang-style where the
placement puts it, in the order the ordering ranks the waiting jobs; a running job
keeps its nodes (no preemption, no migration: the operator's default admission without
a ``highest`` class). With ``backfill`` later jobs start when the head does not fit.

What the ordering sees of a job is what a live operator knows: its request, submit
time and attained service; no run time (no user estimate in these workloads).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .allocation import Allocation, AllocJob, AllocNode
from .cluster import ClusterState, JobView
from .policy import Ordering, Placement
from .topology import Topology

__all__ = ["GangAllocator"]


class GangAllocator:
    """``ordering`` + ``placement`` as an allocator (see the module docstring)."""

    clairvoyant = False

    def __init__(self, ordering: Ordering, placement: Placement, *, backfill: bool = True, name: str | None = None) -> None:
        self.ordering = ordering
        self.placement = placement
        self.backfill = backfill
        self.name = name or f"{getattr(ordering, 'name', 'ordering')}/{getattr(placement, 'name', 'placement')}"
        self._topo: tuple[tuple[int, ...], Topology] | None = None

    def _topology(self, nodes: Sequence[AllocNode]) -> Topology:
        key = tuple(n.gpus for n in nodes)
        if self._topo is None or self._topo[0] != key:
            if len(set(key)) != 1:
                raise ValueError("GangAllocator needs nodes with equal GPUs")
            self._topo = (key, Topology.uniform(len(nodes), key[0]))
        return self._topo[1]

    @staticmethod
    def _view(j: AllocJob) -> JobView:
        w = max(min(j.target_replicas or 1, j.max_replicas), 1)
        return JobView(id=j.id, submit_time=j.submit_time, workers=w, min_workers=w, max_workers=w,
                       attained_service=j.attained_service, placement=[])

    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float) -> Mapping[str, Allocation]:
        state = ClusterState(self._topology(nodes), time=now)
        index = {n.index: k for k, n in enumerate(nodes)}
        out: dict[str, Allocation] = {}
        pending = []
        for j in jobs:
            v = self._view(j)
            if j.allocation:
                place = [index[i] for i in j.allocation]
                v.workers = v.min_workers = v.max_workers = len(place)
                v.placement = place
                v.start_time = now
                state.allocate_job(v, place)
                state.running[v.id] = v
                out[j.id] = Allocation(tuple(j.allocation))
            else:
                pending.append(v)
        state.pending = pending
        if not pending:
            return out
        for v in self.ordering.rank(pending, state):
            place = self.placement.place(v, state)
            if place is None:
                if self.backfill:
                    continue
                break
            state.allocate_job(v, place)
            out[v.id] = Allocation(tuple(nodes[k].index for k in place))
        return out
