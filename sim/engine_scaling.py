"""The event engine's elastic-scaling path: core's :class:`ScalingPlanner` over the
running jobs, as the operator's cycle runs it. This part only translates the jobs
(their reported progress folded in) and applies the plan's one-worker changes. A part
of :class:`~rlsched.sim.engine.Simulator`.
"""

from __future__ import annotations

import numpy as np

from rlsched.core import ClusterState
from rlsched.core.planning import RunningJob, ScalingPlan, TrainingSpec, scaling_steps

from .engine_jobs import RUNNING, grown


class ElasticScaling:
    """The running jobs of ``sim`` as core's scaling planner sees them, and its plans applied."""

    def __init__(self, sim) -> None:  # the Simulator it is a part of
        self.sim = sim

    def jobs(self) -> list[RunningJob]:
        """:meth:`Simulator.elastic_jobs <rlsched.sim.engine.Simulator.elastic_jobs>`."""
        sim = self.sim
        out = []
        t = sim.now
        for v in sim.state.running.values():
            j = sim._by_id[v.id]
            sim.dynamics.sync(j, t)
            spec = j.spec
            j.elastic.observe(v.progress, v.workers, t - float(j.first_start), spec.beta, spec.samples_per_epoch)
            tspec = TrainingSpec(
                min_workers=v.min_workers, max_workers=v.max_workers, gpus_per_worker=v.gpus_per_worker,
                priority_class=spec.priority_class, priority_value=spec.priority, beta=spec.beta,
                max_epochs=spec.max_epochs, data_size=spec.samples_per_epoch, batch_size=spec.batch_size,
            )
            sim.dynamics.report(j)
            out.append(RunningJob(
                key=v.id, spec=tspec, workers=v.workers, progress=v.progress, state=j.elastic,
                submit_time=v.submit_time, start_time=float(v.start_time), placement=list(v.placement),
                patience=spec.patience, job=v, observations=j.obs if j.obs.shapes else None,
                local_batch=spec.batch_per_worker / v.gpus_per_worker,
            ))
        return out

    def apply(self, plan: ScalingPlan) -> dict[str, int]:
        """Apply a plan's one-worker changes now, removals first, each added worker on
        the node the planner found for it (``plan.nodes``; the placement policy's choice
        when absent). Every resize pays ``restart_cost``. Returns the changes made."""
        sim = self.sim
        done: dict[str, int] = {}
        for jid, step in scaling_steps(plan.deltas):
            j = sim._by_id.get(jid)
            if j is None or j.status != RUNNING:
                continue
            node = plan.nodes.get(jid) if step > 0 else None
            if sim._rescale(j, step, None if node is None else [node], sim.now):
                done[jid] = step
        if done:
            sim._record(sim.now)
        return done

    def place_one(self, rj: RunningJob, state: ClusterState) -> int | None:
        """The planner's room check: where the placement policy puts one more worker
        (best fit by free GPUs among the nodes that can host it when there is none)."""
        sim = self.sim
        v = sim._by_id[rj.key].view
        if sim.placement is None:
            c = state.candidates(v.gpus_per_worker, v.gpu_models)
            return int(c[np.argmin(state.free[c])]) if len(c) else None
        nodes = sim.placement.place(grown(v, 1), state, workers=1)
        return int(nodes[0]) if nodes else None
