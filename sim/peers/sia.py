"""Sia as its paper describes it (Jayaram Subramanya et al., "Sia: Heterogeneity-aware,
goodput-optimized ML-cluster scheduling", SOSP 2023, §3).

Per round: each job's goodput on every configuration ``(GPU type, nodes, GPUs)`` of the
paper's set (1, 2, 4 ... GPUs within a node, whole nodes beyond), estimated per type
from what the job reported there or bootstrapped from another type by the ratio of the
one-GPU throughputs it declared (§3.1); rows normalised to their minimum, damped by the
re-allocation factor, raised to the power ``p``; one configuration per job at most under
per-type GPU capacity, Eq. (1), a binary program solved by HiGHS
(:func:`scipy.optimize.milp`). Rules and choices: docs/results/sia_peers.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from rlsched.core.allocation import AllocJob, Allocation, AllocNode, ProfileSample, checked_call
from rlsched.core.goodput import GoodputModel
from rlsched.core.job_goodput import split_batch
from rlsched.core.type_program import Config, configurations, cost, solve

from .pollux_paper import PolluxPaperAllocator

__all__ = ["SiaAllocator", "Config", "configurations", "one_gpu_throughput"]

#: seconds a restart costs, per application, as the policy assumes them (the artifact's
#: ``get_restart_penalty``; 30 s for any other)
RESTART_PENALTY = {"deepspeech2": 25.0, "imagenet": 250.0, "cifar10": 30.0, "bert": 120.0, "yolov3": 45.0}


def one_gpu_throughput(samples: Sequence[ProfileSample]) -> float | None:
    """Samples per second on one GPU from one-GPU profile rows: the largest batch over
    the longest step (the artifact's ratio of one-GPU throughputs); None without rows."""
    rows = [s for s in samples if s.num_replicas == 1 and s.step_time > 0 and s.atomic_bsz > 0]
    if not rows:
        return None
    return max(s.atomic_bsz for s in rows) / max(s.step_time for s in rows)


class SiaAllocator:
    """Sia's policy (module docstring); type-aware, non-clairvoyant."""

    name = "sia"
    clairvoyant = False
    type_aware = True

    def __init__(self, *, p: float = -0.5, lambda_n: float = 1.1, clip: float = 3000.0,
                 restart_penalty: Mapping[str, float] | None = None, default_penalty: float = 30.0,
                 mip_rel_gap: float = 1e-4, seed: int = 0) -> None:
        if not (math.isfinite(p) and p != 0):
            raise ValueError(f"p must be finite and non-zero, got {p}")
        if not (math.isfinite(lambda_n) and lambda_n > 0):
            raise ValueError(f"lambda_n must be > 0 (the size of the no-allocation penalty), got {lambda_n}")
        if not clip > 0:
            raise ValueError(f"clip must be > 0, got {clip}")
        self.p, self.lambda_n, self.clip = float(p), float(lambda_n), float(clip)
        self.restart_penalty = dict(RESTART_PENALTY if restart_penalty is None else restart_penalty)
        self.default_penalty = float(default_penalty)
        self.mip_rel_gap = float(mip_rel_gap)
        self.seed = int(seed)
        #: Pollux's job model (the artifact's goodput model), fitted per GPU type
        self._pollux = PolluxPaperAllocator(population=2, generations=0, seed=seed)
        self._now: float | None = None
        #: job id -> time its allocation last changed (for the checkpoint-restore rule)
        self._changed: dict[str, float] = {}
        #: seconds per decision and of which in the solver, in call order
        self.decision_seconds: list[float] = []
        self.solve_seconds: list[float] = []

    def __repr__(self) -> str:
        return f"SiaAllocator(p={self.p}, lambda_n={self.lambda_n})"

    # ------------------------------------------------------------------ job model
    def penalty(self, job: AllocJob) -> float:
        return self.restart_penalty.get(job.application, self.default_penalty)

    def cap(self, job: AllocJob) -> int:
        """Most GPUs now: ``max_replicas``, and at most twice the most the job has run on
        (any type; Sia's scale-up rule, §3.1), at least 1."""
        seen = max((s.num_replicas for s in job.profile), default=0)
        return max(min(job.max_replicas, max(2 * seen, 1)), 0)

    def _model(self, job: AllocJob, samples: tuple[ProfileSample, ...]) -> GoodputModel:
        return self._pollux.model(replace(job, profile=samples, seed_profile=()))

    def estimators(self, job: AllocJob, types: Sequence[str]) -> dict[str, tuple[GoodputModel | None, str, float]]:
        """Per type the job may run on: ``(model, source type, factor)`` — its goodput on
        ``k`` GPUs of that type is ``factor`` × the model's on ``k`` GPUs of ``source``.

        §3.1: a type where it ran on several GPUs: its own fit there; else, when it ran on
        several GPUs of another type B: B's fit × ``thr1(t)/thr1(B)``, the one-GPU
        throughputs of its seed profile; else its own fit where it ran (one GPU,
        synchronisation unobserved: free), or B's × the ratio; a job that never ran: its
        seed profile on each type. No report and no seed on a type: not there (model
        None, factor 1, on any type, only for a job that declared nothing at all)."""
        own = {t: tuple(s for s in job.profile if s.gpu_type == t) for t in types}
        seeds = {t: tuple(s for s in job.seed_profile if s.gpu_type == t) for t in types}
        thr1 = {t: one_gpu_throughput(seeds[t]) for t in types}
        multi = [t for t in types if any(s.num_replicas >= 2 for s in own[t])]
        ran = [t for t in types if own[t]]
        src_multi = max(multi, key=lambda t: len(own[t])) if multi else None
        src_any = max(ran, key=lambda t: len(own[t])) if ran else None
        out: dict[str, tuple[GoodputModel | None, str, float]] = {}
        for t in types:
            src = None
            if t in multi:
                src = t
            elif src_multi is not None and thr1[t] and thr1[src_multi]:
                src = src_multi
            elif own[t]:
                src = t
            elif src_any is not None and thr1[t] and thr1[src_any]:
                src = src_any
            if src is not None:
                factor = 1.0 if src == t else thr1[t] / thr1[src]
                out[t] = (self._model(job, own[src]), src, factor)
            elif not ran and seeds[t]:
                out[t] = (self._model(job, seeds[t]), t, 1.0)
        if not out and not job.profile and not job.seed_profile:
            out = {t: (None, t, 1.0) for t in types}
        return out

    # ------------------------------------------------------------------ decision
    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float) -> Mapping[str, Allocation]:
        t0 = time.perf_counter()
        self._now = checked_call(self.name, self._now, now, jobs)
        ids = {j.id for j in jobs}
        self._changed = {k: v for k, v in self._changed.items() if k in ids}
        if not jobs or not nodes:
            self.decision_seconds.append(time.perf_counter() - t0)
            self.solve_seconds.append(0.0)
            return {}
        configs = configurations(nodes)
        types = list(dict.fromkeys(c.gpu_type for c in configs))
        gpn = {t: max(n.gpus for n in nodes if n.gpu_type == t) for t in types}
        type_of = {n.index: n.gpu_type for n in nodes}
        rows, cols, vals, forced, plan = [], [], [], [], []
        for i, job in enumerate(jobs):
            cur = self._current(job, type_of, configs)
            allowed = {t for t in types if any(job.runs_on(n) for n in nodes if n.gpu_type == t)}
            est = self.estimators(job, [t for t in types if t in allowed])
            cap, low = self.cap(job), max(job.min_replicas, 1)
            good: dict[int, float] = {}
            how: dict[int, tuple[GoodputModel | None, int, int]] = {}
            for c, cfg in enumerate(configs):
                e = est.get(cfg.gpu_type)
                if e is None or not low <= cfg.gpus <= cap:
                    continue
                gm, src, factor = e
                if gm is None:
                    if cfg.gpus != 1:
                        continue
                    good[c], how[c] = 1.0, (None, 1, 1)
                    continue
                n_src = -(-cfg.gpus // gpn[src])
                g = float(gm.optimize_batch(cfg.gpus, n_src).goodput) * factor
                if g > 0:
                    good[c], how[c] = g, (gm, cfg.gpus, n_src)
            if cur is not None and cur not in good and job.allocation:
                # it runs on a configuration with no estimate now (no feasible batch): keep it possible
                gm = est.get(configs[cur].gpu_type, (None, "", 1.0))[0]
                good[cur] = min(good.values(), default=1.0)
                how[cur] = (gm, configs[cur].gpus, -(-configs[cur].gpus // gpn[configs[cur].gpu_type]))
            if not good:
                plan.append({})
                continue
            base = min(good.values())
            r = self._realloc_factor(job)
            v = np.array([g / base * (r if cur is not None and c != cur else 1.0) for c, g in good.items()])
            rows.extend([i] * len(good))
            cols.extend(good)
            vals.extend(cost(v, self.p, self.lambda_n, self.clip).tolist())
            if cur is not None and cur in good and now - self._changed.get(job.id, -math.inf) < self.penalty(job):
                forced.append((i, cur))  # still in checkpoint-restore: keep it (the artifact's rule)
            plan.append(how)
        capacity = {t: sum(n.gpus for n in nodes if n.gpu_type == t) for t in types}
        chosen, solve_s = solve(len(jobs), configs, capacity, rows, cols, vals, forced, mip_rel_gap=self.mip_rel_gap)
        result = self._place(jobs, nodes, configs, chosen, plan, type_of)
        for job in jobs:
            a = result.get(job.id, Allocation())
            if sorted(a.nodes) != sorted(job.allocation):
                self._changed[job.id] = now
        self.solve_seconds.append(solve_s)
        self.decision_seconds.append(time.perf_counter() - t0)
        return result

    def _current(self, job: AllocJob, type_of: Mapping[int, str], configs: list[Config]) -> int | None:
        """Index of the configuration the job runs in now (None: none, or not one)."""
        if not job.allocation:
            return None
        kinds = {type_of.get(i) for i in job.allocation}
        if len(kinds) != 1:
            return None
        t, k, n = kinds.pop(), len(job.allocation), len(set(job.allocation))
        for c, cfg in enumerate(configs):
            if cfg.gpu_type == t and cfg.gpus == k and cfg.nodes == n:
                return c
        return None

    def _realloc_factor(self, job: AllocJob) -> float:
        """Eq. (2): ``r = (T − N·S)/(T + S)`` for age ``T``, ``N`` restarts and ``S``
        seconds per restart (at least 0); 1 while the job is younger than ``S``."""
        s, age = self.penalty(job), max(job.age, 0.0)
        if age < s:
            return 1.0
        return max(age - job.num_restarts * s, 0.0) / (age + s)

    # ------------------------------------------------------------------ placement
    def _place(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], configs: list[Config],
               chosen: Mapping[int, int], plan: list, type_of: Mapping[int, str]) -> dict[str, Allocation]:
        """Each chosen configuration on nodes of its type (§2, the Placer): a job whose
        configuration is unchanged keeps its nodes; the others, largest first, take whole
        free nodes (several nodes) or the fullest node with room (within a node). Should
        that leave one without room, the type is placed again from empty, largest first,
        each job preferring its own nodes (powers of two and whole nodes always fit
        then); a job that still does not fit gets nothing (the paper's eviction)."""
        out: dict[str, Allocation] = {}
        for t in dict.fromkeys(c.gpu_type for c in configs):
            tnodes = [n for n in nodes if n.gpu_type == t]
            items = sorted(((i, configs[c]) for i, c in chosen.items() if configs[c].gpu_type == t),
                           key=lambda ic: (-ic[1].gpus, jobs[ic[0]].id))
            where = self._place_type(jobs, tnodes, items, keep=True)
            if where is None:
                where = self._place_type(jobs, tnodes, items, keep=False)
            for i, cfg in items:
                job, got = jobs[i], where.get(i, ())
                if not got:
                    continue
                gm, k, n_src = plan[i][chosen[i]]
                if gm is None:
                    out[job.id] = Allocation(got)
                    continue
                choice = gm.optimize_batch(k, n_src)
                out[job.id] = Allocation(got, *split_batch(job, k, int(choice.batch), int(choice.accumulation)))
        return out

    @staticmethod
    def _place_type(jobs: Sequence[AllocJob], tnodes: Sequence[AllocNode], items: list[tuple[int, Config]],
                    keep: bool) -> dict[int, tuple[int, ...]] | None:
        """Node of each replica per job row (see :meth:`_place`); None when ``keep`` and
        one does not fit."""
        free = {n.index: n.gpus for n in tnodes}
        size = {n.index: n.gpus for n in tnodes}
        where: dict[int, tuple[int, ...]] = {}
        if keep:
            for i, cfg in items:
                a = jobs[i].allocation
                if (a and len(a) == cfg.gpus and len(set(a)) == cfg.nodes and all(x in free for x in a)
                        and all(free[x] >= a.count(x) for x in set(a))):
                    for x in a:
                        free[x] -= 1
                    where[i] = tuple(a)
        for i, cfg in items:
            if i in where:
                continue
            own = set(jobs[i].allocation)
            got: tuple[int, ...] | None = None
            if cfg.nodes > 1 or cfg.gpus >= max(size.values()):
                whole = sorted((x for x in free if free[x] == size[x] and size[x] * cfg.nodes == cfg.gpus),
                               key=lambda x: (x not in own, x))
                if len(whole) >= cfg.nodes:
                    got = tuple(x for x in whole[:cfg.nodes] for _ in range(size[x]))
            else:
                room = sorted((x for x in free if free[x] >= cfg.gpus), key=lambda x: (x not in own, free[x], x))
                if room:
                    got = (room[0],) * cfg.gpus
            if got is None:
                if keep:
                    return None
                continue
            for x in got:
                free[x] -= 1
            where[i] = got
        return where
