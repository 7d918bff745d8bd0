"""Baseline for the simulator benchmark: first-fit by scanning every node in Python.

This is what a simulator without a free-capacity index does on every placement
decision; ``bench/run.py`` times it against the indexed
:class:`rlsched.core.placement.FirstFit` on the same trace so the figures read as a
ratio on this machine.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rlsched.core import ClusterState, JobView


class NaiveFirstFit:
    """Lowest-index node with room for each worker, found by scanning every node."""

    name = "naive-firstfit"

    def place(self, job: JobView, state: ClusterState, workers: int | None = None) -> list[int] | None:
        k = job.workers if workers is None else workers
        nodes = state.topology.nodes
        free = state.free.tolist()
        models = job.gpu_models
        g = job.gpus_per_worker
        out: list[int] = []
        for _ in range(k):
            # every node is checked for every worker, as a simulator without an index does
            fits = [i for i in range(len(free)) if free[i] >= g and (models is None or nodes[i].gpu_model in models)]
            if not fits:
                return None
            i = fits[0]
            free[i] -= g
            out.append(i)
        return out

    def score(self, job: JobView, candidates: Sequence[int], state: ClusterState) -> np.ndarray:
        c = np.asarray(candidates, dtype=np.int64)
        return np.where(state.free[c] >= job.gpus_per_worker, -c.astype(float), -np.inf)
