"""Kubernetes objects (plain dicts, as the API returns them) → a core ClusterState.

Free GPUs per node are the node's allocatable ``nvidia.com/gpu`` minus the requests of
its non-terminated pods (phase not Succeeded/Failed). Pods the operator created that
are not bound yet also hold GPUs — they are committed to a gang — and are charged to
the freest nodes so that the next admission does not count them twice. Pods being
deleted are reported separately (``releasing``): they still hold their GPUs but will
give them back, which stops a waiting job from preempting twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from rlsched.core import ClusterState, Topology
from rlsched.core.topology import DEFAULT_TOPOLOGY_LEVELS

__all__ = ["Snapshot", "build_snapshot", "pod_gpus", "parse_quantity_int", "LABEL_JOB", "LABEL_ROLE", "LABEL_INDEX"]

RESOURCE_GPU = "nvidia.com/gpu"
LABEL_JOB = "rlsched.dev/job"
LABEL_ROLE = "rlsched.dev/role"
LABEL_INDEX = "rlsched.dev/worker-index"


def parse_quantity_int(v: Any) -> int:
    """Integer count from a Kubernetes quantity of a countable resource ("4", 4, "4k")."""
    if v is None:
        return 0
    s = str(v).strip()
    mult = {"k": 10**3, "M": 10**6, "G": 10**9}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(float(s))


def pod_gpus(pod: Mapping) -> int:
    """GPUs a pod requests (sum over containers; init containers by max, as the scheduler does)."""
    spec = pod.get("spec") or {}

    def req(c: Mapping) -> int:
        res = c.get("resources") or {}
        r = (res.get("requests") or {}).get(RESOURCE_GPU)
        if r is None:
            r = (res.get("limits") or {}).get(RESOURCE_GPU)
        return parse_quantity_int(r)

    main = sum(req(c) for c in spec.get("containers") or [])
    init = max((req(c) for c in spec.get("initContainers") or []), default=0)
    return max(main, init)


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


def build_snapshot(
    nodes: Iterable[Mapping],
    pods: Iterable[Mapping],
    *,
    levels: tuple[str, ...] = DEFAULT_TOPOLOGY_LEVELS,
    time: float = 0.0,
) -> Snapshot:
    """Build the snapshot from node and pod dicts (camelCase, as the API serves them)."""
    specs = []
    for n in nodes:
        if not _schedulable(n):
            continue
        gpus = parse_quantity_int(((n.get("status") or {}).get("allocatable") or {}).get(RESOURCE_GPU))
        if gpus <= 0:
            continue
        md = n.get("metadata") or {}
        specs.append((md["name"], md.get("labels") or {}, gpus))
    topo = Topology.from_labels(specs, levels=levels)
    state = ClusterState(topo, time=time)
    index = {name: i for i, (name, _, _) in enumerate(specs)}
    releasing = np.zeros(len(specs), dtype=np.int64)
    placement: dict[str, list[int]] = {}
    unbound = 0
    for p in pods:
        if _terminated(p):
            continue
        g = pod_gpus(p)
        md = p.get("metadata") or {}
        node = (p.get("spec") or {}).get("nodeName")
        if not node:
            if md.get("deletionTimestamp") is None:
                unbound += g
            continue
        i = index.get(node)
        if i is None:
            continue
        take = min(g, int(state.free[i]))
        if take:
            state.allocate(i, take)
        if md.get("deletionTimestamp") is not None:
            releasing[i] += take
            continue
        job = (md.get("labels") or {}).get(LABEL_JOB)
        if job:
            placement.setdefault(f"{md.get('namespace', '')}/{job}", []).append(i)
    # unbound pods: charge the freest nodes
    while unbound > 0 and state.free_gpus > 0:
        i = int(np.argmax(state.free))
        take = min(unbound, int(state.free[i]))
        state.allocate(i, take)
        unbound -= take
    return Snapshot(state=state, node_index=index, placement=placement, releasing=releasing)
