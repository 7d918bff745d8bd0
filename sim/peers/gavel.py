"""Gavel as its paper describes it (Narayanan et al., "Heterogeneity-Aware Cluster
Scheduling Policies for Deep Learning Workloads", OSDI 2020), with the policy the Sia
paper compares against: maximum total throughput (§4.2), heterogeneity-aware.

Each round (360 s, as Sia evaluates it) an LP over ``X[m, j]``, the time fraction of job
``m`` on GPU type ``j``: maximise ``Σ T[m, j]·X[m, j]`` with ``Σ_j X[m, j] ≤ 1`` and
``Σ_m k_m·X[m, j] ≤ G_j`` (rigid ``k_m`` GPUs), by HiGHS (:func:`scipy.optimize.linprog`);
then the round-based mechanism (§5) places jobs whole on one type. ``T[m, j]``: steps
per second reported on ``j``, else bootstrapped by the seed one-GPU ratio, else the
seed profile. Details: docs/results/sia_peers.md.
"""

from __future__ import annotations

import math
import time
from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, vstack

from rlsched.core.allocation import AllocJob, Allocation, AllocNode, FreeNodes, ProfileSample, checked_call

from .sia import one_gpu_throughput

__all__ = ["GavelAllocator", "GavelError", "seed_step_time"]


class GavelError(RuntimeError):
    """The LP solver failed (it always has a solution: nothing allocated)."""


def seed_step_time(samples: Sequence[ProfileSample], local_batch: float) -> float | None:
    """One-GPU seconds per step at ``local_batch`` from one-GPU seed rows: linear
    between the rows' batch sizes, proportional to the batch beyond the largest (and
    the smallest row's time below the smallest); None without rows."""
    rows = sorted((s.atomic_bsz, s.step_time) for s in samples if s.num_replicas == 1 and s.step_time > 0)
    if not rows:
        return None
    b, t = np.array(rows, dtype=float).T
    if local_batch > b[-1]:
        return float(t[-1] * local_batch / b[-1])
    return float(np.interp(local_batch, b, t))


class GavelAllocator:
    """Gavel's max-sum-throughput policy with its round-based mechanism (module
    docstring); type-aware, non-clairvoyant, rigid (the job's requested GPUs and batch)."""

    name = "gavel"
    clairvoyant = False
    type_aware = True

    def __init__(self, *, round_s: float = 360.0, seed: int = 0) -> None:
        if not (math.isfinite(round_s) and round_s > 0):
            raise ValueError(f"round_s must be > 0, got {round_s}")
        self.round_s = float(round_s)
        self.seed = int(seed)
        self._now: float | None = None
        self._next_round: float | None = None
        #: job id -> type -> seconds it received there (new jobs start at half a round)
        self._job_time: dict[str, dict[str, float]] = {}
        #: type -> seconds handed out there
        self._type_time: dict[str, float] = {}
        self.decision_seconds: list[float] = []
        self.solve_seconds: list[float] = []

    def __repr__(self) -> str:
        return f"GavelAllocator(round_s={self.round_s})"

    # ------------------------------------------------------------------ throughputs
    @staticmethod
    def size(job: AllocJob) -> int:
        """GPUs the job runs on: what it asked for (rigid), within its bounds."""
        want = job.target_replicas if job.target_replicas is not None else job.min_replicas
        return max(min(int(want), job.max_replicas), max(job.min_replicas, 1))

    def throughputs(self, job: AllocJob, types: Sequence[str], type_gpus: Mapping[str, int]) -> dict[str, float]:
        """Steps per second of the job on its requested GPUs of each type (module
        docstring); types it cannot be on (too few GPUs, nothing reported or declared
        there) left out. A job that declared and reported nothing: 1 on every type."""
        k = self.size(job)
        batch = job.target_batch_size or job.bounds.init_batch
        at_k = {t: [s for s in job.profile if s.gpu_type == t and s.num_replicas == k and s.step_time > 0]
                for t in types}
        seeds = {t: tuple(s for s in job.seed_profile if s.gpu_type == t) for t in types}
        thr1 = {t: one_gpu_throughput(seeds[t]) for t in types}
        measured = {t: 1.0 / float(np.mean([s.step_time for s in at_k[t]])) for t in types if at_k[t]}
        src = max(measured, key=lambda t: len(at_k[t])) if measured else None
        out: dict[str, float] = {}
        for t in types:
            if k > type_gpus[t]:
                continue
            if t in measured:
                out[t] = measured[t]
            elif src is not None and thr1[t] and thr1[src]:
                out[t] = measured[src] * thr1[t] / thr1[src]
            elif seeds[t] and not job.profile:
                step = seed_step_time(seeds[t], batch / k)
                if step:
                    out[t] = 1.0 / step
        if not out and not job.profile and not job.seed_profile:
            out = {t: 1.0 for t in types if k <= type_gpus[t]}
        return out

    # ------------------------------------------------------------------ decision
    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float) -> Mapping[str, Allocation]:
        t0 = time.perf_counter()
        self._now = checked_call(self.name, self._now, now, jobs)
        ids = {j.id for j in jobs}
        self._job_time = {k: v for k, v in self._job_time.items() if k in ids}
        if self._next_round is not None and now < self._next_round - 1e-9:
            # within a round: allocations stand (new jobs wait for the next round)
            self.decision_seconds.append(time.perf_counter() - t0)
            self.solve_seconds.append(0.0)
            return {j.id: Allocation(j.allocation) for j in jobs if j.allocation}
        self._next_round = now + self.round_s
        types = list(dict.fromkeys(n.gpu_type for n in nodes))
        type_gpus = {t: sum(n.gpus for n in nodes if n.gpu_type == t) for t in types}
        for j in jobs:
            if j.id not in self._job_time:
                self._job_time[j.id] = {t: self.round_s / 2 for t in types}
                for t in types:
                    self._type_time[t] = self._type_time.get(t, 0.0) + self.round_s / 2
        thr = [self.throughputs(j, types, type_gpus) for j in jobs]
        X, solve_s = self._solve(jobs, types, type_gpus, thr)
        order = []
        for m, j in enumerate(jobs):
            for c, t in enumerate(types):
                x = X[m, c]
                share = self._job_time[j.id][t] / self._type_time[t] if self._type_time.get(t, 0) > 0 else 0.0
                prio = 0.0 if x <= 0 else (x * 1e9 if share <= 0 else x / share)
                if t in thr[m]:
                    order.append((-prio, -x, m, c))
        order.sort()
        left = dict(type_gpus)
        picked: dict[int, str] = {}
        for _, _, m, c in order:
            t = types[c]
            k = self.size(jobs[m])
            if m in picked or k > left[t]:
                continue
            left[t] -= k
            picked[m] = t
        result = self._place(jobs, nodes, picked)
        for m, t in picked.items():
            if jobs[m].id in result:
                self._job_time[jobs[m].id][t] += self.round_s
                self._type_time[t] += self.round_s
        self.solve_seconds.append(solve_s)
        self.decision_seconds.append(time.perf_counter() - t0)
        return result

    def _solve(self, jobs: Sequence[AllocJob], types: list[str], type_gpus: Mapping[str, int],
               thr: list[dict[str, float]]) -> tuple[np.ndarray, float]:
        """The max-sum-throughput LP: ``X`` (jobs × types) and the solver's seconds."""
        J, T = len(jobs), len(types)
        if J == 0:
            return np.zeros((0, T)), 0.0
        c = np.zeros(J * T)
        ub = np.zeros(J * T)
        k = np.array([self.size(j) for j in jobs], dtype=float)
        for m in range(J):
            for q, t in enumerate(types):
                if t in thr[m]:
                    c[m * T + q] = -thr[m][t]
                    ub[m * T + q] = 1.0
        idx = np.arange(J * T)
        per_job = coo_matrix((np.ones(J * T), (idx // T, idx)), shape=(J, J * T))
        per_type = coo_matrix((np.repeat(k, T), (idx % T, idx)), shape=(T, J * T))
        A = vstack([per_job, per_type]).tocsr()
        b = np.concatenate([np.ones(J), [float(type_gpus[t]) for t in types]])
        t0 = time.perf_counter()
        res = linprog(c, A_ub=A, b_ub=b, bounds=np.stack([np.zeros(J * T), ub], axis=1), method="highs")
        dt = time.perf_counter() - t0
        if res.status != 0 or res.x is None:
            raise GavelError(f"gavel: the LP solver failed ({res.message})")
        return np.clip(res.x.reshape(J, T), 0.0, 1.0), dt

    @staticmethod
    def _place(jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], picked: Mapping[int, str]) -> dict[str, Allocation]:
        """Each picked job whole on its type: on the nodes it holds if it stays there,
        else packed on as few nodes as possible, largest jobs first (§5's placement)."""
        out: dict[str, Allocation] = {}
        type_of = {n.index: n.gpu_type for n in nodes}
        for t in dict.fromkeys(picked.values()):
            free = {n.index: n.gpus for n in nodes if n.gpu_type == t}
            mine = sorted((m for m, tt in picked.items() if tt == t),
                          key=lambda m: (-GavelAllocator.size(jobs[m]), jobs[m].submit_time, jobs[m].id))
            rest = []
            for m in mine:
                a = jobs[m].allocation
                if (a and len(a) == GavelAllocator.size(jobs[m]) and all(type_of.get(i) == t for i in a)
                        and all(free.get(i, 0) >= a.count(i) for i in set(a))):
                    for i in a:
                        free[i] -= 1
                    out[jobs[m].id] = Allocation(tuple(a))
                else:
                    rest.append(m)
            book = FreeNodes(free)
            for m in rest:
                got = book.take(GavelAllocator.size(jobs[m]))
                if got:
                    out[jobs[m].id] = Allocation(got)
        return out
