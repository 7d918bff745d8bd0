"""The DAS agents as they were before they were made linear: the slow reference.

A test oracle, outside the wheel: tests (and ``bench/sim_scaling.py --reference-jobs``)
run it beside the served path and hold their decisions equal. Every job's fit is a pass
over all nodes and the placement smooths with the dense ``nodes x nodes`` RWGP matrix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from rlsched.core.cluster import ClusterState, JobView
from rlsched.core.das_agent import (
    _QUEUE_RANK,
    JOB_FEATURES,
    WINDOW_SELECT,
    DASAgentPlacement,
    DASOrdering,
    _age_key,
    cluster_summary,
    das_logits,
    rwgp_smoother,
)
from rlsched.core.estimate import duration_key
from rlsched.core.ordering import remaining_time
from rlsched.core.placement import worker_slots

import math

__all__ = ["ReferenceDASOrdering", "ReferenceDASAgentPlacement"]


def _fits_now(job: JobView, state: ClusterState) -> bool:
    return int(worker_slots(job, state).sum()) >= job.workers


def _select_window(pending: Sequence[JobView], state: ClusterState, window: int, mode: str = "oldest") -> list[JobView]:
    if mode not in WINDOW_SELECT:
        raise ValueError(f"window_select must be one of {WINDOW_SELECT}, not {mode!r}")
    fifo = sorted(pending, key=_age_key)
    if mode == "oldest" or len(fifo) <= window:
        return fifo[:window]
    n_old = (window + 1) // 2 if mode == "mixed" else 0
    rest = fifo[n_old:]
    short = sorted(rest, key=lambda j: (not _fits_now(j, state), duration_key(remaining_time(j)), _age_key(j)))
    return sorted(fifo[:n_old] + short[: window - n_old], key=_age_key)


def _job_features(job: JobView, state: ClusterState) -> np.ndarray:
    big = max(state.max_gpus, 1)
    gpus = job.workers * job.gpus_per_worker
    runtime = max(remaining_time(job), 0.0)
    wait = max(state.time - job.submit_time, 0.0)
    free = state.free_gpus
    share = min(gpus / free, 4.0) / 4.0 if free > 0 else 1.0
    return np.array(
        [
            gpus / big,
            job.workers / 8.0,
            job.gpus_per_worker / big,
            math.log1p(runtime) / 10.0,
            math.log1p(runtime * gpus) / 12.0,
            math.log1p(wait) / 10.0,
            1.0 if _fits_now(job, state) else 0.0,
            share,
            _QUEUE_RANK.get(job.queue, 1.0),
            math.tanh(job.priority / 10.0),
            math.log1p(max(job.attained_service, 0.0)) / 14.0,
            math.log1p(max(job.attained_service, 0.0) / max(gpus, 1)) / 12.0,
            math.log1p(max(job.progress.epoch, 0)) / 5.0,
            1.0 if runtime > 0 else 0.0,
        ],
        dtype=np.float32,
    )


class ReferenceDASOrdering(DASOrdering):
    """:class:`~rlsched.core.das_agent.DASOrdering` ranking as before the linear rewrite."""

    def observe(self, pending, state):
        head = _select_window(pending, state, self.window, self.window_select)
        feats = np.zeros((self.window, len(JOB_FEATURES)), dtype=np.float32)
        for k, job in enumerate(head):
            feats[k] = _job_features(job, state)
        valid = np.zeros(self.window, dtype=bool)
        valid[: len(head)] = True
        return feats, cluster_summary(state, len(pending), self.window), valid, head

    def rank(self, pending: Sequence[JobView], state: ClusterState) -> list[JobView]:
        fifo = sorted(pending, key=lambda j: (j.submit_time, j.id))
        if self.fallback_reason is not None or not fifo:
            return fifo
        feats, clus, valid, head = self.observe(fifo, state)
        logits = das_logits(
            self.weights, feats[None], clus[None], valid[None], num_heads=self.num_heads, num_layers=self.num_layers
        )[0]
        fits = feats[:, JOB_FEATURES.index("fits_now")] > 0.5
        order = sorted(
            range(len(head)),
            key=lambda k: (_QUEUE_RANK.get(head[k].queue, 1.0), -head[k].priority, self.las_queue(head[k]), not fits[k], -logits[k], k),
        )
        chosen = {id(j) for j in head}
        return [head[k] for k in order] + [j for j in fifo if id(j) not in chosen]


def _placement_features(job: JobView, state: ClusterState) -> np.ndarray:
    q = job.gpus_per_worker
    slots = worker_slots(job, state)
    total = np.maximum(state.total, 1).astype(float)
    need = job.workers * q
    rack_room = np.minimum(state.rack_free[state.rack_of] / max(need, 1), 1.0)
    feasible = slots > 0
    return np.stack(
        [
            feasible.astype(float),
            np.minimum(slots * q, need) / max(need, 1),
            np.where(feasible, (state.total - state.free + q) / total, 0.0),
            state.free / total,
            rack_room,
            (state.free == state.total).astype(float),
        ],
        axis=1,
    ).astype(np.float32)


def _rack_first_fill(job: JobView, state: ClusterState, scores: np.ndarray, workers: int | None = None) -> list[int] | None:
    need = job.workers if workers is None else int(workers)
    slots = worker_slots(job, state)
    if int(slots.sum()) < need:
        return None
    s = np.round(np.asarray(scores, dtype=float), 6)
    feasible = slots > 0
    rack_best = np.full(int(state.rack_of.max()) + 1, -np.inf)
    np.maximum.at(rack_best, state.rack_of[feasible], s[feasible])
    order = np.lexsort((np.arange(len(slots)), -s, state.rack_of, -rack_best[state.rack_of]))
    nodes: list[int] = []
    for i in order:
        if len(nodes) == need:
            break
        nodes.extend([int(i)] * min(int(slots[i]), need - len(nodes)))
    return nodes


class ReferenceDASAgentPlacement(DASAgentPlacement):
    """:class:`~rlsched.core.das_agent.DASAgentPlacement` as before the linear rewrite: the dense
    ``nodes x nodes`` smoother."""

    def __init__(self, model: str | Path | None = None, **kwargs) -> None:
        super().__init__(model, **kwargs)
        self._dense: tuple[object, np.ndarray | None] | None = None

    def _dense_smoother(self, topology) -> np.ndarray | None:
        hit = self._dense
        if hit is None or hit[0] is not topology:
            sm = rwgp_smoother(topology, self.lam, self.noise) if len(topology) <= self.max_smooth_nodes else None
            hit = self._dense = (topology, sm)
        return hit[1]

    def node_scores(self, job: JobView, state: ClusterState) -> np.ndarray:
        if self.fallback_reason is not None:
            return -np.arange(len(state.total), dtype=float)
        feats = _placement_features(job, state)
        a = feats.astype(np.float64) @ self.w + self.b
        sm = self._dense_smoother(state.topology)
        return a if sm is None else sm @ a

    def place(self, job: JobView, state: ClusterState, workers: int | None = None) -> list[int] | None:
        return _rack_first_fill(job, state, self.node_scores(job, state), workers)

    def score(self, job: JobView, candidates: Sequence[int], state: ClusterState) -> np.ndarray:
        cand = np.asarray(candidates, dtype=np.int64)
        s = self.node_scores(job, state)[cand]
        ok = worker_slots(job, state)[cand] > 0
        return np.where(ok, s, -np.inf)
