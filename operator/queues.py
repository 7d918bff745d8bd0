"""The teams' TrainingQueues as the control loop reads and reports them: listed each
cycle into a :class:`~rlsched.core.queues.QueueBook`, and each queue's use (GPUs in
use and borrowed, pending and running jobs) written to its status and metrics."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Collection, Mapping, Sequence

from kubernetes_asyncio.client.exceptions import ApiException

from rlsched.core.contract import GROUP, QUEUE_PLURAL, VERSION
from rlsched.core.queues import QueueBook, QueueError, QueueSpec

from .api import MERGE, read_json
from .job import ACTIVE, Job
from .status import format_time, parse_time

log = logging.getLogger(__name__)


class TeamQueues:
    """Reads the TrainingQueues and reports their use; ``enforced``: an allocator
    applies their quotas (else only their use is reported)."""

    def __init__(self, custom: Any, metrics: Any, *, min_run_s: float, enforced: bool) -> None:
        self.custom, self.metrics, self.min_run_s, self.enforced = custom, metrics, min_run_s, enforced
        self._no_queue_crd = False
        self._queues_unenforced = False
        self._queue_series: set[str] = set()

    async def list(self) -> list[dict]:
        """The TrainingQueues (cluster-scoped); none when their CRD is not installed."""
        try:
            return (await read_json(self.custom.list_cluster_custom_object(
                GROUP, VERSION, QUEUE_PLURAL, _preload_content=False)))["items"]
        except ApiException as exc:
            if exc.status != 404:
                raise
            if not self._no_queue_crd:
                log.info("no TrainingQueue CRD on this cluster: jobs are scheduled without team queues")
                self._no_queue_crd = True
            return []

    def book(self, bodies: Sequence[Mapping]) -> QueueBook:
        """The teams' queues of this cycle (a queue that cannot be read is left out and
        logged: its jobs wait as NoSuchQueue) with the operator's minimum run time."""
        specs = []
        for b in bodies:
            try:
                specs.append(QueueSpec.from_manifest(b))
            except QueueError as exc:
                log.warning("TrainingQueue ignored: %s", exc)
        if specs and not self.enforced and not self._queues_unenforced:
            log.warning("TrainingQueues exist but the operator's allocator does not enforce them (the goodput "
                        "allocators do): their quotas and weights are not enforced, only their use is reported")
            self._queues_unenforced = True
        return QueueBook(specs, min_run_s=self.min_run_s)

    async def report(self, book: QueueBook, bodies: Sequence[Mapping], jobs: Mapping[str, Job],
                     target: Callable[[Job], int], now: float, admitted: Collection[str] = ()) -> None:
        """The waiting metrics of the cycle and each TrainingQueue's status (GPUs in
        use, borrowed, pending and running jobs, as this cycle read them, ``admitted``
        counted as started; ``target``: a job's worker count), written when it changes, with the per-queue metrics
        (bounded: one series per queue object). In both modes: without the allocator the
        quotas are not enforced (docs/queues.md), the use is still reported."""
        m = self.metrics
        held: list[tuple[str | None, int]] = []
        oldest: dict[str, float] = {}
        for j in jobs.values():
            phase = j.status.get("phase")
            if j.spec is None or j.spec.suspend or phase not in ACTIVE:
                continue
            if phase != "Queued" or j.key in admitted:
                held.append((j.team, target(j) * j.spec.gpus_per_worker))
                continue
            held.append((j.team, 0))
            since = parse_time(j.status.get("queuedTime")) or parse_time(j.body["metadata"].get("creationTimestamp"))
            if since is not None:
                oldest[j.team or ""] = max(oldest.get(j.team or "", 0.0), now - since)
        m.oldest_pending.set(max(oldest.values(), default=0.0))
        usage = book.usage(held)
        seen = set()
        for b in bodies:
            name = b["metadata"]["name"]
            seen.add(name)
            row = usage.get(name) or {"gpusInUse": 0, "borrowedGpus": 0, "pendingJobs": 0, "runningJobs": 0}
            nominal = (b.get("spec") or {}).get("nominalGpus", 0)
            m.queue_gpus.labels(queue=name).set(row["gpusInUse"])
            m.queue_borrowed.labels(queue=name).set(row["borrowedGpus"])
            m.queue_pending.labels(queue=name).set(row["pendingJobs"])
            m.queue_running.labels(queue=name).set(row["runningJobs"])
            m.queue_nominal.labels(queue=name).set(nominal if isinstance(nominal, int) else 0)
            m.queue_oldest_pending.labels(queue=name).set(oldest.get(name, 0.0))
            if {k: (b.get("status") or {}).get(k) for k in row} != row:
                try:
                    await self.custom.patch_cluster_custom_object_status(
                        GROUP, VERSION, QUEUE_PLURAL, name, {"status": {**row, "observedTime": format_time(now)}},
                        _content_type=MERGE)
                except (ApiException, OSError, asyncio.TimeoutError) as exc:
                    m.job_errors.labels(kind="transient").inc()
                    log.warning("could not write the status of TrainingQueue %s: %r", name, exc)
        for name in self._queue_series - seen:  # a deleted queue: its series go
            for g in (m.queue_gpus, m.queue_borrowed, m.queue_pending, m.queue_running, m.queue_nominal,
                      m.queue_oldest_pending):
                g.remove(name)
        self._queue_series = seen
