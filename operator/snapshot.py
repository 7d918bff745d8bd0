"""Kubernetes objects (plain dicts, as the API returns them) → a core ClusterState.

Free GPUs, CPU and memory per node are allocatable minus the requests of its
non-terminated pods; unbound pods the operator created are charged where they fit best
and pods being deleted are reported as ``releasing``. One bad object never fails the
snapshot: it is counted conservatively and reported in ``Snapshot.problems``.
Details: docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np

from rlsched.core import ClusterState, Topology
from rlsched.core.contract import (DEFAULT_TOPOLOGY_LEVELS, LABEL_GPU_PRODUCT, PodRequests, ShapeError, controlling_job,
                                   gpu_type_of, node_shape, pod_requests)

__all__ = ["Snapshot", "build_snapshot", "charge_packed"]


def charge_packed(state: ClusterState, workers: int, gpus_per_worker: int, *, prefer: Sequence[int] = (),
                  models: frozenset[str] | None = None) -> None:
    """Charge ``workers`` workers of ``gpus_per_worker`` GPUs that a job holds between two
    generations to the nodes it may run on (``models``: the GPU models its template
    allows; None: any): first the nodes in ``prefer`` (where it last ran) that still
    have room for a worker, then best fit (the fullest node that holds a worker), so a
    small job never takes the whole nodes a large gang needs. What no node holds whole
    is charged to the fullest nodes it may run on, as far as they go."""
    g = max(1, int(gpus_per_worker))
    allowed = state.candidates_total(0, models)
    rank = {int(i): k for k, i in enumerate(prefer)}
    left = max(0, int(workers)) * g
    for _ in range(max(0, int(workers))):
        fit = [int(i) for i in allowed if state.free[i] >= g]
        if not fit:
            break
        i = min(fit, key=lambda n: (rank.get(n, len(rank)), int(state.free[n]), n))
        state.allocate(i, g)
        left -= g
    for i in sorted((int(i) for i in allowed), key=lambda n: (int(state.free[n]) == 0, int(state.free[n]), n)):
        if left <= 0:
            break
        take = min(left, int(state.free[i]))
        if take > 0:
            state.allocate(i, take)
            left -= take


def _terminated(pod: Mapping) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _schedulable(node: Mapping) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("status") == "True"
    return True


@dataclass(slots=True)
class Snapshot:
    """The cluster state and where every job's workers are."""

    state: ClusterState
    node_index: dict[str, int]
    #: job key (namespace/name) -> node index of each bound, live worker
    placement: dict[str, list[int]] = field(default_factory=dict)
    #: per-node GPUs held by pods that are being deleted
    releasing: np.ndarray | None = None
    #: objects that could not be read, ``"Node/<name>"`` or ``"Pod/<ns>/<name>"`` ->
    #: what was wrong and how it was counted
    problems: dict[str, str] = field(default_factory=dict)
    #: node index -> its GPU type (:func:`~rlsched.core.contract.gpu_type_of` of its
    #: ``nvidia.com/gpu.product`` label; ``""`` without one)
    types: dict[int, str] = field(default_factory=dict)


def build_snapshot(
    nodes: Iterable[Mapping],
    pods: Iterable[Mapping],
    *,
    levels: tuple[str, ...] = DEFAULT_TOPOLOGY_LEVELS,
    time: float = 0.0,
    gpu_types: Mapping[str, str] | None = None,
) -> Snapshot:
    """Build the snapshot from node and pod dicts (camelCase, as the API serves them);
    ``gpu_types``: GPU Feature Discovery's product strings -> GPU type keys
    (:func:`~rlsched.core.contract.parse_gpu_types`; an unmapped product is its own type)."""
    specs = []
    problems: dict[str, str] = {}
    for n in nodes:
        if not _schedulable(n):
            continue
        try:
            shape = node_shape(n)
        except ShapeError as exc:
            name = ((n.get("metadata") or {}).get("name")) if isinstance(n, Mapping) else None
            problems[f"Node/{name}"] = f"{exc}; node left out"
            continue
        if shape.gpus > 0:
            specs.append((shape.name, shape.labels, shape.gpus, shape.cpu_milli, shape.memory_mib))
    topo = Topology.from_labels(specs, levels=levels)
    state = ClusterState(topo, time=time)
    index = {name: i for i, (name, *_) in enumerate(specs)}
    types = {i: gpu_type_of(labels.get(LABEL_GPU_PRODUCT), gpu_types or {}) for i, (_, labels, *_) in enumerate(specs)}
    releasing = np.zeros(len(specs), dtype=np.int64)
    placement: dict[str, list[int]] = {}
    unbound: list[int] = []
    for p in pods:
        if _terminated(p):
            continue
        md = p.get("metadata") or {}
        node = (p.get("spec") or {}).get("nodeName")
        try:
            req = pod_requests(p)
            g = req.gpus
        except ShapeError as exc:
            req = PodRequests()
            where = f"Pod/{md.get('namespace', '')}/{md.get('name', '')}"
            if not node:
                problems[where] = f"{exc}; unbound, not counted"
                continue
            problems[where] = f"{exc}; counted as holding every GPU of node {node}"
            g = None
        if not node:
            if md.get("deletionTimestamp") is None:
                unbound.append(g)
            continue
        i = index.get(node)
        if i is None:
            continue
        take = int(state.free[i]) if g is None else min(g, int(state.free[i]))
        if take or req.cpu_milli or req.memory_mib:  # CPU and memory as asked, even past what is left
            state.allocate(i, take, req.cpu_milli, req.memory_mib)
        if md.get("deletionTimestamp") is not None:
            releasing[i] += take
            continue
        owner = controlling_job(p)
        if owner is not None:
            placement.setdefault(f"{md.get('namespace', '')}/{owner.name}", []).append(i)
    for g in sorted(unbound, reverse=True):  # unbound pods: each where it fits best, largest first
        charge_packed(state, 1, g)
    return Snapshot(state=state, node_index=index, placement=placement, releasing=releasing, problems=problems,
                    types=types)
