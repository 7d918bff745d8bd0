"""The event engine's one decision call: the operator's allocator mode, on the engine.

Every running job (synced, its report folded in) and every waiting job go to core's
:meth:`LiveAllocation.plan <rlsched.core.live_allocation.LiveAllocation.plan>` with
each node's GPUs; this part only translates the jobs and applies the plan. A part of
:class:`~rlsched.sim.engine.Simulator`.
"""

from __future__ import annotations

import dataclasses

from rlsched.core.allocation import ProfileSample
from rlsched.core.cluster import JobView
from rlsched.core.live_allocation import LivePlan, movable_room

from .engine_jobs import WAKE, JobState, grown


class AllocationAdapter:
    """``sim``'s allocation policy (``sim.allocation``) deciding under ``sim.queues``."""

    def __init__(self, sim) -> None:  # the Simulator it is a part of
        self.sim = sim
        #: per job: the inputs of its last translation (those compared by identity, those
        #: by value) and the view they gave
        self._kept: dict[str, tuple[tuple, tuple, JobView]] = {}

    def fold(self, j: JobState, record: bool = True) -> None:
        """Job ``j`` synced to now, its report folded into its observations and (with
        ``record``) its reported progress into its record
        (:class:`~rlsched.core.planning.ElasticState`): the fold the operator does each
        cycle."""
        sim = self.sim
        t = sim.now
        sim.dynamics.sync(j, t)
        if record:
            v, spec = j.view, j.spec
            j.elastic.observe(v.progress, v.workers, t - float(j.first_start), spec.beta, spec.samples_per_epoch)
        sim.dynamics.report(j)

    def live_job(self, j: JobState, nodes: tuple[int, ...]) -> JobView:
        """The job as the allocation policy sees it, on ``nodes`` (none: waiting), with
        the seed profile it declares on the cluster's GPU types (``JobSpec.seed_profile``).
        The same view while nothing it is made of changed (a waiting job's); its
        progress is the engine's own record, read at the decision."""
        v = j.view
        spec = j.spec
        batch = None  # the scheduler sets none
        if spec.batch_size is not None:  # its current run's, else the one it asked for
            batch = j.batch if nodes and j.batch is not None else spec.batch_size
        p = v.progress
        since = float(v.start_time) if nodes and v.start_time is not None else None
        stall = j.stall(self.sim.now)
        types = self.sim.dynamics.types
        same = (spec, j.obs, p, types)  # compared by identity
        equal = (nodes, batch, v.attained_service, j.rescales + j.preemptions, since,
                 v.min_workers, v.max_workers, v.gpus_per_worker, v.gpu_models, v.cpu_milli, v.memory_mib,
                 v.submit_time, stall, v.remaining, v.queue)  # the estimate is the spec's (``same``)
        hit = self._kept.get(v.id)
        seeds = None
        if hit is not None and hit[0][0] is spec and hit[0][3] is types:
            seeds = hit[2].seed_profile
            if all(a is b for a, b in zip(hit[0], same)) and hit[1] == equal:
                return hit[2]
        live = JobView(id=v.id, submit_time=v.submit_time, min_workers=v.min_workers, max_workers=v.max_workers,
                       gpus_per_worker=v.gpus_per_worker, workers=len(nodes) or v.workers, placement=list(nodes),
                       observations=j.obs, batch_size=batch, bounds=spec.bounds,
                       attained_service=v.attained_service, restarts=j.rescales + j.preemptions,
                       priority_class=j.spec.priority_class or "normal", team=j.spec.tenant, start_time=since,
                       queue=v.queue, priority=spec.priority,
                       gpu_models=v.gpu_models, cpu_milli=v.cpu_milli, memory_mib=v.memory_mib, progress=p,
                       asked_workers=spec.workers, beta=spec.beta,
                       seed_profile=self._seeds(spec) if seeds is None else seeds,
                       restart_s=stall, est_runtime=v.est_runtime, remaining=v.remaining)
        self._kept[v.id] = (same, equal, live)
        return live

    def _seeds(self, spec) -> tuple[ProfileSample, ...]:
        types = self.sim.dynamics.types
        if types is None:
            return ()
        return tuple(ProfileSample(1, 1, m, t, 0.0, gpu_type=g) for g, m, t in spec.seed_profile(types.values()))

    def _pinned(self, v, gpu_type: str | None):
        """``v`` as the placement sees it when its workers must go to nodes of
        ``gpu_type`` (the operator's node affinity on the generation's pods)."""
        types = self.sim.dynamics.types
        if gpu_type is None or types is None:
            return v
        models = {self.sim.state.topology.nodes[i].gpu_model for i, t in types.items() if t == gpu_type}
        if v.gpu_models is not None:
            models &= v.gpu_models
        return dataclasses.replace(v, gpu_models=frozenset(models))

    def cycle(self) -> LivePlan:
        """One decision now, then the plan applied (:meth:`Simulator.allocation_cycle
        <rlsched.sim.engine.Simulator.allocation_cycle>`)."""
        sim = self.sim
        t = sim.now
        sim._allocated_at = t
        st = sim.state
        jobs: list[JobView] = []
        scales = sim.allocation.scales
        for v in list(st.running.values()):
            j = sim._by_id[v.id]
            self.fold(j, record=scales)  # synced, its report folded in
            live = self.live_job(j, tuple(v.placement))
            if scales:  # with its record, as the operator passes it
                live = dataclasses.replace(live, record=j.elastic, local_batch=j.spec.batch_per_worker / v.gpus_per_worker,
                                           beta=j.spec.beta)
            jobs.append(live)
        capacity, offers = movable_room(st, ((v.placement, v.gpus_per_worker, v.cpu_milli, v.memory_mib)
                                             for v in st.running.values()))
        jobs += [self.live_job(sim._by_id[v.id], ()) for v in st.pending]
        if not jobs:
            return LivePlan()
        models = {i: node.gpu_model for i, node in enumerate(st.topology.nodes)}
        plan = sim.allocation.plan(jobs, capacity, t, queues=sim.queues, models=models, offers=offers,
                                   types=sim.dynamics.types, why=False)
        if plan.error is not None:
            raise plan.error
        self._apply(plan, t)
        if plan.wake_at is not None and (sim._wake_at is None or plan.wake_at < sim._wake_at):
            sim._wake_at = plan.wake_at  # the policy's answer may change then with nothing else happening
            sim._push(plan.wake_at, WAKE, None)
        sim._record(t)
        return plan

    def _apply(self, plan: LivePlan, t: float) -> None:
        """Jobs given nothing suspended, shrinks, then grows and starts in the plan's
        order, new workers where the placement policy puts them (a start it cannot
        place waits for the next decision)."""
        sim = self.sim
        st = sim.state
        back = set(plan.interrupt)
        for jid in plan.stop:
            self._suspend(sim._by_id[jid], t, jid in back)
        grows = []
        for jid, target in plan.resize.items():
            j = sim._by_id[jid]
            if target.gpu_type is not None and j.gpu_type and target.gpu_type != j.gpu_type:
                self._move(j, target, t)
                continue
            delta = target.workers - j.view.workers
            if delta < 0:
                sim._rescale(j, delta, None, t, target.batch_size)
            else:
                grows.append((j, delta, target))
        for jid, target in plan.start.items():
            j = sim._by_id[jid]
            v = j.view
            nodes = sim.placement.place(self._pinned(grown(v, target.workers - v.workers), target.gpu_type), st)
            if nodes:
                if j.spec.batch_size is not None:
                    j.batch = target.batch_size or None
                sim._start(j, list(nodes), t)
                st.pending = [p for p in st.pending if p is not v]
        for j, delta, target in grows:
            nodes = None
            if delta > 0 and target.gpu_type is not None and sim.dynamics.types is not None:
                nodes = sim.placement.place(self._pinned(grown(j.view, delta), target.gpu_type), st, workers=delta)
                if nodes is None:
                    continue  # no room on its type now: as a grow the placement cannot place
            sim._rescale(j, delta, nodes, t, target.batch_size)

    def _move(self, j: JobState, target, t: float) -> None:
        """A running job to ``target.workers`` workers on nodes of ``target.gpu_type``:
        a new generation whose every worker is placed there anew, as the operator's
        resize of a generation pinned to that type (nothing when they do not fit now)."""
        sim = self.sim
        st, v = sim.state, j.view
        sim.dynamics.sync(j, t)
        old = list(v.placement)
        st.release_job(v, old)
        fresh = dataclasses.replace(v, workers=target.workers, max_workers=max(v.max_workers, target.workers),
                                    placement=[])
        nodes = sim.placement.place(self._pinned(fresh, target.gpu_type), st)
        if not nodes:
            st.allocate_job(v, old)
            return
        st.allocate_job(v, nodes)
        v.placement, v.workers = list(nodes), target.workers
        sim._dirty = True
        j.rescales += 1
        if target.batch_size and j.spec.batch_size is not None:
            j.batch = int(target.batch_size)
        if sim.recorder.decisions is not None:
            sim.recorder.decisions.append({"kind": "scale", "job": v.id, "t": t, "delta": target.workers - len(old),
                                           "workers": target.workers, "epoch": v.progress.epoch,
                                           "gpu_type": target.gpu_type, **sim._batch_record(j)})
        sim._restarted(j, t)

    def _suspend(self, j: JobState, t: float, interrupt: bool) -> None:
        """A job the plan stops, to the interrupt queue where the plan says, else its own."""
        sim = self.sim
        if sim.recorder.decisions is not None:
            sim.recorder.decisions.append({"kind": "preempt", "job": j.view.id, "by": sim.allocation.name, "t": t})
        sim._suspend(j, t, interrupt=interrupt)
