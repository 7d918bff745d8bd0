"""Elastic scalings: +1 / -1 / 0 workers per running job.

:meth:`decide` returns ``{job_id: delta}`` for the jobs that change (delta is +1 or
-1; unchanged jobs are left out). Every scaling keeps each job within
``[min_workers, max_workers]``, changes a job by at most one worker per call, and only
grows a job when a node can host the new worker: it checks with tentative
allocations on the state (all undone before returning), counting the GPUs that this
call's -1 decisions free (the worker removed is the job's last, ``placement[-1]``), so
the caller should apply -1 before +1. Formulas and citations: ``docs/policies.md``.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import numpy as np

from .cluster import ClusterState, JobView
from .ordering import remaining_time
from .placement import FirstFit
from .policy import Scaling, register_scaling

__all__ = ["NoScaling", "FairShare", "FCFSScaling", "Optimus", "BetaThreshold"]


def _elastic(running: Sequence[JobView]) -> list[JobView]:
    return [j for j in running if j.min_workers < j.max_workers]


def _can_grow(job: JobView) -> bool:
    return job.workers < job.max_workers


def _can_shrink(job: JobView) -> bool:
    return job.workers > job.min_workers


class _Tentative:
    """Tentative worker additions/removals on a state, undone by :meth:`undo`."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._fit = FirstFit()
        self._log: list[tuple[bool, int, JobView]] = []  # (allocated?, node, job)

    def remove(self, job: JobView) -> None:
        """Free the job's last worker (if its placement is known and consistent)."""
        if not job.placement:
            return
        i = job.placement[-1]
        if not (0 <= i < len(self.state.free)):
            return
        if self.state.free[i] + job.gpus_per_worker > self.state.total[i]:
            return
        self.state.release(i, job.gpus_per_worker, job.cpu_milli, job.memory_mib)
        self._log.append((False, i, job))

    def add(self, job: JobView) -> bool:
        """Reserve a node for one more worker; False if none can host it."""
        i = self._fit._pick(job, self.state)
        if i is None:
            return False
        self.state.allocate(i, job.gpus_per_worker, job.cpu_milli, job.memory_mib)
        self._log.append((True, i, job))
        return True

    def undo(self) -> None:
        for allocated, i, job in reversed(self._log):
            if allocated:
                self.state.release(i, job.gpus_per_worker, job.cpu_milli, job.memory_mib)
            else:
                self.state.allocate(i, job.gpus_per_worker, job.cpu_milli, job.memory_mib)
        self._log.clear()


class _Scaling(Scaling):
    name = ""

    def __init__(self, *, rng: np.random.Generator | None = None) -> None:
        # accepted so every scaling is built the same way; they are deterministic
        del rng

    def decide(self, running: Sequence[JobView], state: ClusterState) -> dict[str, int]:
        t = _Tentative(state)
        try:
            return self._decide(list(running), state, t)
        finally:
            t.undo()

    def _decide(self, running: list[JobView], state: ClusterState, t: _Tentative) -> dict[str, int]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@register_scaling("none")
class NoScaling(_Scaling):
    """Never changes a job's worker count."""

    name = "none"

    def _decide(self, running, state, t):
        return {}


@register_scaling("fs")
class FairShare(_Scaling):
    """Fair share: elastic jobs converge to equal GPU shares of what they hold plus
    the free GPUs (water-filling within each job's bounds).

    A job below its share gets +1 (smallest current share first) when a node can take
    the worker; only when one cannot does a job above its share give one back (largest
    share first), so GPUs never go idle for fairness' sake.
    """

    name = "fs"

    @staticmethod
    def targets(jobs: Sequence[JobView], pool: int) -> dict[str, int]:
        """Water-filling worker targets: ``Σ target × gpus_per_worker <= pool``."""
        target = {j.id: j.min_workers for j in jobs}
        pool -= sum(j.min_workers * j.gpus_per_worker for j in jobs)
        heap = [(j.min_workers * j.gpus_per_worker, j.submit_time, j.id, k) for k, j in enumerate(jobs)]
        heapq.heapify(heap)
        while heap:
            share, submit, jid, k = heapq.heappop(heap)
            j = jobs[k]
            if target[jid] >= j.max_workers or j.gpus_per_worker > pool:
                continue
            target[jid] += 1
            pool -= j.gpus_per_worker
            heapq.heappush(heap, (share + j.gpus_per_worker, submit, jid, k))
        return target

    def _decide(self, running, state, t):
        jobs = _elastic(running)
        if not jobs:
            return {}
        pool = state.free_gpus + sum(j.gpus for j in jobs)
        target = self.targets(jobs, pool)
        out: dict[str, int] = {}
        below = sorted((j for j in jobs if j.workers < target[j.id]), key=lambda j: (j.gpus, j.submit_time, j.id))
        above = sorted((j for j in jobs if j.workers > target[j.id] and _can_shrink(j)), key=lambda j: (-j.gpus, j.submit_time, j.id))
        waiting = []
        for j in below:
            if t.add(j):
                out[j.id] = 1
            else:
                waiting.append(j)
        for j in waiting:
            while above:
                donor = above.pop(0)
                t.remove(donor)
                out[donor.id] = -1
                if t.add(j):
                    out[j.id] = 1
                    break
        return out


@register_scaling("fcfs")
class FCFSScaling(_Scaling):
    """All spare GPUs to the earliest-submitted jobs: +1 in submit order while a node
    can take the worker (so the first job reaches ``max_workers`` first)."""

    name = "fcfs"

    def _decide(self, running, state, t):
        out: dict[str, int] = {}
        for j in sorted(_elastic(running), key=lambda j: (j.submit_time, j.id)):
            if _can_grow(j) and t.add(j):
                out[j.id] = 1
        return out


@register_scaling("optimus")
class Optimus(_Scaling):
    """Marginal-gain scaling in the style of Optimus (Peng et al., EuroSys'18).

    Speed with ``w`` workers follows a synchronous data-parallel model
    ``s(w) = throughput / (1/w + κ (w − 1))`` (per-step compute split over workers,
    communication growing with workers; ``κ = comm_overhead``). The remaining time at
    ``w`` workers is ``T(w) = R s(w_now) / s(w)`` with ``R`` the job's remaining time at
    its current size (the remaining samples ``R s(w_now)`` divided by the new speed);
    ``R`` is the non-clairvoyant estimate (:func:`rlsched.core.ordering.remaining_time`,
    :mod:`rlsched.core.estimate`), and a job whose remaining time is unknown (0) gains
    nothing from a worker, so it is neither grown nor shrunk.
    A job whose last worker slows it (``T(w−1) < T(w)``) gives it back; then GPUs go
    +1 to the largest gains per GPU ``(T(w) − T(w+1)) / gpus_per_worker > 0``.
    """

    name = "optimus"

    def __init__(self, comm_overhead: float = 0.02, *, rng: np.random.Generator | None = None) -> None:
        super().__init__(rng=rng)
        if comm_overhead < 0:
            raise ValueError(f"comm_overhead must be >= 0, got {comm_overhead}")
        self.comm_overhead = comm_overhead

    def speed(self, job: JobView, w: int) -> float:
        base = job.throughput if job.throughput > 0 else 1.0
        return base / (1.0 / w + self.comm_overhead * (w - 1))

    def remaining_at(self, job: JobView, w: int) -> float:
        """Estimated remaining time of ``job`` with ``w`` workers."""
        return remaining_time(job) * self.speed(job, job.workers) / self.speed(job, w)

    def gain(self, job: JobView) -> float:
        """Remaining-time reduction per GPU of one more worker."""
        w = job.workers
        return (self.remaining_at(job, w) - self.remaining_at(job, w + 1)) / job.gpus_per_worker

    def _decide(self, running, state, t):
        out: dict[str, int] = {}
        jobs = _elastic(running)
        for j in jobs:
            w = j.workers
            if _can_shrink(j) and w > 1 and self.remaining_at(j, w - 1) < self.remaining_at(j, w):
                t.remove(j)
                out[j.id] = -1
        grow = [(self.gain(j), j) for j in jobs if j.id not in out and _can_grow(j)]
        for g, j in sorted(grow, key=lambda x: (-x[0], x[1].submit_time, x[1].id)):
            if g <= 0:
                break
            if t.add(j):
                out[j.id] = 1
        return out

    def __repr__(self) -> str:
        return f"Optimus(comm_overhead={self.comm_overhead})"


@register_scaling("beta")
class BetaThreshold(_Scaling):
    """RLPTO's β-threshold rule without learning.

    A job whose accuracy gain over its last evaluation (``Progress.gain``) fell below
    its ``beta`` loses one worker (never below ``min_workers``); free and freed GPUs go
    +1 to jobs still gaining at least ``beta`` and below ``max_workers``, most-gaining
    first (jobs with fewer than two evaluations count as gaining infinitely).
    """

    name = "beta"

    def _decide(self, running, state, t):
        out: dict[str, int] = {}
        jobs = _elastic(running)
        for j in jobs:
            if j.progress.gain < j.beta and _can_shrink(j):
                t.remove(j)
                out[j.id] = -1
        grow = [j for j in jobs if j.progress.gain >= j.beta and _can_grow(j)]
        for j in sorted(grow, key=lambda j: (-j.progress.gain, j.submit_time, j.id)):
            if t.add(j):
                out[j.id] = 1
        return out
