"""The TrainingJob's status as the operator writes and trusts it: merge patches that
keep the operator's record of the fields it owns, conditions, Events, and
:func:`guard_status`, which bounds what anyone else wrote there before the operator
acts on it."""

from __future__ import annotations

import copy
import json
import logging
import math
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from kubernetes_asyncio.client.exceptions import ApiException

from rlsched.core.contract import ANNOTATION_EVENT_TIME as EVENT_TIME_ANNOTATION
from rlsched.core.contract import API_VERSION, GROUP, KIND, PLURAL, VERSION
from rlsched.core.lifecycle import BACKOFF_CAP_S
from rlsched.core.live_allocation import attained_service
from rlsched.core.planning import TrainingSpec

from .api import MERGE
from .job import Job

log = logging.getLogger(__name__)

#: status fields only the operator writes and then acts on (see "What the operator
#: trusts" in docs/design-notes.md); its last written value of each is its record
OWNED_FIELDS = ("phase", "targetWorkers", "queue", "queuedTime", "admittedTime", "startTime", "rlpto",
                "restartGeneration", "startedGeneration", "failures", "restartAfter", "batchSize",
                "attainedGpuSeconds", "attainedSince", "goodput", "queueName", "allocatedGeneration",
                "restartStall")
TIME_FIELDS = ("queuedTime", "admittedTime", "startTime", "attainedSince")
#: clock skew tolerated between the operator, the API server and earlier operators
SKEW_S = 300.0


def parse_time(s: str | None) -> float | None:
    if not s:
        return None
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def format_time(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def get_condition(conditions: Any, ctype: str) -> dict | None:
    """The condition of type ``ctype`` in a status' ``conditions`` (None if absent)."""
    if not isinstance(conditions, list):
        return None
    return next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == ctype), None)


def set_condition(conditions: list[dict] | None, ctype: str, status: str, reason: str, message: str, now: float) -> list[dict]:
    """Upsert one condition; keeps lastTransitionTime when the status did not change.
    Entries that are not objects are dropped."""
    conditions = [c for c in conditions if isinstance(c, Mapping)] if isinstance(conditions, list) else []
    out = [dict(c) for c in conditions if c.get("type") != ctype]
    old = get_condition(conditions, ctype)
    ltt = old.get("lastTransitionTime") if old and old.get("status") == status else format_time(now)
    out.append({"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": ltt})
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` after a JSON merge patch (RFC 7386): objects merge key by key, null
    deletes, anything else replaces. Neither argument is modified."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def merge_diff(current: Any, wanted: Any) -> Any:
    """The merge patch turning ``current`` into ``wanted`` (None: delete the field)."""
    if isinstance(wanted, Mapping) and isinstance(current, Mapping):
        out: dict = {k: None for k in current if k not in wanted}
        for k, v in wanted.items():
            if current.get(k) != v:
                out[k] = merge_diff(current.get(k), v)
        return out
    return copy.deepcopy(wanted)


def stored(v: Any) -> Any:
    """``v`` as the API server keeps it after a merge patch (null members dropped)."""
    return merge_patch(None, v) if isinstance(v, Mapping) else v


def _time(v: Any) -> float | None:
    if not isinstance(v, str):
        return None
    try:
        return parse_time(v)
    except ValueError:
        return None


def guard_status(
    status: Mapping,
    record: Mapping | None,
    spec: TrainingSpec | None,
    *,
    created: float | None,
    now: float,
    live_workers: int | None = None,
    start_timeout_s: float | None = None,
) -> tuple[dict, dict]:
    """The status the operator acts on, and the fields it must write back.

    ``record`` is the operator's own last written value of each of
    :data:`OWNED_FIELDS` (None when it has none: adopt ``status``). Returns
    ``(trusted, changed)``: ``trusted`` is ``status`` with every owned field as
    recorded, then bounded by the spec (``targetWorkers`` in ``[minWorkers,
    maxWorkers]``, ``Starting`` too: the allocator starts jobs at any size in it);
    ``batchSize`` a whole number >= 1 (else the spec's); ``attainedGpuSeconds`` a finite
    number >= 0; times within ``[creation, now]`` give or take :data:`SKEW_S`); adopted without a record, ``Starting``/``Running`` needs a
    worker pod the job controls, running, terminating or exited, or a generation being
    replaced (``live_workers``), else the job is ``Queued`` again (admitted anew: at
    worst a delay) — except ``Starting`` admitted less than ``start_timeout_s`` ago: an
    admission recorded before its pods were created, finished (the gang start timeout
    bounds it as any start). ``changed`` maps each field whose trusted value
    differs from the status to ``(status value, trusted value)``.
    """
    st = copy.deepcopy(dict(status))
    if record is not None:
        for k in OWNED_FIELDS:
            if k in record:
                if record[k] is None:
                    st.pop(k, None)
                else:
                    st[k] = copy.deepcopy(record[k])
    elif st.get("phase") in ("Starting", "Running") and live_workers == 0:
        admitted = _time(st.get("admittedTime")) if st.get("phase") == "Starting" else None
        if admitted is None or start_timeout_s is None or not -SKEW_S <= now - admitted <= start_timeout_s:
            st["phase"], st["targetWorkers"] = "Queued", 0
    phase = st.get("phase")
    if spec is not None:
        if phase in ("Starting", "Running"):
            st["targetWorkers"] = spec.clamp_workers(st.get("targetWorkers"))
    for k in ("restartGeneration", "startedGeneration", "failures", "allocatedGeneration"):
        v = st.get(k)
        if k in st and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            st[k] = 0
    v = st.get("batchSize")
    if "batchSize" in st and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        st.pop("batchSize")
    v = st.get("attainedGpuSeconds")
    if "attainedGpuSeconds" in st and attained_service(v, None, 0, now) != v:
        st["attainedGpuSeconds"] = 0.0
    if "goodput" in st and not isinstance(st["goodput"], Mapping):
        st.pop("goodput")
    if "restartStall" in st and stall_seconds(st["restartStall"]) is None:
        st.pop("restartStall")
    if "restartAfter" in st:
        t = _time(st["restartAfter"])
        if t is None:
            st.pop("restartAfter")
        elif t > now + BACKOFF_CAP_S + SKEW_S:
            st["restartAfter"] = format_time(now + BACKOFF_CAP_S)
    for k in TIME_FIELDS:
        if k not in st:
            continue
        t = _time(st[k])
        if t is None:
            st.pop(k)
        elif t > now + SKEW_S:
            st[k] = format_time(now)
        elif created is not None and t < created - SKEW_S:
            st[k] = format_time(created)
    changed = {k: (status.get(k), st.get(k)) for k in OWNED_FIELDS if stored(status.get(k)) != stored(st.get(k))}
    return st, changed


def stall_seconds(record: Any) -> float | None:
    """The seconds of a ``status.restartStall`` record (``{generation, seconds}``);
    None when it is not one."""
    if not isinstance(record, Mapping):
        return None
    gen, sec = record.get("generation"), record.get("seconds")
    if isinstance(gen, bool) or not isinstance(gen, int) or gen < 0:
        return None
    if isinstance(sec, bool) or not isinstance(sec, (int, float)) or not (math.isfinite(sec) and sec >= 0):
        return None
    return float(sec)


def restart_stall(status: Mapping, generation: int, now: float) -> dict | None:
    """The ``status.restartStall`` to write, or None (nothing new): the seconds from
    the job's last new allocation (``attainedSince``, for the generation in
    ``allocatedGeneration``) to the first progress report of that generation, the
    stall the allocator charges a move of it. The report's time is the trainer's;
    taken at most ``now`` (when the operator saw it), a trainer can only understate
    its own stall."""
    if status.get("allocatedGeneration") != generation:
        return None
    old = status.get("restartStall")
    if isinstance(old, Mapping) and old.get("generation") == generation:
        return None
    prog = status.get("progress")
    since = _time(status.get("attainedSince"))
    if not isinstance(prog, Mapping) or prog.get("generation") != generation or since is None:
        return None
    seen = _time(prog.get("updateTime"))
    if seen is None:
        return None
    return {"generation": generation, "seconds": round(max(0.0, min(seen, now) - since), 3)}


def short(v: Any) -> str:
    """A status value for a message, at most 60 characters."""
    text = json.dumps(v, sort_keys=True, default=str) if v is not None else "(unset)"
    return text if len(text) <= 60 else text[:57] + "..."


class StatusWriter:
    """Writes the jobs' status and Events, keeping per job the operator's last written
    value of each of :data:`OWNED_FIELDS` (its record)."""

    def __init__(self, custom: Any, core: Any, metrics: Any, clock: Callable[[], float] = time.time) -> None:
        self.custom, self.core, self.metrics, self.clock = custom, core, metrics, clock
        #: job uid -> the operator's last written value of each of OWNED_FIELDS
        self.record: dict[str, dict[str, Any]] = {}

    async def patch(self, job: Job | Mapping, patch: dict, *, forget_on_error: bool = True) -> None:
        """Merge-patch the job's status and keep the record of the owned fields written.
        A failed patch (other than 404: the job is gone) forgets the record
        (``forget_on_error``), since what the status now holds is unknown; the next
        cycle adopts it within bounds."""
        body = job.body if isinstance(job, Job) else job
        md = body["metadata"]
        uid = md.get("uid")
        try:
            await self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, md["namespace"], PLURAL, md["name"], {"status": patch}, _content_type=MERGE
            )
        except ApiException as exc:
            if exc.status != 404:
                if forget_on_error:
                    self.record.pop(uid, None)
                raise
        except BaseException:
            if forget_on_error:
                self.record.pop(uid, None)
            raise
        rec = self.record.get(uid)
        if rec is not None:
            for k in OWNED_FIELDS:
                if k in patch:
                    rec[k] = stored(merge_patch({k: rec.get(k)}, {k: patch[k]}).get(k))
        body["status"] = merge_patch(body.get("status") or {}, patch)

    async def event(self, body: Mapping, reason: str, message: str, type_: str = "Normal") -> None:
        """Post a core/v1 Event on the TrainingJob (every decision gets one)."""
        md = body["metadata"]
        now = format_time(self.clock())
        ev = {
            "metadata": {"name": f"{md['name']}.{uuid.uuid4().hex[:12]}", "namespace": md["namespace"],
                         # sub-second order of decisions (event timestamps have 1 s resolution)
                         "annotations": {EVENT_TIME_ANNOTATION: f"{time.time():.6f}"}},
            "involvedObject": {
                "apiVersion": API_VERSION, "kind": KIND, "name": md["name"],
                "namespace": md["namespace"], "uid": md["uid"],
            },
            "reason": reason, "message": message[:1000], "type": type_,
            "source": {"component": "rlsched-operator"},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await self.core.create_namespaced_event(md["namespace"], ev)
        except ApiException as exc:  # events are best-effort, but never silent
            log.warning("could not post event %s on %s: %s", reason, md["name"], exc.reason)
        log.log(logging.WARNING if type_ == "Warning" else logging.INFO,
                "%s/%s %s: %s", md["namespace"], md["name"], reason, message)

    async def trust(self, j: Job, now: float, *, start_timeout_s: float) -> None:
        """Replace the job's status by what the operator may act on
        (:func:`guard_status`); write back and report fields someone else changed."""
        rec = self.record.get(j.uid)
        created = parse_time(j.body["metadata"].get("creationTimestamp"))
        # workers that already exited count too: a job whose chief just finished is
        # judged (Succeeded), not queued and run again by an operator with no record;
        # so do the pods of a Running job whose generation is being replaced (the old
        # ones stopped, terminating or gone, the new ones not created yet: the status
        # says so with restartGeneration > startedGeneration), or the operator that
        # takes over would queue it and take its resize again
        ran = len(j.pods) + sum(1 for p in j.finished if p["metadata"].get("deletionTimestamp") is None)
        started = j.status.get("startedGeneration")
        if (rec is None and j.status.get("phase") == "Running" and isinstance(started, int)
                and j.generation > started):
            ran += 1
        trusted, changed = guard_status(j.status, rec, j.spec, created=created, now=now, live_workers=ran,
                                        start_timeout_s=start_timeout_s)
        if rec is None:
            self.record[j.uid] = {k: stored(trusted.get(k)) for k in OWNED_FIELDS}
        if changed:
            status = j.status
            patch = {k: merge_diff(status.get(k), trusted.get(k)) if isinstance(status.get(k), Mapping)
                     and isinstance(trusted.get(k), Mapping) else trusted.get(k) for k in changed}
            self.metrics.status_resets.inc(len(changed))
            # the record holds what the status must say whether or not this write lands
            await self.patch(j, patch, forget_on_error=False)
            what = ", ".join(f"{k} {short(old)} -> {short(new)}" for k, (old, new) in sorted(changed.items()))
            await self.event(j.body, "StatusReset",
                             f"status fields the operator acts on were not as it left them or out of bounds; "
                             f"restored: {what}", "Warning")
        j.body["status"] = trusted
