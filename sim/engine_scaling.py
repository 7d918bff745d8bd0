"""The event engine's elastic-scaling path: core's :class:`ScalingPlanner` over the
running jobs, as the operator's cycle runs it. This part only translates the jobs
(their reported progress folded in) and applies the plan's one-worker changes. A part
of :class:`~rlsched.sim.engine.Simulator`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rlsched.core import ClusterState, JobView
from rlsched.core.planning import ScalingPlan, scaling_steps

from .engine_jobs import RUNNING, grown


class ElasticScaling:
    """The running jobs of ``sim`` as core's scaling planner sees them, and its plans applied."""

    def __init__(self, sim) -> None:  # the Simulator it is a part of
        self.sim = sim

    def fold(self, j, record: bool = True) -> None:
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

    @staticmethod
    def local_batch(j) -> float:
        """Samples per GPU of job ``j``'s fixed per-worker batch."""
        return j.spec.batch_per_worker / j.view.gpus_per_worker

    def jobs(self) -> list[JobView]:
        """:meth:`Simulator.elastic_jobs <rlsched.sim.engine.Simulator.elastic_jobs>`."""
        sim = self.sim
        out = []
        for v in sim.state.running.values():
            j = sim._by_id[v.id]
            self.fold(j)
            spec = j.spec
            out.append(dataclasses.replace(
                v, beta=spec.beta, max_epochs=spec.max_epochs, batch_size=spec.batch_size, pinned_workers=None,
                patience=spec.patience, record=j.elastic, observations=j.obs if j.obs.shapes else None,
                local_batch=self.local_batch(j), placement=list(v.placement)))
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

    def place_one(self, job: JobView, state: ClusterState) -> int | None:
        """The planner's room check: where the placement policy puts one more worker
        (best fit by free GPUs among the nodes that can host it when there is none)."""
        sim = self.sim
        v = sim._by_id[job.id].view
        if sim.placement is None:
            c = state.candidates(v.gpus_per_worker, v.gpu_models)
            return int(c[np.argmin(state.free[c])]) if len(c) else None
        nodes = sim.placement.place(grown(v, 1), state, workers=1)
        return int(nodes[0]) if nodes else None
