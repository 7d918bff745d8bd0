"""Worker placements: which node each new worker of a job goes to.

Every placement has two faces. :meth:`place` returns a node index for each of a job's
new workers (a gang: all or ``None``), allocating tentatively on the state and
releasing before it returns. :meth:`score` rates candidate nodes for one more worker
(``-inf`` where it cannot go); the extender maps that to 0..10 with
:func:`~rlsched.core.policy.scores_to_extender`.

A node can host a worker of ``job`` when it has ``gpus_per_worker`` free GPUs of an
allowed model (``job.gpu_models``) and, when the job asks for them, enough free CPU and
memory. Formulas and citations: ``docs/policies.md``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .cluster import ClusterState, JobView
from .fgd import Workload, fragmentation, whole_gpu_free_milli
from .policy import Placement, register_placement
from .topology import Level

__all__ = [
    "FirstFit",
    "BestFit",
    "LoadBalance",
    "RandomPlacement",
    "TopologyPacking",
    "FGD",
    "feasible_mask",
    "worker_slots",
]


def _need_other(job: JobView) -> bool:
    return job.cpu_milli > 0 or job.memory_mib > 0


def feasible_mask(job: JobView, state: ClusterState) -> np.ndarray:
    """Boolean per node: can it host one more worker of ``job`` now?"""
    ok = np.zeros(len(state.free), dtype=bool)
    ok[state.candidates(job.gpus_per_worker, job.gpu_models)] = True
    if job.cpu_milli > 0:
        ok &= state.cpu_free >= job.cpu_milli
    if job.memory_mib > 0:
        ok &= state.mem_free >= job.memory_mib
    return ok


def worker_slots(job: JobView, state: ClusterState) -> np.ndarray:
    """How many more workers of ``job`` each node could host now (0 where none)."""
    slots = state.free // job.gpus_per_worker
    if job.cpu_milli > 0:
        slots = np.minimum(slots, np.maximum(state.cpu_free, 0) // job.cpu_milli)
    if job.memory_mib > 0:
        slots = np.minimum(slots, np.maximum(state.mem_free, 0) // job.memory_mib)
    allowed = np.zeros(len(slots), dtype=bool)
    allowed[state.candidates_total(job.gpus_per_worker, job.gpu_models)] = True
    return np.where(allowed, slots, 0).astype(np.int64)


def _workers(job: JobView, workers: int | None) -> int:
    k = job.workers if workers is None else int(workers)
    if k < 0:
        raise ValueError(f"job {job.id}: cannot place {k} workers")
    return k


class _Placement(Placement):
    """Shared machinery: gang placement one worker at a time, tentative allocation."""

    name = ""

    def __init__(self, *, rng: np.random.Generator | None = None) -> None:
        # ``rng`` is accepted so callers can build every placement the same way;
        # deterministic placements ignore it.
        del rng

    # one worker -------------------------------------------------------------
    def _pick(self, job: JobView, state: ClusterState) -> int | None:
        cands = np.flatnonzero(feasible_mask(job, state))
        if len(cands) == 0:
            return None
        s = self._scores(job, state, cands)
        return int(cands[int(np.argmax(s))])  # argmax: first (lowest index) of the best

    def _scores(self, job: JobView, state: ClusterState, cands: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    # protocol ---------------------------------------------------------------
    def place(self, job: JobView, state: ClusterState, workers: int | None = None) -> list[int] | None:
        k = _workers(job, workers)
        if k * job.gpus_per_worker > state.free_gpus:
            return None
        taken: list[int] = []
        try:
            for _ in range(k):
                i = self._pick(job, state)
                if i is None:
                    return None
                state.allocate(i, job.gpus_per_worker, job.cpu_milli, job.memory_mib)
                taken.append(i)
            return list(taken)
        finally:
            for i in taken:
                state.release(i, job.gpus_per_worker, job.cpu_milli, job.memory_mib)

    def score(self, job: JobView, candidates: Sequence[int], state: ClusterState) -> np.ndarray:
        cands = np.asarray(candidates, dtype=np.int64).ravel()
        if len(cands) and (cands.min() < 0 or cands.max() >= len(state.free)):
            raise IndexError(f"candidate node index out of range 0..{len(state.free) - 1}")
        out = np.full(len(cands), -np.inf)
        ok = feasible_mask(job, state)[cands] if len(cands) else np.zeros(0, dtype=bool)
        if ok.any():
            out[ok] = self._scores(job, state, cands[ok])
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class _IndexedFit(_Placement):
    """First/best/worst fit through the ClusterState free-capacity index."""

    def _index(self, job: JobView, state: ClusterState) -> int | None:
        raise NotImplementedError

    def _pick(self, job, state):
        i = self._index(job, state)
        if i is None or not _need_other(job) or (
            state.cpu_free[i] >= job.cpu_milli and state.mem_free[i] >= job.memory_mib
        ):
            return i
        return super()._pick(job, state)  # CPU/memory rule the index out: scan


@register_placement("firstfit")
class FirstFit(_IndexedFit):
    """Lowest-index node that fits."""

    name = "firstfit"

    def _index(self, job, state):
        return state.first_fit(job.gpus_per_worker, job.gpu_models)

    def _scores(self, job, state, cands):
        return -cands.astype(float)


@register_placement("bestfit")
class BestFit(_IndexedFit):
    """Node left with the fewest free GPUs (ties: lowest index)."""

    name = "bestfit"

    def _index(self, job, state):
        return state.best_fit(job.gpus_per_worker, job.gpu_models)

    def _scores(self, job, state, cands):
        return -(state.free[cands] - job.gpus_per_worker).astype(float)


@register_placement("loadbalance")
class LoadBalance(_IndexedFit):
    """Worst fit: the node with the most free GPUs (ties: lowest index)."""

    name = "loadbalance"

    def _index(self, job, state):
        return state.worst_fit(job.gpus_per_worker, job.gpu_models)

    def _scores(self, job, state, cands):
        return (state.free[cands] - job.gpus_per_worker).astype(float)


@register_placement("random")
class RandomPlacement(_Placement):
    """A uniformly random feasible node per worker."""

    name = "random"

    def __init__(self, *, rng: np.random.Generator | None = None) -> None:
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def _pick(self, job, state):
        cands = np.flatnonzero(feasible_mask(job, state))
        if len(cands) == 0:
            return None
        return int(cands[self.rng.integers(len(cands))])

    def _scores(self, job, state, cands):
        return self.rng.random(len(cands))


def _tightest(sums: np.ndarray, k: int) -> int | None:
    """Index of the smallest entry ``>= k`` (ties: lowest index), or None."""
    ok = np.flatnonzero(sums >= k)
    if len(ok) == 0:
        return None
    return int(ok[np.argmin(sums[ok])])


@register_placement("topology")
class TopologyPacking(_Placement):
    """Topology packing: the fewest racks and blocks, near the job's own workers.

    A new job goes on one node if one can take all its workers, else in one rack,
    else in one block, else across blocks, choosing at each level the *tightest* group
    that fits (fewest free worker slots). Inside a group it fills sub-groups the same
    way: the tightest sub-group that holds the rest, otherwise the largest one whole.
    A job that already has workers (``job.placement``) grows inside the smallest group
    (node, rack, block) that contains them all and has room, filling its own nodes
    first. :meth:`score` ranks a candidate by the level the whole remaining gang would
    span if started there, then by how tight that group is.
    """

    name = "topology"

    def __init__(self, *, rng: np.random.Generator | None = None) -> None:
        super().__init__(rng=rng)
        self._block_cache: tuple[object, np.ndarray] | None = None

    def _levels(self, state: ClusterState) -> list[np.ndarray]:
        """Group id of every node per level, coarse to fine: cluster, block, rack."""
        topo = state.topology
        if self._block_cache is None or self._block_cache[0] is not topo:
            ids = {b: k for k, b in enumerate(topo.blocks)}
            self._block_cache = (topo, np.array([ids[b] for b in topo.block_of], dtype=np.int64))
        n = len(topo)
        return [np.zeros(n, dtype=np.int64), self._block_cache[1], np.asarray(state.rack_of)]

    @staticmethod
    def _fill(nodes: np.ndarray, slots: np.ndarray, k: int, levels: list[np.ndarray], out: list[int]) -> int:
        """Put up to ``k`` workers on ``nodes`` (hierarchically tightest); returns the rest."""
        if k <= 0 or len(nodes) == 0:
            return k
        if not levels:
            s = slots[nodes].copy()
            while k > 0 and s.max() > 0:
                j = _tightest(s, k)
                if j is None:
                    j = int(np.argmax(s))
                take = int(min(s[j], k))
                out.extend([int(nodes[j])] * take)
                s[j] -= take
                k -= take
            return k
        gid = levels[0][nodes]
        groups, inv = np.unique(gid, return_inverse=True)
        sums = np.bincount(inv.ravel(), weights=slots[nodes], minlength=len(groups)).astype(np.int64)
        while k > 0 and sums.max() > 0:
            j = _tightest(sums, k)
            if j is None:
                j = int(np.argmax(sums))
            want = int(min(sums[j], k))
            left = TopologyPacking._fill(nodes[inv.ravel() == j], slots, want, levels[1:], out)
            k -= want - left
            sums[j] = 0
        return k

    def place(self, job, state, workers=None):
        k = _workers(job, workers)
        if k == 0:
            return []
        slots = worker_slots(job, state)
        if int(slots.sum()) < k:
            return None
        levels = self._levels(state)  # cluster, block, rack
        node_ids = np.arange(len(slots))
        out: list[int] = []
        own = sorted(set(job.placement))
        if own:
            # smallest group holding every existing worker that has room for k more
            by_level = [node_ids, levels[2], levels[1], levels[0]]
            for depth, gid in enumerate(by_level):
                g = gid[own]
                if (g != g[0]).any():
                    continue
                members = np.flatnonzero(gid == g[0])
                if int(slots[members].sum()) < k:
                    continue
                s = slots.copy()
                for i in sorted(own, key=lambda i: (-s[i], i)):
                    take = int(min(s[i], k - len(out)))
                    out.extend([i] * take)
                    s[i] -= take
                rest = k - len(out)
                sub = levels[4 - depth :]  # the sub-levels inside the group
                left = self._fill(members, s, rest, sub, out)
                return out if left == 0 else None
            return None
        j = _tightest(slots, k)
        if j is not None:
            return [j] * k
        for depth in (2, 1):  # rack, block
            gid = levels[depth]
            sums = np.bincount(gid, weights=slots, minlength=int(gid.max()) + 1).astype(np.int64)
            g = _tightest(sums, k)
            if g is not None:
                left = self._fill(np.flatnonzero(gid == g), slots, k, levels[depth + 1 :], out)
                return out if left == 0 else None
        left = self._fill(node_ids, slots, k, levels[1:], out)
        return out if left == 0 else None

    def _scores(self, job, state, cands):
        slots = worker_slots(job, state)
        _, block, rack = self._levels(state)
        k = max(1, job.workers - len(job.placement))
        rack_sum = np.bincount(rack, weights=slots, minlength=int(rack.max()) + 1)
        block_sum = np.bincount(block, weights=slots, minlength=int(block.max()) + 1)
        total = float(slots.sum())
        # level the remaining gang spans when started at each candidate
        group = np.full(len(cands), total)
        level = np.full(len(cands), float(Level.CLUSTER))
        for lv, sums in (
            (Level.BLOCK, block_sum[block[cands]]),
            (Level.RACK, rack_sum[rack[cands]]),
            (Level.NODE, slots[cands].astype(float)),
        ):
            ok = sums >= k
            level[ok] = float(lv)
            group[ok] = sums[ok]
        own = sorted(set(job.placement))
        if own:
            same = [
                (Level.NODE, (cands == own[0]) if len(own) == 1 else np.zeros(len(cands), dtype=bool)),
                (Level.RACK, (rack[own] == rack[cands][:, None]).all(axis=1)),
                (Level.BLOCK, (block[own] == block[cands][:, None]).all(axis=1)),
            ]
            span = np.full(len(cands), float(Level.CLUSTER))
            for lv, ok in reversed(same):
                span[ok] = float(lv)
            level = np.maximum(level, span)
        tight = (group - k) / (total + 1.0)  # in [0, 1)
        fit = (state.free[cands] - job.gpus_per_worker) / (10.0 * (state.max_gpus + 1))
        return -10.0 * level - tight - fit


@register_placement("fgd")
class FGD(_Placement):
    """Fragmentation-aware placement in the spirit of FGD (Weng et al., ATC'23).

    Each worker goes to the node whose expected fragmentation
    (:func:`rlsched.core.fgd.fragmentation`) under the target ``workload`` grows
    least; ties go to the node left with the fewest free GPUs, then the lowest index.
    ``workload`` is a list of ``(gpus,
    probability)`` pairs or a :class:`~rlsched.core.fgd.Workload`; by default it is
    learned from the snapshot: the GPUs (and CPU) per worker of the pending jobs,
    weighted by worker count, plus the job being placed if its request is not among
    them.
    """

    name = "fgd"

    def __init__(
        self,
        workload: Sequence[tuple[float, float]] | Workload | None = None,
        *,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__(rng=rng)
        if workload is None or isinstance(workload, Workload):
            self.workload = workload
        else:
            self.workload = Workload.from_pairs(workload)
        self._learned: tuple[frozenset, Workload] | None = None
        self._fixed: Workload | None = None
        self._table: tuple[Workload, int, np.ndarray] | None = None

    def place(self, job, state, workers=None):
        # learn the target workload once per gang, not once per worker
        self._fixed = self.target(job, state)
        try:
            return super().place(job, state, workers)
        finally:
            self._fixed = None

    def target(self, job: JobView, state: ClusterState) -> Workload:
        """The workload fragmentation is measured against for this decision."""
        if self.workload is not None:
            return self.workload
        if self._fixed is not None:
            return self._fixed
        counts: dict[tuple[int, int], int] = {}
        for j in state.pending:
            key = (j.gpus_per_worker * 1000, j.cpu_milli)
            counts[key] = counts.get(key, 0) + max(j.workers, 1)
        own = (job.gpus_per_worker * 1000, job.cpu_milli)
        if own not in counts:
            counts[own] = max(job.workers, 1)
        sig = frozenset(counts.items())
        if self._learned is None or self._learned[0] != sig:  # re-learn only on change
            keys = sorted(counts)
            wl = Workload(
                np.array([k[0] for k in keys]), np.array([counts[k] for k in keys], dtype=float), np.array([k[1] for k in keys])
            )
            self._learned = (sig, wl)
        return self._learned[1]

    def delta(self, job: JobView, state: ClusterState, cands: np.ndarray) -> np.ndarray:
        """Growth of expected fragmentation (milli-GPU) if one worker goes on each candidate."""
        width = max(state.max_gpus, 1)
        wl = self.target(job, state)
        free = state.free[cands]
        after = free - job.gpus_per_worker
        if (wl.cpu_milli > 0).any():  # CPU matters: evaluate each candidate node
            cpu = state.cpu_free[cands]
            return fragmentation(whole_gpu_free_milli(after, width), wl, cpu - job.cpu_milli) - fragmentation(
                whole_gpu_free_milli(free, width), wl, cpu
            )
        if self._table is None or self._table[0] is not wl or self._table[1] != width:
            self._table = (wl, width, fragmentation(whole_gpu_free_milli(np.arange(width + 1), width), wl))
        table = self._table[2]
        return table[after] - table[free]

    def _scores(self, job, state, cands):
        left = (state.free[cands] - job.gpus_per_worker) / (state.max_gpus + 1.0)
        return -self.delta(job, state, cands) - 1e-3 * left

    def __repr__(self) -> str:
        return f"FGD(workload={self.workload!r})"
