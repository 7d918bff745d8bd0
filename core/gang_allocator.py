"""Our orderings and placements as an allocation policy.

:class:`GangAllocator` runs an ordering and a placement (the objects the operator and
the extender serve) under the allocation interface, through core's scheduling cycle, so
they can be measured on the interval engine beside the peers: requested GPUs and batch,
gang starts, preemption under a preemptive ordering, optional backfill and an optional
scaling policy. It sees no run time. Details: docs/design-notes.md.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .allocation import Allocation, AllocJob, AllocNode
from .cluster import ClusterState, JobView, Progress
from .cycle import SchedulingCycle
from .job_goodput import job_observations
from .planning import (
    Admission,
    ElasticState,
    QueueEntry,
    RunningEntry,
    RunningJob,
    ScalingPlanner,
    TrainingSpec,
    scaling_steps,
)
from .policy import Ordering, Placement, Scaling
from .topology import Topology

__all__ = ["GangAllocator", "learning_score"]


def _spec(v: JobView) -> TrainingSpec:
    """A gang of the workers the job runs with (the allocator's jobs are not elastic at
    admission)."""
    return TrainingSpec(min_workers=v.workers, max_workers=v.workers)


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
        #: the one cycle the operator runs too: admission, then the planner
        self.cycle = SchedulingCycle(self.admission, self.planner)
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
        """One interval: core's :class:`~rlsched.core.cycle.SchedulingCycle` in its settle
        mode (admission, preemption of the jobs a preemptive ordering ranks after the
        blocked head, the victims released and admission planned again, then the scaling
        step), translated into allocations."""
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
        by_id = {j.id: j for j in jobs}
        waiting = [QueueEntry(key=v.id, spec=_spec(v), submit_time=v.submit_time, priority=0.0, job=v) for v in pending]
        holders = [RunningEntry(key=v.id, spec=_spec(v), priority=0.0, start_time=by_id[v.id].submit_time,
                                placement=list(v.placement), job=v) for v in state.running.values()]
        plan = self.cycle.plan(waiting, holders, state, running=lambda gone: self._elastic_jobs(jobs, gone, state, now),
                               place=self._place, place_one=self._place_one, settle=True)
        if plan.scaling_error is not None:
            raise plan.scaling_error
        for rnd in plan.rounds:  # each gang started where the placement put it; victims wait (keeping their progress)
            for key, where in rnd.placed.items():
                out[key] = Allocation(tuple(nodes[k].index for k in where))
            for key in rnd.released:
                out.pop(key, None)
        for jid, step in scaling_steps(plan.scaling.deltas):
            cur = list(out[jid].nodes)
            if step < 0 and len(cur) > 1:
                cur.pop()
            elif step > 0 and jid in plan.scaling.nodes:
                cur.append(nodes[plan.scaling.nodes[jid]].index)
            out[jid] = Allocation(tuple(cur))
        return out

    def _place(self, v: JobView, state: ClusterState):
        return self.placement.place(v, state)

    def _elastic_jobs(self, jobs: Sequence[AllocJob], gone: set, state: ClusterState, now: float) -> list[RunningJob]:
        """The jobs that were running and keep their GPUs (not in ``gone``), as core's
        planner sees them: each one's reported learning curve folded into its
        :class:`~rlsched.core.planning.ElasticState`."""
        live = {j.id for j in jobs}
        self._elastic = {k: v for k, v in self._elastic.items() if k in live}
        running = []
        for j in jobs:
            if not j.allocation or j.id in gone:  # waiting, or preempted this cycle
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
            spec = TrainingSpec(min_workers=1, max_workers=v.max_workers, beta=self.beta, max_epochs=1 << 30,
                                batch_size=j.batch_size or None)
            running.append(RunningJob(key=j.id, spec=spec, workers=v.workers, progress=prog, state=es,
                                      submit_time=j.submit_time, start_time=now, placement=list(v.placement),
                                      patience=1 << 30, job=v,  # completion is the target, never a β stop
                                      observations=job_observations(j)))
        return running

    def _place_one(self, rj: RunningJob, state: ClusterState) -> int | None:
        v = rj.job
        grown = JobView(id=v.id, submit_time=v.submit_time, workers=v.workers + 1, min_workers=1,
                        max_workers=max(v.max_workers, v.workers + 1), placement=list(v.placement))
        place = self.placement.place(grown, state, workers=1)
        return int(place[0]) if place else None
