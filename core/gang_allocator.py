"""Our orderings and placements as one allocation policy.

:class:`GangAllocator` runs an ordering and a placement (the objects the extender
serves) as an allocator, through core's scheduling cycle: requested gangs, preemption
under a preemptive ordering, optional backfill and scaling. The interval engine, the
event engine and the operator (``--allocator ordering/placement``) call it the same
way. It sees no run time. Details: docs/design-notes.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from .allocation import Allocation, AllocJob, AllocNode
from .cluster import ClusterState, JobView, Progress
from .contract import PRIORITY_CLASSES
from .cycle import SchedulingCycle
from .job_goodput import job_observations
from .planning import (
    HIGHEST_BONUS,
    Admission,
    AdmissionPlan,
    ElasticState,
    ScalingPlanner,
    WaitReason,
    scaling_steps,
    waiting_reasons,
)
from .ordering import reached_threshold
from .policy import Ordering, Placement, Scaling, make_ordering, make_placement, make_scaling
from .queues import QueueBook
from .served import parse_policy_name
from .topology import NodeSpec, Topology

__all__ = ["GangAllocator", "learning_score"]


#: CPU or memory of a node where the allocation does not count them
_UNCOUNTED = 1 << 40


def learning_score(metrics: Sequence[float], higher_is_better: bool) -> list[float]:
    """A reported learning curve as the rising, unit-free score the β rule compares:
    the relative improvement over the first evaluation, ``(m - m1) / |m1|`` for a rising
    metric (accuracy, F1), ``(m1 - m) / |m1|`` for a falling one (word error rate,
    loss). A gain of β = 0.001 per evaluation is then 0.1 % of the starting metric,
    whatever the metric's unit."""
    if not metrics:
        return []
    m1 = float(metrics[0])
    scale = abs(m1) or 1.0
    sign = 1.0 if higher_is_better else -1.0
    return [sign * (float(m) - m1) / scale for m in metrics]


class GangAllocator:
    """``ordering`` + ``placement`` as an allocator (see the module docstring)."""

    clairvoyant = False
    type_aware = False
    #: team queues are the goodput allocators': given queues, this one only reports their use
    enforces_queues = False

    def __init__(self, ordering: Ordering, placement: Placement, scaling: Scaling | None = None, *,
                 backfill: bool = True, preemption: bool = True, beta: float = 0.001, patience: int = 5,
                 scale_every: float | None = None, name: str | None = None) -> None:
        if scale_every is not None and not scale_every > 0:
            raise ValueError(f"scale_every must be > 0 seconds, got {scale_every}")
        self.ordering = ordering
        self.placement = placement
        self.backfill = backfill
        self.beta = beta
        self.planner = ScalingPlanner(scaling, patience=patience) if scaling is not None else None
        #: it scales running jobs (on the caller's record of each, AllocJob.elastic, where given)
        self.scales = self.planner is not None
        #: seconds between two scaling steps (None: every decision), the first one
        #: interval after the first decision (the event engine's scaling interval)
        self.scale_every = scale_every
        self._next_scale: float | None = None
        #: core's admission: the operator's queue rules (preemption under preemptive orderings)
        self.admission = Admission(ordering, backfill=backfill, preemption=preemption)
        #: the one cycle the operator runs too: admission, then the planner
        self.cycle = SchedulingCycle(self.admission, self.planner)
        parts = [ordering.name, placement.name] + ([scaling.name] if scaling is not None else [])
        self.name = name or "/".join(parts)
        self._topo: tuple[tuple, Topology] | None = None
        self._elastic: dict[str, ElasticState] = {}
        self._state: ClusterState | None = None
        #: what the last :meth:`allocate` left waiting and its admission plan (why they wait)
        self._waiting: tuple = (AdmissionPlan(), [], 0)
        #: running jobs the last :meth:`allocate` preempted and started again
        self._restarted: frozenset[str] = frozenset()
        self._interrupted: frozenset[str] = frozenset()

    @classmethod
    def named(cls, text: str, *, seed: int = 0, **options) -> "GangAllocator":
        """``ordering/placement[/scaling][+backfill|+nobackfill]`` (core.served's policy
        names) as a gang allocator, its policies seeded from ``seed``; ValueError for a
        name that is not such a combination."""
        pol = parse_policy_name(text)
        if pol.allocator or not pol.ordering:
            raise ValueError(f"{text!r} is not ordering/placement[/scaling]")
        so, sp, ss = np.random.SeedSequence(seed).spawn(3)
        scaling = make_scaling(pol.scaling, rng=np.random.default_rng(ss)) if pol.scaling else None
        if pol.backfill is not None:
            options = {**options, "backfill": pol.backfill}
        return cls(make_ordering(pol.ordering, rng=np.random.default_rng(so)),
                   make_placement(pol.placement, rng=np.random.default_rng(sp)), scaling, name=pol.label, **options)

    def _topology(self, nodes: Sequence[AllocNode]) -> Topology:
        """The nodes as core's cluster model: one per allocation node, with the GPUs
        given, its model and its CPU and memory (unlimited where not counted)."""
        key = tuple((n.gpus, n.name, n.gpu_model, n.cpu_milli, n.memory_mib) for n in nodes)
        if self._topo is None or self._topo[0] != key:
            width = len(str(max(len(nodes) - 1, 0)))
            specs = [NodeSpec(name=n.name or f"node-{k:0{width}d}", gpus=n.gpus, gpu_model=n.gpu_model or "A100",
                              nvlink_domain_size=max(g.gpus for g in nodes),
                              cpu_milli=_UNCOUNTED if n.cpu_milli is None else n.cpu_milli,
                              memory_mib=_UNCOUNTED if n.memory_mib is None else n.memory_mib)
                     for k, n in enumerate(nodes)]
            self._topo = (key, Topology(specs))
        return self._topo[1]

    def _view(self, j: AllocJob) -> JobView:
        """The job as the ordering and placement see it: a gang of the workers it asks
        for (``target_replicas`` GPUs in workers of ``replica_group`` GPUs), in its
        service queue at its dynamic priority (a ``highest`` job before every other of
        its queue), where every ordering ranks first."""
        g = max(1, j.replica_group)
        w = max(min(j.target_replicas or g, j.max_replicas) // g, 1)
        thresholds = self.ordering.thresholds
        klass = PRIORITY_CLASSES[len(PRIORITY_CLASSES) - 1 - j.priority]
        bonus = HIGHEST_BONUS if klass == "highest" else 0.0
        return JobView(id=j.id, submit_time=j.submit_time, workers=w, min_workers=w, max_workers=w,
                       gpus_per_worker=g, gpu_models=j.gpu_models, cpu_milli=j.cpu_milli * g,
                       memory_mib=j.memory_mib * g, queue=j.service_queue, priority=j.service_priority + bonus,
                       priority_class=klass,
                       attained_service=reached_threshold(j.attained_service, thresholds) if thresholds
                       else j.attained_service, est_runtime=j.est_runtime, remaining=j.remaining, placement=[])

    def order(self, jobs: Sequence[AllocJob]) -> list[AllocJob]:
        """The jobs in the order the ordering serves them (on the last cluster state
        seen): why a job waits."""
        if not jobs:
            return []
        state = self._state or ClusterState(Topology([NodeSpec("node-0", 0)]))
        views = [self._view(j) for j in jobs]
        by_id = {j.id: j for j in jobs}
        return [by_id[v.id] for v in self.ordering.rank(views, state)]

    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float,
                 queues: QueueBook | None = None) -> Mapping[str, Allocation]:
        """One interval: core's :class:`~rlsched.core.cycle.SchedulingCycle` in its settle
        mode (admission, preemption of the jobs a preemptive ordering ranks after the
        blocked head, the victims released and admission planned again, then the scaling
        step), translated into allocations. A job inside its minimum run time
        (``protected``) is never a victim. Team queues are the goodput allocators'
        (``enforces_queues``): ``queues`` is not read."""
        state = ClusterState(self._topology(nodes), time=now)
        self._state = state
        index = {n.index: k for k, n in enumerate(nodes)}
        out: dict[str, Allocation] = {}
        pending = []
        used: dict[int, list[int]] = {}  # node -> GPUs, millicores, MiB the running jobs hold there
        for j in jobs:
            v = self._view(j)
            if j.allocation:
                g = max(1, j.replica_group)
                place = [index[i] for i in j.allocation[::g]]
                v.workers = v.min_workers = v.max_workers = len(place)
                v.placement = place
                v.start_time = j.running_since if j.running_since is not None else j.submit_time
                for k in place:
                    u = used.setdefault(k, [0, 0, 0])
                    u[0] += v.gpus_per_worker
                    u[1] += v.cpu_milli
                    u[2] += v.memory_mib
                state.running[v.id] = v
                out[j.id] = Allocation(tuple(j.allocation))
            else:
                pending.append(v)
        for k in sorted(used):  # once per node: the state the same as worker by worker
            state.allocate(k, *used[k])
        state.pending = pending
        by_id = {j.id: j for j in jobs}
        holders = [v for v in state.running.values() if not by_id[v.id].protected]
        free = int(state.free.sum())
        plan = self.cycle.plan(pending, holders, state, running=lambda gone: self._elastic_jobs(jobs, gone, state, now),
                               place=self._place, place_one=self._place_one, settle=True,
                               scale=self._scaling_due(now))
        if plan.scaling_error is not None:
            raise plan.scaling_error
        last = plan.rounds[-1].admission if plan.rounds else plan.admission  # who preempts still, after settling
        self._waiting = (dataclasses.replace(plan.admission, preempt=list(last.preempt)), pending, free)
        released: set[str] = set()
        for rnd in plan.rounds:  # each gang started where the placement put it; victims wait (keeping their progress)
            for key, where in rnd.placed.items():
                g = max(1, by_id[key].replica_group)
                out[key] = Allocation(tuple(nodes[k].index for k in where for _ in range(g)))
            for key in rnd.released:
                out.pop(key, None)
                released.add(key)
        self._restarted = frozenset(k for k in released if k in out)
        self._interrupted = frozenset(k for rnd in plan.rounds for k in rnd.interrupt)
        for jid, step in scaling_steps(plan.scaling.deltas):
            g = max(1, by_id[jid].replica_group)
            cur = list(out[jid].nodes)
            if step < 0 and len(cur) > g:
                del cur[-g:]
            out[jid] = Allocation(tuple(cur))
        for jid, k in plan.scaling.nodes.items():  # scale-ups last, in the order the planner placed them
            g = max(1, by_id[jid].replica_group)
            out[jid] = Allocation(out.pop(jid).nodes + (nodes[k].index,) * g)
        self._toward_range(jobs, out, nodes, plan.blocked.gpus if plan.blocked is not None else 0)
        return out

    def _scaling_due(self, now: float) -> bool:
        """Whether this decision runs the scaling step (:attr:`scale_every`)."""
        if self.planner is None or self.scale_every is None:
            return self.planner is not None
        if self._next_scale is None:
            self._next_scale = now + self.scale_every
        if now < self._next_scale:
            return False
        self._next_scale = now + self.scale_every
        return True

    @staticmethod
    def _toward_range(jobs: Sequence[AllocJob], out: dict[str, Allocation], nodes: Sequence[AllocNode],
                      reserved: int) -> None:
        """A running job outside its replica range (its pinned workers, ``spec.workers``,
        moved) goes one worker towards it per decision, as core's scaling planner moves a
        pinned job: down by its last worker; up by one worker on a node with room (one
        it runs on first, then the fullest), never into the GPUs the blocked head needs."""
        moving = [j for j in jobs if j.allocation and j.id in out
                  and not j.min_replicas <= len(j.allocation) <= j.max_replicas]
        if not moving:
            return
        used = Counter(i for a in out.values() for i in a.nodes)
        spare = sum(max(n.gpus - used[n.index], 0) for n in nodes) - reserved
        for j in moving:
            g = max(1, j.replica_group)
            cur = list(j.allocation)
            if len(cur) > j.max_replicas:
                del cur[-g:]
            else:
                room = [n for n in nodes if j.runs_on(n) and n.gpus - used[n.index] >= g]
                if spare < g or not room:
                    continue  # it keeps what it holds until there is room
                on = set(cur)
                n = min(room, key=lambda n: (n.index not in on, n.gpus - used[n.index], n.index))
                cur.extend([n.index] * g)
                spare -= g
            used.subtract(out[j.id].nodes)
            used.update(cur)
            out[j.id] = Allocation(tuple(cur))

    def why_waiting(self) -> dict[str, WaitReason]:
        """Why each job the last :meth:`allocate` left waiting waits, from its admission
        plan (:func:`~rlsched.core.planning.waiting_reasons`: ``NoRoom``, ``BehindHead``,
        ``Preempting``, ``Unfittable``)."""
        plan, waiting, free = self._waiting
        return waiting_reasons(plan, waiting, backfill=self.backfill, free_gpus=free)

    def interrupted(self) -> frozenset[str]:
        """The running jobs the last :meth:`allocate` preempted that wait in the
        interrupt queue (:func:`~rlsched.core.cycle.interrupts`: a ``highest`` head's
        lower-class victims); the others wait in their own queue."""
        return self._interrupted

    def restarted(self) -> frozenset[str]:
        """The running jobs the last :meth:`allocate` preempted and then started again (a
        later settle round, from the interrupt queue): a restart, not a resize."""
        return self._restarted

    def next_decision(self, jobs: Sequence[AllocJob], allocations: Mapping[str, Allocation],
                      now: float) -> float | None:
        """The next scaling step's time (:attr:`scale_every`), or earlier, under a
        preemptive ordering that demotes by attained service (Tiresias), the first time
        a job running on what it was just given reaches its next threshold: its queue
        changes then, and with it who may preempt whom."""
        times = [self._next_scale] if self._next_scale is not None else []
        if not (self.ordering.thresholds and self.admission.preemption and self.admission.preemptive_ordering):
            return min(times, default=None)
        for j in jobs:
            given = allocations.get(j.id)
            if given is None or not given.nodes:
                continue
            v = self._view(j)
            v.workers = v.min_workers = v.max_workers = max(1, len(given.nodes) // v.gpus_per_worker)
            t = self.ordering.demotes_at(v, now)
            if t is not None:
                times.append(t)
        return max(min(times), math.nextafter(now, math.inf)) if times else None

    def _place(self, v: JobView, state: ClusterState):
        return self.placement.place(v, state)

    def _elastic_jobs(self, jobs: Sequence[AllocJob], gone: set, state: ClusterState, now: float) -> list[JobView]:
        """The jobs that were running and keep their GPUs (not in ``gone``), as core's
        planner sees them: their views on this decision's nodes, each with the record
        the planner keeps of it. A job the caller sent with its live view and record
        (``AllocJob.elastic``) is shown to the scaling policy with the caller's reported
        progress, estimates and observations, on its own β and range; any other has its
        reported learning curve folded into an
        :class:`~rlsched.core.planning.ElasticState` kept here."""
        live = {j.id for j in jobs}
        self._elastic = {k: v for k, v in self._elastic.items() if k in live}
        running = []
        for j in jobs:
            if not j.allocation or j.id in gone:  # waiting, or preempted this cycle
                continue
            v = state.running[j.id]
            mine = j.elastic if isinstance(j.elastic, JobView) else None
            if mine is not None and mine.record is not None:
                running.append(self._callers_job(j, mine, v))
                continue
            v.min_workers, v.max_workers = 1, max(j.max_replicas, v.workers)
            hist = learning_score(j.metrics, j.higher_is_better)
            prog = Progress(epoch=j.epoch, accuracy=hist[-1] if hist else 0.0, history=hist)
            v.progress = prog
            if j.profile and j.atomic_bsz:
                last = j.profile[-1]
                v.throughput = last.atomic_bsz / max(last.step_time, 1e-9)
            es = self._elastic.setdefault(j.id, ElasticState())
            es.observe(prog, v.workers, j.age, self.beta, 0)
            if j.running_since is None:
                v.start_time = now  # no start known: these jobs tie on it
            v.beta, v.record, v.batch_size = self.beta, es, j.batch_size or None
            v.patience = 1 << 30  # completion is the target, never a β stop
            v.observations = job_observations(j)
            running.append(v)
        return running

    def _callers_job(self, j: AllocJob, mine: JobView, v: JobView) -> JobView:
        """``v`` (this decision's view, its nodes in this allocator's indices) as the
        planner sees the caller's running job ``mine``: its record, progress, estimates,
        start, batch and observations; the range is the job's own in whole workers (a
        pin is :meth:`_toward_range`'s)."""
        g = max(1, j.replica_group)
        v.min_workers, v.max_workers = max(1, j.min_replicas // g), max(j.max_replicas // g, v.workers)
        v.beta = self.beta if j.beta is None else j.beta
        v.progress, v.remaining, v.est_runtime = mine.progress, mine.remaining, mine.est_runtime
        v.start_time, v.record, v.batch_size, v.local_batch = mine.start_time, mine.record, mine.batch_size, \
            mine.local_batch
        obs = mine.observations
        v.observations = obs if obs is not None and obs.shapes else None
        v.patience = 1 << 30  # completion is the plan's (the caller judges it), never this planner's β stop
        return v

    def _place_one(self, v: JobView, state: ClusterState) -> int | None:
        grown = JobView(id=v.id, submit_time=v.submit_time, workers=v.workers + 1, min_workers=1,
                        gpus_per_worker=v.gpus_per_worker,
                        max_workers=max(v.max_workers, v.workers + 1), placement=list(v.placement))
        place = self.placement.place(grown, state, workers=1)
        return int(place[0]) if place else None
