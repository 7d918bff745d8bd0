"""What GPUs are worth to each job of an allocation problem, from what the job reported.

The goodput model (:mod:`rlsched.core.goodput`) of one
:class:`~rlsched.core.allocation.AllocJob` and its goodput table over replica counts;
every allocator that weighs goodput reads jobs through this one object, so they all see
the same non-clairvoyant facts. Fits and tables are cached. Details: docs/design-notes.md.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable

import numpy as np

from .allocation import AllocJob
from .batch import BatchBounds
from .goodput import (EfficiencyModel, FitProblem, GoodputModel, JobObservations, ThroughputModel, ThroughputPrior,
                      fit_many, optimize_many)

__all__ = ["JobGoodput", "observations_of", "job_observations", "split_batch"]


def observations_of(job: AllocJob) -> tuple[tuple[int, int, float, int, float], ...]:
    """The throughput fit's observations from the step times ``job`` measured."""
    return tuple(sorted((s.num_replicas, s.num_nodes, float(s.atomic_bsz), int(s.accum_steps), float(s.step_time))
                        for s in job.profile if s.step_time > 0 and s.atomic_bsz > 0))


def job_observations(job: AllocJob) -> JobObservations | None:
    """What ``job`` reported, as the live record a scaling policy reads
    (:meth:`JobObservations.marginal`): its step times per shape and its gradient
    statistics (``grad_var`` per sample, module docstring); None before it reported a
    step time."""
    obs = observations_of(job)
    if not obs:
        return None
    bounds = job.bounds
    return JobObservations(bounds, grad_sqr=job.grad_sqr, grad_var=_per_sample_var(job, bounds), fitted=obs)


def _per_sample_var(job: AllocJob, bounds: BatchBounds) -> float | None:
    """``job.grad_var`` as the efficiency model reads it: ``tr(Σ)/M0 -> tr(Σ)``."""
    return None if job.grad_var is None else job.grad_var * bounds.init_batch


class JobGoodput:
    """Goodput models and tables of jobs, cached (module docstring).

    ``prior_for(observations)`` gives the throughput prior a job's fit uses (default:
    ``prior`` whatever the observations: moderate synchronisation costs until a job's
    data says otherwise)."""

    def __init__(self, prior: ThroughputPrior | None = None,
                 prior_for: Callable[[tuple], ThroughputPrior] | None = None, cache: int = 4096,
                 refit_tolerance: float | None = None) -> None:
        self.prior = prior if prior is not None else ThroughputPrior()
        self._prior_for = prior_for
        self.cache = int(cache)
        if refit_tolerance is not None and not refit_tolerance >= 0:
            raise ValueError(f"refit_tolerance must be >= 0, got {refit_tolerance}")
        #: None: refit whenever a job's observations change; else keep a job's fit while it
        #: predicts every observation within this relative error (the live
        #: JobObservations' 5% rule, applied to the model's predictions)
        self.refit_tolerance = refit_tolerance
        #: job id -> its last fit and the observations it explained (for refit_tolerance)
        self._job_fit: OrderedDict[str, tuple[FitProblem, ThroughputModel]] = OrderedDict()
        self._fits: OrderedDict[tuple, ThroughputModel] = OrderedDict()
        self._models: OrderedDict[tuple, GoodputModel] = OrderedDict()
        self._tables: OrderedDict[tuple, np.ndarray] = OrderedDict()
        #: id(job) -> (job, bounds, profile, its fit request): a decision asks twice
        #: (prepare, model) of the same job object; held objects keep their ids unique
        self._requests: OrderedDict[int, tuple] = OrderedDict()
        #: id(job) -> (job, fit, bounds, gradient statistics, its model): the model a held
        #: job object was last given, while those are the same
        self._last: OrderedDict[int, tuple] = OrderedDict()
        #: the fit keys of the requests made, each once (jobs that reported alike share one)
        self._keys: OrderedDict[_Key, _Key] = OrderedDict()

    def prior_for(self, observations: tuple) -> ThroughputPrior:
        return self.prior if self._prior_for is None else self._prior_for(observations)

    def _fit_request(self, job: AllocJob, bounds: BatchBounds) -> tuple[tuple, FitProblem]:
        """The cache key of the job's throughput fit and the fit to run."""
        hit = self._requests.get(id(job))
        if hit is not None and hit[0] is job and hit[1] is bounds and hit[2] is job.profile:
            return hit[3]
        obs = observations_of(job)
        prior = self.prior_for(obs)
        key = _Key((obs, prior, bounds.reference_local_batch))
        key = self._keys.setdefault(key, key)  # one key per content: later lookups match it at once
        self._keys.move_to_end(key)
        while len(self._keys) > self.cache:
            self._keys.popitem(last=False)
        req = key, FitProblem(obs, prior, bounds.reference_local_batch)
        _store(self._requests, id(job), (job, bounds, job.profile, req), self.cache)
        return req

    def _fitted(self, problems: list[FitProblem]) -> list[ThroughputModel]:
        """The models of ``problems``, fitted in one batch (:func:`fit_many`)."""
        return fit_many(problems)

    def prepare(self, jobs: Iterable[AllocJob]) -> None:
        """Fit, in one batch, the throughput model of every job whose fit is not cached
        (a decision calls this once before it asks :meth:`model`; each fit is the one
        :meth:`model` would make alone, to rounding)."""
        pending: dict[tuple, FitProblem] = {}
        for job in jobs:
            key, problem = self._fit_request(job, job.bounds)
            if key in self._fits or key in pending or self._still_good(job.id, problem) is not None:
                continue
            pending[key] = problem
        for key, fit in zip(pending, self._fitted(list(pending.values()))):
            _store(self._fits, key, fit, self.cache)

    def model(self, job: AllocJob) -> GoodputModel:
        """The job's goodput model from what it reported."""
        bounds = job.bounds
        key, problem = self._fit_request(job, bounds)
        fit = _cached(self._fits, key)
        if fit is None:
            fit = self._still_good(job.id, problem)
        if fit is None:
            fit = _store(self._fits, key, self._fitted([problem])[0], self.cache)
        if self.refit_tolerance is not None:
            _store(self._job_fit, job.id, (problem, fit), self.cache)
        grads = (job.grad_sqr, job.grad_var)
        last = self._last.get(id(job))
        if last is not None and last[0] is job and last[1] is fit and last[2] is bounds and last[3] == grads:
            return last[4]
        eff = EfficiencyModel(bounds.init_batch, job.grad_sqr, _per_sample_var(job, bounds))
        mkey = (fit, eff, bounds)
        gm = _cached(self._models, mkey)
        if gm is None:  # kept, so its memo of best batches outlives the call
            gm = _store(self._models, mkey, GoodputModel(fit, eff, bounds), self.cache)
        _store(self._last, id(job), (job, fit, bounds, grads, gm), self.cache)
        return gm

    def _still_good(self, job_id: str, problem: FitProblem) -> ThroughputModel | None:
        """The job's last fit, if ``refit_tolerance`` is set, the problem is the same but
        for new observations, the observations it was fitted to are all still there, and
        it predicts each new one within the tolerance."""
        obs = problem.observations
        if self.refit_tolerance is None or not obs:
            return None
        last = _cached(self._job_fit, job_id)
        if last is None or last[0]._replace(observations=obs) != problem:
            return None
        fit, seen = last[1], set(last[0].observations)
        if not seen <= set(obs):
            return None
        new = [o for o in obs if o not in seen]
        if not new:
            return fit
        K, N, m, s_, t = np.array(new, dtype=float).T
        err = np.abs(np.log(fit.iteration_time(K, N, m, s_) / t))
        return fit if float(err.max()) <= np.log1p(self.refit_tolerance) else None

    def _packed_request(self, job: AllocJob, width: int, node_gpus: int):
        """The cache key of the job's packed column, its model, and the placements
        ``(K, N)`` the column asks about (``K = 1 .. kmax``)."""
        gm = self.model(job)
        kmax = min(job.max_replicas, width - 1)
        key = ("packed", gm.throughput, gm.efficiency, gm.bounds, kmax, width, node_gpus)
        K = np.arange(1, max(kmax, 0) + 1)
        return key, gm, K, np.where(K <= node_gpus, 1, np.minimum(K, 2))

    def prepare_packed(self, jobs: Iterable[AllocJob], width: int, node_gpus: int) -> None:
        """Compute, in one search (:func:`optimize_many`), the :meth:`packed` column of
        every job not cached (the same numbers :meth:`packed` computes alone)."""
        pending: dict[tuple, tuple] = {}
        for job in jobs:
            key, gm, K, N = self._packed_request(job, width, node_gpus)
            if key not in self._tables and key not in pending:
                pending[key] = (gm, K, N)
        todo = list(pending.values())
        for key, (gm, K, _), choice in zip(pending, todo, optimize_many([t[0] for t in todo], [t[1] for t in todo],
                                                                          [t[2] for t in todo])):
            _store(self._tables, key, _column(width, K, choice.goodput), self.cache)

    def packed_columns(self, requests: Iterable[tuple[GoodputModel, int, int, int]]) -> list[np.ndarray]:
        """The :meth:`packed` column of each ``(model, kmax, width, node_gpus)`` (a model
        given, e.g. a job's on one GPU type: :mod:`rlsched.core.type_goodput`), the ones
        not cached computed in one search (:func:`optimize_many`)."""
        keys, got, pending = [], {}, {}
        for gm, kmax, width, node_gpus in requests:
            kmax = min(kmax, width - 1)
            key = ("packed", gm.throughput, gm.efficiency, gm.bounds, kmax, width, node_gpus)
            keys.append(key)
            if key in got or key in pending:
                continue
            hit = _cached(self._tables, key)
            if hit is not None:
                got[key] = hit
            else:
                K = np.arange(1, max(kmax, 0) + 1)
                pending[key] = (gm, K, np.where(K <= node_gpus, 1, np.minimum(K, 2)), width)
        todo = list(pending.values())
        for key, (_, K, _, width), choice in zip(pending, todo, optimize_many([t[0] for t in todo],
                                                                                [t[1] for t in todo],
                                                                                [t[2] for t in todo])):
            got[key] = _store(self._tables, key, _column(width, K, choice.goodput), self.cache)
        return [got[k] for k in keys]

    def packed(self, job: AllocJob, width: int, node_gpus: int) -> tuple[np.ndarray, GoodputModel]:
        """``good[K]`` (``K < width``): the best goodput on ``K`` GPUs packed on as few
        nodes as possible — one node while ``K <= node_gpus``, several beyond (the
        synchronisation model distinguishes only one node from several); the column of
        :meth:`table` a packing allocator reads, at half its cost."""
        key, gm, K, N = self._packed_request(job, width, node_gpus)
        good = _cached(self._tables, key)
        if good is None:
            good = _store(self._tables, key, _column(width, K, gm.optimize_batch(K, N).goodput if K.size else K),
                          self.cache)
        return good, gm

    def table(self, job: AllocJob, width: int, node_gpus: int) -> tuple[np.ndarray, GoodputModel]:
        """``table[K, d]`` (``K < width``): the best goodput (samples per second at the
        initial batch's efficiency, over the feasible batch sizes) on ``K`` GPUs of one
        node (``d = 0``) or of several (``d = 1``); 0 where the job cannot train
        (``K = 0``, ``K`` beyond ``max_replicas``, ``K > node_gpus`` on one node, or no
        feasible batch)."""
        gm = self.model(job)
        kmax = min(job.max_replicas, width - 1)
        key = (gm.throughput, gm.efficiency, gm.bounds, kmax, width, node_gpus)
        good = _cached(self._tables, key)
        if good is None:
            good = np.zeros((width, 2))
            if kmax >= 1:
                K = np.arange(1, kmax + 1)
                good[1:kmax + 1, 0] = gm.optimize_batch(K, np.ones_like(K)).goodput
                K2 = np.arange(2, kmax + 1)
                if K2.size:
                    good[2:kmax + 1, 1] = gm.optimize_batch(K2, np.full_like(K2, 2)).goodput
            good[node_gpus + 1:, 0] = 0.0  # one node holds at most node_gpus
            good.setflags(write=False)
            _store(self._tables, key, good, self.cache)
        return good, gm


class _Key:
    """A cache key: the tuple ``parts``, its hash computed once (a fit's key holds every
    observation of its job, and a decision looks it up several times)."""

    __slots__ = ("parts", "_hash")

    def __init__(self, parts: tuple) -> None:
        self.parts, self._hash = parts, hash(parts)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _Key) and self._hash == other._hash and self.parts == other.parts)


def _column(width: int, K: np.ndarray, goodput) -> np.ndarray:
    """A read-only column of ``width`` goodputs: ``goodput`` at ``K``, 0 elsewhere."""
    good = np.zeros(width)
    good[K] = goodput
    good.setflags(write=False)
    return good


def _cached(cache: OrderedDict, key: tuple):
    hit = cache.get(key)
    if hit is not None:
        cache.move_to_end(key)
    return hit


def _store(cache: OrderedDict, key: tuple, value, size: int):
    cache[key] = value
    while len(cache) > size:
        cache.popitem(last=False)
    return value


def split_batch(job: AllocJob, k: int, batch: int, accum: int) -> tuple[int | None, int | None]:
    """(per-GPU batch, accumulation steps) for global ``batch`` on ``k`` GPUs, whole and
    within the application's limits; ``(None, None)`` (the engine's own split of the
    job's batch) where the model found no feasible batch."""
    b = job.bounds
    if batch < 1:
        return None, None
    accum = max(accum, 0)
    atomic = min(max(batch // (k * (accum + 1)), 1), b.largest_local)
    if atomic < b.min_local_batch and k * b.min_local_batch * (accum + 1) <= b.largest:
        atomic = b.min_local_batch
    while k * atomic * (accum + 1) > b.largest and atomic > 1:
        atomic -= 1
    if k * atomic * (accum + 1) > b.largest:
        return None, None
    return atomic, accum
