"""The ``rlsched.dev/required-topology`` rule: a gang that must stay inside one node,
NVLink domain, rack or block.

The extender filters candidate nodes with it (a node that breaks the rule is
``FailedNodes`` with the reason); the simulator and the operator's feasibility checks
ask the same function.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from ..cluster import ClusterState
from ..topology import Level

__all__ = ["TopologyRule", "required_topology"]


class TopologyRule(NamedTuple):
    """Per-candidate verdict: ``ok[pos]``, and ``why(pos)`` the reason a candidate
    fails (None when every candidate passes)."""

    ok: np.ndarray
    why: Callable[[int], str] | None


def required_topology(
    level: Level | None,
    *,
    job: str | None,
    gpus: int,
    gang_size: int | None,
    state: ClusterState,
    candidates: np.ndarray,
    placed: Sequence[int],
) -> TopologyRule:
    """Which ``candidates`` (node indices) may host one more worker of ``job`` (``gpus``
    GPUs each) under a required topology ``level``.

    With workers already ``placed``, the new one must share their node, NVLink domain
    (GFD clique, else the node's domain size), rack or block. Before the first worker,
    a candidate qualifies only if its node / NVLink domain / rack / block has room for
    the whole gang (``gang_size`` workers) now; without a gang size any node does.
    ``level`` None: every candidate qualifies.
    """
    safe = np.asarray(candidates, dtype=np.int64)
    st = state
    n = len(safe)
    if level is None:
        return TopologyRule(np.ones(n, dtype=bool), None)
    topo = st.topology
    racks = st.rack_of
    blocks_id = {b: k for k, b in enumerate(topo.blocks)}
    block_of = np.array([blocks_id[b] for b in topo.block_of], dtype=np.int64)
    word = level.name.lower()
    if placed:
        p = np.array(placed, dtype=np.int64)
        if level <= Level.NODE:
            ok = np.all(safe[:, None] == p[None, :], axis=1)
            if level == Level.NVLINK:
                cl = topo.nodes[placed[0]].clique
                same_clique = cl != "" and all(topo.nodes[i].clique == cl for i in placed)
                if same_clique:
                    ok = np.array([topo.nodes[i].clique == cl for i in safe], dtype=bool)
                else:
                    dom = topo.nodes[placed[0]].nvlink_domain_size
                    ok &= (len(placed) + 1) * gpus <= max(dom, 1)
            where = f"node {topo.nodes[placed[0]].name}"
        elif level == Level.RACK:
            ok = np.all(racks[safe][:, None] == racks[p][None, :], axis=1)
            where = f"rack {topo.rack_of[placed[0]]}"
        else:
            ok = np.all(block_of[safe][:, None] == block_of[p][None, :], axis=1)
            where = f"block {topo.block_of[placed[0]]}"
        return TopologyRule(ok, lambda pos: (
            f"{job}: required topology {word}, the job's placed workers are in {where}"
            f"{' (and beyond)' if len(set(placed)) > 1 and level <= Level.NODE else ''}"
        ))
    if gang_size is None:
        return TopologyRule(np.ones(n, dtype=bool), None)
    need = gang_size * gpus
    if level <= Level.NODE:
        room = st.free[safe]
        if level == Level.NVLINK:
            dom = np.array([max(topo.nodes[i].nvlink_domain_size, 1) for i in safe])
            room = np.minimum(room, dom)
    elif level == Level.RACK:
        room = st.rack_free[racks[safe]]
    else:
        bfree = np.bincount(block_of, weights=st.free, minlength=len(topo.blocks))
        room = bfree[block_of[safe]]
    ok = room >= need
    return TopologyRule(ok, lambda pos: (
        f"{job}: required topology {word}: the gang needs {need} GPUs in one {word}, "
        f"this {word} has {int(room[pos])} free"
    ))
