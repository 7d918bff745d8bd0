"""Our orderings and placements as an allocation policy.

:class:`GangAllocator` runs an :class:`~rlsched.core.policy.Ordering` and a
:class:`~rlsched.core.policy.Placement` — the objects the operator and the extender
serve — under the allocation interface (:mod:`rlsched.core.allocation`), so they can be
measured on the interval engine beside the peers: each job runs its requested GPUs
(``target_replicas``) at its requested batch size, started gang-style where the
placement puts it, in the order the ordering ranks the waiting jobs, through core's
:class:`~rlsched.core.planning.Admission` (the operator's queue rules): a running job
keeps its nodes (no migration), and under a preemptive ordering (Tiresias, SRTF) the
blocked head of the queue evicts jobs the ordering ranks after it, which keep their
progress and wait. With ``backfill`` later jobs start when the head does not fit.

What the ordering sees of a job is what a live operator knows: its request, submit
time and attained service; no run time (no user estimate in these workloads).

With a ``scaling`` policy the allocator also runs core's
:class:`~rlsched.core.planning.ScalingPlanner` — the operator's elastic planner — on the
running jobs each interval, after admission, as the operator's cycle does: each job's
reported learning curve (:func:`learning_score`) is folded into its
:class:`~rlsched.core.planning.ElasticState`, the policy is asked about jobs with a new
evaluation, one worker more or less per decision, within ``[1, max_replicas]``,
scale-ups leave the blocked head's GPUs free, and a job gaining less than ``beta`` gives a
worker back. A measured job completes at its application's target, so the planner's
β stop does not end it here. The batch size stays the job's (its per-GPU share changes).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .allocation import Allocation, AllocJob, AllocNode
from .cluster import ClusterState, JobView, Progress
from .planning import (
    Admission,
    ElasticState,
    QueueEntry,
    RunningEntry,
    RunningJob,
    ScalingPlanner,
    TrainingSpec,
    reserved_gpus,
    scaling_steps,
)
from .policy import Ordering, Placement, Scaling
from .topology import Topology

__all__ = ["GangAllocator", "learning_score"]


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

    def __init__(self, ordering: Ordering, placement: Placement, scaling: Scaling | None = None, *,
                 backfill: bool = True, preemption: bool = True, beta: float = 0.001, patience: int = 5,
                 name: str | None = None) -> None:
        self.ordering = ordering
        self.placement = placement
        self.backfill = backfill
        self.beta = beta
        self.planner = ScalingPlanner(scaling, patience=patience) if scaling is not None else None
        #: core's admission: the operator's queue rules (preemption under preemptive orderings)
        self.admission = Admission(ordering, backfill=backfill, preemption=preemption)
        parts = [getattr(ordering, "name", "ordering"), getattr(placement, "name", "placement")]
        if scaling is not None:
            parts.append(getattr(scaling, "name", "scaling"))
        self.name = name or "/".join(parts)
        self._topo: tuple[tuple[int, ...], Topology] | None = None
        self._elastic: dict[str, ElasticState] = {}

    def _topology(self, nodes: Sequence[AllocNode]) -> Topology:
        key = tuple(n.gpus for n in nodes)
        if self._topo is None or self._topo[0] != key:
            if len(set(key)) != 1:
                raise ValueError("GangAllocator needs nodes with equal GPUs")
            self._topo = (key, Topology.uniform(len(nodes), key[0]))
        return self._topo[1]

    @staticmethod
    def _view(j: AllocJob) -> JobView:
        w = max(min(j.target_replicas or 1, j.max_replicas), 1)
        return JobView(id=j.id, submit_time=j.submit_time, workers=w, min_workers=w, max_workers=w,
                       attained_service=j.attained_service, placement=[])

    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float) -> Mapping[str, Allocation]:
        state = ClusterState(self._topology(nodes), time=now)
        index = {n.index: k for k, n in enumerate(nodes)}
        out: dict[str, Allocation] = {}
        pending = []
        for j in jobs:
            v = self._view(j)
            if j.allocation:
                place = [index[i] for i in j.allocation]
                v.workers = v.min_workers = v.max_workers = len(place)
                v.placement = place
                v.start_time = now
                state.allocate_job(v, place)
                state.running[v.id] = v
                out[j.id] = Allocation(tuple(j.allocation))
            else:
                pending.append(v)
        state.pending = pending
        blocked = self._admit(jobs, nodes, state, pending, out, now)
        if self.planner is not None:
            self._scale(jobs, nodes, state, out, blocked, now)
        return out

    def _admit(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], state: ClusterState,
               pending: list[JobView], out: dict[str, Allocation], now: float) -> JobView | None:
        """Core's admission, as the operator's cycle runs it: the waiting jobs in the
        ordering's order, each gang started where the placement puts it, head-of-line
        blocking or backfill; under a preemptive ordering (Tiresias, SRTF) the blocked
        head evicts jobs the ordering ranks after it (they keep their progress and wait).
        Returns the job left blocked at the head, if any."""
        by_id = {j.id: j for j in jobs}

        def spec(v: JobView) -> TrainingSpec:
            return TrainingSpec(min_workers=v.workers, max_workers=v.workers)

        def place(v: JobView, st: ClusterState):
            return self.placement.place(v, st)

        blocked = None
        for _ in range(2 * len(jobs) + 2):  # each round evicts jobs ranked after the head: rounds end
            waiting = [QueueEntry(key=v.id, spec=spec(v), submit_time=v.submit_time, priority=0.0, job=v)
                       for v in pending]
            running = [RunningEntry(key=v.id, spec=spec(v), priority=0.0, start_time=by_id[v.id].submit_time,
                                    placement=list(v.placement), job=v) for v in state.running.values()]
            plan = self.admission.plan(waiting, running, state, place=place)
            views = {v.id: v for v in pending}
            for key in plan.admit:
                v = views[key]
                where = self.placement.place(v, state)
                if where is None:  # the room check said it fits: a placement that disagrees waits
                    continue
                state.allocate_job(v, where)
                v.placement = list(where)
                state.running[v.id] = v
                out[v.id] = Allocation(tuple(nodes[k].index for k in where))
            started = set(plan.admit)
            pending = [v for v in pending if v.id not in started or v.id not in out]
            blocked = views.get(plan.blocked) if plan.blocked else None
            if not plan.preempt:
                break
            for key in plan.preempt:
                v = state.running.pop(key)
                state.release_job(v, v.placement)
                v.placement = []
                out.pop(key, None)
                pending.append(v)
        return blocked

    def _scale(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], state: ClusterState,
               out: dict[str, Allocation], blocked: JobView | None, now: float) -> None:
        """One elastic cycle of core's planner over the jobs that were running."""
        live = {j.id for j in jobs}
        self._elastic = {k: v for k, v in self._elastic.items() if k in live}
        running = []
        for j in jobs:
            if not j.allocation or j.id not in out:  # waiting, or preempted this cycle
                continue
            v = state.running[j.id]
            v.min_workers, v.max_workers = 1, max(j.max_replicas, v.workers)
            hist = learning_score(j.metrics, j.higher_is_better)
            prog = Progress(epoch=j.epoch, accuracy=hist[-1] if hist else 0.0, history=hist)
            v.progress = prog
            if j.profile and j.atomic_bsz:
                last = j.profile[-1]
                v.throughput = last.atomic_bsz / max(last.step_time, 1e-9)
            es = self._elastic.setdefault(j.id, ElasticState())
            es.observe(prog, v.workers, j.age, self.beta, 0)
            spec = TrainingSpec(min_workers=1, max_workers=v.max_workers, beta=self.beta, max_epochs=1 << 30)
            running.append(RunningJob(key=j.id, spec=spec, workers=v.workers, progress=prog, state=es,
                                      submit_time=j.submit_time, start_time=now, placement=list(v.placement),
                                      patience=1 << 30, job=v))  # completion is the target, never a β stop
        if not running:
            return
        head = None
        if blocked is not None:
            head = TrainingSpec(min_workers=blocked.workers, max_workers=blocked.workers)
        plan = self.planner.plan(running, state, reserved_gpus=reserved_gpus(head), place=self._place_one)
        for jid, step in scaling_steps(plan.deltas):
            cur = list(out[jid].nodes)
            if step < 0 and len(cur) > 1:
                cur.pop()
            elif step > 0 and jid in plan.nodes:
                cur.append(nodes[plan.nodes[jid]].index)
            out[jid] = Allocation(tuple(cur))

    def _place_one(self, rj: RunningJob, state: ClusterState) -> int | None:
        v = rj.job
        grown = JobView(id=v.id, submit_time=v.submit_time, workers=v.workers + 1, min_workers=1,
                        max_workers=max(v.max_workers, v.workers + 1), placement=list(v.placement))
        place = self.placement.place(grown, state, workers=1)
        return int(place[0]) if place else None
