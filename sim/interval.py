"""The interval engine: measured jobs, driven by an allocation policy.

Every ``interval`` seconds (the paper's 60 s) an
:class:`~rlsched.core.allocation.Allocator` decides every job's GPUs, placement and batch
at once; a changed allocation pays ``restart_cost``, a job left out keeps its progress,
and jobs advance by their measured profiles (:mod:`.measured`). The cluster may mix GPU
types (Sia, Jayaram Subramanya et al., SOSP'23): a job runs on one type at a time, at
that type's measured speed, and reports its step times under that type. Teams' queues
are optional. Non-clairvoyant unless the allocator declares itself clairvoyant.
Details: docs/design-notes.md, docs/simulator.md.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time as _time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from rlsched.core.allocation import (
    Allocation,
    AllocationError,
    AllocJob,
    AllocNode,
    Allocator,
    FreeNodes,
    Oracle,
    ProfileSample,
    check_allocations,
    fixed_batch,
)
from rlsched.core.batch import BatchBounds
from rlsched.core.queues import NO_QUEUE, QueueBook

from .engine import JobRecord, SimResult
from .measured import (
    FIXED_BATCH,
    MAX_REPLICAS,
    Application,
    MeasuredCluster,
    MeasuredJobSpec,
    placement_of,
)

__all__ = ["IntervalConfig", "IntervalSimulator", "QueueSample", "one_type_per_job"]


@dataclass(frozen=True)
class IntervalConfig:
    """``interval``: seconds between allocation decisions; ``restart_cost``: seconds
    without progress after a job's allocation changes (``restart_costs``: per
    application, where given); ``max_time``: stop there (jobs still running are
    reported unfinished); ``record_series``: keep the utilisation and queue series;
    ``calibration``: per application, a factor on its measured step times (the real
    runs' speed, e.g. :data:`~.measured.SIA_CALIBRATION`; absent: 1)."""

    interval: float = 60.0
    restart_cost: float = 30.0
    max_time: float = math.inf
    record_series: bool = True
    restart_costs: Mapping[str, float] | None = None
    calibration: Mapping[str, float] | None = None

    def __post_init__(self) -> None:
        if not self.interval > 0 or self.restart_cost < 0:
            raise ValueError("need interval > 0 and restart_cost >= 0")
        for name, table in (("restart_costs", self.restart_costs), ("calibration", self.calibration)):
            for app, x in (table or {}).items():
                if not (math.isfinite(x) and (x > 0 if name == "calibration" else x >= 0)):
                    raise ValueError(f"{name}[{app!r}] = {x} must be finite and " + ("> 0" if name == "calibration" else ">= 0"))


@dataclass(frozen=True)
class QueueSample:
    """One decision, as applied: its time, and per queue — the jobs' tenant, ``""`` for
    jobs without one; only those with a job submitted and unfinished — the GPUs its
    jobs hold, its jobs, those of them left without GPUs, and the GPUs its jobs asked
    for (each job's ``num_replicas``, at most the cluster's GPUs)."""

    t: float
    held: dict[str, int]
    active: dict[str, int]
    waiting: dict[str, int]
    asked: dict[str, int]

    @property
    def contended(self) -> bool:
        """Some submitted job got no GPU in this decision."""
        return any(self.waiting.values())


class _Job:
    __slots__ = (
        "spec", "app", "progress", "epoch", "attained", "restarts", "nodes", "placement", "atomic", "accum",
        "delay", "end", "start", "profile", "grad", "preemptions", "w0", "ideal", "metrics", "queued",
        "since", "fixed_batch", "bounds", "gpu_type", "home", "stall_from", "restart_s",
    )

    def __init__(self, spec: MeasuredJobSpec, app: Application, bounds: BatchBounds) -> None:
        self.spec = spec
        self.app = app
        #: the GPU type it holds now (None: it holds no GPUs), and the last it ran on
        self.gpu_type: str | None = None
        self.home: str | None = None
        self.progress = 0.0
        self.epoch = 0
        self.attained = 0.0
        self.restarts = -1  # the first start is not a restart
        self.nodes: tuple[int, ...] = ()
        self.placement: tuple[int, ...] = ()
        self.atomic = 0
        self.accum = 0
        self.delay = 0.0
        self.end: float | None = None
        self.start: float | None = None
        self.profile: dict[tuple[str, int, int, int], ProfileSample] = {}
        self.grad: tuple[float, float] | None = None
        self.preemptions = 0
        self.w0 = 0
        self.ideal = 0.0
        self.metrics: list[float] = []
        self.queued = 0.0  # seconds with no GPUs since submission
        self.since: float | None = None  # when it last got GPUs after holding none
        #: when its last new allocation began while it has not stepped since (None: it
        #: has), and the seconds its last completed stall took (None: none yet)
        self.stall_from: float | None = None
        self.restart_s: float | None = None
        #: its batch stays its own whatever the allocator asks (:data:`~.measured.FIXED_BATCH`)
        self.fixed_batch = app.name in FIXED_BATCH
        #: the batch limits the allocator sees: the application's on every GPU type of
        #: the cluster (``bounds``), or with a fixed batch the job's own batch as both
        #: the initial and the largest (the bounds of a fixed global batch, as a live job
        #: without ``spec.maxBatchSize`` shows them)
        self.bounds = bounds if not self.fixed_batch else BatchBounds(
            spec.batch_size, spec.batch_size, bounds.min_local_batch, bounds.max_local_batch)

    @property
    def batch(self) -> int:
        return len(self.nodes) * self.atomic * (self.accum + 1)


class _Rates(Mapping[int, float]):
    """An oracle's ``progress_rate`` table, computed on first read of each GPU count
    (a policy reads a few of them; computing all 64 per job per interval dominated)."""

    __slots__ = ("_sim", "_job", "_n", "_memo")

    def __init__(self, sim: "IntervalSimulator", job: _Job, n: int) -> None:
        self._sim, self._job, self._n, self._memo = sim, job, n, {}

    def __getitem__(self, k: int) -> float:
        if not (isinstance(k, int) and 1 <= k <= self._n):
            raise KeyError(k)
        r = self._memo.get(k)
        if r is None:
            r = self._memo[k] = self._sim._packed_rate(self._job, k)
        return r

    def __iter__(self):
        return iter(range(1, self._n + 1))

    def __len__(self) -> int:
        return self._n


class IntervalSimulator:
    """Measured jobs on a cluster of one or several GPU types, an allocator deciding
    every interval.

    The cluster: ``cluster`` (:class:`~.measured.MeasuredCluster`), or ``nodes`` ×
    ``gpus_per_node`` GPUs of the default type (16 × 4 unless given). On a cluster of
    several types an allocator that is not ``type_aware`` decides
    through :func:`one_type_per_job`; one that does must keep each job on one type (an
    allocation across types raises :class:`~rlsched.core.allocation.AllocationError`).
    ``seeds``: per application, the one-GPU step times per type a job of it declares
    (:attr:`AllocJob.seed_profile`; :func:`~.measured.load_seed_profile`), those of the
    cluster's types shown."""

    def __init__(
        self,
        jobs: Sequence[MeasuredJobSpec],
        apps: Mapping[str, Application],
        allocator: Allocator,
        *,
        nodes: int | None = None,
        gpus_per_node: int | None = None,
        cluster: MeasuredCluster | None = None,
        config: IntervalConfig | None = None,
        queues: QueueBook | None = None,
        seeds: Mapping[str, Sequence[ProfileSample]] | None = None,
    ) -> None:
        if not isinstance(allocator, Allocator):
            raise TypeError(f"{type(allocator).__name__} is not an Allocator (name, clairvoyant, type_aware, allocate)")
        if queues is not None:
            _check_queues(allocator, queues, jobs)
        if cluster is None:
            nodes, gpus_per_node = 16 if nodes is None else nodes, 4 if gpus_per_node is None else gpus_per_node
            if nodes < 1 or gpus_per_node < 1:
                raise ValueError("need nodes >= 1 and gpus_per_node >= 1")
            cluster = MeasuredCluster.uniform(nodes, gpus_per_node)
        elif nodes is not None or gpus_per_node is not None:
            raise ValueError("give cluster or nodes and gpus_per_node, not both")
        ids = set()
        for j in jobs:
            if j.id in ids:
                raise ValueError(f"duplicate job id {j.id!r}")
            if j.application not in apps:
                raise ValueError(f"job {j.id}: no measured profile for application {j.application!r}")
            lacking = [t for t in cluster.gpu_types if t not in apps[j.application].gpu_types]
            if lacking:
                raise ValueError(f"job {j.id}: application {j.application!r} has no step times on GPU types {lacking} "
                                 f"of cluster {cluster.name!r} (measured: {', '.join(apps[j.application].gpu_types)})")
            ids.add(j.id)
        self.allocator = allocator
        self.cluster = cluster
        self._seeds = {app: tuple(x for x in samples if x.gpu_type in cluster.gpu_types)
                       for app, samples in (seeds or {}).items()}
        self.queues = queues
        #: each decision's use per queue or tenant (:class:`QueueSample`): with ``queues``,
        #: or jobs that carry a tenant; else empty
        self.queue_log: list[QueueSample] = []
        self._log_queues = queues is not None or any(j.tenant for j in jobs)
        self.config = config or IntervalConfig()
        self.nodes = [AllocNode(i, g, f"node-{i}", gpu_model=t, gpu_type=t) for i, (t, g) in enumerate(cluster.node_types())]
        self._type_of = [n.gpu_type for n in self.nodes]
        #: GPUs per node of each type, and each type's GPUs
        self._gpn = {g.gpu_type: g.gpus_per_node for g in cluster.groups}
        self._type_gpus = {g.gpu_type: g.nodes * g.gpus_per_node for g in cluster.groups}
        self.gpus_per_node = cluster.groups[0].gpus_per_node if cluster.homogeneous else None
        self.total_gpus = cluster.total_gpus
        #: the most GPUs one job can hold: all of one type
        self._job_cap = max(self._type_gpus.values())
        self.clairvoyant = bool(allocator.clairvoyant)
        #: decisions go through :func:`one_type_per_job` (several types, an allocator unaware of them)
        self._pin_types = not cluster.homogeneous and not allocator.type_aware
        envelope = {name: _envelope(apps[name], cluster.gpu_types) for name in {j.application for j in jobs}}
        self._jobs = [_Job(s, apps[s.application], envelope[s.application])
                      for s in sorted(jobs, key=lambda s: (s.submit_time, s.id))]
        self._by_id = {j.spec.id: j for j in self._jobs}
        for j in self._jobs:
            j.ideal = self._ideal_runtime(j)
        self.now = 0.0
        self._next = 0  # next job to arrive (index into _jobs, by submit time)
        self._active: list[_Job] = []
        self._records: list[JobRecord] = []
        self._series: tuple[list[float], list[int], list[int]] = ([], [], [])
        self._decisions = 0
        self._wall = 0.0

    # ------------------------------------------------------------------ public API
    @property
    def done(self) -> bool:
        return (self._next >= len(self._jobs) and not self._active) or self.now >= self.config.max_time

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Run to the end; ``progress(done, total)`` after every interval."""
        t0 = _time.perf_counter()
        try:
            while not self.done:
                self.step()
                if progress is not None:
                    progress(len(self._records), len(self._jobs))
        finally:
            self._wall += _time.perf_counter() - t0
        return self.result()

    def step(self) -> None:
        """One decision at ``now`` for the submitted jobs, then one interval of training."""
        cfg = self.config
        while self._next < len(self._jobs) and self._jobs[self._next].spec.submit_time <= self.now:
            j = self._jobs[self._next]
            j.queued += self.now - j.spec.submit_time  # submitted between two decisions
            self._active.append(j)
            self._next += 1
        if self._active:
            self._decide()
        elif self._next < len(self._jobs):  # idle: jump to the interval of the next arrival
            t_next = self._jobs[self._next].spec.submit_time
            self.now += max(math.ceil((t_next - self.now) / cfg.interval), 1) * cfg.interval
            return
        self._record()
        dt = min(cfg.interval, cfg.max_time - self.now)
        for j in self._active:
            self._train(j, dt)
        self.now += dt
        finished = [j for j in self._active if j.end is not None]
        if finished:
            self._active = [j for j in self._active if j.end is None]
            for j in finished:
                self._finish(j)

    def views(self) -> list[AllocJob]:
        """The submitted, unfinished jobs as the allocator sees them now."""
        return [self._view(j) for j in self._active]

    def result(self) -> SimResult:
        t, used, queue = self._series
        first = float(self._jobs[0].spec.submit_time) if self._jobs else 0.0
        return SimResult(
            records=list(self._records),
            unfittable=[],
            unfinished=[j.spec.id for j in self._jobs if j.end is None],
            total_gpus=self.total_gpus,
            series_t=np.array(t, dtype=float),
            series_used=np.array(used, dtype=np.int64),
            series_queue=np.array(queue, dtype=np.int64),
            events=self._decisions,
            wall_s=self._wall,
            first_submit=first,
            clairvoyant=self.clairvoyant,
        )

    # ------------------------------------------------------------------ internals
    def _max_replicas(self, j: _Job) -> int:
        cap = min(j.spec.batch_size // j.bounds.min_local_batch, self._job_cap, MAX_REPLICAS.get(j.app.name, self._job_cap))
        return max(cap, min(j.spec.num_replicas, self._job_cap), 1)

    def _view(self, j: _Job) -> AllocJob:
        spec = j.spec
        v = AllocJob(
            id=spec.id, submit_time=spec.submit_time, application=spec.application, age=self.now - spec.submit_time,
            attained_service=j.attained, num_restarts=max(j.restarts, 0), allocation=j.nodes,
            target_replicas=min(spec.num_replicas, self._job_cap), target_batch_size=spec.batch_size,
            min_replicas=1, max_replicas=self._max_replicas(j), bounds=j.bounds, batch_size=j.batch,
            atomic_bsz=j.atomic, accum_steps=j.accum, epoch=j.epoch, progress=j.progress,
            grad_sqr=j.grad[0] if j.grad else None, grad_var=j.grad[1] if j.grad else None,
            profile=tuple(j.profile.values()), metrics=tuple(j.metrics), higher_is_better=j.app.higher_is_better,
            seed_profile=self._seeds.get(spec.application, ()), restart_s=j.restart_s,
        )
        if self.queues is not None:
            v.queue = spec.tenant
            v.protected = bool(j.nodes) and j.since is not None and self.now - j.since < self.queues.min_run(spec.tenant)
        if self.clairvoyant:
            v.oracle = Oracle(
                remaining_progress=max(j.app.target_progress - j.progress, 0.0),
                progress_rate=_Rates(self, j, v.max_replicas),
            )
        return v

    def _packed(self, k: int, gpu_type: str) -> tuple[int, ...]:
        g = self._gpn[gpu_type]
        return (g,) * (k // g) + ((k % g,) if k % g else ())

    def _update_time(self, j: _Job, placement: tuple[int, ...], atomic: int, accum: int,
                     gpu_type: str) -> tuple[float, float, float]:
        """(seconds per update, step time, sync time) of the job as it runs: measured
        on ``gpu_type``, times its application's calibration factor where one is given."""
        out = j.app.update_time(placement, atomic, accum, gpu_type)
        c = (self.config.calibration or {}).get(j.app.name)
        return out if c is None else (out[0] * c, out[1] * c, out[2] * c)

    def _packed_config(self, j: _Job, k: int, gpu_type: str) -> tuple[float, int]:
        """(seconds per update, total batch) of the job on ``k`` GPUs of ``gpu_type``
        packed on as few nodes as possible, at its target batch size."""
        atomic, accum = fixed_batch(j.spec.batch_size, k, j.app.bounds_on(gpu_type))
        t, _, _ = self._update_time(j, self._packed(k, gpu_type), atomic, accum, gpu_type)
        return t, k * atomic * (accum + 1)

    def _packed_rate(self, j: _Job, k: int) -> float:
        """True progress per second on ``k`` GPUs packed, at the job's target batch, on
        the type it runs on (or last ran on; the cluster's first before it has run)."""
        gpu_type = j.home or self.cluster.gpu_types[0]
        t, batch = self._packed_config(j, min(k, self._type_gpus[gpu_type]), gpu_type)
        return j.app.gain(batch, j.epoch) / t

    def _ideal_runtime(self, j: _Job) -> float:
        """Seconds from start to completion at the requested GPUs packed on the type
        where that is fastest, no waiting and no restart: the slowdown metric's
        denominator (engine-side truth, never shown)."""
        app = j.app
        best = math.inf
        for gpu_type in self.cluster.gpu_types:
            t, batch = self._packed_config(j, min(j.spec.num_replicas, self._type_gpus[gpu_type]), gpu_type)
            total, prev = 0.0, 0.0
            for e, p in enumerate(app.epoch_progress):
                total += (p - prev) * t / app.gain(batch, e)
                prev = p
            best = min(best, total)
        return best

    def _decide(self) -> None:
        views = [self._view(j) for j in self._active]
        allocate = self.allocator.allocate
        if self._pin_types:
            allocate = one_type_per_job(allocate, {j.spec.id: j.home for j in self._active})
        # an allocator without queues is called without the keyword (:func:`_check_queues`)
        result = allocate(views, self.nodes, self.now, **({} if self.queues is None else {"queues": self.queues}))
        check_allocations(views, self.nodes, result)
        for jid, a in result.items():
            types = {self._type_of[i] for i in a.nodes}
            if len(types) > 1:
                raise AllocationError(f"job {jid}: allocation spans GPU types {sorted(types)}; "
                                      "a job runs on one GPU type at a time")
        self._decisions += 1
        for j in self._active:
            a = result.get(j.spec.id, Allocation())
            self._apply(j, a)
        if self._log_queues:
            held: dict[str, int] = {}
            active: dict[str, int] = {}
            waiting: dict[str, int] = {}
            asked: dict[str, int] = {}
            for j in self._active:
                q = j.spec.tenant or NO_QUEUE
                held[q] = held.get(q, 0) + len(j.nodes)
                active[q] = active.get(q, 0) + 1
                waiting[q] = waiting.get(q, 0) + (not j.nodes)
                asked[q] = asked.get(q, 0) + min(j.spec.num_replicas, self._job_cap)
            self.queue_log.append(QueueSample(self.now, held, active, waiting, asked))

    def _apply(self, j: _Job, a: Allocation) -> None:
        nodes = tuple(a.nodes)
        if not nodes:
            if j.nodes:
                j.preemptions += 1
            j.nodes, j.placement, j.atomic, j.accum, j.delay = (), (), 0, 0, 0.0
            j.since = None
            j.gpu_type = None
            j.stall_from = None
            return
        if not j.nodes:
            j.since = self.now
        gpu_type = self._type_of[nodes[0]]
        if a.atomic_bsz is None or j.fixed_batch:
            atomic, accum = fixed_batch(j.spec.batch_size, len(nodes), j.app.bounds_on(gpu_type))
        else:
            atomic, accum = int(a.atomic_bsz), int(a.accum_steps or 0)
        if sorted(nodes) != sorted(j.nodes):  # a move between types changes every node: a restart
            j.restarts += 1
            j.delay = (self.config.restart_costs or {}).get(j.app.name, self.config.restart_cost)
            j.stall_from = self.now
            if j.start is None:
                j.start = self.now
                j.w0 = len(nodes)
        j.nodes = nodes
        j.placement = placement_of(nodes)
        j.atomic, j.accum = atomic, accum
        j.gpu_type = j.home = gpu_type

    def _train(self, j: _Job, dt: float) -> None:
        """Advance a job by ``dt`` seconds of wall time from ``now``."""
        if not j.nodes:
            j.queued += dt
            return
        r = len(j.nodes)
        wait = min(j.delay, dt)
        j.delay -= wait
        j.attained += wait * r
        left = dt - wait
        t = self.now + wait
        if j.stall_from is not None and left > 0:  # it steps again: the stall it saw, as a live job sees it
            j.restart_s = t - j.stall_from
            j.stall_from = None
        app = j.app
        gpu_type = j.gpu_type
        cost, step, sync = self._update_time(j, j.placement, j.atomic, j.accum, gpu_type)
        key = (gpu_type, len(j.placement), r, j.atomic)
        if key not in j.profile:
            j.profile[key] = ProfileSample(len(j.placement), r, j.atomic, step, sync, gpu_type=gpu_type)
        batch = j.batch
        target = app.epoch_progress
        while left > 0:
            j.grad = app.grad_stats(batch, j.epoch)
            rate = app.gain(batch, j.epoch) / cost
            nxt = float(target[j.epoch])
            if j.progress + rate * left < nxt:
                j.progress += rate * left
                j.attained += left * r
                return
            need = (nxt - j.progress) / rate
            j.progress = nxt
            j.epoch += 1
            j.metrics.append(app.metric_at(batch, j.epoch))
            j.attained += need * r
            t += need
            left -= need
            if j.epoch >= app.max_epochs:
                j.end = t
                return

    def _finish(self, j: _Job) -> None:
        self._records.append(JobRecord(
            id=j.spec.id, submit=j.spec.submit_time, start=float(j.start if j.start is not None else j.end),
            end=float(j.end), workers=j.w0, gpus=j.w0, ideal_runtime=j.ideal, fee=0.0,
            accuracy=math.nan, epochs=j.epoch, level=-1,  # metrics differ per application: no mean
            rescales=max(j.restarts, 0), preemptions=j.preemptions, queued=j.queued,
        ))
        j.nodes = ()

    def _record(self) -> None:
        if not self.config.record_series:
            return
        t, used, queue = self._series
        t.append(self.now)
        used.append(sum(len(j.nodes) for j in self._active))
        queue.append(sum(1 for j in self._active if not j.nodes))


def _envelope(app: Application, gpu_types: Sequence[str]) -> BatchBounds:
    """The batch limits of ``app`` that hold on every one of ``gpu_types``: its global
    batch range, the per-GPU range every type fits (its bounds on a single type)."""
    bs = [app.bounds_on(t) for t in gpu_types]
    if len(bs) == 1:
        return bs[0]
    lo, hi = max(b.min_local_batch for b in bs), min(b.max_local_batch for b in bs)
    return BatchBounds(bs[0].init_batch, bs[0].max_batch, min(lo, hi), hi)


def one_type_per_job(allocate: Callable[..., Mapping[str, Allocation]],
                     home: Mapping[str, str | None]) -> Callable[..., Mapping[str, Allocation]]:
    """``allocate`` of an allocator unaware of GPU types, kept to one type per job on
    a cluster of several: a running job is shown limited to the type it runs on
    (``home``: the type each job last ran on; :attr:`AllocJob.gpu_models`, which
    allocators that place by GPU model honour), so it grows or shrinks there; a job
    that waits may start or resume on any one type (a resume is a restart anyway). A
    job the allocator spreads over several types is placed again, its replicas packed
    on one type with room for all of them after the others' allocations (its home type
    first, then the types that held most of them); where none has, it keeps what one
    type can hold, its per-GPU batch unchanged. An allocator that ignores
    ``gpu_models`` may move a running job to another type whole (a restart)."""

    def pinned(jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float, **kw) -> Mapping[str, Allocation]:
        type_of = {n.index: n.gpu_type for n in nodes}
        shown = [dataclasses.replace(j, gpu_models=frozenset({home[j.id]}))
                 if j.allocation and home.get(j.id) is not None and j.gpu_models is None else j for j in jobs]
        out = dict(allocate(shown, nodes, now, **kw))
        spread = [jid for jid, a in out.items() if len({type_of.get(i) for i in a.nodes}) > 1]
        if not spread:
            return out
        free = {n.index: n.gpus for n in nodes}
        for jid, a in out.items():
            if jid not in spread:
                for i in a.nodes:
                    free[i] = free.get(i, 0) - 1
        order = list(dict.fromkeys(type_of.values()))
        for jid in spread:
            a = out[jid]
            types = [type_of[i] for i in a.nodes]
            held = {t: types.count(t) for t in order}
            prefer = sorted(order, key=lambda t: (t != home.get(jid), -held[t], types.index(t) if t in types else len(types)))
            where: tuple[int, ...] = ()
            for t in prefer:
                got = FreeNodes({i: f for i, f in free.items() if type_of[i] == t}).take(len(a.nodes))
                if got is not None:
                    where = got
                    break
            else:
                best = max(prefer, key=lambda t: sum(f for i, f in free.items() if type_of[i] == t))
                where = FreeNodes({i: f for i, f in free.items() if type_of[i] == best}).take_upto(
                    len(a.nodes), {i: f for i, f in free.items() if type_of[i] == best})
            for i in where:
                free[i] -= 1
            out[jid] = dataclasses.replace(a, nodes=where) if where else Allocation()
        return out

    return pinned


def _check_queues(allocator: Allocator, queues: QueueBook, jobs: Sequence[MeasuredJobSpec]) -> None:
    """Refuse queues the run could not honour (the module docstring)."""
    if not isinstance(queues, QueueBook):
        raise TypeError(f"queues must be a QueueBook, got {type(queues).__name__}")
    try:
        params = inspect.signature(allocator.allocate).parameters
    except (TypeError, ValueError):  # no signature to read: do not guess
        params = {}
    if "queues" not in params and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise TypeError(f"allocator {getattr(allocator, 'name', type(allocator).__name__)!r} takes no queues "
                        "(its allocate has no 'queues' parameter): it would ignore them; run it without queues")
    missing = sorted({j.tenant for j in jobs if j.tenant and queues.get(j.tenant) is None})
    if missing:
        raise ValueError(f"no queue for the tenants {missing}: give every tenant a queue (or run without queues)")
    barred = sorted({j.tenant or NO_QUEUE for j in jobs if not queues.spec_of(j.tenant).allows("normal")})
    if barred:
        raise ValueError(f"queues {barred} do not allow the class 'normal' of the measured jobs: they would never run")
