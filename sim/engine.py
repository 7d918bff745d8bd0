"""Deterministic discrete-event simulator of a GPU cluster running training jobs.

One :class:`Simulator` holds the event heap, a :class:`~rlsched.core.ClusterState`, the
jobs and one seeded generator; a run is a pure function of its inputs and seed. Every
admission, preemption and scaling decision is core's scheduling cycle, as in the
operator: the engine translates its jobs into core's entries and applies the decisions.
Event order, preemption and scaling: docs/design-notes.md, docs/simulator.md.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import time as _time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from rlsched.core import ClusterState, JobView, Level, Ordering, Placement, PlacementError, Scaling, Topology
from rlsched.core.cycle import Preemption, SchedulingCycle
from rlsched.core.decision_clock import DecisionClock
from rlsched.core.estimate import estimate_remaining
from rlsched.core.batch import UNIT_BATCH
from rlsched.core.goodput import JobObservations
from rlsched.core.live_allocation import LiveAllocation, LiveJob, LivePlan, movable_room
from rlsched.core.queues import QueueBook
from rlsched.core.planning import (
    Admission,
    ElasticState,
    QueueEntry,
    RunningEntry,
    RunningJob,
    ScalingPlan,
    ScalingPlanner,
    TrainingSpec,
    convergence_gains,
    scaling_steps,
)

from .convergence import ConvergenceModel, stop_epoch
from .job import JobSpec, batch_rate, comm_time, ideal_level, throughput, topology_limits

__all__ = ["SimConfig", "Simulator", "SimResult", "JobRecord"]

log = logging.getLogger("rlsched.sim")

_FINISH, _ARRIVAL, _SCALE, _DEMOTE, _WAKE = 0, 1, 2, 3, 4
_PENDING, _RUNNING, _DONE, _DROPPED, _FUTURE = 0, 1, 2, 3, 4
#: orderings that rank by a per-job key, so ranking a subset is consistent (DRF is
#: not: its progressive filling depends on the other jobs in the list)
_KEY_ORDERINGS = frozenset({"fifo", "sjf", "srtf", "tetris", "tiresias"})
#: ... whose relative order of two pending jobs never changes while they wait
_STATIC_ORDERINGS = frozenset({"fifo", "sjf", "srtf", "tiresias"})


def _curve_grad_stats(gamma: float, batch_per_worker: int) -> tuple[float, float]:
    """``(gradSqr, gradVar)`` (per-sample) a trainer of a job on ``ConvergenceModel``'s
    curve reports: the curve's efficiency at ``w`` workers of ``b`` samples each,
    ``1 / (1 + γ(w − 1))``, is Pollux's ``(φ + b)/(φ + w·b)`` with the noise scale
    ``φ = b(1 − γ)/γ`` samples (all noise, ``φ = ∞``, at ``γ = 0``)."""
    if gamma <= 0:
        return 0.0, 1.0
    return 1.0, batch_per_worker * (1.0 - gamma) / gamma


def _grown(v: JobView, delta: int) -> JobView:
    """``v`` as the placement sees it while adding ``delta`` workers: the job at its new
    size with its current placement, as every worker of a gang is placed (``workers``
    the gang, ``placement`` the workers placed so far) and as the extender scores an
    added worker pod (its ``rlsched.dev/gang-size`` is the new count). Placing it as a
    job of its old size counted the gang's GPUs one worker short in DAS's room and
    learned terms (found by the twin check)."""
    return dataclasses.replace(v, workers=v.workers + delta, max_workers=max(v.max_workers, v.workers + delta),
                               placement=list(v.placement))


@dataclass(frozen=True)
class SimConfig:
    """Engine options.

    ``backfill``: keep starting later jobs when the head of the queue does not fit.
    ``scaling_interval``: seconds between scaling-policy calls.
    ``restart_cost``: seconds without progress after a job's worker count changes
    and after a preempted job resumes.
    ``preemption``: let core's admission preempt (``highest`` jobs; preemptive
    orderings such as SRTF and Tiresias); on by default, like the operator's
    ``OperatorConfig.preemption``.
    ``max_time``: stop the run at this simulated time (jobs still running are
    reported unfinished).
    ``clairvoyant``: show the policies every job's true run time and remaining time
    (``JobView.est_runtime`` / ``remaining``), as the simulator once did —
    for labelled reference runs only, never a baseline. Off (the default), a view
    carries what a live operator knows: the user's estimate where the job gives one
    (:meth:`JobSpec.user_estimate`) and the remaining time of
    :func:`rlsched.core.estimate.estimate_remaining` from it and the reported progress;
    the true run time stays on the engine's private job state.
    ``record_series``: keep utilization / queue time series.
    ``record_decisions``: keep a log of every decision (``SimResult.decisions``):
    admissions and resumes (job, time, nodes), preemptions (victim, preemptor, time),
    worker changes (job, time, delta) and finishes — what the twin check
    (``rlsched_dev.twin``) compares with the live operator's events.
    ``incremental_ranking``: avoid re-ranking the whole queue on every pass — with
    backfill, rank only the arrivals since the last pass when no GPU was released;
    without, keep the last ranking for orderings whose order never changes while jobs
    wait (see :meth:`Simulator._schedule_static`). Exact for orderings that sort by a
    per-job key; ``None`` turns it on for the built-in key orderings only.
    """

    backfill: bool = False
    scaling_interval: float = 300.0
    restart_cost: float = 30.0
    max_time: float = math.inf
    record_series: bool = True
    incremental_ranking: bool | None = None
    preemption: bool = True
    clairvoyant: bool = False
    record_decisions: bool = False
    #: seconds a job runs before it may be preempted (the operator's ``--min-run-time``)
    min_run_s: float = 0.0
    #: an allocation policy also decides when a job arrived, finished or gave GPUs
    #: back, besides every ``scaling_interval`` — as the operator's cycle sees such a
    #: change within seconds; off, freed GPUs and new jobs wait for the next interval
    allocate_on_events: bool = True
    #: least seconds between two decisions on events (core's DecisionClock): a burst
    #: of events within it makes one decision at its end
    decision_gap: float = 30.0

    def __post_init__(self) -> None:
        if self.scaling_interval <= 0 or self.restart_cost < 0 or self.decision_gap < 0:
            raise ValueError("need scaling_interval > 0, restart_cost >= 0 and decision_gap >= 0")


@dataclass(slots=True)
class JobRecord:
    """What happened to one job."""

    id: str
    submit: float
    start: float
    end: float
    workers: int  # initial worker count
    gpus: int  # initial GPUs
    ideal_runtime: float  # run time at initial workers, ideal placement
    fee: float
    accuracy: float  # final accuracy (nan for fixed-duration jobs)
    epochs: int
    level: int  # span level at start
    rescales: int
    preemptions: int = 0  # times it was suspended (checkpointed) and requeued
    #: seconds it held no GPUs between submission and completion (the interval engine
    #: counts it; nan where not counted)
    queued: float = math.nan

    @property
    def jct(self) -> float:
        return self.end - self.submit

    @property
    def wait(self) -> float:
        return self.start - self.submit


@dataclass
class SimResult:
    """Everything metrics need from a finished (or stopped) run."""

    records: list[JobRecord]
    unfittable: list[str]
    unfinished: list[str]
    total_gpus: int
    series_t: np.ndarray
    series_used: np.ndarray
    series_queue: np.ndarray
    events: int
    wall_s: float
    first_submit: float
    skipped: dict[str, int] = field(default_factory=dict)
    #: the policies saw true run times (SimConfig.clairvoyant): a reference run
    clairvoyant: bool = False
    #: the decision log (``SimConfig.record_decisions``), in the order decided:
    #: ``{"kind": "admit"|"preempt"|"scale"|"finish", "job", "t", ...}``; the admissions
    #: and resizes of a job with an adaptive batch (``JobSpec.batch_size``) also say the
    #: global ``batch`` it trains at from then on
    decisions: list[dict] = field(default_factory=list)


class _Job:
    """Engine-side mutable state of one job (not part of the public API)."""

    __slots__ = (
        "spec", "view", "conv", "status", "work_total", "work_done", "rate", "seg_start",
        "resume_at", "eff", "fee", "fee_rate", "version", "accs", "acc_first", "ideal",
        "level0", "rescales", "w0", "first_start", "preemptions", "elastic", "ran", "obs", "reported", "batch",
    )

    def __init__(self, spec: JobSpec, conv: ConvergenceModel | None) -> None:
        self.spec = spec
        self.view = spec.view()
        self.conv = conv
        self.status = _FUTURE
        self.work_total = 0.0
        self.work_done = 0.0
        self.rate = 0.0
        self.seg_start = 0.0
        self.resume_at = 0.0
        self.eff = 0.0
        self.fee = 0.0
        self.fee_rate = 0.0
        self.version = 0
        self.accs: np.ndarray | None = None
        self.acc_first = 1
        self.ideal = 0.0
        self.level0 = -1
        self.rescales = 0
        self.w0 = spec.workers
        self.first_start: float | None = None
        self.preemptions = 0
        #: what core's ScalingPlanner remembers of the job (the operator's status.rlpto)
        self.elastic = ElasticState()
        self.ran = 0.0  # seconds it held its workers (what a live operator measures)
        #: the step times it "reported" (an allocation policy's input: status.goodput live)
        self.obs = JobObservations(spec.bounds or UNIT_BATCH)
        self.reported = 0  # the epoch of its last report
        #: the global batch a scheduler set for its current run (an adaptive batch while
        #: it runs under an allocation policy; None: ``spec.batch_size``, or none)
        self.batch: int | None = None


class Simulator:
    """A GPU cluster, a job trace and (optionally) the policies that schedule it."""

    def __init__(
        self,
        jobs: Sequence[JobSpec],
        topology: Topology,
        *,
        ordering: Ordering | None = None,
        placement: Placement | None = None,
        scaling: Scaling | None = None,
        seed: int = 0,
        config: SimConfig | None = None,
        allocation: LiveAllocation | None = None,
        queues: QueueBook | None = None,
    ) -> None:
        if queues is not None and allocation is None:
            raise ValueError("teams' queues are decided by an allocation policy: give allocation= too")
        if allocation is not None:
            if ordering is not None or scaling is not None or placement is None:
                raise ValueError("an allocation policy decides alone: give it the placement policy that puts new "
                                 "workers on nodes (the extender's, live), and no ordering or scaling")
        elif (ordering is None) != (placement is None):
            raise ValueError("give both an ordering and a placement policy, or neither")
        if scaling is not None and placement is None:
            raise ValueError("a scaling policy needs a placement policy to add workers")
        ids = set()
        for j in jobs:
            if j.id in ids:
                raise ValueError(f"duplicate job id {j.id!r}")
            ids.add(j.id)
        self.topology = topology
        self.config = config or SimConfig()
        self.ordering = ordering
        #: the operator's admission rules (head-of-line blocking, or backfill)
        self.admission = (
            None if ordering is None
            else Admission(ordering, backfill=self.config.backfill, preemption=self.config.preemption,
                           min_run_s=self.config.min_run_s)
        )
        #: the ordering preempts by itself (SRTF, Tiresias), so every pass looks for victims
        self._policy_preempts = self.admission is not None and self.config.preemption and self.admission.preemptive_ordering
        self._demotes_at = getattr(ordering, "demotes_at", None) if self._policy_preempts else None
        self._highest_pending = 0  # pending ``highest`` jobs (they may preempt)
        self.placement = placement
        self.scaling = scaling
        #: an allocation policy deciding every job's workers each ``scaling_interval``
        #: (the operator's ``--allocator``: the same core object, :meth:`allocation_cycle`)
        self.allocation = allocation
        #: the teams' queues the allocation decides under (each job charged to its
        #: ``tenant``), with the minimum run time (``SimConfig.min_run_s`` when not given)
        self.queues = queues if queues is not None else QueueBook(min_run_s=self.config.min_run_s)
        #: core's elastic planner over ``scaling`` (the operator's ScalingPlanner)
        self.planner = ScalingPlanner(scaling) if scaling is not None else None
        #: core's scheduling cycle over the two: every preemption and scaling decision
        #: (the operator and the gang allocator run it too); the engine only applies them
        self.cycle = SchedulingCycle(self.admission, self.planner)
        self.rng = np.random.default_rng(seed)
        self.state = ClusterState(topology)
        self.now = 0.0
        self._bw = topology.bandwidth
        self._limits = topology_limits(topology)
        self._domain = [max(n.nvlink_domain_size, 1) for n in topology.nodes]
        self._price = np.array([n.price_per_gpu_hour for n in topology.nodes]) / 3600.0
        self._best_bw: dict[int, float] = {}
        order = sorted(range(len(jobs)), key=lambda k: (jobs[k].submit_time, k))
        # per-job convergence seeds and evaluation noise, drawn in job-list order
        seeds = self.rng.integers(0, 2**63 - 1, size=len(jobs)).tolist()
        lengths = np.array([0 if j.fixed else j.max_epochs for j in jobs], dtype=np.int64)
        noise = self.rng.standard_normal(int(lengths.sum()))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        self._jobs: list[_Job] = []
        noise_off: list[int] = []
        for k in order:
            spec = jobs[k]
            conv = None
            if not spec.fixed:
                conv = spec.convergence_model(seeds[k], noise[offsets[k] : offsets[k + 1]])
                noise_off.append(offsets[k])
            self._jobs.append(_Job(spec, conv))
        self._by_id = {j.spec.id: j for j in self._jobs}
        self._prepare_all(noise, noise_off)
        self._next_arrival = 0
        self._heap: list[tuple] = []
        self._counter = 0
        self._events = 0
        self._dirty = False
        self._new: list[JobView] = []  # arrivals since the last policy pass
        self._full_pass_needed = True  # GPUs were released since the last pass
        inc = self.config.incremental_ranking
        self._incremental = (getattr(ordering, "name", "") in _KEY_ORDERINGS) if inc is None else inc
        self._static = self._incremental and getattr(ordering, "name", "") in _STATIC_ORDERINGS
        self._order: list[JobView] | None = None  # last full ranking (static orderings)
        self._pos = 0
        self._side: list[JobView] = []  # arrivals since that ranking
        self._fit_cache: dict[tuple, int] = {}
        # a ranking that may leave jobs which cannot start unordered among themselves
        # (``rank_for_start``, core.policy): the same jobs start, as the placement
        # cannot start a job whose worker slots fall short and a pass only takes capacity
        rfs = getattr(ordering, "rank_for_start", None)
        self._rank_for_start = (
            rfs if rfs is not None and getattr(placement, "respects_worker_slots", False) else None
        ) if ordering is not None else None
        self._records: list[JobRecord] = []
        self._unfittable: list[str] = []
        self._series_t: list[float] = []
        self._series_used: list[int] = []
        self._series_queue: list[int] = []
        self._wall = 0.0
        self._decisions: list[dict] | None = [] if self.config.record_decisions else None
        self._wake_at: float | None = None  # the pending _WAKE event's time
        self._allocated_at: float | None = None  # when the allocation policy last decided
        self._clock = DecisionClock(gap=self.config.decision_gap, interval=self.config.scaling_interval)
        self._first_submit = float(min((j.submit_time for j in jobs), default=0.0))
        self._total_gpus = self.state.total_gpus
        self.now = self._first_submit
        if (scaling is not None or allocation is not None) and self._jobs:
            self._push(self._first_submit + self.config.scaling_interval, _SCALE, None)

    # ================================================================== public API
    @property
    def done(self) -> bool:
        """Nothing left to happen: no pending job, no event left (every job finished or
        was dropped), or max_time reached."""
        if self.now >= self.config.max_time:
            return True
        return not self.state.pending and not self._heap_live() and self._next_arrival >= len(self._jobs)

    @property
    def pending(self) -> list[JobView]:
        return self.state.pending

    @property
    def running(self) -> list[JobView]:
        return list(self.state.running.values())

    def job(self, job_id: str) -> JobView:
        return self._by_id[job_id].view

    def spec(self, job_id: str) -> JobSpec:
        return self._by_id[job_id].spec

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Run to the end with the configured policies; ``progress(done, total)`` is
        called now and then."""
        if self.ordering is None and self.allocation is None:
            raise ValueError("run() needs ordering and placement policies, or an allocation policy; "
                             "use start()/advance()")
        t0 = _time.perf_counter()
        total = len(self._jobs)
        tick = max(total // 100, 1)
        last = -1
        while self.step():
            if progress is not None:
                n = len(self._records) + len(self._unfittable)
                if n // tick != last:
                    last = n // tick
                    progress(n, total)
        if progress is not None:
            progress(len(self._records) + len(self._unfittable), total)
        self._wall += _time.perf_counter() - t0
        return self.result()

    def step(self) -> bool:
        """Process every event of the next event time, then let the policies decide.
        Returns False when nothing is left to do."""
        if not self._advance():
            return False
        if self.ordering is not None and self._dirty:
            self._schedule()
        elif self.allocation is not None and self._dirty and self.config.allocate_on_events:
            self._dirty = False
            due = self._clock.next_due(self._allocated_at, self.now, changed=True)
            if due <= self.now and self._allocated_at != self.now:
                self.allocation_cycle()
            elif due > self.now and (self._wake_at is None or due < self._wake_at):
                self._wake_at = due  # decide once the gap has passed, on what changed by then
                self._push(due, _WAKE, None)
        self._record(self.now)
        return True

    def decide(self) -> None:
        """Let the policies decide now, without moving the clock: one pass of core's
        cycle (admission, then preemption rounds) over the waiting jobs — what
        :meth:`step` runs after an event time's events. The scheduling environments call
        it with the agents' pick as the ordering and placement
        (:class:`rlsched.sim.envs.AgentTurn`)."""
        if self.ordering is None:
            raise ValueError("decide() needs ordering and placement policies")
        self._schedule()
        self._record(self.now)

    def advance(self) -> bool:
        """Process every event of the next event time (no policy decisions).
        Returns False when there is no event left or max_time is reached."""
        if not self._advance():
            return False
        self._record(self.now)
        return True

    def _advance(self) -> bool:
        t = self._next_time()
        if t is None:
            return False
        if t > self.config.max_time:
            self.now = self.config.max_time
            return False
        self.now = t
        self.state.time = t
        heap = self._heap
        scale = False
        while heap and heap[0][0] == t and heap[0][1] == _FINISH:
            _, _, _, (j, version) = heapq.heappop(heap)
            if version == j.version and j.status == _RUNNING:
                self._events += 1
                self._finish(j, t)
        jobs = self._jobs
        while self._next_arrival < len(jobs) and jobs[self._next_arrival].spec.submit_time == t:
            j = jobs[self._next_arrival]
            self._next_arrival += 1
            self._events += 1
            self._arrive(j, t)
        while heap and heap[0][0] == t:
            _, kind, _, payload = heapq.heappop(heap)
            if kind == _SCALE:
                scale = True
                self._events += 1
            elif kind == _FINISH and payload[1] == payload[0].version and payload[0].status == _RUNNING:
                self._events += 1
                self._finish(payload[0], t)
            elif kind == _DEMOTE and payload[1] == payload[0].version and payload[0].status == _RUNNING:
                self._events += 1
                self._demote(payload[0], t)
            elif kind == _WAKE:  # a running job's minimum run time ended: it may be preempted now
                self._events += 1
                self._wake_at = None
                self._dirty = True
        if scale and (self.scaling is not None or self.allocation is not None):
            if self.ordering is not None and self._dirty:
                self._schedule()
            self._scale_tick(t)
            if self.state.running or self.state.pending or self._next_arrival < len(jobs):
                self._push(t + self.config.scaling_interval, _SCALE, None)
        return True

    def advance_until(self, t: float) -> None:
        """Process every event up to time ``t`` (the policies decide, if set), then
        move the clock to ``t`` — for agents acting on a fixed time step."""
        while (nt := self._next_time()) is not None and nt <= t and nt <= self.config.max_time:
            if self.ordering is not None:
                self.step()
            else:
                self.advance()
        if t > self.now:
            self.now = self.state.time = min(t, self.config.max_time)

    def start(self, job_id: str, nodes: Sequence[int]) -> None:
        """Start pending job ``job_id`` with one worker on each of ``nodes`` (gang:
        ``len(nodes)`` must be between its min and max workers)."""
        j = self._by_id[job_id]
        if j.status != _PENDING:
            raise ValueError(f"job {job_id} is not pending")
        v = j.view
        if not (v.min_workers <= len(nodes) <= v.max_workers):
            raise ValueError(f"job {job_id}: {len(nodes)} workers outside [{v.min_workers}, {v.max_workers}]")
        self._start(j, list(nodes), self.now)
        self.state.pending = [p for p in self.state.pending if p is not v]
        self._record(self.now)

    def scale(self, job_id: str, delta: int, nodes: Sequence[int] | None = None) -> bool:
        """Add (``delta`` > 0, on ``nodes`` or where the placement policy says) or
        remove (``delta`` < 0, the newest) workers of a running job. The job pays the
        restart cost. Returns False when nothing changed."""
        j = self._by_id[job_id]
        if j.status != _RUNNING or delta == 0:
            return False
        ok = self._rescale(j, delta, nodes, self.now)
        if ok:
            self._record(self.now)
        return ok

    def preemptions(self, job_id: str) -> int:
        """How many times the job was suspended so far."""
        return self._by_id[job_id].preemptions

    def fits_now(self, job_id: str) -> bool:
        """Whether the job's current gang could be placed right now (slot count)."""
        v = self._by_id[job_id].view
        c = self.state.candidates(v.gpus_per_worker, v.gpu_models)
        return int((self.state.free[c] // v.gpus_per_worker).sum()) >= v.workers

    def result(self) -> SimResult:
        unfinished = [j.spec.id for j in self._jobs if j.status in (_PENDING, _RUNNING, _FUTURE)]
        return SimResult(
            records=list(self._records),
            unfittable=list(self._unfittable),
            unfinished=unfinished,
            total_gpus=self.state.total_gpus,
            series_t=np.array(self._series_t, dtype=float),
            series_used=np.array(self._series_used, dtype=np.int64),
            series_queue=np.array(self._series_queue, dtype=np.int64),
            events=self._events,
            wall_s=self._wall,
            first_submit=float(self._first_submit),
            clairvoyant=self.config.clairvoyant,
            decisions=list(self._decisions or ()),
        )

    def ideal_runtime(self, job_id: str) -> float:
        """Run time at the job's requested workers and ideal placement: the engine's
        secret (metrics, tests), never a policy input unless ``SimConfig.clairvoyant``."""
        j = self._by_id[job_id]
        if j.status == _FUTURE:
            self._prepare(j)
        return j.ideal

    # ================================================================== internals
    def _push(self, t: float, kind: int, payload) -> None:
        self._counter += 1
        heapq.heappush(self._heap, (t, kind, self._counter, payload))

    def _heap_live(self) -> bool:
        heap = self._heap
        while heap:
            t, kind, _, payload = heap[0]
            if kind == _FINISH or kind == _DEMOTE:
                j, version = payload
                if version == j.version and j.status == _RUNNING:
                    return True
                heapq.heappop(heap)
                continue
            # a scaling tick only matters while work remains
            if self.state.running or self.state.pending or self._next_arrival < len(self._jobs):
                return True
            heapq.heappop(heap)
        return False

    def _next_time(self) -> float | None:
        live = self._heap_live()
        ta = self._jobs[self._next_arrival].spec.submit_time if self._next_arrival < len(self._jobs) else None
        th = self._heap[0][0] if live else None
        if ta is None:
            return th
        if th is None:
            return ta
        return min(ta, th)

    def _prepare(self, j: _Job) -> None:
        """Ideal run time and (training jobs) the accuracy curve at the requested workers."""
        spec = j.spec
        w = spec.workers
        if spec.fixed:
            j.ideal = float(spec.duration)
            j.work_total = j.ideal
            return
        best = self._best_step(spec, w)
        conv = j.conv
        spe = spec.samples_per_epoch
        epochs = np.arange(1, spec.max_epochs + 1)
        accs = conv.evaluate(epochs, epochs * self._efficiency(j, w))
        e_stop = stop_epoch(accs, 1, (), 0, spec.beta, spec.patience, spec.max_epochs)
        j.accs, j.acc_first = accs, 1
        j.work_total = float(e_stop * spe)
        j.ideal = j.work_total / self._ideal_throughput(spec, w, best)

    def _efficiency(self, j: _Job, workers: int | None = None) -> float:
        """Statistical efficiency of one sample of ``j`` now: at its global batch with an
        adaptive batch (:meth:`JobSpec.batch_efficiency`), else the convergence model's
        at ``workers`` (default its current workers)."""
        if j.spec.batch_size is not None:
            return j.spec.batch_efficiency(j.batch)
        return j.conv.efficiency(j.view.workers if workers is None else workers)

    @staticmethod
    def _ideal_throughput(spec: JobSpec, workers: int, best: float) -> float:
        """Samples per second at ``workers`` at the best step time ``best`` (at
        ``batch_size`` with an adaptive batch)."""
        if spec.batch_size is None:
            return workers * spec.batch_per_worker / best
        return batch_rate(spec, workers, spec.batch_size, best - spec.compute_time)

    def _best_step(self, spec: JobSpec, workers: int) -> float:
        """Step time at the fastest level any placement of ``workers`` can reach."""
        n = workers * spec.gpus_per_worker
        bw = self._best_bw.get(n)
        if bw is None:
            lvl = int(ideal_level(n, self._limits))
            bw = self._best_bw[n] = max(self._bw.at(Level(v)) for v in range(lvl, int(Level.CLUSTER) + 1))
        return spec.compute_time + comm_time(spec.grad_gb, n, bw)

    def _prepare_all(self, noise: np.ndarray, noise_off: list[int], chunk: int = 8192) -> None:
        """:meth:`_prepare` for every job at once, vectorised over jobs: the same
        formulas as :meth:`ConvergenceModel.evaluate` and :func:`stop_epoch`, with
        ``noise[noise_off[k] + e - 1]`` the standard-normal noise of training job k
        after epoch e."""
        train = [j for j in self._jobs if j.conv is not None and j.spec.batch_size is None]
        for j in self._jobs:
            if j.conv is None or j.spec.batch_size is not None:  # an adaptive batch: its own efficiency
                self._prepare(j)
        for lo in range(0, len(train), chunk):
            part = train[lo : lo + chunk]
            specs = [j.spec for j in part]
            c = [j.conv for j in part]
            emax = max(s.max_epochs for s in specs)
            idx = np.arange(emax)
            epochs = idx + 1
            max_e = np.array([s.max_epochs for s in specs])
            inside = idx < max_e[:, None]
            pos = np.minimum(np.array(noise_off[lo : lo + len(part)])[:, None] + idx, max(len(noise) - 1, 0))
            sigma = np.array([m.noise for m in c])[:, None]
            eps = np.where(inside, noise[pos] if len(noise) else 0.0, 0.0) * sigma
            gamma = np.array([m.gamma for m in c])
            w = np.array([s.workers for s in specs])
            eff = (1.0 / (1.0 + gamma * (w - 1)))[:, None]
            acc_max = np.array([m.acc_max for m in c])[:, None]
            acc0 = np.array([m.acc0 for m in c])[:, None]
            tau = np.array([m.tau for m in c])[:, None]
            accs = np.clip(acc_max - (acc_max - acc0) * np.exp(-(epochs * eff) / tau) + eps, 0.0, 1.0)
            gains = convergence_gains(accs)  # the planner's β-rule gain after each epoch
            beta = np.array([s.beta for s in specs])[:, None]
            patience = np.array([s.patience for s in specs])[:, None]
            small = gains < beta
            last_big = np.maximum.accumulate(np.where(small, -1, idx), axis=1)
            hit = ((idx - last_big) >= patience) & inside
            stop = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, max_e).tolist()
            for r, j in enumerate(part):
                spec = specs[r]
                j.accs, j.acc_first = accs[r, : spec.max_epochs], 1
                j.work_total = float(stop[r] * spec.samples_per_epoch)
                j.ideal = j.work_total / (spec.workers * spec.batch_per_worker / self._best_step(spec, spec.workers))

    def _fit_slots(self, v: JobView) -> int:
        """Workers of ``v`` the empty cluster could host (GPUs, GPU model, CPU, memory)."""
        key = (v.gpus_per_worker, v.gpu_models, v.cpu_milli, v.memory_mib)
        slots = self._fit_cache.get(key)
        if slots is None:
            st = self.state
            c = st.candidates_total(v.gpus_per_worker, v.gpu_models)
            per = st.total[c] // v.gpus_per_worker
            if v.cpu_milli > 0:
                per = np.minimum(per, st.cpu_total[c] // v.cpu_milli)
            if v.memory_mib > 0:
                per = np.minimum(per, st.mem_total[c] // v.memory_mib)
            slots = int(per.sum())
            self._fit_cache[key] = slots
        return slots

    def _arrive(self, j: _Job, t: float) -> None:
        v = j.view
        slots = self._fit_slots(v)
        if slots < v.min_workers:
            j.status = _DROPPED
            self._unfittable.append(v.id)
            log.warning(
                "job %s can never fit: needs %d workers of %d GPUs%s%s, the empty cluster has room for %d; dropped",
                v.id, v.min_workers, v.gpus_per_worker,
                f" of {sorted(v.gpu_models)}" if v.gpu_models else "",
                f", {v.cpu_milli} mCPU, {v.memory_mib} MiB" if v.cpu_milli or v.memory_mib else "", slots,
            )
            return
        if slots < v.workers:
            log.warning("job %s asks %d workers, at most %d fit; starting with %d", v.id, v.workers, slots, slots)
            v.workers = slots
            j.w0 = slots
            j.spec = j.spec.with_(workers=slots, max_workers=max(slots, v.min_workers))
            self._prepare(j)
        if self.config.clairvoyant:  # a labelled reference: the policies see the truth
            v.est_runtime = j.ideal
            v.remaining = j.ideal
        else:  # what the user tells, if anything; the true run time stays on ``j``
            v.est_runtime = j.spec.user_estimate(j.ideal)
            v.remaining = estimate_remaining(v.est_runtime, 0.0, 0, 0)
        j.status = _PENDING
        if j.spec.priority_class == "highest":
            self._highest_pending += 1
        self.state.pending.append(v)
        self._new.append(v)
        self._dirty = True

    def _schedule(self) -> None:
        """One policy pass, then (preemption on) core's
        :meth:`SchedulingCycle.preemption_rounds <rlsched.core.cycle.SchedulingCycle.preemption_rounds>`:
        the blocked head of the queue asks for victims, the engine suspends them and
        starts it (:meth:`_apply_preemption`), and passes again, until nobody
        preempts."""
        self._schedule_pass()
        st = self.state
        if not (st.pending and self.cycle.preemption_possible(self._highest_pending > 0)):
            return
        if self._policy_preempts:  # the ordering compares live attained service / remaining time
            for v in st.running.values():
                self._sync(self._by_id[v.id], self.now)
        self.cycle.preemption_rounds(st, self.now, entry=self._entry, holder=self._running_entry,
                                     apply=self._apply_preemption, admit=self._schedule_pass)
        self._wake_for_protected()

    def _wake_for_protected(self) -> None:
        """With a minimum run time, a preemption it refused may be due when the first
        protected job's protection ends: look again then (the operator looks every
        cycle)."""
        min_run = self.admission.min_run_s
        if min_run <= 0 or not self.state.pending:
            return
        ends = [float(v.start_time) + min_run for v in self.state.running.values()
                if v.start_time is not None and self.now - float(v.start_time) < min_run]
        if ends and (self._wake_at is None or min(ends) < self._wake_at):
            self._wake_at = min(ends)
            self._push(self._wake_at, _WAKE, None)

    def _gang_spec(self, v: JobView) -> TrainingSpec:
        """The job as core's admission sees it: its gang is the workers it has (or
        starts with), its class and priority."""
        return TrainingSpec(
            min_workers=v.workers, max_workers=max(v.workers, v.max_workers), gpus_per_worker=v.gpus_per_worker,
            priority_class=self._by_id[v.id].spec.priority_class, priority_value=v.priority,
        )

    def _entry(self, v: JobView) -> QueueEntry:
        """The waiting job as core's admission sees it (its gang: the workers it starts with)."""
        return QueueEntry(key=v.id, spec=self._gang_spec(v), submit_time=v.submit_time, priority=v.priority,
                          queue=v.queue, job=v)

    def _running_entry(self, v: JobView) -> RunningEntry:
        return RunningEntry(key=v.id, spec=self._gang_spec(v), priority=v.priority, start_time=float(v.start_time),
                            placement=list(v.placement), job=v)

    def _apply_preemption(self, d: Preemption) -> bool:
        """Apply core's decision (:meth:`SchedulingCycle.preempt
        <rlsched.core.cycle.SchedulingCycle.preempt>`): suspend its victims (to the
        interrupt queue where it says), then start the head where the placement says.
        Returns False when the head's placement failed (it waits)."""
        head = d.head.job
        interrupt = set(d.interrupt)
        for key in d.victims:
            if self._decisions is not None:
                self._decisions.append({"kind": "preempt", "job": key, "t": self.now, "by": head.id})
            self._suspend(self._by_id[key], self.now, interrupt=key in interrupt)
        if self._try_start(head):
            self.state.pending = [p for p in self.state.pending if p.start_time is None]
            return True
        log.warning("t=%g: job %s preempted %s but its placement failed; it waits", self.now, head.id, d.victims)
        return False

    def _suspend(self, j: _Job, t: float, interrupt: bool) -> None:
        """Checkpoint a running job: keep its progress, epochs and attained service,
        release its GPUs, requeue it (interrupt queue when ``interrupt``)."""
        self._sync(j, t)
        v = j.view
        st = self.state
        st.release_job(v, v.placement)
        del st.running[v.id]
        v.placement = []
        v.start_time = None
        j.batch = None  # the batch of its next run is the scheduler's choice then
        if v.workers != j.w0:
            # it resumes with the gang it started with (the operator restarts a preempted
            # job at minWorkers), its accuracy curve from there at that worker count
            v.workers = j.w0
            if not j.spec.fixed:
                self._retarget(j)
        if interrupt:
            v.queue = "interrupt"
        j.status = _PENDING
        j.rate = 0.0
        j.version += 1  # its finish and demotion events are void
        j.preemptions += 1
        st.pending.append(v)
        self._new.append(v)
        self._order = None  # the static ranking cache held it as started
        self._dirty = True
        self._full_pass_needed = True
        if j.spec.priority_class == "highest":
            self._highest_pending += 1
        log.debug("t=%g: job %s suspended at epoch %d (%s queue)", t, v.id, v.progress.epoch, v.queue)

    def _demote(self, j: _Job, t: float) -> None:
        """A running job's attained service crossed one of the ordering's thresholds."""
        self._sync(j, t)
        v = j.view
        for th in getattr(self.ordering, "thresholds", ()):
            # the clock's float sums may stop a hair short of the threshold
            if 0 < th - v.attained_service <= 1e-9 * max(1.0, th):
                v.attained_service = float(th)
        if self.state.pending:
            self._dirty = True
        self._schedule_demote(j, t)

    def _schedule_demote(self, j: _Job, t: float) -> None:
        if self._demotes_at is not None:
            td = self._demotes_at(j.view, t)
            if td is not None:
                self._push(max(td, t), _DEMOTE, (j, j.version))

    def _schedule_pass(self) -> None:
        """One policy pass: rank the pending jobs and start them in order. With a
        placement that ``respects_worker_slots``, an ordering's ``rank_for_start`` ranks
        (core.policy: jobs that cannot start may stay unordered among themselves; they
        fail to start wherever they stand, so the same jobs start).

        Translation and caching only: who starts is core's :meth:`Admission.walk
        <rlsched.core.planning.Admission.walk>` (head-of-line or backfill) over the
        ordering's ranking; the caches only skip ranking what cannot change."""
        self._dirty = False
        st = self.state
        pending = st.pending
        new, self._new = self._new, []
        backfill = self.config.backfill
        if self._static and not backfill:
            self._absorb(new)
            if st.free_gpus > 0:
                self._schedule_static()
            return
        if not pending or st.free_gpus == 0:
            self._full_pass_needed = self._full_pass_needed or bool(pending)
            return
        if self._incremental and backfill and not self._full_pass_needed:
            # Backfill, and nothing released since the last full pass: every job tried
            # then still does not fit, so only the new arrivals can start. Exact for
            # orderings that sort by a per-job key.
            ranked = self.ordering.rank(new, st) if len(new) > 1 else new
        elif self._rank_for_start is not None:
            ranked = self._rank_for_start(pending, st)
        else:
            ranked = self.ordering.rank(pending, st)
        self._full_pass_needed = False
        started, _ = self.admission.walk((v for v in ranked if v.start_time is None), self._try_start)
        if started:
            st.pending = [p for p in pending if p.start_time is None]

    def _try_start(self, v: JobView) -> bool:
        """Start pending job ``v`` where the placement policy says, if it fits now."""
        st = self.state
        if v.gpus > st.free_gpus:
            return False
        nodes = self.placement.place(v, st)
        if nodes is None:
            return False
        if len(nodes) != v.workers:
            raise PlacementError(
                f"placement {self.placement.name!r} gave {len(nodes)} nodes for {v.workers} workers of job {v.id}"
            )
        self._start(self._by_id[v.id], nodes, self.now)
        return True

    def _absorb(self, new: list[JobView]) -> None:
        """Merge new arrivals into the cached ranking (static orderings)."""
        st = self.state
        side = self._side
        rank = self.ordering.rank
        if self._order is None or len(side) + len(new) > max(32, len(st.pending) // 8):
            self._order = rank(st.pending, st)
            self._pos = 0
            side.clear()
            return
        for x in new:  # binary insertion, comparing two jobs at a time
            lo, hi = 0, len(side)
            while lo < hi:
                mid = (lo + hi) // 2
                if rank([side[mid], x], st)[0] is x:
                    hi = mid
                else:
                    lo = mid + 1
            side.insert(lo, x)

    def _schedule_static(self) -> None:
        """Head-of-line pass for orderings whose relative order of pending jobs never
        changes (FIFO, SJF, SRTF, Tiresias without preemption): keep the last full
        ranking plus a side list of later arrivals, and find each next head by ranking
        only (head of the ranking + side list). The side list is folded into a full
        re-ranking when it outgrows an eighth of the queue. A cache over core's
        :meth:`Admission.walk <rlsched.core.planning.Admission.walk>`: it decides
        nothing of its own."""
        started, _ = self.admission.walk(self._static_heads(), self._try_start)  # backfill is off here
        if started:
            st = self.state
            st.pending = [p for p in st.pending if p.start_time is None]

    def _static_heads(self):
        """The successive heads of the cached ranking + side list; resumed only after
        the last head started (a blocked head ends the head-of-line walk)."""
        st = self.state
        side = self._side
        order = self._order
        while True:
            pos = self._pos
            while pos < len(order) and order[pos].start_time is not None:
                pos += 1
            self._pos = pos
            head = order[pos] if pos < len(order) else None
            while side and side[0].start_time is not None:  # started from outside
                del side[0]
            if side:  # side is kept ranked: compare the two heads
                v = side[0] if head is None else self.ordering.rank([head, side[0]], st)[0]
            elif head is not None:
                v = head
            else:
                return
            yield v
            if v is head:
                self._pos += 1
            else:
                del side[0]

    def _start(self, j: _Job, nodes: list[int], t: float) -> None:
        v = j.view
        if len(nodes) != v.workers:
            v.workers = len(nodes)
        self.state.allocate_job(v, nodes)
        v.placement = list(nodes)
        v.start_time = t
        self.state.running[v.id] = v
        j.status = _RUNNING
        j.seg_start = t
        if self._decisions is not None:
            self._decisions.append({"kind": "admit", "job": v.id, "t": t, "nodes": list(nodes),
                                    "workers": len(nodes), "resume": j.first_start is not None,
                                    **self._batch_record(j)})
        if j.spec.priority_class == "highest":
            self._highest_pending -= 1
        if j.first_start is None:
            j.first_start = t
            j.resume_at = t
            j.level0 = self._set_rate(j)
        else:  # a resume from a checkpoint
            j.resume_at = t + self.config.restart_cost
            v.queue = j.spec.queue
            self._set_rate(j)
        if (v.workers != j.w0 or j.spec.batch_size is not None) and not j.spec.fixed:
            self._retarget(j)  # (an adaptive batch: at the batch it was given)
        self._schedule_finish(j, t)
        self._schedule_demote(j, t)

    def _batch_record(self, j: _Job) -> dict:
        """``{"batch": global batch}`` for the decision log of a job with an adaptive
        batch (nothing for the others: their log is unchanged)."""
        return {} if j.spec.batch_size is None else {"batch": j.spec.global_batch(j.view.workers, j.batch)}

    def _level(self, v: JobView) -> Level:
        p = v.placement
        first = p[0]
        if len(p) == 1 or all(i == first for i in p):  # one node: Topology.span_level's rule, inlined
            dom = self._domain[first]
            return Level.NVLINK if v.gpus <= dom else Level.NODE
        return self.state.span_level(p, v.gpus_per_worker)

    def _set_rate(self, j: _Job) -> int:
        """Rate, fee rate and throughput at the job's placement; returns its level."""
        v, spec = j.view, j.spec
        lvl = self._level(v)
        thr = throughput(spec, v.workers, lvl, self._bw, j.batch)
        if spec.fixed:
            ideal_thr = spec.workers * spec.batch_per_worker / self._best_step(spec, spec.workers)
            j.rate = thr / ideal_thr
        else:
            j.rate = thr
        price = self._price
        j.fee_rate = v.gpus_per_worker * float(sum(price[i] for i in v.placement))
        v.throughput = thr / max(v.workers, 1)
        return int(lvl)

    def _retarget(self, j: _Job) -> None:
        """Recompute when a training job stops, from its history and current workers."""
        spec, conv, v = j.spec, j.conv, j.view
        spe = spec.samples_per_epoch
        k = v.progress.epoch
        if k >= spec.max_epochs:
            j.work_total = j.work_done
            j.accs, j.acc_first = np.empty(0), k + 1
            return
        hist = v.progress.history
        small = convergence_gains(np.asarray(hist, dtype=float)) < spec.beta if hist else np.zeros(0, dtype=bool)
        streak = len(small) - int(np.flatnonzero(~small)[-1]) - 1 if (~small).any() else len(small)
        if hist and streak >= spec.patience:
            j.work_total = j.work_done
            return
        epochs = np.arange(k + 1, spec.max_epochs + 1)
        eff = j.eff + (epochs * spe - j.work_done) / spe * self._efficiency(j)
        accs = conv.evaluate(epochs, eff)
        e_stop = stop_epoch(accs, k + 1, hist, streak, spec.beta, spec.patience, spec.max_epochs)
        j.accs, j.acc_first = accs, k + 1
        j.work_total = max(float(e_stop * spe), j.work_done)

    def _sync(self, j: _Job, t: float, final: bool = False) -> None:
        """Bring a running job's progress, fee and reported accuracy up to time ``t``."""
        v, spec = j.view, j.spec
        dt = t - j.seg_start
        if dt > 0:
            active = t - max(j.seg_start, j.resume_at)
            if active > 0:
                delta = min(j.rate * active, j.work_total - j.work_done)
                j.work_done += delta
                if j.conv is not None:
                    j.eff += delta / spec.samples_per_epoch * self._efficiency(j)
            j.fee += j.fee_rate * dt
            v.attained_service += v.gpus * dt
            j.ran += dt
            j.seg_start = t
        if final:
            j.work_done = j.work_total
        if j.rate > 0 and self.config.clairvoyant:
            v.remaining = (j.work_total - j.work_done) / j.rate
        if j.conv is not None and j.accs is not None:
            spe = spec.samples_per_epoch
            k_old = v.progress.epoch
            k_new = int(j.work_total // spe) if final else int((j.work_done + 1e-6) // spe)
            k_new = min(k_new, j.acc_first + len(j.accs) - 1)
            if k_new > k_old:
                p = v.progress
                new = j.accs[k_old + 1 - j.acc_first : k_new + 1 - j.acc_first]
                p.history.extend(new.tolist())
                p.epoch = k_new
                p.accuracy = p.history[-1]
                conv = j.conv
                eff_k = j.eff - (j.work_done - k_new * spe) / spe * self._efficiency(j)
                p.loss = conv.loss_min + (conv.loss0 - conv.loss_min) * math.exp(-eff_k / conv.tau)
                p.max_loss = conv.loss0
        if not self.config.clairvoyant:  # from the estimate, time run and reported epochs only
            v.remaining = estimate_remaining(v.est_runtime, j.ran, v.progress.epoch, 0 if spec.fixed else spec.max_epochs)

    def _schedule_finish(self, j: _Job, t: float) -> None:
        j.version += 1
        if j.rate <= 0:
            return
        t_fin = max(t, j.resume_at) + (j.work_total - j.work_done) / j.rate
        self._push(t_fin, _FINISH, (j, j.version))

    def _finish(self, j: _Job, t: float) -> None:
        self._sync(j, t, final=True)
        v = j.view
        self.state.release_job(v, v.placement)
        del self.state.running[v.id]
        j.status = _DONE
        j.rate = 0.0
        self._dirty = True
        self._full_pass_needed = True
        if self._decisions is not None:
            self._decisions.append({"kind": "finish", "job": v.id, "t": t, "epoch": v.progress.epoch,
                                    "jct": t - v.submit_time})
        self._records.append(
            JobRecord(
                id=v.id,
                submit=v.submit_time,
                start=float(j.first_start),
                end=t,
                workers=j.w0,
                gpus=j.w0 * v.gpus_per_worker,
                ideal_runtime=j.ideal,
                fee=j.fee,
                accuracy=v.progress.accuracy if j.conv is not None else math.nan,
                epochs=v.progress.epoch,
                level=j.level0,
                rescales=j.rescales,
                preemptions=j.preemptions,
            )
        )

    def _rescale(self, j: _Job, delta: int, nodes: Sequence[int] | None, t: float, batch: int | None = None) -> bool:
        """Resize a running job by ``delta`` workers (added on ``nodes``, or where the
        placement policy puts them); ``batch``: the global batch of its next run (an
        adaptive batch set by an allocation policy; None: unchanged)."""
        v = j.view
        new = v.workers + delta
        if not (v.min_workers <= new <= v.max_workers):
            return False
        self._sync(j, t)
        if delta > 0:
            if nodes is None:
                if self.placement is None:
                    raise ValueError("no nodes given and no placement policy to choose them")
                nodes = self.placement.place(_grown(v, delta), self.state, workers=delta)
                if nodes is None:
                    return False
            nodes = list(nodes)
            if len(nodes) != delta:
                raise PlacementError(f"job {v.id}: {len(nodes)} nodes for {delta} new workers")
            self.state.allocate_job(v, nodes)
            v.placement = v.placement + nodes
        else:
            gone = v.placement[new:]
            self.state.release_job(v, gone)
            v.placement = v.placement[:new]
            self._dirty = True
            self._full_pass_needed = True
        v.workers = new
        j.rescales += 1
        if batch and j.spec.batch_size is not None:
            j.batch = int(batch)
        if self._decisions is not None:
            self._decisions.append({"kind": "scale", "job": v.id, "t": t, "delta": delta, "workers": new,
                                    "epoch": v.progress.epoch, **self._batch_record(j)})
        j.resume_at = t + self.config.restart_cost
        self._set_rate(j)
        if not j.spec.fixed:
            self._retarget(j)
        self._schedule_finish(j, t)
        self._schedule_demote(j, t)
        return True

    def _scale_tick(self, t: float) -> None:
        if self.allocation is not None:
            self.allocation_cycle()
        elif self.state.running:
            self.scaling_cycle()

    # ------------------------------------------------------------ allocation policy
    def _report(self, j: _Job) -> None:
        """The step time the job's chief reported with its evaluations since the last
        cycle (a report comes with each completed epoch, as ``rlsched.trainer``'s at an
        epoch's end; the twin's replay trainer reports the same), folded into what the
        policy may read as the operator folds ``status.progress``: seconds per step on its
        workers and nodes at its global batch (a fixed per-worker batch in sample-units
        of one per GPU), and its gradient statistics."""
        v = j.view
        if j.rate <= 0 or j.spec.fixed or v.progress.epoch <= j.reported:
            return
        j.reported = v.progress.epoch
        spec = j.spec
        if spec.batch_size is not None:
            batch = spec.global_batch(v.workers, j.batch)
            step, stats = batch / j.rate, spec.grad_stats()
        else:  # a fixed batch per worker
            batch = v.workers * v.gpus_per_worker
            step = v.workers * spec.batch_per_worker / j.rate
            stats = _curve_grad_stats(j.conv.gamma, spec.batch_per_worker) if j.conv is not None else None
        report = {"workers": v.workers, "globalBatchSize": batch, "stepTimeSeconds": step}
        if stats is not None:
            report["gradSqr"], report["gradVar"] = stats
        j.obs = j.obs.update(report, len(set(v.placement)))

    def _live_job(self, j: _Job, nodes: tuple[int, ...]) -> LiveJob:
        v = j.view
        spec = j.spec
        batch = None  # the scheduler sets none
        if spec.batch_size is not None:  # its current run's, else the one it asked for
            batch = j.batch if nodes and j.batch is not None else spec.batch_size
        return LiveJob(key=v.id, submit_time=v.submit_time, min_workers=v.min_workers, max_workers=v.max_workers,
                       gpus_per_worker=v.gpus_per_worker, nodes=nodes, observations=j.obs,
                       batch_size=batch, bounds=spec.bounds,
                       attained_service=v.attained_service, restarts=j.rescales + j.preemptions,
                       priority_class=j.spec.priority_class or "normal", queue=j.spec.tenant,
                       running_since=float(v.start_time) if nodes and v.start_time is not None else None,
                       gpu_models=v.gpu_models, cpu_milli=v.cpu_milli, memory_mib=v.memory_mib,
                       epoch=v.progress.epoch, metrics=tuple(v.progress.history))

    def allocation_cycle(self) -> LivePlan:
        """One decision of the allocation policy now, as the operator's allocator mode
        takes it (``core/live_allocation.py``): every running job (synced, its report
        folded in) and every waiting job to :meth:`LiveAllocation.plan` with each
        node's GPUs, then the plan applied — jobs given nothing suspended, shrinks,
        then grows and starts in the plan's order, new workers where the placement
        policy puts them (a start or grow it cannot place waits for the next cycle).
        Every change pays ``restart_cost``."""
        t = self.now
        self._allocated_at = t
        st = self.state
        jobs: list[LiveJob] = []
        for v in list(st.running.values()):
            j = self._by_id[v.id]
            self._sync(j, t)
            self._report(j)
            jobs.append(self._live_job(j, tuple(v.placement)))
        capacity, offers = movable_room(st, ((v.placement, v.gpus_per_worker, v.cpu_milli, v.memory_mib)
                                             for v in st.running.values()))
        jobs += [self._live_job(self._by_id[v.id], ()) for v in st.pending]
        if not jobs:
            return LivePlan()
        models = {i: node.gpu_model for i, node in enumerate(st.topology.nodes)}
        plan = self.allocation.plan(jobs, capacity, t, queues=self.queues, models=models, offers=offers)
        if plan.error is not None:
            raise plan.error
        for jid in plan.stop:
            self._suspend_for_allocation(self._by_id[jid], t)
        grows = []
        for jid, target in plan.resize.items():
            j = self._by_id[jid]
            delta = target.workers - j.view.workers
            if delta < 0:
                self._rescale(j, delta, None, t, target.batch_size)
            else:
                grows.append((j, delta, target.batch_size))
        for jid, target in plan.start.items():
            j = self._by_id[jid]
            v = j.view
            nodes = self.placement.place(_grown(v, target.workers - v.workers), st)
            if nodes:
                if j.spec.batch_size is not None:
                    j.batch = target.batch_size or None
                self._start(j, list(nodes), t)
                st.pending = [p for p in st.pending if p is not v]
        for j, delta, batch in grows:
            self._rescale(j, delta, None, t, batch)
        self._record(t)
        return plan

    def _suspend_for_allocation(self, j: _Job, t: float) -> None:
        if self._decisions is not None:
            self._decisions.append({"kind": "preempt", "job": j.view.id, "by": self.allocation.name, "t": t})
        self._suspend(j, t, interrupt=True)

    # ------------------------------------------------------------ elastic scaling
    def elastic_jobs(self) -> list[RunningJob]:
        """The running jobs as core's :class:`ScalingPlanner` sees them, synced to now:
        each job's reported progress folded into its :class:`ElasticState` (the same
        fold the operator does each cycle), its own β patience, and its live view."""
        out = []
        t = self.now
        for v in self.state.running.values():
            j = self._by_id[v.id]
            self._sync(j, t)
            spec = j.spec
            j.elastic.observe(v.progress, v.workers, t - float(j.first_start), spec.beta, spec.samples_per_epoch)
            tspec = TrainingSpec(
                min_workers=v.min_workers, max_workers=v.max_workers, gpus_per_worker=v.gpus_per_worker,
                priority_class=spec.priority_class, priority_value=spec.priority, beta=spec.beta,
                max_epochs=spec.max_epochs, data_size=spec.samples_per_epoch, batch_size=spec.batch_size,
            )
            self._report(j)
            out.append(RunningJob(
                key=v.id, spec=tspec, workers=v.workers, progress=v.progress, state=j.elastic,
                submit_time=v.submit_time, start_time=float(v.start_time), placement=list(v.placement),
                patience=spec.patience, job=v, observations=j.obs if j.obs.shapes else None,
                local_batch=spec.batch_per_worker / v.gpus_per_worker,
            ))
        return out

    def scaling_cycle(self, policy: Scaling | None = None) -> ScalingPlan:
        """One elastic-scaling cycle now, as the operator's cycle runs it: core's
        :class:`ScalingPlanner` over :meth:`elastic_jobs` with ``policy`` (default the
        engine's scaling policy), GPUs reserved for the blocked head of the queue, room
        checked with the placement policy; the plan is applied (:meth:`apply_scaling`)
        and GPUs freed by it go to waiting jobs at once. Returns the plan."""
        if self.ordering is not None and self._dirty:
            self._schedule()
        if policy is None and self.planner is None:
            raise ValueError("no scaling policy: give one, or build the simulator with scaling=")
        cycle = self.cycle if policy is None else SchedulingCycle(self.admission, ScalingPlanner(policy))
        running = self.elastic_jobs()
        if not running:
            return ScalingPlan()
        plan = cycle.scale(running, self.state, blocked=self._blocked_head(), place_one=self._place_one)
        self.apply_scaling(plan)
        if self.ordering is not None and self._dirty:
            self._schedule()
        return plan

    def apply_scaling(self, plan: ScalingPlan) -> dict[str, int]:
        """Apply a plan's one-worker changes now, removals first, each added worker on
        the node the planner found for it (``plan.nodes``; the placement policy's choice
        when absent). Every resize pays ``restart_cost``. Returns the changes made."""
        done: dict[str, int] = {}
        for jid, step in scaling_steps(plan.deltas):
            j = self._by_id.get(jid)
            if j is None or j.status != _RUNNING:
                continue
            node = plan.nodes.get(jid) if step > 0 else None
            if self._rescale(j, step, None if node is None else [node], self.now):
                done[jid] = step
        if done:
            self._record(self.now)
        return done

    def _blocked_head(self) -> QueueEntry | None:
        """The job at the head of the waiting queue (core's
        :meth:`SchedulingCycle.head <rlsched.core.cycle.SchedulingCycle.head>`; after a
        policy pass every waiting job is blocked or behind it), as admission sees it."""
        head = self.cycle.head(self.state.pending, self.state)
        return None if head is None else self._entry(head)

    def _place_one(self, rj: RunningJob, state: ClusterState) -> int | None:
        """The planner's room check: where the placement policy puts one more worker
        (best fit by free GPUs among the nodes that can host it when there is none)."""
        v = self._by_id[rj.key].view
        if self.placement is None:
            c = state.candidates(v.gpus_per_worker, v.gpu_models)
            return int(c[np.argmin(state.free[c])]) if len(c) else None
        nodes = self.placement.place(_grown(v, 1), state, workers=1)
        return int(nodes[0]) if nodes else None

    def training_curve(self, job_id: str) -> tuple[ConvergenceModel | None, float]:
        """The job's convergence model (None for fixed-duration jobs) and the effective
        epochs it has trained, synced to now. The engine's private truth: for
        environments' rewards and oracle baselines, never a policy's input."""
        j = self._by_id[job_id]
        if j.status == _RUNNING:
            self._sync(j, self.now)
        return j.conv, j.eff

    def ideal_throughput(self, job_id: str, workers: int) -> float:
        """Samples per second of the job at ``workers`` workers on the fastest placement."""
        spec = self._by_id[job_id].spec
        return self._ideal_throughput(spec, workers, self._best_step(spec, workers))

    def _record(self, t: float) -> None:
        if not self.config.record_series:
            return
        used = self._total_gpus - self.state.free_gpus
        q = len(self.state.pending)
        st = self._series_t
        if st and st[-1] == t:
            self._series_used[-1] = used
            self._series_queue[-1] = q
        else:
            st.append(t)
            self._series_used.append(used)
            self._series_queue.append(q)
