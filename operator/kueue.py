"""Kueue admits, rlsched places and scales: a TrainingJob labelled with Kueue's queue
name is held until Kueue admits its Workload, then rlsched runs it within what Kueue
admitted.

The operator is the kind's controller in Kueue's external-framework contract, here in
pure translation: :func:`workload_for` (the job's Workload), :func:`admission_of` (what
Kueue decided) and :func:`finished_condition` (releasing the quota). Nothing here talks
to the API server. Details: docs/operator.md, docs/design-notes.md.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any, Mapping

from rlsched.core.contract import KUEUE_GROUP, KUEUE_LABEL_QUEUE_NAME, KUEUE_VERSION
from rlsched.core.planning import TrainingSpec

from .resources import owner_reference, set_worker_gpus

__all__ = ["KueueAdmission", "queue_name", "workload_name", "workload_for", "admission_of", "finished_condition",
           "POD_SET", "WORKLOAD_PLURAL"]

#: the Workload's one pod set
POD_SET = "workers"
#: Kueue's Workload kind and its resource (kueue.x-k8s.io)
WORKLOAD_KIND, WORKLOAD_PLURAL = "Workload", "workloads"


@dataclass(frozen=True)
class KueueAdmission:
    """Kueue's decision on a job's Workload: ``admitted`` with ``workers`` pods, or not
    (``reason``, ``message``: why, from the Workload's conditions)."""

    admitted: bool
    workers: int = 0
    reason: str = ""
    message: str = ""


def queue_name(body: Mapping) -> str | None:
    """The LocalQueue the job names with Kueue's label (None: not Kueue's)."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    q = labels.get(KUEUE_LABEL_QUEUE_NAME)
    return q if isinstance(q, str) and q else None


def workload_name(body: Mapping) -> str:
    """``trainingjob-<name>-<5 hex of the uid>``, at most 253 characters (a new job of the
    same name gets a new Workload)."""
    md = body["metadata"]
    tail = hashlib.sha256(md["uid"].encode()).hexdigest()[:5]
    return f"trainingjob-{md['name'][:253 - 18]}-{tail}"


def workload_for(body: Mapping, spec: TrainingSpec) -> dict:
    """The Workload Kueue admits for the labelled TrainingJob ``body``."""
    md = body["metadata"]
    count = spec.pinned_workers or spec.max_workers
    tmpl = copy.deepcopy(body["spec"]["template"])
    set_worker_gpus(tmpl["spec"], spec.gpus_per_worker)
    pod_set: dict[str, Any] = {"name": POD_SET, "count": count,
                               "template": {"metadata": tmpl.get("metadata") or {}, "spec": tmpl["spec"]}}
    if spec.min_workers < count:
        pod_set["minCount"] = spec.min_workers
    return {
        "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
        "kind": WORKLOAD_KIND,
        "metadata": {"name": workload_name(body), "namespace": md["namespace"],
                     "labels": {KUEUE_LABEL_QUEUE_NAME: queue_name(body) or ""},
                     "ownerReferences": [owner_reference(body)]},
        "spec": {"queueName": queue_name(body) or "", "podSets": [pod_set]},
    }


def _condition(wl: Mapping, kind: str) -> Mapping | None:
    for c in (wl.get("status") or {}).get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def admission_of(wl: Mapping | None) -> KueueAdmission:
    """Kueue's decision on the Workload ``wl`` (None: it does not exist yet). Admitted
    means condition ``Admitted=True`` and an admission naming the pod set's count (an
    older ``Evicted=True`` does not count once Kueue admits it again); a ``Finished``
    Workload is not admitted."""
    if wl is None:
        return KueueAdmission(False, reason="KueueWorkload", message="its Workload is being created")
    name = (wl.get("metadata") or {}).get("name", "")

    def said(kind: str) -> KueueAdmission | None:
        c = _condition(wl, kind)
        if c is None or c.get("status") != "True":
            return None
        return KueueAdmission(False, reason=f"Kueue{kind}", message=f"Kueue: Workload {name} {kind.lower()} "
                                                                   f"({c.get('reason', '')}: {c.get('message', '')})")

    if (done := said("Finished")) is not None:
        return done
    adm = _condition(wl, "Admitted")
    assigned = ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    count = next((a.get("count") for a in assigned if isinstance(a, Mapping) and a.get("name") == POD_SET), None)
    if adm is not None and adm.get("status") == "True" and assigned:
        if count is None:  # Kueue omits the count when it admits the pod set's own
            pod_sets = (wl.get("spec") or {}).get("podSets") or []
            count = next((p.get("count") for p in pod_sets if p.get("name") == POD_SET), 0)
        return KueueAdmission(True, workers=int(count))
    if (evicted := said("Evicted")) is not None:  # evicted and not admitted again (yet)
        return evicted
    quota = _condition(wl, "QuotaReserved")
    why = quota.get("message", "") if quota is not None else ""
    return KueueAdmission(False, reason="KueueAdmission",
                          message=f"waiting for Kueue to admit Workload {name} in LocalQueue "
                                  f"{(wl.get('spec') or {}).get('queueName', '')}" + (f": {why}" if why else ""))


def finished_condition(succeeded: bool, message: str, now: str) -> dict:
    """The ``Finished`` condition of the Workload of a job that ended (Kueue then
    releases its quota)."""
    return {"type": "Finished", "status": "True", "reason": "Succeeded" if succeeded else "Failed",
            "message": message[:32768], "lastTransitionTime": now}
