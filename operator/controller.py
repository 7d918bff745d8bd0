"""The control loop: one cycle reads the cluster, decides with the pure planners, acts.

State lives in the API server, not in this process: the job's phase, queue, intended
worker count (``status.targetWorkers``), dynamic priority and RLPTO state are all in
the TrainingJob's status, worker pods have deterministic names, and every cycle
reconciles pods towards ``targetWorkers``. An operator killed at any point and
restarted therefore picks up where it stopped: a half-created gang is completed (or
timed out), a scale step whose pod was not yet created is created, and a duplicate is
impossible (409 Conflict on the same name). Pods, ServiceAccounts, Roles and
RoleBindings whose TrainingJob is gone are deleted by the loop as well as by the
garbage collector (ownerReferences), so nothing is orphaned on control planes without
a kube-controller-manager either.

Each component writes only its own status fields: the operator merge-patches phase,
queue, workers, conditions, timing and ``rlpto``; ``status.progress`` belongs to the
job's chief (``rlsched.trainer.report``).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Mapping

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rlsched.core import Progress, make_ordering, make_scaling
from rlsched.core.contract import ANNOTATION_EVENT_TIME as EVENT_TIME_ANNOTATION
from rlsched.core.contract import ANNOTATION_PRIORITY_REQUESTS as REQUESTS_ANNOTATION
from rlsched.core.contract import API_VERSION, DEFAULT_SCHEDULER_NAME, GROUP, KIND, LABEL_INDEX, LABEL_JOB, PLURAL, VERSION
from rlsched.core.contract import POD_SECURITY_BASELINE
from rlsched.core.planning import (
    Admission,
    AdmissionPlan,
    DynamicPriority,
    ElasticState,
    QueueEntry,
    RunningEntry,
    RunningJob,
    ScalingPlanner,
    TrainingSpec,
)
from rlsched.core.policy import ORDERINGS, SCALINGS

from .metrics import OperatorMetrics
from .podsecurity import POD_SECURITY_REASON, PodSecurityGate
from .resources import trainer_rbac, worker_pod
from .snapshot import build_snapshot
from .spec import SpecError, parse_spec

__all__ = ["OperatorConfig", "Controller", "REQUESTS_ANNOTATION", "parse_time", "format_time"]

log = logging.getLogger(__name__)

MERGE = "application/merge-patch+json"
ACTIVE = ("Queued", "Starting", "Running")


@dataclass
class OperatorConfig:
    """Everything the operator can be told; the CLI fills it from flags."""

    kubeconfig: str | None = None
    namespace: str | None = None
    cycle_s: float = 5.0
    start_timeout_s: float = 120.0
    grace_period_s: int = 30
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    ordering: str = "fifo"
    ordering_model: str | None = None
    #: "auto": the learned RLPTO policy when ``scaling_model`` is set, else "beta"
    scaling: str = "auto"
    scaling_model: str | None = None
    patience: int = 5
    mu: float = 0.1
    promote_at: float = 1.0
    demote_at: float = -1.0
    backfill: bool = False
    preemption: bool = True
    metrics_port: int | None = 9090
    peering: str | None = None
    priority: int = 0
    forecast_interval_s: float = 3600.0
    forecast_configmap: str = "rlsched-forecast"
    forecast_namespace: str = "default"
    gru_model: str | None = None
    sweep_every: int = 10
    #: API calls for different jobs in flight at once within a cycle
    parallelism: int = 16
    #: Pod Security Standard of worker templates in namespaces without a
    #: pod-security.kubernetes.io/enforce label (operator/podsecurity.py)
    pod_security_level: str = POD_SECURITY_BASELINE
    #: let every namespace's templates read Secrets (else only namespaces labelled so)
    allow_secret_mounts: bool = False


def parse_time(s: str | None) -> float | None:
    if not s:
        return None
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def format_time(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def job_key(body: Mapping) -> str:
    md = body["metadata"]
    return f"{md['namespace']}/{md['name']}"


def progress_of(status: Mapping) -> Progress:
    p = status.get("progress") or {}
    loss = p.get("loss")
    ml = p.get("maxLoss")
    return Progress(
        epoch=int(p.get("epoch", 0) or 0),
        loss=float("nan") if loss is None else float(loss),
        max_loss=float("nan") if ml is None else float(ml),
        accuracy=float(p.get("accuracy", 0.0) or 0.0),
        history=[float(x) for x in p.get("history") or []],
    )


def set_condition(conditions: list[dict] | None, ctype: str, status: str, reason: str, message: str, now: float) -> list[dict]:
    """Upsert one condition; keeps lastTransitionTime when the status did not change."""
    out = [dict(c) for c in conditions or [] if c.get("type") != ctype]
    old = next((c for c in conditions or [] if c.get("type") == ctype), None)
    ltt = old.get("lastTransitionTime") if old and old.get("status") == status else format_time(now)
    out.append({"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": ltt})
    return out


def requests_count(body: Mapping) -> int:
    v = ((body.get("metadata") or {}).get("annotations") or {}).get(REQUESTS_ANNOTATION, "0")
    try:
        return int(v)
    except ValueError:
        return 0


def _model_kwargs(factory, model: str | None) -> dict:
    """Pass a weights file under the name the policy factory takes (``path``/``model``)."""
    if not model:
        return {}
    import inspect

    params = inspect.signature(factory).parameters
    for key in ("path", "model"):
        if key in params:
            return {key: model}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"model": model}
    raise ValueError(f"policy {factory!r} takes no weights file")


def build_scaling(name: str, model: str | None):
    """The core scaling policy (``rlpto`` with its weights file, ``beta``, ...)."""
    if name == "auto":
        name = "rlpto" if model else "beta"
    make_scaling("none")  # loads the builtin policy modules
    factory = SCALINGS.get(name.lower())
    policy = make_scaling(name, **(_model_kwargs(factory, model) if factory else {}))
    if policy.fallback_reason:
        log.warning("scaling %s: %s", name, policy.fallback_reason)
    return policy


def build_ordering(name: str, model: str | None):
    """The core ordering policy (``fifo``, ``sjf``, ``das`` with its weights file, ...)."""
    make_ordering("fifo")  # loads the builtin policy modules
    factory = ORDERINGS.get(name.lower())
    return make_ordering(name, **(_model_kwargs(factory, model) if factory else {}))


@dataclass
class _Job:
    """One TrainingJob as read this cycle."""

    body: dict
    spec: TrainingSpec | None
    error: str | None
    pods: list[dict] = field(default_factory=list)

    @property
    def key(self) -> str:
        return job_key(self.body)

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    @property
    def ns(self) -> str:
        return self.body["metadata"]["namespace"]

    @property
    def status(self) -> dict:
        return self.body.get("status") or {}

    def live_pods(self) -> list[dict]:
        return [p for p in self.pods if p["metadata"].get("deletionTimestamp") is None
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


class Controller:
    """Runs the admission/scaling cycle against one API server."""

    def __init__(
        self,
        config: OperatorConfig,
        api: client.ApiClient,
        metrics: OperatorMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.api = api
        self.metrics = metrics
        self.clock = clock
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.priority = DynamicPriority(config.mu, config.promote_at, config.demote_at)
        self.queues = Admission(
            build_ordering(config.ordering, config.ordering_model),
            backfill=config.backfill,
            preemption=config.preemption,
            start_timeout_s=config.start_timeout_s,
        )
        self.planner = ScalingPlanner(build_scaling(config.scaling, config.scaling_model), patience=config.patience)
        self.pod_security = PodSecurityGate(self.core, self.read_json, config)
        self.cycles = 0
        self.last_plan: AdmissionPlan | None = None

    # ------------------------------------------------------------------ API helpers
    async def read_json(self, coro) -> Any:
        """Await a ``_preload_content=False`` call and decode its JSON body (raw dicts,
        camelCase, as the pure modules expect); HTTP errors raise ApiException."""
        resp = await coro
        try:
            if resp.status >= 400:
                raise ApiException(status=resp.status, reason=f"{resp.reason}: {(await resp.text())[:300]}")
            return await resp.json()
        finally:
            resp.release()

    async def list_jobs(self) -> list[dict]:
        ns = self.config.namespace
        if ns:
            call = self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _preload_content=False)
        else:
            call = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, _preload_content=False)
        return (await self.read_json(call))["items"]

    async def patch_status(self, job: _Job | Mapping, patch: dict) -> None:
        body = job.body if isinstance(job, _Job) else job
        md = body["metadata"]
        try:
            await self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, md["namespace"], PLURAL, md["name"], {"status": patch}, _content_type=MERGE
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        body.setdefault("status", {}).update(patch)

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
        log.info("%s/%s %s: %s", md["namespace"], md["name"], reason, message)

    async def create_ignoring_conflict(self, coro) -> bool:
        try:
            await coro
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    async def delete_pod(self, ns: str, name: str, grace: int | None = None) -> None:
        try:
            await self.core.delete_namespaced_pod(name, ns, grace_period_seconds=grace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    # ------------------------------------------------------------------ the cycle
    async def run(self, stop: asyncio.Event, is_leader: Callable[[], Any] | None = None) -> None:
        """Cycle every ``cycle_s`` until ``stop`` is set; API errors are logged and retried."""
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                if is_leader is None or await is_leader():
                    await self.cycle()
            except ApiException as exc:
                log.error("cycle failed: API %s %s", exc.status, exc.reason)
            except (OSError, asyncio.TimeoutError) as exc:
                log.error("cycle failed: %r", exc)
            except Exception:  # a bug must not stop scheduling for good: log it loudly, retry
                log.exception("cycle failed with an unexpected error")
            wait = max(0.0, self.config.cycle_s - (time.monotonic() - t0))
            try:
                await asyncio.wait_for(stop.wait(), timeout=wait)
            except asyncio.TimeoutError:
                pass

    async def cycle(self) -> None:
        now = self.clock()
        self.cycles += 1
        bodies, pods_all, nodes = await asyncio.gather(
            self.list_jobs(),
            self.read_json(self.core.list_pod_for_all_namespaces(
                field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False)),
            self.read_json(self.core.list_node(_preload_content=False)),
        )
        pods = pods_all["items"]
        snap = build_snapshot(nodes["items"], pods, time=now)
        jobs: dict[str, _Job] = {}
        for b in bodies:
            try:
                spec, err = parse_spec(b.get("spec"), scheduler_name=self.config.scheduler_name), None
            except SpecError as exc:
                spec, err = None, str(exc)
            jobs[job_key(b)] = _Job(b, spec, err)
        uids = {b["metadata"]["uid"] for b in bodies}
        for p in pods:
            md = p["metadata"]
            job = (md.get("labels") or {}).get(LABEL_JOB)
            if not job:
                continue
            j = jobs.get(f"{md['namespace']}/{job}")
            owners = {o.get("uid") for o in md.get("ownerReferences") or []}
            if j is None or not owners & uids:
                if self.config.namespace in (None, md["namespace"]):
                    await self.delete_pod(md["namespace"], md["name"], 0)
                    log.info("deleted orphan pod %s/%s", md["namespace"], md["name"])
                continue
            j.pods.append(p)

        waiting: list[QueueEntry] = []
        running: list[RunningJob] = []
        holders: list[RunningEntry] = []

        async def observe(j: _Job) -> None:
            phase = j.status.get("phase")
            if not phase and j.spec is not None:
                return  # the create handler has not enqueued it yet
            if phase and phase not in ACTIVE:
                for p in j.live_pods():
                    await self.delete_pod(j.ns, p["metadata"]["name"], self.config.grace_period_s)
                return
            if j.spec is None:
                await self.fail(j, "InvalidSpec", j.error or "invalid spec", now)
                return
            refusal = await self.pod_security.check(j.body, self.cycles)
            if refusal is not None and (refusal.final or phase == "Queued"):
                if refusal.final:
                    await self.fail(j, POD_SECURITY_REASON, refusal.message, now)
                return  # else its namespace is unreadable: not admitted until it can be checked
            if phase == "Queued":
                waiting.append(await self._queue_entry(j, now))
            elif phase == "Starting":
                await self._starting(j, now)
            if j.status.get("phase") == "Running":
                running.append(await self._running(j, snap.placement.get(j.key, []), now))
            if j.status.get("phase") in ("Starting", "Running"):
                holders.append(RunningEntry(
                    key=j.key, spec=j.spec,
                    priority=float(j.status.get("effectivePriority", j.spec.priority_value)),
                    start_time=parse_time(j.status.get("admittedTime")) or now,
                    placement=snap.placement.get(j.key, []),
                ))

        # jobs are independent here: observe them concurrently (bounded), then decide
        # on the whole picture in a fixed order
        await self._each(observe, jobs.values())
        order = {k: i for i, k in enumerate(jobs)}
        for lst in (waiting, running, holders):
            lst.sort(key=lambda e: order[e.key])

        plan = self.queues.plan(waiting, holders, snap.state, snap.releasing)
        self.last_plan = plan
        for key in plan.preempt:
            await self.preempt(jobs[key], plan.blocked or "", now)
        if plan.preempt and plan.blocked:
            # the preemptor is served before every queue until it starts (like a nominated pod)
            await self.patch_status(jobs[plan.blocked], {"nominated": True})
        await self._each(lambda key: self.admit(jobs[key], now), plan.admit)

        running = [r for r in running if r.key not in plan.preempt]
        splan = self.planner.plan(running, snap.state, reserved_gpus=plan.waiting_gpus if plan.blocked else 0)

        async def act(rj: RunningJob) -> None:
            j = jobs[rj.key]
            if rj.key in splan.finished:
                await self.complete(j, rj, splan.finished[rj.key], now)
                return
            d = splan.deltas.get(rj.key, 0)
            patch: dict[str, Any] = {}
            rl = rj.state.to_status()
            if rl != j.status.get("rlpto"):
                patch["rlpto"] = rl
            if d:
                target = rj.workers + d
                patch["targetWorkers"] = target
                self.metrics.scaling_decisions.labels(direction="up" if d > 0 else "down").inc()
                await self.patch_status(j, patch)
                await self.event(j.body, "ScaledUp" if d > 0 else "ScaledDown",
                                 f"workers {rj.workers} -> {target} (accuracy gain {rj.state.gain:.4g}, beta {rj.spec.beta})")
                await self.reconcile_pods(j, target)
            elif patch:
                await self.patch_status(j, patch)

        await self._each(act, running)
        if self.config.sweep_every and self.cycles % self.config.sweep_every == 1:
            await self.sweep_rbac(uids)
        self._metrics(jobs, plan)

    async def _each(self, fn, items) -> None:
        """Run ``fn(item)`` for every item, at most ``config.parallelism`` at a time;
        the first error is raised after all have finished."""
        sem = asyncio.Semaphore(max(1, self.config.parallelism))

        async def one(item):
            async with sem:
                await fn(item)

        results = await asyncio.gather(*(one(i) for i in items), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    # ------------------------------------------------------------------ per phase
    async def _queue_entry(self, j: _Job, now: float) -> QueueEntry:
        st = j.status
        pr = float(st.get("effectivePriority", j.spec.priority_value))
        seen = int(st.get("priorityRequestsSeen", 0))
        total = requests_count(j.body)
        interrupted = st.get("queue") == "interrupt"
        if total != seen:
            pr, seen = self.priority.update(pr, total, seen)
        queue = self.priority.queue(j.spec.priority_class, pr, interrupted)
        if queue != st.get("queue") or pr != st.get("effectivePriority") or seen != st.get("priorityRequestsSeen"):
            old = st.get("queue")
            await self.patch_status(j, {"queue": queue, "effectivePriority": pr, "priorityRequestsSeen": seen})
            if old and queue != old:
                await self.event(j.body, "Promoted" if queue == "urgent" else "Demoted",
                                 f"priority {pr:.3g}: queue {old} -> {queue}")
        submit = parse_time(st.get("queuedTime")) or parse_time(j.body["metadata"].get("creationTimestamp")) or now
        return QueueEntry(key=j.key, spec=j.spec, submit_time=submit, priority=pr, queue=queue,
                          nominated=bool(st.get("nominated")))

    async def _starting(self, j: _Job, now: float) -> None:
        target = int(j.status.get("targetWorkers") or j.spec.min_workers)
        await self.reconcile_pods(j, target)
        live = j.live_pods()
        running = [p for p in live if (p.get("status") or {}).get("phase") == "Running"]
        if len(running) >= target:
            created = parse_time(j.body["metadata"].get("creationTimestamp")) or now
            queued = parse_time(j.status.get("queuedTime")) or created
            wait = max(0.0, (parse_time(j.status.get("admittedTime")) or now) - queued)
            await self.patch_status(j, {
                "phase": "Running", "startTime": format_time(now), "workers": len(live),
                "readyWorkers": len(running), "admissionWaitSeconds": wait,
                "conditions": set_condition(j.status.get("conditions"), "Running", "True", "GangStarted",
                                            f"all {target} workers running", now),
            })
            await self.event(j.body, "Started", f"gang of {target} workers running after {wait:.1f}s in the queue")
            return
        admitted = parse_time(j.status.get("admittedTime")) or now
        if self.queues.start_timed_out(admitted, now):
            for p in j.pods:
                await self.delete_pod(j.ns, p["metadata"]["name"], 0)
            j.pods = []
            await self.patch_status(j, {
                "phase": "Queued", "workers": 0, "readyWorkers": 0, "targetWorkers": 0,
                "conditions": set_condition(j.status.get("conditions"), "Running", "False", "GangTimeout",
                                            f"{target - len(running)} of {target} workers still not running after "
                                            f"{self.config.start_timeout_s:.0f}s; requeued", now),
            })
            await self.event(j.body, "GangTimeout", f"only {len(running)}/{target} workers running; pods deleted, requeued", "Warning")

    async def _running(self, j: _Job, placement: list[int], now: float) -> RunningJob:
        target = int(j.status.get("targetWorkers") or j.spec.min_workers)
        await self.reconcile_pods(j, target)
        live = j.live_pods()
        ready = sum(1 for p in live if any(c.get("type") == "Ready" and c.get("status") == "True"
                                          for c in (p.get("status") or {}).get("conditions") or []))
        if j.status.get("workers") != len(live) or j.status.get("readyWorkers") != ready:
            await self.patch_status(j, {"workers": len(live), "readyWorkers": ready})
        prog = progress_of(j.status)
        state = ElasticState.from_status(j.status.get("rlpto"))
        start = parse_time(j.status.get("startTime")) or now
        state.observe(prog, target, now - start, j.spec.beta, j.spec.data_size)
        submit = parse_time(j.body["metadata"].get("creationTimestamp")) or now
        return RunningJob(key=j.key, spec=j.spec, workers=target, progress=prog, state=state,
                          submit_time=submit, start_time=start, placement=placement)

    # ------------------------------------------------------------------ actions
    async def reconcile_pods(self, j: _Job, target: int) -> None:
        """Create missing workers ``0..target-1``, delete those with index >= target."""
        have: dict[int, dict] = {}
        for p in j.live_pods():
            try:
                have[int(p["metadata"]["labels"][LABEL_INDEX])] = p
            except (KeyError, ValueError):
                continue
        for idx, p in sorted(have.items(), reverse=True):
            if idx >= target:
                await self.delete_pod(j.ns, p["metadata"]["name"], self.config.grace_period_s)
                j.pods = [q for q in j.pods if q is not p]
        missing = [idx for idx in range(target) if idx not in have]
        if missing:
            await self.ensure_rbac(j)  # idempotent; the pods run under the job's account
        for idx in missing:
            pod = worker_pod(j.body, idx, j.spec.gpus_per_worker,
                             scheduler_name=self.config.scheduler_name, grace_period_s=self.config.grace_period_s)
            if await self.create_ignoring_conflict(self.core.create_namespaced_pod(j.ns, pod)):
                j.pods.append(pod)
            else:
                await self._clear_finished(j.ns, pod["metadata"]["name"])

    async def _clear_finished(self, ns: str, name: str) -> None:
        """A worker name is taken by a pod that already finished (Succeeded/Failed):
        delete it so the worker can be created again next cycle."""
        try:
            old = await self.read_json(self.core.read_namespaced_pod(name, ns, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        if (old.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            await self.delete_pod(ns, name, 0)
            log.info("deleted finished worker %s/%s to recreate it", ns, name)

    async def ensure_rbac(self, j: _Job) -> None:
        sa, role, binding = trainer_rbac(j.body)
        await self.create_ignoring_conflict(self.core.create_namespaced_service_account(j.ns, sa))
        await self.create_ignoring_conflict(self.rbac.create_namespaced_role(j.ns, role))
        await self.create_ignoring_conflict(self.rbac.create_namespaced_role_binding(j.ns, binding))

    async def admit(self, j: _Job, now: float) -> None:
        target = j.spec.min_workers
        queued = parse_time(j.status.get("queuedTime")) or parse_time(j.body["metadata"].get("creationTimestamp")) or now
        self.metrics.admission_wait.observe(max(0.0, now - queued))
        await self.patch_status(j, {
            "phase": "Starting", "targetWorkers": target, "admittedTime": format_time(now), "nominated": False,
            "conditions": set_condition(j.status.get("conditions"), "Admitted", "True", "GangFits",
                                        f"{target} x {j.spec.gpus_per_worker} GPUs free", now),
        })
        await self.event(j.body, "Admitted",
                         f"starting gang of {target} workers x {j.spec.gpus_per_worker} GPUs from queue {j.status.get('queue')}")
        await self.reconcile_pods(j, target)

    async def preempt(self, j: _Job, by: str, now: float) -> None:
        for p in j.live_pods():
            await self.delete_pod(j.ns, p["metadata"]["name"], self.config.grace_period_s)
        self.metrics.preemptions.inc()
        await self.patch_status(j, {
            "phase": "Queued", "queue": "interrupt", "targetWorkers": 0, "workers": 0, "readyWorkers": 0,
            "preemptions": int(j.status.get("preemptions", 0)) + 1, "queuedTime": format_time(now),
            "conditions": set_condition(j.status.get("conditions"), "Running", "False", "Preempted",
                                        f"preempted by {by}; resumes first from the interrupt queue", now),
        })
        await self.event(j.body, "Preempted",
                         f"preempted by highest-priority job {by}; workers get {self.config.grace_period_s}s to checkpoint",
                         "Warning")

    async def complete(self, j: _Job, rj: RunningJob, why: str, now: float) -> None:
        for p in j.live_pods():
            await self.delete_pod(j.ns, p["metadata"]["name"], self.config.grace_period_s)
        created = parse_time(j.body["metadata"].get("creationTimestamp")) or now
        await self.patch_status(j, {
            "phase": "Succeeded", "reason": why, "completionTime": format_time(now), "jctSeconds": now - created,
            "targetWorkers": 0, "workers": 0, "readyWorkers": 0, "rlpto": rj.state.to_status(),
            "conditions": set_condition(j.status.get("conditions"), "Complete", "True", why,
                                        f"epoch {rj.progress.epoch}, accuracy {rj.progress.accuracy:.4f}", now),
        })
        await self.event(j.body, "Completed", f"{why} at epoch {rj.progress.epoch}, accuracy "
                                              f"{rj.progress.accuracy:.4f}, JCT {now - created:.1f}s")

    async def fail(self, j: _Job, reason: str, message: str, now: float) -> None:
        for p in j.live_pods():
            await self.delete_pod(j.ns, p["metadata"]["name"], 0)
        await self.patch_status(j, {
            "phase": "Failed", "reason": reason, "message": message, "queue": "",
            "conditions": set_condition(j.status.get("conditions"), "Valid", "False", reason, message, now),
        })
        await self.event(j.body, reason, message, "Warning")

    async def sweep_rbac(self, uids: set[str]) -> None:
        """Delete trainer ServiceAccounts/Roles/RoleBindings whose job is gone."""
        sel = "app.kubernetes.io/managed-by=rlsched-operator"
        ns = self.config.namespace
        kinds = [
            (self.core.list_service_account_for_all_namespaces, self.core.list_namespaced_service_account,
             self.core.delete_namespaced_service_account),
            (self.rbac.list_role_for_all_namespaces, self.rbac.list_namespaced_role, self.rbac.delete_namespaced_role),
            (self.rbac.list_role_binding_for_all_namespaces, self.rbac.list_namespaced_role_binding,
             self.rbac.delete_namespaced_role_binding),
        ]
        for list_all, list_ns, delete in kinds:
            call = list_ns(ns, label_selector=sel, _preload_content=False) if ns else list_all(
                label_selector=sel, _preload_content=False)
            for item in (await self.read_json(call))["items"]:
                md = item["metadata"]
                if not {o.get("uid") for o in md.get("ownerReferences") or []} & uids:
                    try:
                        await delete(md["name"], md["namespace"])
                    except ApiException as exc:
                        if exc.status != 404:
                            raise

    def _metrics(self, jobs: Mapping[str, _Job], plan: AdmissionPlan) -> None:
        m = self.metrics
        phases: dict[str, int] = {p: 0 for p in ("Queued", "Starting", "Running", "Succeeded", "Failed")}
        queues = {"interrupt": 0, "urgent": 0, "normal": 0}
        workers = 0
        admitted = set(plan.admit)
        for j in jobs.values():
            ph = j.status.get("phase")
            if ph in phases:
                phases[ph] += 1
            if ph == "Queued" and j.key not in admitted and j.status.get("queue") in queues:
                queues[j.status["queue"]] += 1
            workers += len(j.live_pods())
        for p, n in phases.items():
            m.jobs.labels(phase=p).set(n)
        for q, n in queues.items():
            m.queue_length.labels(queue=q).set(n)
        m.workers.set(workers)
