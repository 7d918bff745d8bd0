"""Kueue's decision on each job labelled with a LocalQueue, read and carried out: a job
is held until its Workload is admitted, then runs within the admitted worker count,
and a finished job's Workload is marked Finished so that Kueue releases its quota
(the pure reading is :mod:`rlsched.operator.kueue`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping

from kubernetes_asyncio.client.exceptions import ApiException

from rlsched.core.contract import KUEUE_GROUP, KUEUE_VERSION
from rlsched.core.planning import WaitReason

from .api import MERGE, read_json
from .job import Job
from .kueue import WORKLOAD_PLURAL as KUEUE_WORKLOAD_PLURAL
from .kueue import admission_of as kueue_admission_of
from .kueue import finished_condition as kueue_finished_condition
from .kueue import queue_name as kueue_queue_name
from .kueue import workload_for
from .status import StatusWriter, format_time


class KueueGate:
    """Holds, sizes and finishes the Kueue-labelled jobs of a cycle."""

    def __init__(self, custom: Any, status: StatusWriter, namespace: str | None,
                 clock: Callable[[], float] = time.time) -> None:
        self.custom, self.status, self.namespace, self.clock = custom, status, namespace, clock

    async def gate(self, jobs: Mapping[str, Job], by_uid: Mapping[str, Job]) -> None:
        """Kueue's decision on each labelled job (operator/kueue.py): held until its
        Workload is admitted, then run within the admitted count; a finished job's
        Workload is marked Finished (Kueue releases its quota)."""
        if not any(kueue_queue_name(j.body) for j in jobs.values()):
            return
        try:
            if self.namespace:
                call = self.custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, self.namespace,
                                                                 KUEUE_WORKLOAD_PLURAL, _preload_content=False)
            else:
                call = self.custom.list_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, KUEUE_WORKLOAD_PLURAL,
                                                              _preload_content=False)
            workloads = (await read_json(call))["items"]
        except ApiException as exc:
            if exc.status != 404:
                raise
            for j in jobs.values():
                if kueue_queue_name(j.body):
                    j.hold = WaitReason(0, "KueueMissing", f"labelled for Kueue's LocalQueue "
                                                           f"{kueue_queue_name(j.body)}, but Kueue's Workload API is "
                                                           f"not served on this cluster")
            return
        for wl in workloads:
            for ref in (wl.get("metadata") or {}).get("ownerReferences") or []:
                j = by_uid.get(ref.get("uid"))
                if ref.get("controller") and j is not None and j.ns == wl["metadata"].get("namespace"):
                    j.workload = wl
        for j in jobs.values():
            if not kueue_queue_name(j.body) or j.spec is None:
                continue
            phase = j.status.get("phase")
            if phase in ("Succeeded", "Failed"):
                await self.finish_workload(j, phase == "Succeeded")
                continue
            adm = kueue_admission_of(j.workload)
            if not adm.admitted:
                j.hold = WaitReason(0, adm.reason, adm.message)
            else:  # rlsched places and scales within what Kueue admitted
                top = max(j.spec.min_workers, min(j.spec.max_workers, adm.workers))
                j.spec = dataclasses.replace(j.spec, max_workers=top)

    async def create_workload(self, j: Job) -> None:
        body = workload_for(j.body, j.spec)
        try:
            await self.custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, j.ns, KUEUE_WORKLOAD_PLURAL,
                                                              body)
            await self.status.event(j.body, "WorkloadCreated", f"Kueue Workload {body['metadata']['name']} in LocalQueue "
                                                        f"{body['spec']['queueName']}: the job waits for its admission")
        except ApiException as exc:
            if exc.status != 409:  # 409: made by an earlier cycle, not listed yet
                raise

    async def finish_workload(self, j: Job, succeeded: bool) -> None:
        wl = j.workload
        if wl is None or any(c.get("type") == "Finished" and c.get("status") == "True"
                             for c in (wl.get("status") or {}).get("conditions") or []):
            return
        conds = [c for c in (wl.get("status") or {}).get("conditions") or [] if c.get("type") != "Finished"]
        cond = kueue_finished_condition(succeeded, j.status.get("message") or j.status.get("reason") or "",
                                        format_time(self.clock()))
        await self.custom.patch_namespaced_custom_object_status(
            KUEUE_GROUP, KUEUE_VERSION, j.ns, KUEUE_WORKLOAD_PLURAL, wl["metadata"]["name"],
            {"status": {"conditions": conds + [cond]}}, _content_type=MERGE)
