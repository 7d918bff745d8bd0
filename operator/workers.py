"""The worker pods of a job's generation: created towards ``status.targetWorkers``
under deterministic names (a duplicate is a 409), stopped with the grace period, and
let go through the worker-exit finalizer once their exit has been judged
(:func:`~rlsched.core.lifecycle.judge_stop`). Pods a TrainingJob controls whose job is
gone are deleted here too."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Mapping, Sequence

from kubernetes_asyncio.client.exceptions import ApiException

from rlsched.core import ClusterState
from rlsched.core.contract import FINALIZER_WORKER_EXIT, controlling_job
from rlsched.core.lifecycle import judge_stop

from .api import JobRejected, api_error, create_ignoring_conflict, permanent_rejection, read_json
from .job import ACTIVE, Job, pod_generation, worker_state
from .rbac import Rbac
from .resources import worker_pod
from .snapshot import charge_packed
from .status import StatusWriter, get_condition, parse_time, set_condition

log = logging.getLogger(__name__)

#: seconds after its grace period a stopped worker may take to report its exit
STOP_WAIT_S = 60.0


class Workers:
    """Creates, stops and releases the operator's worker pods."""

    def __init__(self, core: Any, status: StatusWriter, rbac: Rbac, metrics: Any, config: Any,
                 clock: Callable[[], float] = time.time) -> None:
        self.core, self.status, self.rbac, self.metrics, self.config, self.clock = \
            core, status, rbac, metrics, config, clock

    def assign(self, jobs: Mapping[str, Job], pods: Sequence[dict], ended: Sequence[dict]) -> list[dict]:
        """Give each job (by uid) the worker pods it controls, running (``pods``) and
        exited (``ended``); returns the orphans, pods whose TrainingJob is gone. A pod
        only labelled as a job's is nobody's."""
        orphans: list[dict] = []
        for p in pods:
            owner = controlling_job(p)
            if owner is None:
                continue
            md = p["metadata"]
            j = jobs.get(owner.uid)
            if j is not None and j.ns == md.get("namespace"):
                j.pods.append(p)
            elif self.config.namespace in (None, md.get("namespace")) and (
                    md.get("deletionTimestamp") is None or FINALIZER_WORKER_EXIT in (md.get("finalizers") or [])):
                orphans.append(p)
        for p in ended:
            owner = controlling_job(p)
            j = jobs.get(owner.uid) if owner is not None else None
            if j is not None and j.ns == p["metadata"].get("namespace"):
                j.finished.append(p)
            elif owner is not None and self.config.namespace in (None, p["metadata"].get("namespace")) and \
                    FINALIZER_WORKER_EXIT in (p["metadata"].get("finalizers") or []):
                orphans.append(p)  # its job is gone: nobody judges its exit
        return orphans

    async def delete_orphans(self, orphans: Sequence[dict]) -> None:
        """Delete (or, already going, let go of) each pod whose TrainingJob is gone; a
        failure is counted and retried next cycle."""
        for p in orphans:
            md = p["metadata"]
            try:
                if md.get("deletionTimestamp") is not None:  # already going: only let go of it
                    await self.release_pod(p)
                    continue
                await self.delete_pod(md["namespace"], md["name"], 0)
                log.info("deleted orphan pod %s/%s (its TrainingJob is gone)", md["namespace"], md["name"])
            except (ApiException, OSError, asyncio.TimeoutError) as exc:
                self.metrics.job_errors.labels(kind="transient").inc()
                log.warning("could not delete orphan pod %s/%s: %r", md["namespace"], md["name"], exc)

    async def stop(self, j: Job, grace: int | None = None) -> None:
        """Stop every live worker of the job, with ``grace`` (the grace period by default)."""
        for p in j.live_pods():
            await self.delete_pod(j.ns, p["metadata"]["name"], self.config.grace_period_s if grace is None else grace)

    async def delete_pod(self, ns: str, name: str, grace: int | None = None) -> None:
        """Delete a worker pod; at once (``grace`` 0: it already exited, or it is killed)
        its finalizer is removed first, so that a worker still held when found exited is
        one stopped with the grace period (:meth:`release_stopped` judges it)."""
        try:
            if grace == 0:
                await self.core.patch_namespaced_pod(
                    name, ns, {"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER_WORKER_EXIT]}},
                    _content_type="application/strategic-merge-patch+json")
            await self.core.delete_namespaced_pod(name, ns, grace_period_seconds=grace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def reconcile(self, j: Job, target: int) -> bool:
        """Bring the job's pods to workers ``0..target-1`` of its current generation;
        True when every one of them exists.

        Pods of an older generation (or with an index >= ``target``) are stopped first
        — SIGTERM with the grace period for a live one, at once for one that already
        exited — and the new generation is created only once they are gone (names and
        GPUs are reused, and the job never holds more than ``maxWorkers`` pods), and
        not before ``status.restartAfter`` (the backoff after a failure).
        ``target`` is clamped to the spec first. A pod the API server refuses for good
        raises :class:`JobRejected` (the job fails); a transient refusal sets condition
        ``PodsCreated=False`` and leaves the rest to the next cycle."""
        target = j.spec.clamp_workers(target)
        gen = j.generation
        old = False
        for p in j.all_pods():
            w = worker_state(p)
            if w is not None and w.generation == gen and w.index < target:
                continue
            old = True
            if p["metadata"].get("deletionTimestamp") is None:
                finished = w is None or w.finished
                await self.delete_pod(j.ns, p["metadata"]["name"], 0 if finished else self.config.grace_period_s)
        if old:
            return False  # the new generation starts once the old one is gone
        after = parse_time(j.status.get("restartAfter"))
        if after is not None and self.clock() < after:
            return False
        have = {w.index for w in j.workers() if w.generation == gen and not w.stopping}
        missing = [idx for idx in range(target) if idx not in have]
        if missing:
            await self.rbac.ensure(j)  # idempotent; the pods run under the job's account
            await self.rbac.ensure_service(j)  # the workers' stable names
        for idx in missing:
            try:
                pod = worker_pod(j.body, idx, j.spec.gpus_per_worker,
                                 scheduler_name=self.config.scheduler_name, grace_period_s=self.config.grace_period_s,
                                 gang_size=target, generation=gen, batch_size=j.batch_size,
                                 gpu_type=j.gpu_type, gpu_types=self.config.gpu_types,
                                 # a generation's whole gang ran: a checkpoint may exist
                                 resume=j.status.get("startedGeneration") is not None)
            except ValueError as exc:  # WorkerGPUError, ShapeError: the template cannot make a worker
                raise JobRejected("Valid", "InvalidSpec", str(exc)) from exc
            name = pod["metadata"]["name"]
            try:
                created = await create_ignoring_conflict(self.core.create_namespaced_pod(j.ns, pod))
            except ApiException as exc:
                reason, message = api_error(exc)
                if permanent_rejection(exc.status, message):
                    raise JobRejected("PodsCreated", reason,
                                      f"the API server refused worker pod {name} ({exc.status} {reason}): {message}") from exc
                self.metrics.job_errors.labels(kind="transient").inc()
                await self.pods_pending(j, reason, f"creating worker pod {name} failed ({exc.status} {reason}): "
                                                    f"{message}; retried next cycle")
                return False
            if created:
                j.pods.append(pod)
            else:
                await self.clear_finished(j.ns, name)
                return False
        old_cond = get_condition(j.status.get("conditions"), "PodsCreated")
        if missing and old_cond and old_cond.get("status") != "True":
            await self.status.patch(j, {"conditions": set_condition(
                j.status.get("conditions"), "PodsCreated", "True", "Created", f"workers 0..{target - 1} exist",
                self.clock())})
        return True

    async def pods_pending(self, j: Job, reason: str, message: str) -> None:
        """Condition ``PodsCreated=False`` (and a Warning Event when it changes)."""
        old = get_condition(j.status.get("conditions"), "PodsCreated")
        if old and old.get("status") == "False" and old.get("reason") == reason:
            log.warning("%s: %s", j.key, message)
            return
        await self.status.patch(j, {"conditions": set_condition(
            j.status.get("conditions"), "PodsCreated", "False", reason, message, self.clock())})
        await self.status.event(j.body, "PodsNotCreated", message, "Warning")

    async def clear_finished(self, ns: str, name: str) -> None:
        """A worker name is taken by a pod that already finished (Succeeded/Failed):
        delete it so the worker can be created again next cycle."""
        try:
            old = await read_json(self.core.read_namespaced_pod(name, ns, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        if (old.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            await self.delete_pod(ns, name, 0)
            log.info("deleted finished worker %s/%s to recreate it", ns, name)

    async def release_stopped(self, j: Job, now: float) -> None:
        """Judge the exits of the job's workers being deleted that have exited
        (:func:`~rlsched.core.lifecycle.judge_stop`: an unclean stop is shown as a
        Warning Event and condition ``StopUnclean=True``, never counted), then remove
        their finalizer so that they go. A worker that never started (not bound, or
        Pending) goes at once; one still not exited :data:`STOP_WAIT_S` after its grace
        period (its node is gone) is let go unjudged."""
        active = j.status.get("phase") in ACTIVE
        gone: set[str] = set()
        for p in j.all_pods():
            md = p["metadata"]
            if md.get("deletionTimestamp") is None or FINALIZER_WORKER_EXIT not in (md.get("finalizers") or []):
                continue
            w = worker_state(p)
            started = bool((p.get("spec") or {}).get("nodeName")) and w is not None and w.phase != "Pending"
            if w is not None and not w.finished and started:
                if now < (parse_time(md["deletionTimestamp"]) or now) + STOP_WAIT_S:
                    continue
                log.warning("%s: worker %s not exited %.0fs after its grace period; let go unjudged",
                            j.key, md["name"], STOP_WAIT_S)
            v = judge_stop(w, generation=j.generation, active=active) if w is not None else None
            if v is not None:
                old = get_condition(j.status.get("conditions"), "StopUnclean")
                if not v.clean or (old is not None and old.get("status") == "True"):
                    await self.status.patch(j, {"conditions": set_condition(
                        j.status.get("conditions"), "StopUnclean", "False" if v.clean else "True", v.reason,
                        v.message, now)})
                if not v.clean:
                    self.metrics.unclean_stops.inc()
                    await self.status.event(j.body, "StopUnclean", v.message, "Warning")
            if await self.release_pod(p):
                gone.add(md["name"])
        if gone:  # released pods that were being deleted are gone: the next generation may start now
            j.pods = [p for p in j.pods if p["metadata"]["name"] not in gone]
            j.finished = [p for p in j.finished if p["metadata"]["name"] not in gone]

    async def release_pod(self, pod: Mapping) -> bool:
        """Remove the operator's finalizer from a worker pod (a JSON patch that tests the
        list first, so no one else's finalizer is lost); True when it is off."""
        md = pod["metadata"]
        have = list(md.get("finalizers") or [])
        if FINALIZER_WORKER_EXIT not in have:
            return True
        patch = [{"op": "test", "path": "/metadata/finalizers", "value": have},
                 {"op": "replace", "path": "/metadata/finalizers",
                  "value": [f for f in have if f != FINALIZER_WORKER_EXIT]}]
        try:
            await self.core.patch_namespaced_pod(md["name"], md["namespace"], patch,
                                                 _content_type="application/json-patch+json")
        except ApiException as exc:
            if exc.status == 404:
                return True
            if exc.status in (409, 422):  # changed since it was listed: next cycle
                return False
            raise
        return True


def hold_restarting(jobs: Sequence[Job] | Any, listed: Mapping[str, int], state: ClusterState,
                    target: Callable[[Job], int], node_index: Mapping[str, int] | None = None) -> None:
    """A Starting or Running job whose generation is being replaced (the old workers
    gone, the new not all created yet, a failed generation waiting out its backoff)
    still holds its GPUs: charge the workers (of ``target(job)``) its listed pods do
    not hold where it last ran, else packed on nodes of the GPU models it may use
    (:func:`~rlsched.operator.snapshot.charge_packed`), so that admission and scaling
    do not give them away between two generations (found by the twin check) and a
    small job does not take the whole nodes a large gang needs. Mutates ``state``."""
    index = node_index or {}
    for j in jobs:
        if j.spec is None or j.status.get("phase") not in ("Starting", "Running"):
            continue
        done = sum(1 for w in j.workers() if w.generation == j.generation and w.finished and not w.stopping)
        missing = target(j) - listed.get(j.key, 0) - done
        if missing <= 0:
            continue
        ran = sorted(j.finished, key=pod_generation, reverse=True)  # the latest generation's nodes first
        prefer = [index[n] for p in ran if (n := (p.get("spec") or {}).get("nodeName")) in index]
        charge_packed(state, missing, j.spec.gpus_per_worker, prefer=list(dict.fromkeys(prefer)),
                      models=j.spec.gpu_models)
