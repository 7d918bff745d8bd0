"""Elastic scalings: +1 / -1 / 0 workers per running job.

:meth:`decide` returns ``{job_id: delta}`` for the jobs that change (delta is +1 or
-1; unchanged jobs are left out). Every scaling keeps each job within
``[min_workers, max_workers]``, changes a job by at most one worker per call, and only
grows a job when a node can host the new worker: it checks with tentative
allocations on the state (released before returning), counting GPUs freed by this
call's -1 decisions (the worker removed is the job's last, ``placement[-1]``), so the
caller should apply -1 before +1. Formulas and citations: ``docs/policies.md``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .cluster import ClusterState, JobView
from .policy import register_scaling

__all__ = ["NoScaling"]


@register_scaling("none")
class NoScaling:
    """Never changes a job's worker count."""

    name = "none"

    def __init__(self, *, rng: np.random.Generator | None = None) -> None:
        del rng

    def decide(self, running: Sequence[JobView], state: ClusterState) -> dict[str, int]:
        return {}

    def __repr__(self) -> str:
        return "NoScaling()"
