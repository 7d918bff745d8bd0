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
from .policy import register_placement
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


class _Placement:
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
