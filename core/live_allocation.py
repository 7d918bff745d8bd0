"""An allocation policy deciding for the live operator: jobs in, one call, actions out.

:class:`LiveAllocation` gives the allocator what the operator knows of each TrainingJob
(its live view, :class:`~rlsched.core.cluster.JobView`) and the nodes' GPU capacity,
makes one call to the allocator's pure ``allocate`` (AdaptDL's shape) and returns a
:class:`LivePlan` of starts, resizes and stops that the operator only carries out; a
policy that raises keeps every job as it is.
Translation of workers, batch sizes and reports: docs/design-notes.md.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from .allocation import AllocJob, Allocation, Allocator, AllocNode, ProfileSample, WakingAllocator
from .batch import BatchBounds
from .cluster import JobView
from .contract import class_rank
from .goodput import JobObservations, ShapeRecord
from .planning.admission import WaitReason
from .planning.elastic import training_end
from .policy import allocator_names, make_allocator
from .queues import QueueBook

__all__ = ["LiveTarget", "LivePlan", "LiveAllocation", "RankingAllocator", "AdmittingAllocator",
           "make_live_allocator",
           "parse_allocator_options", "check_live_allocator",
           "attained_service", "movable_room", "observations_from_status", "observations_to_status", "one_type"]


def movable_room(state: Any, held: Iterable[tuple[Sequence[int], int, int, int]]
                 ) -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
    """What an allocation policy may give on each node: the free GPUs, CPU and memory
    of ``state`` (a :class:`~rlsched.core.cluster.ClusterState`) plus what the jobs it
    may move hold there — ``held``: per such job, the node of each of its workers and
    a worker's GPUs, millicores and MiB. ``(capacity, offers)`` for
    :meth:`LiveAllocation.plan` (the operator's and the event engine's reading)."""
    n = len(state.free)
    gpus = [int(x) for x in state.free]
    cpu = [int(x) for x in state.cpu_free]
    mem = [int(x) for x in state.mem_free]
    for nodes, g, c, m in held:
        for i in nodes:
            gpus[i] += g
            cpu[i] += c
            mem[i] += m
    return {i: gpus[i] for i in range(n)}, {i: (cpu[i], mem[i]) for i in range(n)}


def one_type(nodes: Iterable[int], types: Mapping[int, str]) -> str | None:
    """The GPU type of ``nodes`` when all are of one known type (``types``: node index
    -> type, ``""`` unknown), else None."""
    if not types:
        return None
    seen = {types.get(i, "") for i in nodes}
    return next(iter(seen)) if len(seen) == 1 and "" not in seen else None


def parse_allocator_options(text: str) -> tuple[str, dict[str, float | None]]:
    """``name[@key=value[,key=value]]`` -> ``(name, {key: value})``: numeric options of
    an allocator's constructor (``none`` for None), e.g. ``goodput@restart_delay=10``."""
    name, _, opts = text.partition("@")
    kwargs: dict[str, float | None] = {}
    for item in filter(None, opts.split(",")):
        key, sep, value = item.partition("=")
        try:
            kwargs[key.strip()] = None if value.strip().lower() == "none" else float(value)
        except ValueError:
            raise ValueError(f"{text!r}: option {item!r} is not key=number") from None
        if not sep or not key.strip():
            raise ValueError(f"{text!r}: option {item!r} is not key=number")
    return name.strip(), kwargs


def make_live_allocator(text: str) -> Allocator:
    """A fresh allocator for the operator from ``name[@key=value,...]``
    (:func:`parse_allocator_options`), one of core's live allocation policies
    (:func:`~rlsched.core.policy.allocator_names`); ValueError naming the choices or the
    bad option."""
    name, kwargs = parse_allocator_options(text)
    live = allocator_names(live=True)
    try:
        if name in live:
            return make_allocator(name, **kwargs)
        if "/" in name:  # ordering/placement[/scaling]: the heuristics' admission cycle
            from .gang_allocator import GangAllocator

            return GangAllocator.named(name, **kwargs)
    except TypeError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    raise ValueError(f"unknown live allocator {name!r}; choose one of {', '.join(live)} "
                     f"or ordering/placement[/scaling][+backfill|+nobackfill]")


def check_live_allocator(text: str) -> str:
    """``text`` when it names an allocator :func:`make_live_allocator` builds (without
    building it: no weights read); ValueError naming the choices otherwise."""
    from .served import parse_policy_name

    live = allocator_names(live=True)
    choices = (f"choose one of {', '.join(live)} or a heuristic as "
               "ordering/placement[/scaling][+backfill|+nobackfill], e.g. fifo/das/rlpto+nobackfill")
    try:
        name = parse_allocator_options(text)[0].strip()
        heuristic = "/" in name and parse_policy_name(name).ordering is not None
    except ValueError as exc:
        raise ValueError(f"{exc}; {choices}") from None
    if name in live or heuristic:
        return text
    raise ValueError(f"{text!r} is not an allocation policy; {choices}")


def attained_service(stored: Any, since: float | None, gpus: int, now: float) -> float:
    """GPU-seconds attained: ``stored`` (what the status recorded up to ``since``) plus
    ``gpus`` held from ``since`` to ``now``; a malformed or negative ``stored`` counts 0."""
    base = float(stored) if isinstance(stored, (int, float)) and not isinstance(stored, bool) else 0.0
    base = base if math.isfinite(base) and base >= 0 else 0.0
    if since is None or gpus <= 0:
        return base
    return base + gpus * max(0.0, now - since)


def observations_to_status(obs: JobObservations, last_report: str | None) -> dict:
    """``status.goodput``: the shapes a job ran (``[workers, nodes, batch, accumulation,
    stepTimeSeconds, reports]`` each, and the GPU type as a seventh element when one is
    known), its gradient statistics, the type of its latest step time (``gpuType``) and
    the ``updateTime`` of the last report folded in."""
    out: dict[str, Any] = {"shapes": [[r.workers, r.nodes, r.batch, r.accumulation, r.step_time, r.reports]
                                      + ([r.gpu_type] if r.gpu_type else []) for r in obs.shapes]}
    if obs.grad_sqr is not None and obs.grad_var is not None:
        out["gradSqr"], out["gradVar"] = obs.grad_sqr, obs.grad_var
    if obs.gpu_type:
        out["gpuType"] = obs.gpu_type
    if last_report:
        out["lastReport"] = last_report
    return out


def observations_from_status(value: Any, bounds: BatchBounds) -> tuple[JobObservations, str | None]:
    """The record :func:`observations_to_status` wrote, and the last report folded in.
    A status is not trusted: a malformed row is left out, anything else malformed
    gives a fresh record. A row of six (written before GPU types) is of no type."""
    if not isinstance(value, Mapping):
        return JobObservations(bounds), None
    shapes: dict[tuple, ShapeRecord] = {}
    for row in value.get("shapes") or []:
        try:
            workers, nodes, batch, _accum, step, reports = (int(row[0]), int(row[1]), int(row[2]), row[3],
                                                            float(row[4]), int(row[5]))
            gtype = row[6] if len(row) > 6 else ""
        except (TypeError, ValueError, IndexError, KeyError):
            continue
        if not (1 <= nodes <= workers and batch >= 1 and math.isfinite(step) and step > 0 and isinstance(gtype, str)):
            continue
        accum = int(bounds.accumulation_steps(batch, workers))  # as JobObservations.record derives it
        shapes[(gtype, workers, nodes, batch, accum)] = ShapeRecord(workers, nodes, batch, accum, step,
                                                                    max(1, reports), gtype)
    sqr, var = value.get("gradSqr"), value.get("gradVar")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (sqr, var)):
        sqr = var = None
    current = value.get("gpuType")
    current = current if isinstance(current, str) else ""
    rows = tuple(shapes[k] for k in sorted(shapes))
    fitted = tuple((r.workers, r.nodes, r.local_batch, r.accumulation, r.step_time) for r in rows
                   if r.gpu_type == current)
    obs = JobObservations(bounds, rows, None if sqr is None else float(sqr), None if var is None else float(var),
                          fitted=fitted, gpu_type=current)
    last = value.get("lastReport")
    return obs, last if isinstance(last, str) else None


@lru_cache(maxsize=4096)
def _capped(b: BatchBounds) -> BatchBounds:
    """``b`` with its largest global batch as the per-GPU limit (built once per bounds)."""
    return replace(b, max_local_batch=b.largest)


@lru_cache(maxsize=4096)
def _fixed(lo: int, hi: int) -> BatchBounds:
    """The bounds of a job with a fixed batch per GPU: one sample per replica (built
    once per range)."""
    return BatchBounds(lo, hi, 1, 1)


def _learned(obs: JobObservations | None, g: int, b: BatchBounds | None
             ) -> tuple[tuple[ProfileSample, ...], float | None, float | None]:
    """A job's observations in the allocator's terms: its profile (replicas are GPUs)
    and gradient statistics (``tr(Σ)/M0``; a job without bounds counts every sample)."""
    profile: tuple[ProfileSample, ...] = ()
    sqr = var = None
    if obs is not None:
        profile = tuple(ProfileSample(num_nodes=r.nodes, num_replicas=r.workers * g,
                                      atomic_bsz=max(1, round(r.local_batch / g)),
                                      step_time=r.step_time, sync_time=0.0, accum_steps=r.accumulation,
                                      gpu_type=r.gpu_type)
                        for r in obs.shapes)
        if obs.grad_sqr is not None and obs.grad_var is not None and b is not None:
            sqr, var = obs.grad_sqr, obs.grad_var / b.init_batch  # per-sample tr(Σ) -> tr(Σ)/M0
    if b is None:  # no batch the scheduler may change: every sample counts (noise scale ∞)
        sqr, var = 0.0, 1.0
    return profile, sqr, var


@dataclass(frozen=True)
class LiveTarget:
    """Workers and global batch (None: the scheduler sets none) of a job's next
    generation, and the GPU type its workers are pinned to (None: any node)."""

    workers: int
    batch_size: int | None
    gpu_type: str | None = None


@lru_cache(maxsize=64)
def _rank(priority_class: str) -> int:
    """:func:`~rlsched.core.contract.class_rank`, looked up once per class."""
    return class_rank(priority_class)


def _gpus_on(jobs: Iterable[JobView]) -> Counter[int]:
    """Node index -> GPUs ``jobs`` hold there."""
    out: Counter[int] = Counter()
    for j in jobs:
        g = max(1, j.gpus_per_worker)
        if g == 1:
            out.update(j.placement)
        else:
            for n in j.placement:
                out[n] += g
    return out


#: the target of a job the allocator gives nothing: it waits
_WAITS = LiveTarget(0, None)
#: no GPUs (the allocator's answer for a job it leaves out)
_NOTHING = Allocation()


@dataclass
class LivePlan:
    """What the operator does this cycle. ``allocations``: the allocator's answer, for
    the record (empty after a policy error)."""

    #: the jobs to start, in the order to start them (an admitting allocator's: the
    #: order it placed their gangs in)
    start: dict[str, LiveTarget] = field(default_factory=dict)
    #: running jobs that ended by themselves (β stop, ``maxEpochs``): job -> reason
    complete: dict[str, str] = field(default_factory=dict)
    resize: dict[str, LiveTarget] = field(default_factory=dict)
    stop: list[str] = field(default_factory=list)
    #: the stopped jobs that wait in the interrupt queue and resume first: those an
    #: admitting allocator says (RLPTO's class rule), every one for any other allocator;
    #: the others wait in their own queue
    interrupt: list[str] = field(default_factory=list)
    allocations: dict[str, Allocation] = field(default_factory=dict)
    error: Exception | None = None
    #: why each job that waits after this plan waits (``status.waiting``)
    waiting: dict[str, WaitReason] = field(default_factory=dict)
    #: when to decide again though nothing happens (None: on events): the allocator's
    #: wish, or the end of a protection from preemption while a job waits
    wake_at: float | None = None
    #: per team queue after this plan: ``gpusInUse``, ``borrowedGpus``, ``pendingJobs``,
    #: ``runningJobs`` (the queues' status and metrics; empty without queues)
    queues: dict[str, dict[str, int]] = field(default_factory=dict)


@runtime_checkable
class RankingAllocator(Allocator, Protocol):
    """An allocator that can say in which order it serves jobs (why a job waits)."""

    def order(self, jobs: Sequence[AllocJob]) -> list[AllocJob]: ...

    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float,
                 queues: QueueBook | None = None) -> Mapping[str, Allocation]: ...


@runtime_checkable
class AdmittingAllocator(RankingAllocator, Protocol):
    """An allocator that runs admission itself (the gang allocator): after a decision it
    says why the jobs it left waiting wait, which running jobs it preempted and started
    again, and which of those it preempted wait in the interrupt queue;
    ``enforces_queues``: whether it applies team queues' quotas (else their use is only
    reported); ``scales``: whether it scales running jobs on the caller's record of each
    (:attr:`JobView.record`)."""

    enforces_queues: bool
    scales: bool

    def why_waiting(self) -> dict[str, WaitReason]: ...

    def restarted(self) -> frozenset[str]: ...

    def interrupted(self) -> frozenset[str]: ...


class LiveAllocation:
    """One allocator deciding the live operator's cycle (module docstring)."""

    def __init__(self, allocator: RankingAllocator, name: str | None = None) -> None:
        if not isinstance(allocator, RankingAllocator):
            raise TypeError(f"{allocator!r} cannot say in which order it serves jobs (no order(jobs))")
        if allocator.clairvoyant:
            raise ValueError(f"{allocator.name} is clairvoyant: it cannot decide for a live scheduler")
        self.allocator = allocator
        self._name = name
        self._waking = isinstance(allocator, WakingAllocator)
        self._admitting = allocator if isinstance(allocator, AdmittingAllocator) else None
        #: per job: its observations, GPUs per worker and bounds, and what they give
        #: the allocator (:func:`_learned`); kept while they are the same objects
        self._kept: dict[str, tuple[Any, int, Any, tuple]] = {}

    @classmethod
    def named(cls, text: str, **options: Any) -> "LiveAllocation":
        """The allocator ``name[@options]`` (:func:`make_live_allocator`), called by its
        name (``goodput-rlpto``, not its class's) in events and waiting reasons."""
        return cls(make_live_allocator(text), name=parse_allocator_options(text)[0], **options)

    @property
    def name(self) -> str:
        """The allocator's name as configured (else its own)."""
        return self._name or self.allocator.name

    # ------------------------------------------------------------------ translation
    @staticmethod
    def alloc_job(job: JobView, now: float, protected: bool = False,
                  learned: tuple[tuple[ProfileSample, ...], float | None, float | None] | None = None) -> AllocJob:
        """``job`` in the allocator's terms (replicas are GPUs); ``protected``: it keeps
        the GPUs it holds (its minimum run time). ``learned``: what :func:`_learned`
        gives for its observations, when the caller kept it (None: derived here)."""
        g = max(1, job.gpus_per_worker)
        lo, hi = job.worker_range
        b = job.bounds
        if b is None:  # a fixed local batch per GPU: goodput is throughput
            bounds = _fixed(lo * g, hi * g)
        else:  # no per-GPU limit: the largest global batch (the goodput model's reference share)
            bounds = b if b.max_local_batch is not None else _capped(b)
        profile, sqr, var = learned if learned is not None else _learned(job.observations, g, b)
        nodes = job.placement
        held = tuple(nodes) if g == 1 else tuple(n for n in nodes for _ in range(g))
        prog = job.progress
        elastic = job if nodes and job.record is not None else None  # a running job the caller records, and its β
        return AllocJob(id=job.id, submit_time=job.submit_time, application=job.id,
                        age=max(0.0, now - job.submit_time), attained_service=job.attained_service,
                        num_restarts=max(0, job.restarts), allocation=held,
                        target_replicas=min(max(job.asked_workers or lo, lo), hi) * g,
                        target_batch_size=bounds.init_batch, min_replicas=lo * g, max_replicas=hi * g,
                        bounds=bounds, batch_size=job.batch_size or 0, grad_sqr=sqr, grad_var=var, profile=profile,
                        epoch=max(prog.epoch, 0), metrics=tuple(prog.history), higher_is_better=True,
                        priority=_rank(job.priority_class), queue=job.team,
                        service_queue=job.queue, service_priority=job.priority,
                        elastic=elastic, beta=job.beta if elastic is not None else None,
                        running_since=job.start_time if nodes else None,
                        protected=protected and bool(nodes), gpu_models=job.gpu_models,
                        cpu_milli=-(-max(job.cpu_milli, 0) // g), memory_mib=-(-max(job.memory_mib, 0) // g),
                        replica_group=g, seed_profile=job.seed_profile, restart_s=job.restart_s,
                        est_runtime=job.est_runtime, remaining=job.remaining)

    def target(self, job: JobView, alloc: Allocation, types: Mapping[int, str] | None = None) -> LiveTarget:
        """The allocator's answer for ``job`` in whole workers (0: it waits; a running job
        outside its worker range keeps a size from its own to the range); its
        GPU type when every node of the allocation is of one known type (``types``: node
        index -> type)."""
        g = max(1, job.gpus_per_worker)
        lo, hi = job.worker_range
        given, cur = alloc.replicas // g, len(job.placement)
        if job.placement and (cur <= given < lo or hi < given <= cur):
            workers = given  # a running job outside its range on its way to it (its pin moved)
        else:
            workers = min(given, hi)
            if workers < lo:
                return _WAITS
        batch = alloc.batch_size if job.bounds is not None else None
        if batch is not None and workers * g != alloc.replicas:  # rounded down: keep the per-GPU share
            batch = max(job.bounds.init_batch, alloc.atomic_bsz * workers * g * ((alloc.accum_steps or 0) + 1))
        return LiveTarget(workers, int(batch) if batch is not None else None, one_type(alloc.nodes, types or {}))

    # ------------------------------------------------------------------ decision
    @staticmethod
    def ended(job: JobView) -> str | None:
        """``"MaxEpochs"``, ``"Converged"`` or None: whether a running job ended by itself
        (:func:`~rlsched.core.planning.training_end` on its progress)."""
        if not job.placement:
            return None
        return training_end(job.progress.epochs_done, job.max_epochs, job.streak, job.patience)

    @staticmethod
    def protected(job: JobView, book: QueueBook, now: float) -> bool:
        """Whether a running job is still inside its minimum run time (its queue's, else
        the scheduler's): it keeps what it holds."""
        return bool(job.placement) and job.start_time is not None and now - job.start_time < book.min_run(job.team)

    @property
    def enforces_queues(self) -> bool:
        """Whether the allocator applies team queues' quotas (the goodput allocators);
        else their use is only reported and no job waits for its queue."""
        return self._admitting is None or self._admitting.enforces_queues

    @property
    def scales(self) -> bool:
        """Whether the allocator scales running jobs on the caller's record of each
        (:attr:`JobView.record`: a caller with one passes it)."""
        return self._admitting is not None and self._admitting.scales

    @staticmethod
    def barred(job: JobView, book: QueueBook) -> WaitReason | None:
        """Why a waiting job may not run at all under its queue: a queue that does not
        exist, or a service class its queue does not allow. Running jobs are never barred
        (a queue edited or deleted under them does not evict them)."""
        if job.placement or not job.team:
            return None
        q = book.get(job.team)
        if q is None:
            return WaitReason(0, "NoSuchQueue", f"its queue {job.team!r} does not exist (kubectl get trainingqueues)")
        if not q.allows(job.priority_class):
            return WaitReason(0, "PriorityNotAllowed", f"queue {q.name!r} allows the classes "
                                                        f"{', '.join(sorted(q.priority_classes))}, not {job.priority_class!r}")
        return None

    def _learned_of(self, job: JobView) -> tuple[tuple[ProfileSample, ...], float | None, float | None]:
        """:func:`_learned` for ``job``, kept while its observations and bounds are the
        same (immutable) objects."""
        g, obs, b = max(1, job.gpus_per_worker), job.observations, job.bounds
        hit = self._kept.get(job.id)
        if hit is not None and hit[0] is obs and hit[1] == g and hit[2] is b:
            return hit[3]
        out = _learned(obs, g, b)
        self._kept[job.id] = (obs, g, b, out)
        return out

    def plan(self, jobs: Sequence[JobView], capacity: Mapping[int, int], now: float,
             names: Mapping[int, str] | None = None, queues: QueueBook | None = None,
             models: Mapping[int, str] | None = None,
             offers: Mapping[int, tuple[int, int]] | None = None,
             types: Mapping[int, str] | None = None, why: bool = True) -> LivePlan:
        """Decide for ``jobs``: those with ``nodes`` run (and may move, unless not
        ``movable``), the others wait; a running job whose own end came
        (:meth:`ended`) is in ``complete`` and its GPUs are not given this time.
        ``capacity``: node index -> GPUs the allocator may give (free GPUs plus those the
        running ``jobs`` hold there). ``queues``: the teams' queues and the minimum run
        time (:mod:`rlsched.core.queues`; None: neither). ``models``: node index -> its
        GPU model (a job limited to some models, ``JobView.gpu_models``, gets GPUs only
        on nodes of those models). ``offers``: node index -> ``(millicores, MiB)`` the
        allocator may give, as ``capacity`` counts GPUs (None: CPU and memory not
        counted); a job's workers (``JobView.cpu_milli``/``memory_mib``) get GPUs only
        where their CPU and memory fit. ``types``: node index -> its GPU type
        (:func:`~rlsched.core.contract.gpu_type_of`; absent or ``""``: one type), given
        to the allocator as ``AllocNode.gpu_type``; a target whose nodes are all of one
        type carries it (``LiveTarget.gpu_type``), and a running job a type-aware
        allocator (``type_aware``) moves to another type at the same size gets a new
        generation (``resize``). ``why``: say why each waiting job waits
        (``LivePlan.waiting``; False: left empty, nothing else changes)."""
        names, models, offers, types = names or {}, models or {}, offers or {}, types or {}
        book = queues or QueueBook()
        ended = {j.id: end for j in jobs if (end := self.ended(j)) is not None}
        decided = [j for j in jobs if j.movable and j.id not in ended]
        gone = _gpus_on(j for j in jobs if j.movable and j.id in ended)
        room = {i: int(c) - gone[i] for i, c in capacity.items()}  # an ended job's GPUs free next decision
        nodes = [AllocNode(i, c, names.get(i, ""), models.get(i, ""),
                           *(offers[i] if i in offers else (None, None)), types.get(i, ""))
                 for i, c in sorted(room.items())]
        held = _gpus_on(decided)
        over = {i: (held[i], room.get(i, 0)) for i in held if held[i] > room.get(i, 0)}
        if over:
            raise ValueError(f"running jobs hold more GPUs than the capacity given (node: held, capacity): {over}")
        enforced = self.enforces_queues
        barred = {j.id: w for j in decided if enforced and (w := self.barred(j, book)) is not None}
        free_jobs = [j for j in decided if j.id not in barred]
        guarded = [self.protected(j, book, now) for j in free_jobs]
        asked = [self.alloc_job(j, now, k, self._learned_of(j)) for j, k in zip(free_jobs, guarded)]
        if len(self._kept) > 2 * len(free_jobs) + 64:  # forget the jobs that left
            live = {j.id for j in free_jobs}
            self._kept = {k: v for k, v in self._kept.items() if k in live}
        try:
            out = dict(self.allocator.allocate(asked, nodes, now, queues=book if enforced else None))
        except Exception as exc:  # noqa: BLE001 - a broken policy keeps everyone as they are
            return LivePlan(error=exc, complete=ended)
        plan = LivePlan(allocations=out, complete=ended)
        wakes = [self.allocator.next_decision(asked, out, now)] if self._waking else []
        targets = {j.id: self.target(j, out.get(j.id, _NOTHING), types) for j in free_jobs}
        moves = bool(self.allocator.type_aware)  # only a type-aware choice moves a job
        # a running job the allocator preempted and started again in one decision is
        # stopped and started: its workers go where the new gang's placement puts them,
        # after its preemptor's
        again = self._admitting.restarted() if self._admitting is not None else ()
        for j in free_jobs:
            t = targets[j.id]
            if not j.placement:
                if t.workers:
                    plan.start[j.id] = t
            elif t.workers == 0:
                plan.stop.append(j.id)
            elif j.id in again:  # preempted and resumed in one decision
                plan.stop.append(j.id)
                plan.start[j.id] = t
            elif t.workers != len(j.placement) or (moves and t.gpu_type is not None
                                                   and t.gpu_type != one_type(j.placement, types)):
                plan.resize[j.id] = t
        if self._admitting is not None:  # starts and grows in the order it placed them
            plan.start = {k: plan.start[k] for k in out if k in plan.start}
            plan.resize = {k: plan.resize[k] for k in out if k in plan.resize}
        said = self._admitting.interrupted() if self._admitting is not None else None
        plan.interrupt = [k for k in plan.stop if said is None or k in said]
        if why:
            use: Counter[str] = Counter()
            for j in free_jobs:
                use[j.team or ""] += targets[j.id].workers * max(1, j.gpus_per_worker)
            plan.waiting = self._why(free_jobs, asked, plan, nodes, book if enforced else QueueBook(), use)
            if self._admitting is not None:  # the allocator's own reasons
                own = self._admitting.why_waiting()
                plan.waiting.update({k: w for k, w in own.items() if k in plan.waiting})
            waits = bool(plan.waiting)
        else:  # the jobs _why would name: every one that does not run after this plan
            stopped = set(plan.stop)
            waits = any(not (j.placement and j.id not in stopped) and j.id not in plan.start for j in free_jobs)
        if waits:  # a protection from preemption that ends may let a waiting job in
            wakes += [j.start_time + book.min_run(j.team) for j, k in zip(free_jobs, guarded) if k]
        plan.wake_at = min((w for w in wakes if w is not None), default=None)
        plan.waiting.update(barred)
        if book.active:
            plan.queues = book.usage((j.team, targets[j.id].workers * max(1, j.gpus_per_worker)
                                      if j.id in targets else 0) for j in decided)
        return plan

    def _why(self, jobs: Sequence[JobView], asked: Sequence[AllocJob], plan: LivePlan,
             nodes: Sequence[AllocNode], book: QueueBook, use: Mapping[str, int]) -> dict[str, WaitReason]:
        """Why each job left without GPUs waits: its place in the allocator's order among
        them, and the jobs served before it; under queues, its queue's cap, or the
        minimum run time of the jobs holding its queue's guarantee."""
        by_key = {j.id: j for j in jobs}
        running = {k for k, j in by_key.items() if j.placement and k not in plan.stop} | set(plan.start)
        kept = [a for a in asked if a.protected]
        out: dict[str, WaitReason] = {}
        room: dict[tuple, int] = {}  # job shape -> GPUs its nodes could hold
        pos = before = 0
        for a in self.allocator.order(asked):
            key = a.id
            if key in running:
                before += 1
                continue
            j = by_key[key]
            pos += 1
            gang = j.worker_range[0] * max(1, j.gpus_per_worker)
            q = book.spec_of(j.team) if book.active else None
            if a.shape not in room:  # the GPUs of the nodes that could hold it, once per shape
                room[a.shape] = sum(a.room_on(n) for n in nodes)
            total = room[a.shape]
            if gang > total:
                on = ("" if j.gpu_models is None else f" on nodes of GPU model {', '.join(sorted(j.gpu_models))}"
                      if j.gpu_models else " on nodes of a GPU model its workers allow (the cluster has none)")
                if a.needs_offers:
                    on += f" with room for its workers' {j.cpu_milli}m CPU and {j.memory_mib}Mi memory each"
                out[key] = WaitReason(pos, "Unfittable", f"its gang needs {gang} GPUs, {total} are the allocator's{on}")
            elif q is not None and use.get(q.name, 0) + gang > q.cap:
                out[key] = WaitReason(pos, "Quota", f"queue {q.name!r} uses {use.get(q.name, 0)} of its "
                                                    f"{q.nominal_gpus} nominal + {q.borrowing_limit} borrowable GPUs; "
                                                    f"its gang needs {gang}")
            elif q is not None and use.get(q.name, 0) + gang <= q.nominal_gpus and kept:
                out[key] = WaitReason(pos, "MinRunTime", f"queue {q.name!r}'s guarantee ({q.nominal_gpus} GPUs, "
                                                         f"{use.get(q.name, 0)} in use) covers its gang of {gang}; "
                                                         f"{len(kept)} job(s) holding GPUs are inside their minimum "
                                                         f"run time and keep them until it ends")
            else:
                share = " under the queues' fair share" if q is not None else ""
                out[key] = WaitReason(pos, "Ranked", f"the {self.name} allocator gives the GPUs to {before} job(s) "
                                                     f"ranked before it (service class, attained GPU-seconds, submit "
                                                     f"time){share}; its gang needs {gang} GPUs")
        return out
