"""Deterministic discrete-event simulator of a GPU cluster running training jobs.

One :class:`Simulator` holds the clock, the event heap, a
:class:`~rlsched.core.ClusterState`, the jobs and one seeded generator; a run is a pure
function of its inputs and seed. Every decision is one call of core's
:class:`~rlsched.core.live_allocation.LiveAllocation`, as in the operator: a heuristic
(ordering, placement, scaling) is core's gang allocator behind that call. Its parts: the
job dynamics (:mod:`.engine_jobs`), the adapter that translates jobs and applies the
plan (:mod:`.engine_allocation`) and the records (:mod:`.engine_record`). Event order,
preemption and scaling: docs/design-notes.md, docs/simulator.md.
"""

from __future__ import annotations

import heapq
import logging
import math
import time as _time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from rlsched.core import ClusterState, JobView, Ordering, Placement, PlacementError, Scaling, Topology
from rlsched.core.decision_clock import DecisionClock
from rlsched.core.estimate import estimate_remaining
from rlsched.core.gang_allocator import GangAllocator
from rlsched.core.live_allocation import LiveAllocation, LivePlan
from rlsched.core.queues import QueueBook

from .convergence import ConvergenceModel
from .engine_allocation import AllocationAdapter
from .engine_jobs import FINISH as _FINISH, SCALE as _SCALE, WAKE as _WAKE
from .engine_jobs import DONE as _DONE, DROPPED as _DROPPED, FUTURE as _FUTURE, PENDING as _PENDING
from .engine_jobs import RUNNING as _RUNNING
from .engine_jobs import JobDynamics, JobState, build_jobs, grown
from .engine_record import JobRecord, Recorder, SimResult
from .job import JobSpec

__all__ = ["SimConfig", "Simulator", "SimResult", "JobRecord"]

log = logging.getLogger("rlsched.sim")


@dataclass(frozen=True)
class SimConfig:
    """Engine options.

    ``backfill``: keep starting later jobs when the head of the queue does not fit
    (a heuristic's admission).
    ``scaling_interval``: seconds between decisions without events, and between a
    heuristic's scaling steps.
    ``restart_cost``: seconds without progress after a job's worker count changes
    and after a preempted job resumes.
    ``preemption``: let a heuristic's admission preempt (``highest`` jobs; preemptive
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
    """

    backfill: bool = False
    scaling_interval: float = 300.0
    restart_cost: float = 30.0
    max_time: float = math.inf
    record_series: bool = True
    preemption: bool = True
    clairvoyant: bool = False
    record_decisions: bool = False
    #: seconds a job runs before it may be preempted (the operator's ``--min-run-time``)
    min_run_s: float = 0.0
    #: the policy also decides when a job arrived, finished or gave GPUs back, besides
    #: every ``scaling_interval`` — as the operator's cycle sees such a change within
    #: seconds; off, freed GPUs and new jobs wait for the next interval
    allocate_on_events: bool = True
    #: least seconds between two decisions on events (core's DecisionClock): a burst
    #: of events within it makes one decision at its end
    decision_gap: float = 30.0
    #: GPU types of the nodes: GPU Feature Discovery's product strings (``NodeSpec.gpu_model``)
    #: -> type keys, as the operator's ``--gpu-types`` (an unmapped product is its own
    #: type); a job then runs at its ``JobSpec.gpu_speed`` on the type of its nodes, its
    #: reports carry that type and an allocation policy sees each node's type. None: the
    #: nodes carry no type
    gpu_types: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.scaling_interval <= 0 or self.restart_cost < 0 or self.decision_gap < 0:
            raise ValueError("need scaling_interval > 0, restart_cost >= 0 and decision_gap >= 0")


def _check_policies(jobs: Sequence[JobSpec], ordering, placement, scaling, allocation, queues) -> None:
    """Raise ValueError on a combination of policies the engine cannot run, or on a
    duplicate job id."""
    if queues is not None and allocation is None:
        raise ValueError("teams' queues are decided by an allocation policy: give allocation= too")
    if allocation is not None:
        if ordering is not None or scaling is not None or placement is None:
            raise ValueError("an allocation policy decides alone: give it the placement policy that puts new "
                             "workers on nodes (the extender's, live), and no ordering or scaling")
    elif ordering is None or placement is None:
        raise ValueError("give an allocation policy, or an ordering and a placement policy")
    ids = set()
    for j in jobs:
        if j.id in ids:
            raise ValueError(f"duplicate job id {j.id!r}")
        ids.add(j.id)


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
        _check_policies(jobs, ordering, placement, scaling, allocation, queues)
        self.topology = topology
        self.config = config or SimConfig()
        #: the placement that puts new workers on nodes (the extender's, live)
        self.placement = placement
        if ordering is not None:  # a heuristic: core's gang allocator over the three
            cfg = self.config
            allocation = LiveAllocation(GangAllocator(
                ordering, placement, scaling, backfill=cfg.backfill, preemption=cfg.preemption,
                scale_every=cfg.scaling_interval if scaling is not None else None))
        #: the policy deciding every job's workers in one call (the operator's
        #: ``--allocator``: the same core object, :meth:`allocation_cycle`)
        self.allocation = allocation
        #: the teams' queues the allocation decides under (each job charged to its
        #: ``tenant``), with the minimum run time (``SimConfig.min_run_s`` when not given)
        self.queues = queues if queues is not None else QueueBook(min_run_s=self.config.min_run_s)
        self.rng = np.random.default_rng(seed)
        self.state = ClusterState(topology)
        self.now = 0.0
        #: the jobs' speed, progress and accuracy curves
        self.dynamics = JobDynamics(topology, self.state, self.config.clairvoyant, self.config.gpu_types)
        self._jobs, noise, noise_off = build_jobs(jobs, self.rng)  # in submission order
        self._by_id = {j.spec.id: j for j in self._jobs}
        self.dynamics.prepare_all(self._jobs, noise, noise_off)
        self._next_arrival = 0
        self._heap: list[tuple] = []
        self._counter = 0
        self._events = 0
        self._dirty = False  # something changed since the policy's last decision
        self.alloc = AllocationAdapter(self)  # the allocation policy's decisions
        self.recorder = Recorder(self.state, self.config.record_series, self.config.record_decisions)
        self._wall = 0.0
        self._wake_at: float | None = None  # the pending _WAKE event's time
        self._allocated_at: float | None = None  # when the allocation policy last decided
        self._clock = DecisionClock(gap=self.config.decision_gap, interval=self.config.scaling_interval)
        self._first_submit = float(min((j.submit_time for j in jobs), default=0.0))
        self.now = self._first_submit
        if self._jobs:
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
        t0 = _time.perf_counter()
        total = len(self._jobs)
        tick = max(total // 100, 1)
        last = -1
        while self.step():
            if progress is not None:
                n = len(self.recorder.records) + len(self.recorder.unfittable)
                if n // tick != last:
                    last = n // tick
                    progress(n, total)
        if progress is not None:
            progress(len(self.recorder.records) + len(self.recorder.unfittable), total)
        self._wall += _time.perf_counter() - t0
        return self.result()

    def step(self) -> bool:
        """Process every event of the next event time, then let the policies decide.
        Returns False when nothing is left to do."""
        if not self._advance():
            return False
        if self._dirty and self.config.allocate_on_events:
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
        """Let the allocation policy decide now, without moving the clock: one call, as
        :meth:`step` makes after an event time's events. The scheduling environments
        call it with the agents' pick as the policy's ordering and placement
        (:class:`rlsched.sim.envs.AgentTurn`)."""
        self.allocation_cycle()

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
            elif kind == _WAKE:  # the policy's answer may change now (a demotion, a protection ended)
                self._events += 1
                self._wake_at = None
                self._dirty = True
        if scale:
            self.allocation_cycle()
            if self.state.running or self.state.pending or self._next_arrival < len(jobs):
                self._push(t + self.config.scaling_interval, _SCALE, None)
        return True

    def advance_until(self, t: float) -> None:
        """Process every event up to time ``t``, the policies deciding, then move the
        clock to ``t``."""
        while (nt := self._next_time()) is not None and nt <= t and nt <= self.config.max_time:
            self.step()
        if t > self.now:
            self.now = self.state.time = min(t, self.config.max_time)

    def preemptions(self, job_id: str) -> int:
        """How many times the job was suspended so far."""
        return self._by_id[job_id].preemptions

    def result(self) -> SimResult:
        unfinished = [j.spec.id for j in self._jobs if j.status in (_PENDING, _RUNNING, _FUTURE)]
        return self.recorder.result(unfinished, self._events, self._wall, self._first_submit, self.config.clairvoyant)

    def ideal_runtime(self, job_id: str) -> float:
        """Run time at the job's requested workers and ideal placement: the engine's
        secret (metrics, tests), never a policy input unless ``SimConfig.clairvoyant``."""
        j = self._by_id[job_id]
        if j.status == _FUTURE:
            self.dynamics.prepare(j)
        return j.ideal

    def training_curve(self, job_id: str) -> tuple[ConvergenceModel | None, float]:
        """The job's convergence model (None for fixed-duration jobs) and the effective
        epochs it has trained, synced to now. The engine's private truth: for
        environments' rewards and oracle baselines, never a policy's input."""
        j = self._by_id[job_id]
        if j.status == _RUNNING:
            self.dynamics.sync(j, self.now)
        return j.conv, j.eff

    def ideal_throughput(self, job_id: str, workers: int) -> float:
        """Samples per second of the job at ``workers`` workers on the fastest placement."""
        spec = self._by_id[job_id].spec
        return self.dynamics.ideal_throughput(spec, workers, self.dynamics.best_step(spec, workers))

    def allocation_cycle(self) -> LivePlan:
        """One decision of the allocation policy now, as the operator's allocator mode
        takes it (``core/live_allocation.py``): every running job (synced, its report
        folded in) and every waiting job to :meth:`LiveAllocation.plan` with each
        node's GPUs, then the plan applied — jobs given nothing suspended, shrinks,
        then grows and starts in the plan's order, new workers where the placement
        policy puts them (a start or grow it cannot place waits for the next cycle).
        Every change pays ``restart_cost``."""
        return self.alloc.cycle()

    # ================================================================== the heap
    def _push(self, t: float, kind: int, payload) -> None:
        self._counter += 1
        heapq.heappush(self._heap, (t, kind, self._counter, payload))

    def _heap_live(self) -> bool:
        heap = self._heap
        while heap:
            t, kind, _, payload = heap[0]
            if kind == _FINISH:
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

    def _record(self, t: float) -> None:
        self.recorder.record(t)

    # ================================================================== a job's transitions
    def _arrive(self, j: JobState, t: float) -> None:
        v = j.view
        slots = self.dynamics.fit_slots(v)
        if slots < v.min_workers:
            j.status = _DROPPED
            self.recorder.unfittable.append(v.id)
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
            self.dynamics.prepare(j)
        if self.config.clairvoyant:  # a labelled reference: the policies see the truth
            v.est_runtime = j.ideal
            v.remaining = j.ideal
        else:  # what the user tells, if anything; the true run time stays on ``j``
            v.est_runtime = j.spec.user_estimate(j.ideal)
            v.remaining = estimate_remaining(v.est_runtime, 0.0, 0, 0)
        j.status = _PENDING
        self.state.pending.append(v)
        self._dirty = True

    def _start(self, j: JobState, nodes: list[int], t: float) -> None:
        v = j.view
        if len(nodes) != v.workers:
            v.workers = len(nodes)
        self.state.allocate_job(v, nodes)
        v.placement = list(nodes)
        v.start_time = t
        self.state.running[v.id] = v
        j.status = _RUNNING
        j.seg_start = t
        decisions = self.recorder.decisions
        if decisions is not None:
            decisions.append({"kind": "admit", "job": v.id, "t": t, "nodes": list(nodes),
                              "workers": len(nodes), "resume": j.first_start is not None,
                              **self._batch_record(j)})
        if j.first_start is None:  # this engine charges a first start no stall: it measures none
            j.first_start = t
            j.resume_at = t
            j.level0 = self.dynamics.set_rate(j)
        else:  # a resume from a checkpoint
            j.restarted(t, t + self.config.restart_cost)
            v.queue = j.spec.queue
            self.dynamics.set_rate(j)
        if (v.workers != j.w0 or j.spec.batch_size is not None) and not j.spec.fixed:
            self.dynamics.retarget(j)  # (an adaptive batch: at the batch it was given)
        self._schedule_finish(j, t)

    @staticmethod
    def _batch_record(j: JobState) -> dict:
        """``{"batch": global batch}`` for the decision log of a job with an adaptive
        batch (nothing for the others: their log is unchanged)."""
        return {} if j.spec.batch_size is None else {"batch": j.spec.global_batch(j.view.workers, j.batch)}

    def _suspend(self, j: JobState, t: float, interrupt: bool) -> None:
        """Checkpoint a running job: keep its progress, epochs and attained service,
        release its GPUs, requeue it (interrupt queue when ``interrupt``)."""
        self.dynamics.sync(j, t)
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
                self.dynamics.retarget(j)
        if interrupt:
            v.queue = "interrupt"
        j.status = _PENDING
        j.rate = 0.0
        j.version += 1  # its finish and demotion events are void
        j.preemptions += 1
        st.pending.append(v)
        self._dirty = True
        log.debug("t=%g: job %s suspended at epoch %d (%s queue)", t, v.id, v.progress.epoch, v.queue)

    def _schedule_finish(self, j: JobState, t: float) -> None:
        j.version += 1
        if j.rate <= 0:
            return
        t_fin = max(t, j.resume_at) + (j.work_total - j.work_done) / j.rate
        self._push(t_fin, _FINISH, (j, j.version))

    def _finish(self, j: JobState, t: float) -> None:
        self.dynamics.sync(j, t, final=True)
        v = j.view
        self.state.release_job(v, v.placement)
        del self.state.running[v.id]
        j.status = _DONE
        j.rate = 0.0
        self._dirty = True
        self.recorder.finished(j, t)

    def _rescale(self, j: JobState, delta: int, nodes: Sequence[int] | None, t: float,
                 batch: int | None = None) -> bool:
        """Resize a running job by ``delta`` workers (added on ``nodes``, or where the
        placement policy puts them); ``batch``: the global batch of its next run (an
        adaptive batch set by an allocation policy; None: unchanged)."""
        v = j.view
        new = v.workers + delta
        if not (v.min_workers <= new <= v.max_workers):
            return False
        self.dynamics.sync(j, t)
        if delta > 0:
            if nodes is None:
                nodes = self.placement.place(grown(v, delta), self.state, workers=delta)
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
        v.workers = new
        j.rescales += 1
        if batch and j.spec.batch_size is not None:
            j.batch = int(batch)
        if self.recorder.decisions is not None:
            self.recorder.decisions.append({"kind": "scale", "job": v.id, "t": t, "delta": delta, "workers": new,
                                            "epoch": v.progress.epoch, **self._batch_record(j)})
        self._restarted(j, t)
        return True

    def _restarted(self, j: JobState, t: float) -> None:
        """A running job's workers changed at ``t``: it pays the restart, then runs at its
        new rate; its finish and its demotion are scheduled again."""
        j.restarted(t, t + self.config.restart_cost)
        self.dynamics.set_rate(j)
        if not j.spec.fixed:
            self.dynamics.retarget(j)
        self._schedule_finish(j, t)
