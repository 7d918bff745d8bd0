"""Tiresias as an allocator: discretized two-dimensional LAS, two queues, fixed GPUs.

Written from Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning",
NSDI 2019 (§3.2, §3.3), in the setting of the Pollux paper's Tiresias baseline (Qiao et
al., OSDI 2021, §5). The rules and choices: docs/benchmark.md, "How the peers decide".
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from rlsched.core.allocation import AllocJob, Allocation, AllocationError, AllocNode
from rlsched.core.cluster import JobView
from rlsched.core.ordering import POLLUX_THRESHOLD
from rlsched.core.ordering import Tiresias as TiresiasOrdering
from rlsched.core.packing import keep_or_pack

__all__ = ["TiresiasAllocator"]


class TiresiasAllocator:
    """Tiresias' discretized 2D-LAS with two queues, fixed GPUs and batch size."""

    name = "tiresias-2q"
    clairvoyant = False
    type_aware = False

    def __init__(self, threshold: float = POLLUX_THRESHOLD, starvation_factor: float = 0.0) -> None:
        if not math.isfinite(threshold):
            raise ValueError(f"threshold must be finite, got {threshold}")
        if not (math.isfinite(starvation_factor) and starvation_factor >= 0):
            raise ValueError(f"starvation_factor must be finite and >= 0, got {starvation_factor}")
        # the ordering holds the queue rule (and checks the threshold is positive)
        self._las = TiresiasOrdering(thresholds=(threshold,))
        self.threshold = self._las.thresholds[0]
        self.starvation_factor = float(starvation_factor)
        self._now: float | None = None
        #: job id -> time the job was seen in queue 1 first (queue 1's order)
        self._demoted_at: dict[str, float] = {}
        #: job id -> attained service at its last promotion (counted from there)
        self._baseline: dict[str, float] = {}
        #: job id -> time its current run started (running jobs only)
        self._run_start: dict[str, float] = {}
        #: job id -> length of its last run, and when it was last preempted
        self._last_run: dict[str, float] = {}
        self._wait_start: dict[str, float] = {}

    def queue_of(self, job: AllocJob) -> int:
        """0 or 1: the job's queue from its attained service (since its last promotion)."""
        service = job.attained_service - self._baseline.get(job.id, 0.0)
        # the ordering's own promotion rule is off (promote_knob None), so its ``now`` is unused
        return self._las.queue_of(JobView(job.id, job.submit_time, attained_service=service), 0.0)

    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float) -> Mapping[str, Allocation]:
        if self._now is not None and now < self._now:
            raise ValueError(f"{self.name}: called at {now} after {self._now}; one instance serves one run in time order")
        self._now = now
        by_id = {j.id: j for j in jobs}
        if len(by_id) != len(jobs):
            raise AllocationError(f"{self.name}: duplicate job ids")
        for j in jobs:
            if j.target_replicas is None or not j.min_replicas <= j.target_replicas <= j.max_replicas:
                raise AllocationError(
                    f"job {j.id}: {self.name} runs fixed-size jobs; target_replicas {j.target_replicas} "
                    f"is not within [{j.min_replicas}, {j.max_replicas}]"
                )
        self._forget(by_id)
        queues = self._queues(jobs, now)

        free = sum(n.gpus for n in nodes)
        admitted: list[AllocJob] = []
        for j in queues:
            if j.target_replicas <= free:
                admitted.append(j)
                free -= j.target_replicas
        # a job limited to some GPU models runs whole on them or waits (fixed size)
        where = keep_or_pack([(j, j.target_replicas) for j in admitted], nodes, partial=True)
        where = {jid: w for jid, w in where.items() if len(w) == by_id[jid].target_replicas}

        self._record_runs(jobs, where, now)
        return {j.id: Allocation(where.get(j.id, ())) for j in jobs}

    def order(self, jobs: Sequence[AllocJob], now: float) -> list[AllocJob]:
        """The service order: queue 0 by arrival, then queue 1 by demotion (as of the
        last :meth:`allocate`, which records demotions and promotions)."""
        queue = {j.id: self.queue_of(j) for j in jobs}
        zero = sorted((j for j in jobs if queue[j.id] == 0), key=lambda j: (j.submit_time, j.id))
        one = sorted(
            (j for j in jobs if queue[j.id] == 1),
            key=lambda j: (self._demoted_at.get(j.id, now), j.submit_time, j.id),
        )
        return zero + one

    def _queues(self, jobs: Sequence[AllocJob], now: float) -> list[AllocJob]:
        """Promote starved jobs, record new demotions, return the service order."""
        for j in jobs:
            q = self.queue_of(j)
            if q == 1 and self.starvation_factor > 0 and not j.allocation and self._starved(j, now):
                self._baseline[j.id] = j.attained_service
                q = 0
            if q == 1:
                self._demoted_at.setdefault(j.id, now)
            else:
                self._demoted_at.pop(j.id, None)
        return self.order(jobs, now)

    def _starved(self, job: AllocJob, now: float) -> bool:
        if job.id not in self._wait_start:
            # waiting when first seen: its run so far stands for its last run
            self._wait_start[job.id] = now
            self._last_run[job.id] = job.attained_service / job.target_replicas
        waited = now - self._wait_start[job.id]
        return waited > self.starvation_factor * self._last_run[job.id]

    def _record_runs(self, jobs: Sequence[AllocJob], where: Mapping[str, tuple[int, ...]], now: float) -> None:
        for j in jobs:
            runs = j.id in where
            if j.allocation and j.id not in self._run_start:
                # running when first seen: its run so far stands for its current run
                self._run_start[j.id] = now - j.attained_service / j.target_replicas
            if runs and not j.allocation:
                self._run_start[j.id] = now
                self._wait_start.pop(j.id, None)
                self._last_run.pop(j.id, None)
            elif not runs and j.allocation:
                self._last_run[j.id] = now - self._run_start.pop(j.id)
                self._wait_start[j.id] = now

    def _forget(self, live: Mapping[str, AllocJob]) -> None:
        """Drop the state of jobs that are gone (finished)."""
        for d in (self._demoted_at, self._baseline, self._run_start, self._last_run, self._wait_start):
            for jid in [k for k in d if k not in live]:
                del d[jid]

    def __repr__(self) -> str:
        return f"TiresiasAllocator(threshold={self.threshold}, starvation_factor={self.starvation_factor})"
