"""The extender's view of the cluster: nodes, pods, and pods it assumed onto nodes.

Fed by watch events (or a static file) and read by every filter/prioritize call. GPUs in
use on a node count its bound pods and the pods the extender assumed there, so two pods
scored back to back never count the same free GPUs; the cluster state is kept up to date
incrementally. Details: docs/design-notes.md.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Callable, Iterable, Mapping

from ..core.cluster import ClusterState
from ..core.contract import DEFAULT_TOPOLOGY_LEVELS, NodeShape, node_shape
from ..core.topology import Topology
from .objects import PodInfo, parse_pod

__all__ = ["ClusterCache"]

log = logging.getLogger(__name__)


class ClusterCache:
    """Nodes, pods and assumptions, with a :class:`ClusterState` built from them."""

    def __init__(
        self,
        levels: tuple[str, ...] = DEFAULT_TOPOLOGY_LEVELS,
        assume_ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        on_observation: Callable[[str, float], None] | None = None,
    ) -> None:
        if assume_ttl <= 0:
            raise ValueError("assume_ttl must be > 0")
        self.levels = tuple(levels)
        self.assume_ttl = float(assume_ttl)
        self.clock = clock
        self.on_observation = on_observation
        self.nodes: dict[str, NodeShape] = {}
        self.pods: dict[str, PodInfo] = {}
        #: pod key -> (node, gpus, job, expiry time)
        self.assumed: dict[str, tuple[str, int, str | None, float]] = {}
        #: assumptions made by a binding (certain), as opposed to guesses from scoring
        self._firm: set[str] = set()
        #: GPUs per node held by guesses (assumptions not in ``_firm``)
        self._guess: Counter[str] = Counter()
        self._contrib: dict[str, tuple[str, int, str | None]] = {}
        self.used: Counter[str] = Counter()
        #: node -> GPUs in use, for the known nodes with more in use than they have
        self._over: dict[str, int] = {}
        self.job_nodes: dict[str, Counter[str]] = {}
        self._topology: Topology | None = None
        self._state: ClusterState | None = None
        self._dirty = True
        self.synced: dict[str, bool] = {"nodes": False, "pods": False}
        self.last_update: float | None = None
        self.rebuilds = 0

    # ------------------------------------------------------------------ nodes
    def touch(self) -> None:
        """Note that the source was heard from (an event, a list or a bookmark)."""
        self.last_update = self.clock()

    def upsert_node(self, obj: Mapping) -> None:
        info = node_shape(obj)
        old = self.nodes.get(info.name)
        if old != info:
            self.nodes[info.name] = info
            self._dirty = True
            self._check_over(info.name)
        self.touch()

    def delete_node(self, name: str) -> None:
        if self.nodes.pop(name, None) is not None:
            self._dirty = True
            self._over.pop(name, None)
        self.touch()

    def replace_nodes(self, objs: Iterable[Mapping]) -> None:
        """A fresh list of all nodes (after a (re-)list)."""
        new = {}
        for o in objs:
            info = node_shape(o)
            new[info.name] = info
        if new != self.nodes:
            self.nodes = new
            self._dirty = True
            self._over.clear()
            for node in self.used:
                self._check_over(node)
        self.synced["nodes"] = True
        self.touch()

    # ------------------------------------------------------------------ pods
    def upsert_pod(self, obj: Mapping) -> PodInfo:
        info = parse_pod(obj)
        old = self.pods.get(info.key)
        self.pods[info.key] = info
        if info.node is not None or info.phase in ("Succeeded", "Failed"):
            self._drop(info.key)  # kube-scheduler decided: drop our guess
        self._recompute(info.key)
        if (
            self.on_observation is not None
            and info.observed_speed is not None
            and info.node is not None
            and (old is None or old.observed_speed != info.observed_speed or old.node != info.node)
        ):
            self.on_observation(info.node, info.observed_speed)
        self.touch()
        return info

    def delete_pod(self, key: str) -> None:
        self.pods.pop(key, None)
        self._drop(key)
        self._recompute(key)
        self.touch()

    def replace_pods(self, objs: Iterable[Mapping]) -> None:
        fresh: dict[str, PodInfo] = {}
        for o in objs:
            try:
                info = parse_pod(o)
            except ValueError as exc:  # one odd pod must not stop the cache
                log.warning("skipping pod in list: %s", exc)
                continue
            fresh[info.key] = info
        for key in list(self.pods):
            if key not in fresh:
                self.delete_pod(key)
        for key, info in fresh.items():
            self.pods[key] = info
            if info.node is not None:
                self._drop(key)
            self._recompute(key)
        self.synced["pods"] = True
        self.touch()

    # ------------------------------------------------------------------ assumptions
    def assume(self, key: str, node: str, gpus: int, job: str | None, *, firm: bool = False) -> None:
        """Count ``gpus`` of pod ``key`` on ``node`` until it is seen bound. ``firm``:
        the extender bound it there itself; otherwise it is a guess (the node the pod
        scored best on), which kube-scheduler may not follow."""
        pod = self.pods.get(key)
        if pod is not None and pod.node is not None:
            return  # already bound; the bound pod counts
        # re-inserted at the end: the dict stays in expiry order (one TTL, a monotonic
        # clock), so expire() stops at the first assumption still alive
        self._unassume(key)
        self.assumed[key] = (node, int(gpus), job, self.clock() + self.assume_ttl)
        if firm:
            self._firm.add(key)
        elif gpus:
            self._guess[node] += int(gpus)
        self._recompute(key)

    def _unassume(self, key: str) -> tuple | None:
        """Remove ``key``'s assumption (and its share of the guesses); returns it."""
        old = self.assumed.pop(key, None)
        if key in self._firm:
            self._firm.discard(key)
        elif old is not None and old[1]:
            node = old[0]
            self._guess[node] -= old[1]
            if self._guess[node] <= 0:
                del self._guess[node]
        return old

    def _drop(self, key: str) -> None:
        self._unassume(key)

    def forget(self, key: str) -> None:
        if self._unassume(key) is not None:
            self._recompute(key)

    def guessed(self) -> dict[str, int]:
        """GPUs per node held only by guesses (assumptions not made by a binding):
        kept as assumptions come and go, so reading it costs the nodes guessed, not
        the pods assumed."""
        return self._guess

    def expire(self) -> int:
        """Drop assumptions older than the TTL; returns how many. Assumptions are kept
        in expiry order, so this costs the expired ones, not all (it runs on every
        request, with up to a burst's worth of pods assumed)."""
        now = self.clock()
        old = []
        for k, (_, _, _, t) in self.assumed.items():
            if t > now:
                break
            old.append(k)
        for k in old:
            self.forget(k)
        return len(old)

    # ------------------------------------------------------------------ accounting
    def _recompute(self, key: str) -> None:
        pod = self.pods.get(key)
        new = None
        if pod is not None and pod.holds_gpus:
            new = (pod.node, pod.gpus, pod.job)
        elif key in self.assumed:
            node, gpus, job, _ = self.assumed[key]
            new = (node, gpus, job)
        old = self._contrib.get(key)
        if old == new:
            return
        if old is not None:
            self._add(old, -1)
            del self._contrib[key]
        if new is not None:
            self._add(new, +1)
            self._contrib[key] = new

    def _add(self, contrib: tuple[str, int, str | None], sign: int) -> None:
        node, gpus, job = contrib
        self.used[node] += sign * gpus
        if self.used[node] == 0:
            del self.used[node]
        self._check_over(node)
        if job is not None:
            c = self.job_nodes.setdefault(job, Counter())
            c[node] += sign
            if c[node] <= 0:
                del c[node]
            if not c:
                del self.job_nodes[job]
        self._sync(node)

    def _sync(self, node: str) -> None:
        if self._dirty or self._state is None:
            return
        i = self._topology.index.get(node) if self._topology else None
        if i is None:
            return
        st = self._state
        want = max(0, int(st.total[i]) - self.used.get(node, 0))
        have = int(st.free[i])
        if want < have:
            st.allocate(i, have - want)
        elif want > have:
            st.release(i, want - have)

    # ------------------------------------------------------------------ reads
    def state(self) -> ClusterState:
        """The current snapshot (rebuilt only after node changes)."""
        if self._dirty or self._state is None:
            names = sorted(self.nodes)
            topo = Topology.from_labels(
                ((n, self.nodes[n].labels, self.nodes[n].gpus) for n in names), levels=self.levels
            )
            st = ClusterState(topo)
            for node, used in self.used.items():
                i = topo.index.get(node)
                if i is not None and used > 0:
                    st.allocate(i, min(used, int(st.total[i])))
            self._topology, self._state, self._dirty = topo, st, False
            self.rebuilds += 1
        return self._state

    def job_placement(self, job: str | None, exclude: str | None = None) -> list[str]:
        """Node of every bound or assumed worker of ``job`` (one entry per pod),
        leaving out pod ``exclude``."""
        if job is None:
            return []
        out: list[str] = []
        for node, count in self.job_nodes.get(job, {}).items():
            out.extend([node] * count)
        if exclude is not None and exclude in self._contrib and self._contrib[exclude][2] == job:
            out.remove(self._contrib[exclude][0])
        return out

    def _check_over(self, node: str) -> None:
        shape = self.nodes.get(node)
        used = self.used.get(node, 0)
        if shape is not None and used > shape.gpus:
            self._over[node] = int(used)
        else:
            self._over.pop(node, None)

    def overcommit(self) -> dict[str, tuple[int, int]]:
        """``node -> (GPUs in use, GPUs of the node)`` for every known node with more GPUs
        in use by bound and assumed pods than it has (``state()`` clamps those at 0
        free; this is the true count). Kept up to date by every change, so reading
        it costs the over-committed nodes, not the cluster."""
        return {node: (used, int(self.nodes[node].gpus)) for node, used in self._over.items()}

    def overcommit_used(self) -> dict[str, int]:
        """``node -> GPUs in use`` of the over-committed nodes (see :meth:`overcommit`)."""
        return dict(self._over)

    def overcommitted_gpus(self) -> int:
        """GPUs in use beyond the capacity of their node, summed over nodes."""
        return sum(used - total for used, total in self.overcommit().values())

    def age(self) -> float:
        """Seconds since the cache last heard from its source (inf before that)."""
        return float("inf") if self.last_update is None else self.clock() - self.last_update

    @property
    def ready(self) -> bool:
        return all(self.synced.values())
