"""Hand-written policies for the engine's tests: the test says where each job's workers
go and how many GPUs each job holds when, and the engine carries it out."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from rlsched.core.allocation import Allocation


class Pinned:
    """A placement putting each job's first workers on the nodes ``where[job]`` names
    and the workers it adds later on ``more[job]`` (None where the test names none)."""

    name = "pinned"
    fallback_reason = None
    model_version = ""

    def __init__(self, where: Mapping[str, Sequence[int]], more: Mapping[str, Sequence[int]] | None = None) -> None:
        self.where = {k: list(v) for k, v in where.items()}
        self.more = {k: list(v) for k, v in (more or {}).items()}

    def place(self, job, state, workers=None):
        if job.placement:  # a running job's added workers
            nodes = self.more.get(job.id)
            return None if nodes is None else nodes[: workers or len(nodes)]
        return self.where.get(job.id)

    def score(self, job, candidates, state):
        raise NotImplementedError("the tests place by hand")


class ByHand:
    """An allocator giving each job the GPUs ``plan(now)`` names (job id -> nodes, one
    entry per GPU); jobs served in the order they came."""

    name = "by-hand"
    clairvoyant = False
    type_aware = False

    def __init__(self, plan: Callable[[float], Mapping[str, Sequence[int]]]) -> None:
        self.plan = plan

    def allocate(self, jobs, nodes, now, queues=None):
        want = self.plan(now)
        return {j.id: Allocation(tuple(want[j.id])) for j in jobs if j.id in want}

    def order(self, jobs):
        return sorted(jobs, key=lambda j: (j.submit_time, j.id))
