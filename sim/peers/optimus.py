"""Optimus + Oracle as an allocator: greedy GPUs by marginal reduction of remaining time.

Written from Peng et al., "Optimus: An Efficient Dynamic Resource Scheduler for Deep
Learning Clusters", EuroSys 2018 (§5.1), as the Pollux paper ran it (Qiao et al., OSDI
2021, §5): the true remaining work replaces Optimus' estimates, so it is a clairvoyant
reference, never a baseline. The rules: docs/benchmark.md, "How the peers decide".
"""

from __future__ import annotations

import heapq
import math
from typing import Mapping, Sequence

from rlsched.core.allocation import AllocJob, Allocation, AllocationError, AllocNode, Oracle
from rlsched.core.packing import keep_or_pack

__all__ = ["MissingOracleError", "OptimusOracle"]


class MissingOracleError(AllocationError):
    """A clairvoyant allocator got a job without :attr:`AllocJob.oracle`: the engine
    must run it as a clairvoyant reference (``Allocator.clairvoyant`` is True)."""


class OptimusOracle:
    """Optimus' greedy marginal-gain allocation given each job's true remaining work."""

    name = "optimus-oracle"
    clairvoyant = True
    type_aware = False

    def oracle(self, job: AllocJob) -> Oracle:
        """The job's oracle, checked: :class:`MissingOracleError` when it has none,
        :class:`AllocationError` when its remaining work is not finite."""
        o = job.oracle
        if o is None:
            raise MissingOracleError(
                f"job {job.id}: {self.name} is clairvoyant and needs AllocJob.oracle; "
                "the engine must run it as a clairvoyant reference"
            )
        if not math.isfinite(o.remaining_progress):
            raise AllocationError(f"job {job.id}: remaining_progress {o.remaining_progress} is not finite")
        return o

    def remaining_time(self, job: AllocJob, k: int) -> float:
        """``T(k)``: seconds the job still needs on ``k`` GPUs (∞ when it cannot run there)."""
        o = self.oracle(job)
        rate = o.progress_rate.get(k, 0.0) if 1 <= k <= job.max_replicas else 0.0
        if not (math.isfinite(rate) and rate >= 0):
            raise AllocationError(f"job {job.id}: progress_rate[{k}] = {rate} is not a finite rate >= 0")
        if rate == 0:
            return math.inf
        return max(o.remaining_progress, 0.0) / rate

    def gain(self, job: AllocJob, k: int) -> float:
        """``T(k) − T(k+1)``: the remaining time one more GPU saves (``-∞`` past
        ``max_replicas`` or where the job cannot run; 0 from ∞ to ∞)."""
        a, b = self.remaining_time(job, k), self.remaining_time(job, k + 1)
        if math.isinf(b):
            return -math.inf if math.isfinite(a) else 0.0
        return a - b

    def counts(self, jobs: Sequence[AllocJob], total: int) -> dict[str, int]:
        """GPUs per job (only jobs that get some) from ``total`` GPUs."""
        arrival = sorted(jobs, key=lambda j: (j.submit_time, j.id))
        for j in arrival:
            self.oracle(j)  # every job checked, even one that gets no GPU
        free = total
        count: dict[str, int] = {}
        for j in arrival:
            first = max(1, j.min_replicas)
            if first <= min(free, j.max_replicas):
                count[j.id] = first
                free -= first
        # max-heap of (gain of one more GPU, arrival rank), one entry per running job
        heap = [(-self.gain(j, count[j.id]), rank, j) for rank, j in enumerate(arrival) if j.id in count]
        heapq.heapify(heap)
        while free > 0 and heap:
            g, rank, j = heapq.heappop(heap)
            if not -g > 0:
                break  # the best job gains nothing: neither does any other
            count[j.id] += 1
            free -= 1
            heapq.heappush(heap, (-self.gain(j, count[j.id]), rank, j))
        return count

    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float) -> Mapping[str, Allocation]:
        if len({j.id for j in jobs}) != len(jobs):
            raise AllocationError(f"{self.name}: duplicate job ids")
        count = self.counts(jobs, sum(n.gpus for n in nodes))
        arrival = sorted((j for j in jobs if j.id in count), key=lambda j: (j.submit_time, j.id))
        where = keep_or_pack([(j, count[j.id]) for j in arrival], nodes)
        return {j.id: Allocation(where.get(j.id, ())) for j in jobs}

    def __repr__(self) -> str:
        return "OptimusOracle()"
