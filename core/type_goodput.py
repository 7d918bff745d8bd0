"""A job's goodput model on each GPU type, from what the job reported or declared.

The throughput model (:mod:`rlsched.core.goodput`) is fitted per (job, GPU type) to the
step times the job reported on that type (:attr:`ProfileSample.gpu_type`). On a type it
has not run on, it is bootstrapped as Sia does (Jayaram Subramanya et al., "Sia:
Heterogeneity-aware, goodput-optimized ML-cluster scheduling", SOSP 2023): the fit on a
type it ran on, scaled by the ratio of the job's one-GPU throughputs on the two types
from the seed profile it declared (:attr:`AllocJob.seed_profile`); with seed rows on the
type but no run to scale, the model is fitted to those rows. Statistical efficiency does
not depend on the type. Nothing else is read: no engine table, no oracle.
Rules and choices: docs/design-notes.md ("Goodput per GPU type").
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections import OrderedDict
from typing import Iterable, NamedTuple

import numpy as np

from .allocation import AllocJob, ProfileSample
from .batch import BatchBounds
from .goodput import GoodputModel, ThroughputModel, ThroughputParams
from .job_goodput import JobGoodput

__all__ = [
    "FITTED",
    "BOOTSTRAPPED",
    "SEEDED",
    "PRIOR",
    "TypeModel",
    "TypeGoodput",
    "samples_on",
    "seed_ratio",
    "scaled",
]

#: where a :class:`TypeModel` comes from: the job's reports on the type itself; the fit
#: on another type it ran on, scaled by the seed ratio; its seed rows on the type alone;
#: the prior (the job has reported and declared nothing, so no type differs from another)
FITTED, BOOTSTRAPPED, SEEDED, PRIOR = "fitted", "bootstrapped", "seeded", "prior"


class TypeModel(NamedTuple):
    """A job's goodput model on ``gpu_type`` and its origin: ``kind`` (one of
    :data:`FITTED`, :data:`BOOTSTRAPPED`, :data:`SEEDED`, :data:`PRIOR`), ``source`` (the
    type whose reports were fitted: ``gpu_type`` itself when fitted, the other type when
    bootstrapped; ``""`` seeded or prior) and ``ratio`` (one-GPU throughput on
    ``gpu_type`` over that on ``source``, the factor every throughput of the source fit
    was multiplied by; 1 otherwise)."""

    gpu_type: str
    goodput: GoodputModel
    kind: str
    source: str = ""
    ratio: float = 1.0

    @property
    def throughput(self) -> ThroughputModel:
        return self.goodput.throughput


def samples_on(samples: Iterable[ProfileSample], gpu_type: str) -> tuple[ProfileSample, ...]:
    """The ``samples`` measured on ``gpu_type``."""
    return tuple(s for s in samples if s.gpu_type == gpu_type)


def _one_gpu_curve(samples: Iterable[ProfileSample]) -> tuple[np.ndarray, np.ndarray] | None:
    """``(log m, log step_time)`` of the one-GPU, no-accumulation rows, by increasing
    ``m`` (repeated ``m``: their mean step time); None without such a row."""
    rows: dict[int, list[float]] = {}
    for s in samples:
        if s.num_replicas == 1 and s.num_nodes == 1 and s.accum_steps == 0 and s.atomic_bsz > 0 and s.step_time > 0:
            rows.setdefault(int(s.atomic_bsz), []).append(float(s.step_time))
    if not rows:
        return None
    m = np.array(sorted(rows), dtype=float)
    t = np.array([sum(rows[k]) / len(rows[k]) for k in sorted(rows)])
    return np.log(m), np.log(t)


def seed_ratio(job: AllocJob, target: str, source: str) -> float | None:
    """One-GPU throughput of ``job`` on ``target`` over that on ``source``, from the
    seed profile it declared; None without a one-GPU seed row on both types, or when
    their measured batches do not overlap.

    Both are taken at the same per-GPU batch ``m*``: the largest both seeds measured,
    capped at the job's largest micro-batch (``bounds.largest_local``) but not below
    the smallest both measured; each type's step time at ``m*`` interpolated
    linearly in ``(log m, log t)`` between its rows. The ratio is ``t_source(m*) /
    t_target(m*)``."""
    return _ratio(_one_gpu_curve(samples_on(job.seed_profile, source)),
                  _one_gpu_curve(samples_on(job.seed_profile, target)), job.bounds.largest_local)


def _ratio(a: tuple[np.ndarray, np.ndarray] | None, b: tuple[np.ndarray, np.ndarray] | None,
           largest_local: int) -> float | None:
    """:func:`seed_ratio` from the source's and the target's one-GPU curves."""
    if a is None or b is None:
        return None
    lo, hi = max(a[0][0], b[0][0]), min(a[0][-1], b[0][-1])
    if lo > hi:
        return None
    x = max(min(hi, math.log(largest_local)), lo)
    return float(math.exp(np.interp(x, *a) - np.interp(x, *b)))


class _Seeds(NamedTuple):
    """A seed profile split by GPU type: its rows and its one-GPU curve per type, and
    the ratios asked of it (``(source, target, largest micro-batch)`` -> ratio)."""

    rows: dict[str, tuple[ProfileSample, ...]]
    curves: dict[str, tuple[np.ndarray, np.ndarray] | None]
    ratios: dict[tuple[str, str, int], float | None]

    @classmethod
    def of(cls, seed_profile: tuple[ProfileSample, ...]) -> "_Seeds":
        rows: dict[str, list[ProfileSample]] = {}
        for s in seed_profile:
            rows.setdefault(s.gpu_type, []).append(s)
        return cls({t: tuple(v) for t, v in rows.items()}, {t: _one_gpu_curve(v) for t, v in rows.items()}, {})

    def ratio(self, source: str, target: str, largest_local: int) -> float | None:
        """:func:`seed_ratio` of ``target`` over ``source``, computed once."""
        key = (source, target, largest_local)
        if key not in self.ratios:
            self.ratios[key] = _ratio(self.curves.get(source), self.curves.get(target), largest_local)
        return self.ratios[key]


def scaled(model: ThroughputModel, factor: float) -> ThroughputModel:
    """``model`` with every time ``factor`` times longer: its six time parameters
    multiplied by ``factor``, γ kept. ``T_iter`` is homogeneous of degree one in them,
    so every step time is ``factor`` times the model's and every throughput (and
    goodput) ``1/factor`` times, at every placement and batch."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be finite and > 0, got {factor}")
    p = model.params.astuple()
    return ThroughputModel(ThroughputParams(*(v * factor for v in p[:6]), p[6]))


class _Plan(NamedTuple):
    """How to get a job's model on a type: the job (or a view of it holding only the
    samples to fit) whose :meth:`JobGoodput.model` to take, and what to tell of it."""

    view: AllocJob
    kind: str
    source: str = ""
    ratio: float = 1.0


class TypeGoodput:
    """Goodput models of jobs per GPU type (module docstring), over a
    :class:`~rlsched.core.job_goodput.JobGoodput` that does every fit (its prior, its fit
    rules and its caches; default: a fresh one).

    A job whose reports all carry one type gets, on that type, exactly
    ``jobs.model(job)``: the single-type path, unchanged. ``model(job, t)`` in full:

    1. reports on ``t``: the fit to them alone (:data:`FITTED`);
    2. else, seed rows on ``t`` and reports on another type ``u`` with seed rows too:
       the fit on ``u`` with every throughput multiplied by :func:`seed_ratio` ``(job,
       t, u)`` (:data:`BOOTSTRAPPED`); ``u``: the type with the most reported samples
       (ties: by name) among those whose ratio is known;
    3. else, seed rows on ``t``: the fit to those one-GPU rows (:data:`SEEDED`);
    4. else, nothing reported nor declared on any type: the prior's model, the same on
       every type (:data:`PRIOR`);
    5. else None: the job has data, but none that says how fast it is on ``t``.

    The efficiency model and batch bounds are the job's own on every type."""

    def __init__(self, jobs: JobGoodput | None = None, cache: int = 4096) -> None:
        self.jobs = jobs if jobs is not None else JobGoodput()
        self.cache = int(cache)
        self._boot: OrderedDict[tuple, GoodputModel] = OrderedDict()
        #: id(model) -> (model, ratio, its bootstrapped model): the last answer per model
        self._boot_of: dict[int, tuple[GoodputModel, float, GoodputModel]] = {}
        #: id(seed profile) -> (that profile, its rows and curves per type): jobs of one
        #: model share their declared profile, so it is split once, not per decision
        self._seeds: OrderedDict[int, tuple[tuple, _Seeds]] = OrderedDict()
        #: job id -> its plans per type and the facts they were made from, kept across
        #: decisions while those facts are the same (:class:`_Known`)
        self._known: OrderedDict[str, _Known] = OrderedDict()

    def model(self, job: AllocJob, gpu_type: str) -> TypeModel | None:
        """The job's goodput model on ``gpu_type`` (class docstring); None when not
        offered."""
        known = self._known.get(job.id)
        if (known is not None and known.job is job and known.profile is job.profile
                and known.seed_profile is job.seed_profile and gpu_type in known.plans):
            plan = known.plans[gpu_type]
        else:
            plan = self._plan(job, gpu_type)
        if plan is None:
            return None
        gm = self.jobs.model(plan.view)
        if plan.kind == BOOTSTRAPPED:
            gm = self._bootstrapped(gm, plan.ratio)
        return TypeModel(gpu_type, gm, plan.kind, plan.source, plan.ratio)

    def _bootstrapped(self, gm: GoodputModel, ratio: float) -> GoodputModel:
        """``gm`` with every throughput ``ratio`` times, kept (so its memo of best batches
        outlives the call) and found again from the same ``gm`` object at once."""
        last = self._boot_of.get(id(gm))
        if last is not None and last[0] is gm and last[1] == ratio:
            return last[2]
        key = (gm.throughput.params, ratio, gm.efficiency, gm.bounds)
        boot = self._boot.get(key)
        if boot is None:
            boot = GoodputModel(scaled(gm.throughput, 1.0 / ratio), gm.efficiency, gm.bounds)
            self._boot[key] = boot
            while len(self._boot) > self.cache:
                self._boot.popitem(last=False)
        else:
            self._boot.move_to_end(key)
        self._boot_of[id(gm)] = (gm, ratio, boot)
        while len(self._boot_of) > self.cache:
            self._boot_of.pop(next(iter(self._boot_of)))
        return boot

    def models(self, job: AllocJob, gpu_types: Iterable[str]) -> dict[str, TypeModel]:
        """:meth:`model` on each of ``gpu_types``, the types not offered left out."""
        out = {}
        for t in gpu_types:
            m = self.model(job, t)
            if m is not None:
                out[t] = m
        return out

    def prepare(self, jobs: Iterable[AllocJob], gpu_types: Iterable[str]) -> None:
        """Run, in one batch (:meth:`JobGoodput.prepare`), every fit that :meth:`model`
        of these jobs on these types needs and has not cached."""
        types = tuple(gpu_types)
        views = []
        for j in jobs:
            known = self._known.get(j.id)
            if known is not None and known.holds(j):
                known = known._replace(job=j, profile=j.profile, seed_profile=j.seed_profile)
                self._known.move_to_end(j.id)
            else:
                known = _Known(j, j.profile, j.seed_profile, j.bounds, (j.grad_sqr, j.grad_var), {})
            self._known[j.id] = known
            reported = None
            for t in types:
                if t not in known.plans:
                    reported = _reported(j) if reported is None else reported
                    known.plans[t] = self._plan(j, t, reported)
                if known.plans[t] is not None:
                    views.append(known.plans[t].view)
        while len(self._known) > self.cache:
            self._known.popitem(last=False)
        self.jobs.prepare(views)

    # ------------------------------------------------------------------ internals
    def _seed(self, job: AllocJob) -> _Seeds:
        """The job's seed profile split by type, cached by the profile's identity."""
        prof = job.seed_profile
        hit = self._seeds.get(id(prof))
        if hit is not None and hit[0] is prof:
            self._seeds.move_to_end(id(prof))
            return hit[1]
        seeds = _Seeds.of(prof)
        self._seeds[id(prof)] = (prof, seeds)
        while len(self._seeds) > self.cache:
            self._seeds.popitem(last=False)
        return seeds

    def _plan(self, job: AllocJob, gpu_type: str,
              reported: dict[str, tuple[ProfileSample, ...]] | None = None) -> _Plan | None:
        if reported is None:
            reported = _reported(job)
        if gpu_type in reported:
            return _Plan(_only(job, gpu_type, reported), FITTED, gpu_type)
        sd = self._seed(job)
        seeds = sd.rows.get(gpu_type, ())
        if seeds:
            for source in sorted(reported, key=lambda u: (-len(reported[u]), u)):
                ratio = sd.ratio(source, gpu_type, job.bounds.largest_local)
                if ratio is not None:
                    return _Plan(_only(job, source, reported), BOOTSTRAPPED, source, ratio)
            return _Plan(_view(job, seeds, f"seed {gpu_type}"), SEEDED)
        if not reported and not job.seed_profile:
            return _Plan(job, PRIOR)
        return None


class _Known(NamedTuple):
    """A job's plans per GPU type (None: not offered) and what they were made from: its
    reports, its seed profile, its batch bounds and gradient statistics (all a plan and
    its view's fit read). ``job``: the object of the last :meth:`TypeGoodput.prepare`."""

    job: AllocJob
    profile: tuple[ProfileSample, ...]
    seed_profile: tuple[ProfileSample, ...]
    bounds: BatchBounds
    grad: tuple[float | None, float | None]
    plans: dict[str, _Plan | None]

    def holds(self, job: AllocJob) -> bool:
        """Whether ``job`` has the facts these plans were made from (a job that reported
        again, or whose gradient statistics moved, is planned and fitted anew)."""
        return (self.profile == job.profile and self.seed_profile == job.seed_profile
                and self.bounds == job.bounds and self.grad == (job.grad_sqr, job.grad_var))


def _reported(job: AllocJob) -> dict[str, tuple[ProfileSample, ...]]:
    """The job's usable reports (a positive step time and batch) per GPU type."""
    out: dict[str, list[ProfileSample]] = {}
    for s in job.profile:
        if s.step_time > 0 and s.atomic_bsz > 0:
            out.setdefault(s.gpu_type, []).append(s)
    return {t: tuple(v) for t, v in out.items()}


def _only(job: AllocJob, gpu_type: str, reported: dict[str, tuple[ProfileSample, ...]]) -> AllocJob:
    """The job as its fit on ``gpu_type`` sees it: itself when every report is of that
    type (the single-type path), else a view holding that type's reports alone."""
    if len(reported) == 1:
        return job
    return _view(job, reported[gpu_type], gpu_type)


#: every field of a job, in the order its constructor takes them (a view is a copy:
#: :func:`dataclasses.replace` takes six times as long)
_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(AllocJob)))


def _view(job: AllocJob, profile: tuple[ProfileSample, ...], tag: str) -> AllocJob:
    """``job`` with only ``profile`` as its reports, under an id of its own (a
    :class:`JobGoodput` keeps per-id fit state; one per type here)."""
    view = AllocJob(*_FIELDS(job))
    view.id, view.profile = f"{job.id}\x00{tag}", profile
    return view
