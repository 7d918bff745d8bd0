"""The event engine's allocation-policy path: the operator's allocator mode, on the engine.

Every running job (synced, its report folded in) and every waiting job go to core's
:meth:`LiveAllocation.plan <rlsched.core.live_allocation.LiveAllocation.plan>` with
each node's GPUs; this part only translates the jobs and applies the plan. A part of
:class:`~rlsched.sim.engine.Simulator`.
"""

from __future__ import annotations

from rlsched.core.live_allocation import LiveJob, LivePlan, movable_room

from .engine_jobs import WAKE, JobState, grown


class AllocationAdapter:
    """``sim``'s allocation policy (``sim.allocation``) deciding under ``sim.queues``."""

    def __init__(self, sim) -> None:  # the Simulator it is a part of
        self.sim = sim

    @staticmethod
    def live_job(j: JobState, nodes: tuple[int, ...]) -> LiveJob:
        """The job as the allocation policy sees it, on ``nodes`` (none: waiting)."""
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
                       epoch=v.progress.epoch, metrics=tuple(v.progress.history), start_workers=spec.workers)

    def cycle(self) -> LivePlan:
        """One decision now, then the plan applied (:meth:`Simulator.allocation_cycle
        <rlsched.sim.engine.Simulator.allocation_cycle>`)."""
        sim = self.sim
        t = sim.now
        sim._allocated_at = t
        st = sim.state
        jobs: list[LiveJob] = []
        for v in list(st.running.values()):
            j = sim._by_id[v.id]
            sim.dynamics.sync(j, t)
            sim.dynamics.report(j)
            jobs.append(self.live_job(j, tuple(v.placement)))
        capacity, offers = movable_room(st, ((v.placement, v.gpus_per_worker, v.cpu_milli, v.memory_mib)
                                             for v in st.running.values()))
        jobs += [self.live_job(sim._by_id[v.id], ()) for v in st.pending]
        if not jobs:
            return LivePlan()
        models = {i: node.gpu_model for i, node in enumerate(st.topology.nodes)}
        plan = sim.allocation.plan(jobs, capacity, t, queues=sim.queues, models=models, offers=offers)
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
        for jid in plan.stop:
            self._suspend(sim._by_id[jid], t)
        grows = []
        for jid, target in plan.resize.items():
            j = sim._by_id[jid]
            delta = target.workers - j.view.workers
            if delta < 0:
                sim._rescale(j, delta, None, t, target.batch_size)
            else:
                grows.append((j, delta, target.batch_size))
        for jid, target in plan.start.items():
            j = sim._by_id[jid]
            v = j.view
            nodes = sim.placement.place(grown(v, target.workers - v.workers), st)
            if nodes:
                if j.spec.batch_size is not None:
                    j.batch = target.batch_size or None
                sim._start(j, list(nodes), t)
                st.pending = [p for p in st.pending if p is not v]
        for j, delta, batch in grows:
            sim._rescale(j, delta, None, t, batch)

    def _suspend(self, j: JobState, t: float) -> None:
        sim = self.sim
        if sim.recorder.decisions is not None:
            sim.recorder.decisions.append({"kind": "preempt", "job": j.view.id, "by": sim.allocation.name, "t": t})
        sim._suspend(j, t, interrupt=True)
