"""Pollux as its paper describes it: PolluxSched (Qiao et al., "Pollux: Co-adaptive
Cluster Scheduling for Goodput-Optimized Deep Learning", OSDI 2021, §4.2).

Written from the paper's text and formulas, with four model rules taken from its
artifact where the paper is silent (A1-A4); the benchmark's reference peer,
non-clairvoyant. The rules, choices and search: docs/benchmark.md, "How the peers decide".
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Mapping, Sequence

import numpy as np

from rlsched.core.allocation import AllocJob, Allocation, AllocNode, checked_call
from rlsched.core.batch import BatchBounds
from rlsched.core.goodput import GoodputModel, ThroughputModel, ThroughputPrior
from rlsched.core.goodput import FitProblem, fit_many  # the shared fit
from rlsched.core.job_goodput import JobGoodput, observations_of, split_batch

__all__ = ["PolluxPaperAllocator"]


class PolluxPaperAllocator:
    """PolluxSched of the OSDI'21 paper (docs/benchmark.md)."""

    name = "pollux-paper"
    clairvoyant = False
    type_aware = False
    #: fitted throughput models kept (least recently used dropped)
    FIT_CACHE = 4096

    def __init__(
        self,
        *,
        p: float = -1.0,
        restart_delay: float = 30.0,
        population: int = 100,
        generations: int = 100,
        seed: int = 0,
        epsilon: float = 1e-3,
        exploration: bool = True,
        interference_avoidance: bool = True,
        prior: ThroughputPrior | None = None,
        artifact_rules: bool = True,
        split_fit: bool = True,
    ) -> None:
        if not (math.isfinite(p) and p != 0):
            raise ValueError(f"p must be finite and non-zero, got {p}")
        if not (math.isfinite(restart_delay) and restart_delay >= 0):
            raise ValueError(f"restart_delay must be >= 0, got {restart_delay}")
        if population < 2 or generations < 0:
            raise ValueError("need population >= 2 and generations >= 0")
        if not epsilon > 0:
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        self.p, self.restart_delay, self.epsilon = float(p), float(restart_delay), float(epsilon)
        self.population, self.generations, self.seed = int(population), int(generations), int(seed)
        self.exploration, self.interference_avoidance = bool(exploration), bool(interference_avoidance)
        self.prior = prior if prior is not None else ThroughputPrior()
        #: the artifact's readings of what the paper leaves open (rules A1, A2, A4 in
        #: docs/benchmark.md); False: the earlier choices (for comparison and tests)
        self.artifact_rules = bool(artifact_rules)
        #: rule A3 (docs/benchmark.md): fit compute and step times too (only with artifact_rules)
        self.split_fit = bool(split_fit)
        self._rng = np.random.default_rng(seed)
        self._now: float | None = None
        #: the last population: job ids (rows), node indices (columns), matrices
        self._pop: tuple[list[str], list[int], np.ndarray] | None = None
        #: each job's goodput model and table from what it reported (cached fits)
        jobs_cls = _PaperJobGoodput if self.artifact_rules else JobGoodput
        self._jobs = jobs_cls(self.prior, prior_for=self.prior_for, cache=self.FIT_CACHE)
        self._jobs.split_fit = self.split_fit

    def __repr__(self) -> str:
        return (f"PolluxPaperAllocator(p={self.p}, restart_delay={self.restart_delay}, population={self.population}, "
                f"generations={self.generations}, seed={self.seed})")

    # ------------------------------------------------------------------ job model
    def model(self, job: AllocJob) -> GoodputModel:
        """The job's goodput model from what it reported (docs/benchmark.md)."""
        return self._jobs.model(job)

    def prior_for(self, observations: tuple) -> ThroughputPrior:
        """Pollux's prior-driven exploration (§4.1): a synchronisation term the job has
        not been observed on is free (0) — within one node until it ran on 2+ GPUs of
        one node, across nodes until it ran on 2+ nodes — and one it has been observed
        on is fitted from its data, regularised towards :attr:`prior`'s moderate
        values. (:meth:`ThroughputPrior.optimistic` pins *every* sync term at the fit's
        floor, where the log-coordinate gradient vanishes, so even observed sync costs
        stay near 0; that is not the paper's rule.) Rule A1 (docs/benchmark.md) then
        floors an unseen cross-node term at 1.1× the fitted within-node one."""
        local = any(k >= 2 and n == 1 for k, n, *_ in observations)
        across = any(n >= 2 for _, n, *_ in observations)
        return replace(self.prior, local_sync=self.prior.local_sync if local else (0.0, 0.0),
                       node_sync=self.prior.node_sync if across else (0.0, 0.0))

    def cap(self, job: AllocJob) -> int:
        """Most GPUs the job may get now: ``max_replicas``, and with exploration at most
        twice the most it has measured a step time on (at least 1)."""
        cap = job.max_replicas
        if self.exploration:
            seen = max((s.num_replicas for s in job.profile), default=0)
            cap = min(cap, max(2 * seen, 1))
        return max(cap, 0)

    def speedup_table(self, job: AllocJob, n_jobs: int, total_gpus: int, node_gpus: int,
                      width: int) -> tuple[np.ndarray, GoodputModel]:
        """``table[K, d]``: SPEEDUP on ``K`` GPUs (``K < width``) on one node (``d = 0``)
        or several (``d = 1``), relative to the fair share (docs/benchmark.md); 0 where
        the job cannot run (or ``K`` GPUs do not fit one node, for ``d = 0``)."""
        good, gm = self._jobs.table(job, width, node_gpus)
        if self.artifact_rules:
            base = fair_share_goodput(gm, max(-(-total_gpus // max(n_jobs, 1)), 1))
            table = good / base if base > 0 else np.zeros_like(good)
            return table, gm
        kmax = min(job.max_replicas, width - 1)
        fair = min(max(-(-total_gpus // max(n_jobs, 1)), 1), kmax)
        base = 0.0
        for k in range(fair, 0, -1):  # the fair share, or the largest K below it where the job can train
            base = good[k, 0] if k <= node_gpus else good[k, 1]
            if base > 0:
                break
        table = good / base if base > 0 else np.zeros_like(good)
        return table, gm

    # ------------------------------------------------------------------ decision
    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float) -> Mapping[str, Allocation]:
        self._now = checked_call(self.name, self._now, now, jobs)
        if not jobs:
            return {}
        self._jobs.prepare(jobs)  # every job's throughput fit, in one batch
        problem = _Problem(self, jobs, nodes)
        best = problem.search(self._initial(problem), self._rng)
        self._pop = (problem.ids, problem.node_ids, problem.last_population)
        return problem.decode(best)

    def _initial(self, pb: "_Problem") -> np.ndarray:
        """The current allocation plus the previous interval's population, mapped onto
        the current jobs (new jobs: no GPUs) and nodes."""
        seeds = [pb.base, pb.greedy()]
        if self._pop is not None:
            ids, node_ids, pop = self._pop
            rows = {jid: i for i, jid in enumerate(ids)}
            cols = {n: i for i, n in enumerate(node_ids)}
            src_r = [rows[jid] for jid in pb.ids if jid in rows]
            dst_r = [i for i, jid in enumerate(pb.ids) if jid in rows]
            src_c = [cols[n] for n in pb.node_ids if n in cols]
            dst_c = [i for i, n in enumerate(pb.node_ids) if n in cols]
            carried = np.zeros((pop.shape[0], *pb.base.shape), dtype=np.int64)
            carried[np.ix_(np.arange(pop.shape[0]), dst_r, dst_c)] = pop[np.ix_(np.arange(pop.shape[0]), src_r, src_c)]
            seeds.extend(carried)
        return pb.repair(np.stack(seeds))

    # ------------------------------------------------------------------ for tests
    def fitness_of(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode],
                   result: Mapping[str, Allocation]) -> float:
        """FITNESS_p of an allocation (as :meth:`allocate` returns it) of ``jobs``."""
        col = {n.index: i for i, n in enumerate(nodes)}
        m = np.zeros((1, len(jobs), len(nodes)), dtype=np.int64)
        for r, j in enumerate(jobs):
            for n in result.get(j.id, Allocation()).nodes:
                m[0, r, col[n]] += 1
        return float(self.fitness_of_matrices(jobs, nodes, m)[0])

    def fitness_of_matrices(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode],
                            matrices: np.ndarray) -> np.ndarray:
        """FITNESS_p of each allocation matrix ``matrices[i, j, n]`` (GPUs of
        ``jobs[j]`` on ``nodes[n]``), as the search scores it (no repair)."""
        pb = _Problem(self, jobs, nodes)
        rank = {jid: r for r, jid in enumerate(pb.ids)}
        order = np.array([rank[j.id] for j in jobs])
        states = np.zeros((matrices.shape[0], *pb.base.shape), dtype=np.int64)
        states[:, order, :] = matrices
        return pb.fitness(states)


class _Problem:
    """One interval's search problem: jobs in priority order (rows), nodes (columns)."""

    def __init__(self, pol: PolluxPaperAllocator, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode]) -> None:
        self.pol = pol
        self.jobs = sorted(jobs, key=lambda j: (j.attained_service, j.submit_time, j.id))
        self.ids = [j.id for j in self.jobs]
        self.node_ids = [n.index for n in nodes]
        col = {n: i for i, n in enumerate(self.node_ids)}
        self.capacity = np.array([n.gpus for n in nodes], dtype=np.int64)
        J, N = len(self.jobs), len(self.node_ids)
        total, node_gpus = int(self.capacity.sum()), int(self.capacity.max(initial=0))
        self.caps = np.array([min(pol.cap(j), total) for j in self.jobs], dtype=np.int64)
        self.mins = np.array([max(j.min_replicas, 1) for j in self.jobs], dtype=np.int64)
        width = int(max(self.caps.max(initial=0), max((j.max_replicas for j in self.jobs), default=0), 1)) + 1
        width = min(width, total + 1)
        tables, self.models = [], []
        for j in self.jobs:
            t, gm = pol.speedup_table(j, J, total, node_gpus, width)
            tables.append(t)
            self.models.append(gm)
        self.table = np.stack(tables)  # (J, width, 2)
        self.width = width
        self.base = np.zeros((J, N), dtype=np.int64)
        for r, j in enumerate(self.jobs):
            for n in j.allocation:
                if n in col:
                    self.base[r, col[n]] += 1
        d = pol.restart_delay
        age = np.array([max(j.age, 0.0) for j in self.jobs])
        restarts = np.array([j.num_restarts for j in self.jobs], dtype=float)
        self.factor = np.maximum(age - restarts * d, 0.0) / (age + d) if d > 0 else np.ones(J)
        self.last_population = np.zeros((0, J, N), dtype=np.int64)

    # ---------------------------------------------------------------- fitness
    def fitness(self, states: np.ndarray) -> np.ndarray:
        """FITNESS_p of each matrix of ``states`` (P, J, N)."""
        P, J, _ = states.shape
        K = np.minimum(states.sum(axis=2), self.width - 1)
        multi = (np.count_nonzero(states, axis=2) > 1).astype(np.int64)
        sp = self.table[np.arange(J)[None, :], K, multi]
        changed = np.any(states != self.base[None], axis=2)
        sp = np.where(changed, sp * self.factor[None, :], sp)
        p = self.pol.p
        return np.mean((sp + self.pol.epsilon) ** p, axis=1) ** (1.0 / p)

    # ---------------------------------------------------------------- repair
    def repair(self, states: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
        """Make every matrix feasible: each job within its cap (GPUs beyond it dropped
        from nodes in a random order, or in node order without ``rng``), at most one
        distributed job per node, node capacity (earlier rows — higher priority — keep
        theirs), at least ``min_replicas`` or nothing."""
        s = np.maximum(states, 0).astype(np.int64)
        P, J, N = s.shape
        if rng is not None:
            order = np.argsort(rng.random((P, J, N)), axis=2)
        else:
            order = np.broadcast_to(np.arange(N), (P, J, N))
        t = np.take_along_axis(s, order, axis=2)
        t = np.diff(np.minimum(np.cumsum(t, axis=2), self.caps[None, :, None]), axis=2, prepend=0)
        np.put_along_axis(s, order, t, axis=2)
        if self.pol.interference_avoidance:
            distributed = np.count_nonzero(s, axis=2) > 1
            on = (s > 0) & distributed[:, :, None]
            s[on & (np.cumsum(on, axis=1) > 1)] = 0
        s = np.diff(np.minimum(np.cumsum(s, axis=1), self.capacity[None, None, :]), axis=1, prepend=0)
        s[s.sum(axis=2) < self.mins[None, :]] = 0
        return s

    # ---------------------------------------------------------------- operators
    def _mutate(self, s: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Per job row, one of (else unchanged): back to the current allocation (5%), no
        GPUs (5%), more GPUs — 1 up to all the free ones — on one node that has free
        GPUs (15%), one GPU fewer on one of its nodes (10%), all its GPUs onto one node
        (5%)."""
        s = s.copy()
        P, J, N = s.shape
        u = rng.random((P, J))
        pick = rng.random((P, J, N))
        pi, ji = np.nonzero(u < 0.05)
        s[pi, ji] = self.base[ji]
        pi, ji = np.nonzero((u >= 0.05) & (u < 0.10))
        s[pi, ji] = 0
        pi, ji = np.nonzero((u >= 0.10) & (u < 0.25))
        free = np.maximum(self.capacity[None, :] - s.sum(axis=1), 0)[pi]          # (len, N)
        node = np.argmax(pick[pi, ji] * (free > 0), axis=1)
        room = free[np.arange(pi.size), node]
        s[pi, ji, node] += np.where(room > 0, rng.integers(0, np.maximum(room, 1)) + 1, 0)
        pi, ji = np.nonzero((u >= 0.25) & (u < 0.35))
        node = np.argmax(pick[pi, ji] * (s[pi, ji] > 0), axis=1)
        s[pi, ji, node] = np.maximum(s[pi, ji, node] - 1, 0)
        pi, ji = np.nonzero((u >= 0.35) & (u < 0.40))
        k = s[pi, ji].sum(axis=1)
        node = np.argmax(pick[pi, ji], axis=1)
        s[pi, ji] = 0
        s[pi, ji, node] = k
        return s

    def greedy(self) -> np.ndarray:
        """A seed for the search (not the paper's; it only starts the GA closer): from
        the jobs' current allocations, one GPU at a time to the job whose term of the
        power mean improves most (penalty included), placed on its nodes first, else on
        the node with the most free GPUs; until no GPU is free or no job gains."""
        s = self.base.copy()
        J, N = s.shape
        p, eps = self.pol.p, self.pol.epsilon
        free = self.capacity - s.sum(axis=0)
        while free.sum() > 0:
            K = s.sum(axis=1)
            multi = (np.count_nonzero(s, axis=1) > 1).astype(np.int64)
            cur = self.table[np.arange(J), np.minimum(K, self.width - 1), multi]
            cur = np.where(np.any(s != self.base, axis=1), cur * self.factor, cur)
            best, gain = -1, 0.0
            for j in range(J):
                if K[j] >= self.caps[j]:
                    continue
                own = [n for n in np.nonzero(s[j])[0] if free[n] > 0]
                n = own[0] if own else int(np.argmax(free))
                multi_new = int(np.count_nonzero(s[j]) + (s[j, n] == 0) > 1)
                new = self.table[j, min(K[j] + 1, self.width - 1), multi_new] * self.factor[j]
                g = (cur[j] + eps) ** p - (new + eps) ** p  # p < 0: the term falls as speedup rises
                g = g if p < 0 else -g
                if g > gain:
                    best, gain, where = j, g, n
            if best < 0:
                break
            s[best, where] += 1
            free[where] -= 1
        return s

    def search(self, initial: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The genetic algorithm (docs/benchmark.md); the best matrix found."""
        P = self.pol.population
        pop = initial[:P]
        while pop.shape[0] < P:  # fill up with mutants of the seeds
            extra = pop[rng.integers(0, pop.shape[0], size=P - pop.shape[0])]
            pop = np.concatenate([pop, self.repair(self._mutate(extra, rng), rng)])
        fit = self.fitness(pop)
        J = pop.shape[1]
        for _ in range(self.pol.generations):
            a, b = rng.integers(0, P, size=(2, P))
            parents = np.where(fit[a] >= fit[b], a, b)           # binary tournament
            mates = np.roll(parents, 1)
            take = rng.random((P, J)) < 0.5                       # uniform crossover of job rows
            child = np.where(take[:, :, None], pop[parents], pop[mates])
            child = self.repair(self._mutate(child, rng), rng)
            both = np.concatenate([pop, child])
            fboth = np.concatenate([fit, self.fitness(child)])
            keep = self._survivors(both, fboth, P)
            pop, fit = both[keep], fboth[keep]
        self.last_population = pop
        return pop[int(np.argmax(fit))]

    @staticmethod
    def _survivors(states: np.ndarray, fit: np.ndarray, P: int) -> np.ndarray:
        """(μ + λ) survival: the ``P`` fittest *distinct* matrices (copies only when
        there are fewer than ``P``), so that the population does not collapse onto one
        allocation and lose the variety crossover needs."""
        order = np.argsort(-fit, kind="stable")
        flat = states[order].reshape(len(order), -1)
        # distinct by a 64-bit hash of each matrix (a collision only costs variety)
        weights = np.random.default_rng(0x9E3779B9).integers(1, 2**62, size=flat.shape[1])
        _, first = np.unique((flat * weights).sum(axis=1), return_index=True)
        distinct = order[np.sort(first)]
        if distinct.size >= P:
            return distinct[:P]
        rest = np.setdiff1d(order, distinct, assume_unique=True)
        return np.concatenate([distinct, rest[np.argsort(-fit[rest], kind="stable")][: P - distinct.size]])

    # ---------------------------------------------------------------- decoding
    def decode(self, state: np.ndarray) -> dict[str, Allocation]:
        """Node of each replica and the goodput-optimal batch of each job."""
        out: dict[str, Allocation] = {}
        for r, (job, gm) in enumerate(zip(self.jobs, self.models)):
            row = state[r]
            k = int(row.sum())
            if k == 0:
                out[job.id] = Allocation()
                continue
            nodes = tuple(int(self.node_ids[c]) for c in np.nonzero(row)[0] for _ in range(int(row[c])))
            n = int(np.count_nonzero(row))
            choice = gm.optimize_batch(k, min(n, k))
            out[job.id] = Allocation(nodes, *split_batch(job, k, int(choice.batch), int(choice.accumulation)))
        return out


# ---------------------------------------------------------------------- artifact rules
def fair_share_goodput(gm: GoodputModel, replicas: int) -> float:
    """Rule A4 (docs/benchmark.md): the goodput of the fair share ``a_f`` — ``replicas``
    (``ceil(G/J)``) GPUs modelled as one node (no cross-node synchronisation), whatever
    the job's ``max_replicas`` and the node size, at the best batch; where the job's
    largest batch cannot feed that many replicas (``replicas·min_local > max_batch``)
    the batch range is stretched to ``replicas·min_local`` so the baseline exists
    (the artifact, ``pollux.py`` ~246-256 with ``goodput.py``'s ``optimize``, does the
    same: one node, ``ceil(1/(dominant share·J))`` replicas, no cap, batches from
    ``max(M0, K·min_local)``)."""
    b = gm.bounds
    need = replicas * b.min_local_batch
    if need > b.largest:
        gm = GoodputModel(gm.throughput, gm.efficiency, replace(b, max_batch=int(need)))
    return float(gm.optimize_batch(int(replicas), 1).goodput)


def one_batch_size_prior(prior: ThroughputPrior, observations: tuple, reference_batch: float) -> ThroughputPrior:
    """Rule A2 (docs/benchmark.md): with step times measured at one per-GPU batch ``m``
    only, the fixed part of a micro-batch's compute is half of it, ``α_grad =
    T_grad(m)/2`` (artifact ``goodput.py`` ~173-180: ``α_c`` fixed at half the mean
    observed compute time). The prior states ``α_grad`` as the fraction ``f`` of ``C``
    at ``reference_batch`` ``m_ref``: ``f·C = (1 − f)·C·m/m_ref`` gives
    ``f = m / (m + m_ref)``; one batch size leaves ``f`` undetermined by the data, so
    the fit keeps it. Unchanged with no observations or with two batch sizes or more
    (the data then decide)."""
    sizes = {float(o[2]) for o in observations}
    if len(sizes) != 1:
        return prior
    m = sizes.pop()
    return replace(prior, overhead_fraction=m / (m + float(reference_batch)))


def node_sync_floor(model: ThroughputModel, observations: tuple) -> ThroughputModel:
    """Rule A1 (docs/benchmark.md): a job never observed on several nodes has its
    cross-node synchronisation terms at least 1.1× its within-node ones,
    ``α_node ≥ 1.1·α_local`` and ``β_node ≥ 1.1·β_local`` (artifact ``goodput.py``
    ~201-204: "alpha_n and beta_n are at least alpha_r and beta_r", enforced after the
    fit while no multi-node observation exists). Once it has been (``N ≥ 2`` in some
    observation) the fit stands."""
    if any(int(o[1]) >= 2 for o in observations):
        return model
    p = model.params
    an, bn = max(p.alpha_node, 1.1 * p.alpha_local), max(p.beta_node, 1.1 * p.beta_local)
    if an == p.alpha_node and bn == p.beta_node:
        return model
    return ThroughputModel(replace(p, alpha_node=an, beta_node=bn))


def compute_observations(job: AllocJob) -> tuple[tuple[float, float], ...]:
    """Rule A3's data: ``(m, compute seconds of one micro-batch)`` per measured sample,
    the compute being the step time less its synchronisation, ``(step − sync)/(s + 1)``
    (``AllocJob.profile`` reports both; samples with no positive compute are left out)."""
    out = set()
    for s in job.profile:
        c = (s.step_time - s.sync_time) / (int(s.accum_steps) + 1)
        if s.step_time > 0 and s.atomic_bsz > 0 and c > 0:
            out.add((float(s.atomic_bsz), float(c)))
    return tuple(sorted(out))


def fit_split(observations: tuple, compute: tuple, prior: ThroughputPrior, reference_batch: float) -> FitProblem:
    """Rule A3 (docs/benchmark.md): the throughput model fitted to the step times *and*,
    separately, the compute times — the artifact fits ``T_grad = α_c + β_c·m`` to
    the measured compute times and the whole model to the step times, the two RMSLEs
    summed (artifact ``simulator.py`` ~91-98 feeds ``step − sync`` as the compute time;
    ``goodput.py``'s objective). Here: the shared fit's least squares on ``log T_iter``
    and its prior, plus one residual ``(log T_grad(m) − log compute)/noise`` per compute
    observation (:class:`~rlsched.core.goodput.FitProblem`'s ``compute`` rows); so the
    compute part of a step is measured, not inferred through the synchronisation model.
    Same bounds, starts and tolerances as the shared fit."""
    return FitProblem(tuple(observations), prior, float(reference_batch), tuple(compute))


class _PaperJobGoodput(JobGoodput):
    """:class:`~rlsched.core.job_goodput.JobGoodput` with the artifact's fit rules A1
    and A2 (docs/benchmark.md), for ``pollux-paper`` only: the shared class, which the
    ``goodput`` allocator uses, is unchanged."""

    #: rule A3 on (set by :class:`PolluxPaperAllocator`)
    split_fit = False

    def _fit_request(self, job: AllocJob, bounds: BatchBounds) -> tuple[tuple, FitProblem]:
        obs = observations_of(job)
        ref = bounds.reference_local_batch
        prior = one_batch_size_prior(self.prior_for(obs), obs, ref)
        compute = compute_observations(job) if self.split_fit else ()
        return ("paper", obs, compute, prior, ref), fit_split(obs, compute, prior, ref)

    def _fitted(self, problems: list[FitProblem]) -> list[ThroughputModel]:
        return [node_sync_floor(raw, pb.observations) for raw, pb in zip(fit_many(problems), problems)]
