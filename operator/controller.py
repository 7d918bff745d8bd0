"""The control loop: one cycle reads the cluster, decides with the pure planners, acts.

State lives in the API server, not in this process (phase, queue, target workers,
priority and RLPTO state in the TrainingJob's status; deterministic pod names), so an
operator killed at any point and restarted picks up where it stopped. Failures are
contained to the object that caused them, and every status field the operator acts on
is checked against the spec or its own record. Details: docs/design-notes.md,
docs/operator.md.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Collection, Mapping, Sequence

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from rlsched.core import ClusterState, JobView, Progress, make_ordering, make_placement, make_scaling
from rlsched.core.cluster import progress_from_report
from rlsched.core.contract import ANNOTATION_EVENT_TIME as EVENT_TIME_ANNOTATION
from rlsched.core.contract import ANNOTATION_PRIORITY_REQUESTS as REQUESTS_ANNOTATION
from rlsched.core.contract import (
    KUEUE_GROUP,
    KUEUE_VERSION,
    QUEUE_PLURAL,
    ANNOTATION_GANG_SIZE,
    API_VERSION,
    DEFAULT_SCHEDULER_NAME,
    DEFAULT_TOPOLOGY_LEVELS,
    GROUP,
    KIND,
    LABEL_GENERATION,
    LABEL_INDEX,
    LABEL_MANAGED_BY,
    MANAGED_BY_OPERATOR,
    PLURAL,
    POD_SECURITY_BASELINE,
    VERSION,
    FINALIZER_WORKER_EXIT,
    ShapeError,
    controlling_job,
    gpu_model_rule,
    judge_batch,
)
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
    WaitReason,
    gang_unfittable,
    waiting_reasons,
)
from rlsched.core.batch import UNIT_BATCH
from rlsched.core.cycle import SchedulingCycle
from rlsched.core.live_allocation import (
    LiveAllocation,
    LiveJob,
    LiveTarget,
    attained_service,
    movable_room,
    observations_from_status,
    observations_to_status,
)
from rlsched.core.das import resolve_placement_model, serving_placement
from rlsched.core.lifecycle import BACKOFF_CAP_S, FAIL, RESTART, SUCCEED, Verdict, WorkerState, judge, judge_stop
from rlsched.core.policy import ORDERINGS, SCALINGS
from rlsched.core.queues import QueueBook, QueueError, QueueSpec

from .kueue import admission_of as kueue_admission_of
from .kueue import finished_condition as kueue_finished_condition
from .kueue import queue_name as kueue_queue_name
from .kueue import WORKLOAD_PLURAL as KUEUE_WORKLOAD_PLURAL
from .kueue import workload_for
from .metrics import OperatorMetrics
from .podsecurity import POD_SECURITY_REASON, PodSecurityGate
from .resources import trainer_rbac, worker_pod, worker_service
from .snapshot import build_snapshot, charge_packed
from .spec import SpecError, parse_spec

__all__ = ["OperatorConfig", "Controller", "REQUESTS_ANNOTATION", "parse_time", "format_time", "OWNED_FIELDS",
           "JobRejected", "api_error", "permanent_rejection", "guard_status", "merge_patch", "merge_diff"]

log = logging.getLogger(__name__)

MERGE = "application/merge-patch+json"
ACTIVE = ("Queued", "Starting", "Running")
PHASES = ("Queued", "Starting", "Running", "Succeeded", "Failed")
#: status fields only the operator writes and then acts on (see "What the operator
#: trusts" above); its last written value of each is its record
OWNED_FIELDS = ("phase", "targetWorkers", "queue", "nominated", "queuedTime", "admittedTime", "startTime", "rlpto",
                "restartGeneration", "startedGeneration", "failures", "restartAfter", "batchSize",
                "attainedGpuSeconds", "attainedSince", "goodput", "queueName")
TIME_FIELDS = ("queuedTime", "admittedTime", "startTime", "attainedSince")
#: why a job with ``spec.suspend`` waits
SUSPENDED = WaitReason(0, "Suspended", "spec.suspend is true: rlsched does not admit it until it is cleared")
#: clock skew tolerated between the operator, the API server and earlier operators
SKEW_S = 300.0
#: seconds after its grace period a stopped worker may take to report its exit
STOP_WAIT_S = 60.0
#: ``Status.reason`` the API server gives for each HTTP status (when its body has none)
HTTP_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "AlreadyExists",
                410: "Expired", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
                503: "ServiceUnavailable", 504: "Timeout"}


class JobRejected(Exception):
    """A job cannot go on: the API server refused its worker pods for good, or its pod
    could not be built. The job fails with condition ``ctype=False``, ``reason`` and
    ``message``."""

    def __init__(self, ctype: str, reason: str, message: str) -> None:
        super().__init__(message)
        self.ctype, self.reason, self.message = ctype, reason, message


def api_error(exc: ApiException) -> tuple[str, str]:
    """``(reason, message)`` of an API error: the ``reason`` and ``message`` of the
    ``Status`` object in its body when there is one, else from the HTTP status."""
    reason = message = None
    body = getattr(exc, "body", None)
    if body:
        try:
            st = json.loads(body)
        except ValueError:
            st = None
            message = (body.decode(errors="replace") if isinstance(body, bytes) else str(body))[:500]
        if isinstance(st, dict):
            reason = st.get("reason") if isinstance(st.get("reason"), str) else None
            message = st.get("message") if isinstance(st.get("message"), str) else message
    reason = reason or HTTP_REASONS.get(exc.status or 0) or ("ServerError" if (exc.status or 0) >= 500 else "ApiError")
    message = message or str(exc.reason or f"HTTP {exc.status}")
    return reason, message


def permanent_rejection(status: int | None, message: str) -> bool:
    """Whether the API server's refusal of a pod would repeat for the same pod: 400,
    422, and 403 except quota (``exceeded quota``, may free up) and the operator's own
    RBAC (``cannot create resource``, fixed by an administrator, not by the job)."""
    if status in (400, 422):
        return True
    if status == 403:
        return "exceeded quota" not in message and "cannot create resource" not in message
    return False


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


def _stored(v: Any) -> Any:
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
    start_at_min: bool = True,
    start_timeout_s: float | None = None,
) -> tuple[dict, dict]:
    """The status the operator acts on, and the fields it must write back.

    ``record`` is the operator's own last written value of each of
    :data:`OWNED_FIELDS` (None when it has none: adopt ``status``). Returns
    ``(trusted, changed)``: ``trusted`` is ``status`` with every owned field as
    recorded, then bounded by the spec (``targetWorkers`` in ``[minWorkers,
    maxWorkers]``, exactly ``minWorkers`` while ``Starting`` unless not ``start_at_min``
    (an allocator starts jobs at any size); ``batchSize`` a whole number >= 1 (else
    the spec's); ``attainedGpuSeconds`` a finite number >= 0; ``nominated`` only on a
    queued ``highest`` job unless recorded; times within ``[creation, now]`` give or
    take :data:`SKEW_S`); adopted without a record, ``Starting``/``Running`` needs a
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
        if phase == "Starting" and start_at_min:
            st["targetWorkers"] = spec.min_workers
        elif phase in ("Starting", "Running"):
            st["targetWorkers"] = spec.clamp_workers(st.get("targetWorkers"))
        if st.get("nominated") and record is None and not (phase == "Queued" and spec.priority_class == "highest"):
            st["nominated"] = False
    for k in ("restartGeneration", "startedGeneration", "failures"):
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
    changed = {k: (status.get(k), st.get(k)) for k in OWNED_FIELDS if _stored(status.get(k)) != _stored(st.get(k))}
    return st, changed


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
    #: the extender's placement policy (and its weights): admission checks room by
    #: placing each gang as the extender will (``Admission.plan``'s ``place``)
    placement: str = "das"
    placement_model: str | None = None
    #: node-label keys of the topology, coarse to fine (the extender's ``--topology-levels``)
    topology_levels: tuple[str, ...] = DEFAULT_TOPOLOGY_LEVELS
    #: an allocation policy deciding every job's workers and batch at once
    #: (``goodput``; core/live_allocation.py) instead of admission + scaling; None: off
    allocator: str | None = None
    #: "auto": the learned RLPTO policy when ``scaling_model`` is set, else "beta"
    scaling: str = "auto"
    scaling_model: str | None = None
    patience: int = 5
    mu: float = 0.1
    promote_at: float = 1.0
    demote_at: float = -1.0
    backfill: bool = False
    preemption: bool = True
    #: seconds a job runs before it may be preempted (0: none)
    min_run_s: float = 0.0
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
    return progress_from_report(status.get("progress") or {})


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


def requests_count(body: Mapping) -> int:
    """The user's priority-request counter (annotation); 0 when absent or not an integer."""
    v = ((body.get("metadata") or {}).get("annotations") or {}).get(REQUESTS_ANNOTATION, "0")
    try:
        return int(v)
    except (TypeError, ValueError):
        log.debug("%s: annotation %s=%r is not an integer; 0 requests", job_key(body), REQUESTS_ANNOTATION, v)
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


def build_placement(name: str, model: str | None):
    """The extender's placement policy as the extender builds it
    (:func:`rlsched.core.das.serving_placement`, the committed DAS weights by default),
    for admission's room check."""
    policy = serving_placement(name, resolve_placement_model(name, model))
    if policy.fallback_reason:
        log.warning("placement %s: %s", name, policy.fallback_reason)
    return policy


def build_ordering(name: str, model: str | None):
    """The core ordering policy (``fifo``, ``sjf``, ``das`` with its weights file, ...)."""
    make_ordering("fifo")  # loads the builtin policy modules
    factory = ORDERINGS.get(name.lower())
    return make_ordering(name, **(_model_kwargs(factory, model) if factory else {}))


def with_gpu_models(spec: TrainingSpec, body_spec: Mapping, models: Sequence[str]) -> TrainingSpec:
    """``spec`` with the GPU models (of ``models``, the cluster's) its worker template
    allows (:func:`~rlsched.core.contract.gpu_model_rule`, the extender's reading), so
    that admission checks room only where the workers can run; unchanged without a
    constraint. ``ShapeError`` for a malformed constraint."""
    tmpl = body_spec.get("template") or {}
    pod = tmpl.get("spec") if isinstance(tmpl.get("spec"), Mapping) else {}
    ann = (tmpl.get("metadata") or {}).get("annotations") if isinstance(tmpl.get("metadata"), Mapping) else None
    allows, text = gpu_model_rule(dict(pod), dict(ann) if isinstance(ann, Mapping) else {}, "spec.template")
    if not text:
        return spec
    return dataclasses.replace(spec, gpu_models=frozenset(m for m in models if allows(m)))


def checkpoint_path(body: Mapping) -> str | None:
    """The job's ``spec.checkpoint.path`` (None without one)."""
    ckpt = (body.get("spec") or {}).get("checkpoint")
    path = ckpt.get("path") if isinstance(ckpt, Mapping) else None
    return path if isinstance(path, str) and path else None


def pod_generation(pod: Mapping) -> int:
    """The generation a worker pod belongs to (``rlsched.dev/generation``; 0 when the
    label is missing: pods of an operator before generations)."""
    v = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_GENERATION, "0")
    try:
        return max(0, int(v))
    except (TypeError, ValueError):
        return -1  # never the current generation: stopped and replaced


def worker_state(pod: Mapping) -> WorkerState | None:
    """A worker pod as :func:`rlsched.core.lifecycle.judge` reads it: index,
    generation, phase, the exit code of its first (worker) container, whether the
    operator is stopping it and whether someone evicted it. None when the pod has no
    worker index."""
    md = pod.get("metadata") or {}
    try:
        index = int((md.get("labels") or {})[LABEL_INDEX])
    except (KeyError, TypeError, ValueError):
        return None
    st = pod.get("status") or {}
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or [{}]
    first = containers[0].get("name") if isinstance(containers[0], Mapping) else None
    code = None
    for cs in st.get("containerStatuses") or []:
        if not isinstance(cs, Mapping) or (first is not None and cs.get("name") != first):
            continue
        term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
        if isinstance(term, Mapping) and isinstance(term.get("exitCode"), int):
            code = term["exitCode"]
        break
    phase = st.get("phase") or "Pending"
    if phase == "Failed" and code is None:
        code = -1  # failed without a container exit (e.g. evicted before it started)
    disrupted = st.get("reason") == "Evicted" or any(
        isinstance(c, Mapping) and c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        for c in st.get("conditions") or [])
    try:
        gang = int((md.get("annotations") or {}).get(ANNOTATION_GANG_SIZE, ""))
    except ValueError:
        gang = None
    return WorkerState(name=md.get("name", ""), index=index, generation=pod_generation(pod), phase=phase,
                       exit_code=code, stopping=md.get("deletionTimestamp") is not None, disrupted=disrupted,
                       gang_size=gang if gang and gang > 0 else None)


@dataclass
class _Job:
    """One TrainingJob as read this cycle."""

    body: dict
    spec: TrainingSpec | None
    error: str | None
    pods: list[dict] = field(default_factory=list)
    #: its worker pods that terminated (Succeeded/Failed) and still exist
    finished: list[dict] = field(default_factory=list)
    #: why it is held without workers although spec.suspend is false (Kueue has not
    #: admitted it), or None
    hold: WaitReason | None = None
    #: its Kueue Workload (a job labelled with Kueue's queue name), as read this cycle
    workload: dict | None = None
    #: the team queue (TrainingQueue) it is charged to this cycle, or None
    team: str | None = None

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
    def uid(self) -> str:
        return self.body["metadata"]["uid"]

    @property
    def status(self) -> dict:
        return self.body.get("status") or {}

    @property
    def batch_size(self) -> int | None:
        """The global batch of its current generation: the scheduler's
        (``status.batchSize``), else the spec's; None: neither sets one."""
        b = self.status.get("batchSize")
        if isinstance(b, int) and not isinstance(b, bool) and b >= 1:
            return b
        return self.spec.batch_size if self.spec is not None else None

    def live_pods(self) -> list[dict]:
        return [p for p in self.pods if p["metadata"].get("deletionTimestamp") is None
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]

    def _count(self, key: str) -> int:
        """A non-negative whole number of the status (0 when absent or malformed)."""
        v = self.status.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0

    @property
    def generation(self) -> int:
        return self._count("restartGeneration")

    @property
    def failures(self) -> int:
        return self._count("failures")

    def all_pods(self) -> list[dict]:
        """Every worker pod the job controls: running, terminating and terminated."""
        seen = {p["metadata"].get("uid") or p["metadata"]["name"] for p in self.pods}
        return self.pods + [p for p in self.finished
                            if (p["metadata"].get("uid") or p["metadata"]["name"]) not in seen]

    def workers(self) -> list[WorkerState]:
        """The job's worker pods as the lifecycle reads them (:func:`worker_state`)."""
        return [w for w in (worker_state(p) for p in self.all_pods()) if w is not None]


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
            min_run_s=config.min_run_s,
        )
        self.planner = ScalingPlanner(build_scaling(config.scaling, config.scaling_model), patience=config.patience)
        #: core's cycle over the two: what every cycle decides (the simulator's allocator runs it too)
        self.scheduling = SchedulingCycle(self.queues, self.planner)
        #: the allocation policy, when one decides instead of admission + scaling
        self.allocation = LiveAllocation.named(config.allocator) if config.allocator else None
        self._no_queue_crd = False
        self._queues_unenforced = False
        self._queue_series: set[str] = set()
        self.placement = build_placement(config.placement, config.placement_model)
        self._fallback_placement = make_placement("bestfit")
        self.pod_security = PodSecurityGate(self.core, self.read_json, config)
        self.cycles = 0
        self.last_plan: AdmissionPlan | None = None
        #: job uid -> the operator's last written value of each of OWNED_FIELDS
        self.record: dict[str, dict[str, Any]] = {}
        #: unreadable objects already logged (each is logged once while it lasts)
        self._reported: set[str] = set()
        #: job uid -> the unexpected error last reported on it by an event
        self._errors: dict[str, str] = {}

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

    async def list_queues(self) -> list[dict]:
        """The TrainingQueues (cluster-scoped); none when their CRD is not installed."""
        try:
            return (await self.read_json(self.custom.list_cluster_custom_object(
                GROUP, VERSION, QUEUE_PLURAL, _preload_content=False)))["items"]
        except ApiException as exc:
            if exc.status != 404:
                raise
            if not self._no_queue_crd:
                log.info("no TrainingQueue CRD on this cluster: jobs are scheduled without team queues")
                self._no_queue_crd = True
            return []

    def queue_book(self, bodies: Sequence[Mapping]) -> QueueBook:
        """The teams' queues of this cycle (a queue that cannot be read is left out and
        logged: its jobs wait as NoSuchQueue) with the operator's minimum run time."""
        specs = []
        for b in bodies:
            try:
                specs.append(QueueSpec.from_manifest(b))
            except QueueError as exc:
                log.warning("TrainingQueue ignored: %s", exc)
        if specs and self.allocation is None and not self._queues_unenforced:
            log.warning("TrainingQueues exist but the operator runs without an allocator (--allocator none): "
                        "their quotas and weights are not enforced, only their use is reported")
            self._queues_unenforced = True
        return QueueBook(specs, min_run_s=self.config.min_run_s)

    async def patch_status(self, job: _Job | Mapping, patch: dict, *, forget_on_error: bool = True) -> None:
        """Merge-patch the job's status and keep the record of the owned fields written.
        A failed patch (other than 404: the job is gone) forgets the record
        (``forget_on_error``), since what the status now holds is unknown; the next
        cycle adopts it within bounds."""
        body = job.body if isinstance(job, _Job) else job
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
                    rec[k] = _stored(merge_patch({k: rec.get(k)}, {k: patch[k]}).get(k))
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

    async def create_ignoring_conflict(self, coro) -> bool:
        try:
            await coro
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    async def delete_pod(self, ns: str, name: str, grace: int | None = None) -> None:
        """Delete a worker pod; at once (``grace`` 0: it already exited, or it is killed)
        its finalizer is removed first, so that a worker still held when found exited is
        one stopped with the grace period (:meth:`_release_stopped` judges it)."""
        try:
            if grace == 0:
                await self.core.patch_namespaced_pod(
                    name, ns, {"metadata": {"$deleteFromPrimitiveList/finalizers": [FINALIZER_WORKER_EXIT]}},
                    _content_type="application/strategic-merge-patch+json")
            await self.core.delete_namespaced_pod(name, ns, grace_period_seconds=grace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    # ------------------------------------------------------------------ the cycle
    async def run(self, stop: asyncio.Event, is_leader: Callable[[], Any] | None = None) -> None:
        """Cycle every ``cycle_s`` until ``stop`` is set; a cycle that fails is logged,
        counted (``rlsched_operator_cycle_errors_total``) and retried."""
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                if is_leader is None or await is_leader():
                    await self.cycle()
                else:
                    self.record.clear()  # another replica writes now: its values are not ours
            except ApiException as exc:
                self.metrics.cycle_errors.inc()
                log.error("cycle failed: API %s %s", exc.status, exc.reason)
            except (OSError, asyncio.TimeoutError) as exc:
                self.metrics.cycle_errors.inc()
                log.error("cycle failed: %r", exc)
            except Exception:  # a bug must not stop scheduling for good: log it loudly, retry
                self.metrics.cycle_errors.inc()
                log.exception("cycle failed with an unexpected error")
            wait = max(0.0, self.config.cycle_s - (time.monotonic() - t0))
            try:
                await asyncio.wait_for(stop.wait(), timeout=wait)
            except asyncio.TimeoutError:
                pass

    async def cycle(self) -> None:
        now = self.clock()
        self.cycles += 1
        self.metrics.cycles.inc()
        bodies, others, nodes, mine, queue_bodies = await asyncio.gather(
            self.list_jobs(),
            # everyone else's pods that hold resources, for the snapshot
            self.read_json(self.core.list_pod_for_all_namespaces(
                label_selector=f"{LABEL_MANAGED_BY}!={MANAGED_BY_OPERATOR}",
                field_selector="status.phase!=Succeeded,status.phase!=Failed", _preload_content=False)),
            self.read_json(self.core.list_node(_preload_content=False)),
            # the operator's workers in one list, whatever their phase: a worker that exits
            # between two lists (one of running pods, one of exited) would be in neither
            self.read_json(self.core.list_pod_for_all_namespaces(
                label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY_OPERATOR}", _preload_content=False)),
            self.list_queues(),
        )
        book = self.queue_book(queue_bodies)
        exited = {"Succeeded", "Failed"}
        # the workers that exited: their exit codes decide success, failure, restart
        ended = {"items": [p for p in mine["items"] if (p.get("status") or {}).get("phase") in exited]}
        pods = others["items"] + [p for p in mine["items"] if (p.get("status") or {}).get("phase") not in exited]
        snap = build_snapshot(nodes["items"], pods, time=now, levels=self.config.topology_levels)
        self._report_unreadable(snap.problems)
        jobs: dict[str, _Job] = {}
        for b in bodies:
            try:
                spec, err = parse_spec(b.get("spec"), scheduler_name=self.config.scheduler_name,
                                       name=b["metadata"]["name"]), None
                spec = with_gpu_models(spec, b["spec"], snap.state.models)
            except (SpecError, ShapeError) as exc:
                spec, err = None, str(exc)
            jobs[job_key(b)] = _Job(b, spec, err)
        by_uid = {j.uid: j for j in jobs.values()}
        for j in jobs.values():
            if j.spec is not None:
                j.team = book.resolve(j.ns, j.spec.queue_name) or None
        if any(kueue_queue_name(j.body) for j in jobs.values()):
            await self._kueue_gate(jobs, by_uid)
        for uid in set(self.record) - set(by_uid):
            del self.record[uid]
        for uid in set(self._errors) - set(by_uid):
            del self._errors[uid]

        # the operator's pods are those a TrainingJob controls; labels alone mean nothing
        orphans: list[dict] = []
        for p in pods:
            owner = controlling_job(p)
            if owner is None:
                continue
            md = p["metadata"]
            j = by_uid.get(owner.uid)
            if j is not None and j.ns == md.get("namespace"):
                j.pods.append(p)
            elif self.config.namespace in (None, md.get("namespace")) and (
                    md.get("deletionTimestamp") is None or FINALIZER_WORKER_EXIT in (md.get("finalizers") or [])):
                orphans.append(p)
        for p in ended["items"]:
            owner = controlling_job(p)
            j = by_uid.get(owner.uid) if owner is not None else None
            if j is not None and j.ns == p["metadata"].get("namespace"):
                j.finished.append(p)
            elif owner is not None and self.config.namespace in (None, p["metadata"].get("namespace")) and \
                    FINALIZER_WORKER_EXIT in (p["metadata"].get("finalizers") or []):
                orphans.append(p)  # its job is gone: nobody judges its exit
        for p in orphans:
            md = p["metadata"]
            try:
                if md.get("deletionTimestamp") is not None:  # already going: only let go of it
                    await self._release_pod(p)
                    continue
                await self.delete_pod(md["namespace"], md["name"], 0)
                log.info("deleted orphan pod %s/%s (its TrainingJob is gone)", md["namespace"], md["name"])
            except (ApiException, OSError, asyncio.TimeoutError) as exc:
                self.metrics.job_errors.labels(kind="transient").inc()
                log.warning("could not delete orphan pod %s/%s: %r", md["namespace"], md["name"], exc)

        waiting: list[QueueEntry] = []
        running: list[RunningJob] = []
        holders: list[RunningEntry] = []

        async def observe(j: _Job) -> None:
            await self._release_stopped(j, now)
            if not j.status.get("phase") and j.uid not in self.record:
                if j.spec is None:
                    await self.fail(j, "InvalidSpec", j.error or "invalid spec", now)
                return  # a valid job: the create handler has not enqueued it yet
            await self._trust(j, now)
            phase = j.status.get("phase")
            if phase not in ACTIVE or phase == "Queued":
                # a finished or queued job holds no workers: these are left over from a
                # step that recorded the new phase and stopped before its pods were stopped
                for p in j.live_pods():
                    await self.delete_pod(j.ns, p["metadata"]["name"], self.config.grace_period_s)
                if phase not in ACTIVE:
                    return
            if j.spec is None:
                await self.fail(j, "InvalidSpec", j.error or "invalid spec", now)
                return
            refusal = await self.pod_security.check(j.body, self.cycles)
            if refusal is not None and (refusal.final or phase == "Queued"):
                if refusal.final:
                    await self.fail(j, POD_SECURITY_REASON, refusal.message, now)
                return  # else its namespace is unreadable: not admitted until it can be checked
            if j.spec.suspend or j.hold is not None:  # held by its owner or by Kueue: no pods, not admitted
                if j.hold is not None and j.hold.reason == "KueueWorkload":
                    await self._create_workload(j)
                await self._suspended(j, now, j.hold)
                return
            cond = get_condition(j.status.get("conditions"), "Suspended")
            if cond and cond.get("status") == "True":
                why = "Kueue admitted its Workload" if j.workload is not None else "spec.suspend is false"
                await self.patch_status(j, {"conditions": set_condition(
                    j.status.get("conditions"), "Suspended", "False", "Resumed", why, now)})
                await self.event(j.body, "Resumed", f"{why}: the job waits for admission")
            try:
                if phase == "Queued":
                    waiting.append(await self._queue_entry(j, now))
                elif phase == "Starting":
                    await self._starting(j, now)
                if j.status.get("phase") == "Running":
                    rj = await self._running(j, snap.placement.get(j.key, []), now)
                    if rj is not None:
                        running.append(rj)
            finally:
                # a job holding GPUs stays visible to preemption even when a step failed
                if j.status.get("phase") in ("Starting", "Running"):
                    holders.append(RunningEntry(
                        key=j.key, spec=j.spec, priority=self._priority(j),
                        start_time=parse_time(j.status.get("admittedTime")) or now,
                        placement=snap.placement.get(j.key, []),
                    ))

        listed = {j.key: len(j.pods) for j in jobs.values()}
        # jobs are independent here: observe them concurrently (bounded), then decide
        # on the whole picture in a fixed order
        await self._each(observe, jobs.values(), now)
        self._hold_restarting(jobs.values(), listed, snap.state, snap.node_index)
        order = {k: i for i, k in enumerate(jobs)}
        for lst in (waiting, running, holders):
            lst.sort(key=lambda e: order[e.key])

        if self.allocation is not None:  # an allocation policy decides everything at once
            # a gang that can never fit is reported as admission reports it (condition, event, gauge)
            unfit = AdmissionPlan(unfittable={e.key: why for e in waiting
                                              if (why := gang_unfittable(e.spec, snap.state)) is not None})
            await self._each(lambda j: self._schedulable(j, unfit.unfittable.get(j.key), now),
                             [jobs[e.key] for e in waiting], now)
            await self._allocate(jobs, waiting, running, snap, now, book)
            await self._sweep(by_uid)
            self._metrics(jobs, unfit)
            await self._queue_status(book, queue_bodies, jobs, now)
            return

        # decide on the whole picture at once (core's cycle: admission, then scaling on
        # the state after it), then act on the plan
        cplan = self.scheduling.plan(waiting, holders, snap.state, running=running, releasing=snap.releasing,
                                     place=self._place)
        plan = cplan.admission
        self.last_plan = plan
        why = waiting_reasons(plan, waiting, backfill=self.config.backfill, free_gpus=int(snap.state.free.sum()))
        await self._each(lambda j: self._waiting(j, why.get(j.key)), [jobs[k] for k in why], now)
        await self._each(lambda j: self._schedulable(j, plan.unfittable.get(j.key), now),
                         [jobs[e.key] for e in waiting], now)
        await self._each(lambda j: self.preempt(j, plan.blocked or "", now), [jobs[k] for k in plan.preempt], now)
        if plan.preempt and plan.blocked:
            # the preemptor is served before every queue until it starts (like a nominated pod)
            await self._each(lambda j: self.patch_status(j, {"nominated": True}), [jobs[plan.blocked]], now)
        # one gang after the other, in the order admission planned them: kube-scheduler
        # takes pods of equal priority in the order they arrive, so the gangs are placed
        # in that order too, each around the ones before it, as admission's room check
        # (the extender's placement) assumed; created concurrently, a later gang could
        # take the nodes planned for an earlier one (found by the twin check)
        for k in plan.admit:
            await self._contain(jobs[k], lambda j: self.admit(j, now), now)

        if cplan.scaling_error is not None:  # a broken scaling policy: admissions are done, the cycle fails here
            raise cplan.scaling_error
        running = cplan.running
        splan = cplan.scaling
        by_key = {r.key: r for r in running}

        async def act(j: _Job) -> None:
            rj = by_key[j.key]
            if rj.key in splan.finished:
                await self.complete(j, splan.finished[rj.key], now, rj=rj)
                return
            d = splan.deltas.get(rj.key, 0)
            patch = self._rlpto_patch(j, rj)
            if d:
                target = j.spec.clamp_workers(rj.workers + d)
                # a new world size is a new generation: every worker restarts from the
                # checkpoint at the new size (recorded before the old workers are stopped)
                patch["targetWorkers"] = target
                patch["restartGeneration"] = j.generation + 1
                self.metrics.scaling_decisions.labels(direction="up" if d > 0 else "down").inc()
                self.metrics.restarts.labels(reason="Rescaled").inc()
                await self.patch_status(j, patch)
                await self.event(j.body, "ScaledUp" if d > 0 else "ScaledDown",
                                 f"workers {rj.workers} -> {target} (generation {j.generation}, "
                                 f"accuracy gain {rj.state.gain:.4g}, beta {rj.spec.beta})")
                await self.reconcile_pods(j, target)
            elif patch:
                await self.patch_status(j, patch)

        await self._each(act, [jobs[r.key] for r in running], now)
        await self._sweep(by_uid)
        self._metrics(jobs, plan)
        await self._queue_status(book, queue_bodies, jobs, now, plan.admit)

    async def _sweep(self, by_uid: Mapping[str, _Job]) -> None:
        if self.config.sweep_every and self.cycles % self.config.sweep_every == 1:
            try:
                await self.sweep_rbac(set(by_uid))
            except (ApiException, OSError, asyncio.TimeoutError) as exc:
                self.metrics.job_errors.labels(kind="transient").inc()
                log.warning("RBAC sweep failed, retried later: %r", exc)

    @staticmethod
    def _rlpto_patch(j: _Job, rj: RunningJob) -> dict[str, Any]:
        """The status patch that records the job's elastic state (``status.rlpto``), if it changed."""
        rl = _stored(rj.state.to_status())
        if rl == _stored(j.status.get("rlpto")):
            return {}
        old = j.status.get("rlpto")
        return {"rlpto": merge_diff(old, rl) if isinstance(old, Mapping) else rl}

    # ------------------------------------------------------------------ allocator mode
    def _service(self, j: _Job, now: float) -> float:
        """GPU-seconds the job attained (its GPUs held since ``attainedSince``)."""
        held = self._target(j) * j.spec.gpus_per_worker if j.status.get("phase") in ("Starting", "Running") else 0
        return attained_service(j.status.get("attainedGpuSeconds"), parse_time(j.status.get("attainedSince")),
                                held, now)

    async def _observe_goodput(self, j: _Job, placement: Sequence[int]):
        """Fold the chief's latest report into ``status.goodput`` (a report of the
        current generation at its size; the nodes its workers run on are known here)
        and return the record."""
        bounds = j.spec.bounds
        obs, last = observations_from_status(j.status.get("goodput"), bounds or UNIT_BATCH)
        prog = j.status.get("progress")
        if not isinstance(prog, Mapping) or not prog.get("updateTime") or prog.get("updateTime") == last:
            return obs
        gen, workers = prog.get("generation"), prog.get("workers")
        if (gen is not None and gen != j.generation) or workers != len(placement):
            return obs  # a report of another generation or size: its shape is not known
        report = dict(prog)
        if bounds is None:  # a fixed local batch: one unit per GPU
            report["globalBatchSize"] = len(placement) * j.spec.gpus_per_worker
        try:
            obs = obs.update(report, len(set(placement)))
        except ValueError as exc:
            log.warning("%s: progress report not used for the goodput model: %s", j.key, exc)
            return obs
        await self.patch_status(j, {"goodput": observations_to_status(obs, str(prog["updateTime"]))})
        return obs

    async def _allocate(self, jobs: Mapping[str, _Job], waiting: Sequence[QueueEntry],
                        running: Sequence[RunningJob], snap, now: float, book: QueueBook | None = None) -> None:
        """One call into the allocation policy (core/live_allocation.py) and its plan
        carried out. The policy moves only jobs whose current generation runs whole
        (every worker bound); the GPUs of the others stay charged where they are."""
        state = snap.state
        held: list[tuple[tuple[int, ...], int, int, int]] = []  # what the jobs the policy may move hold
        live: list[LiveJob] = []
        done: set[str] = set()
        by_key = {r.key: r for r in running}

        async def judge(j: _Job) -> None:  # the job's own end (β stop, maxEpochs), as without an allocator
            rj = by_key[j.key]
            why = self.planner.finished(rj)
            if why:
                done.add(j.key)
                await self.complete(j, why, now, rj=rj)
            else:
                patch = self._rlpto_patch(j, rj)
                if patch:
                    await self.patch_status(j, patch)

        await self._each(judge, [jobs[r.key] for r in running], now)
        for r in running:
            j = jobs[r.key]
            placement = tuple(snap.placement.get(j.key, ()))
            if j.key in done:
                continue  # its GPUs are released: free for the others next cycle
            if j.status.get("startedGeneration") != j.generation or len(placement) != r.workers:
                continue
            obs = await self._observe_goodput(j, placement)
            held.append((placement, j.spec.gpus_per_worker, j.spec.cpu_milli, j.spec.memory_mib))
            live.append(self._live_job(j, now, placement, obs))
        for e in waiting:
            j = jobs[e.key]
            bounds = j.spec.bounds
            obs = observations_from_status(j.status.get("goodput"), bounds)[0] if bounds is not None else None
            live.append(self._live_job(j, now, (), obs))
        names = {i: n for n, i in snap.node_index.items()}
        models = {i: node.gpu_model for i, node in enumerate(state.topology.nodes)}
        capacity, offers = movable_room(state, held)
        plan = self.allocation.plan(live, capacity, now, names, queues=book, models=models, offers=offers)
        if plan.error is not None:
            self.metrics.cycle_errors.inc()
            log.error("allocator %s failed; every job keeps its GPUs this cycle: %r", self.allocation.name, plan.error)
            return
        await self._each(lambda j: self.patch_status(j, {"queueName": j.team}),
                         [j for j in (jobs[lj.key] for lj in live) if j.team != j.status.get("queueName")], now)
        await self._each(lambda j: self._waiting(j, plan.waiting.get(j.key)),
                         [jobs[k] for k in plan.waiting if k not in plan.stop], now)
        await self._each(lambda j: self._stop_reallocated(j, now), [jobs[k] for k in plan.stop], now)
        await self._each(lambda j: self._resize(j, plan.resize[j.key], now), [jobs[k] for k in plan.resize], now)
        for k, t in plan.start.items():  # in the policy's order, as admission does (one gang after another)
            await self._contain(jobs[k], lambda j, t=t: self.admit(j, now, target=t.workers, batch=t.batch_size), now)

    def _live_job(self, j: _Job, now: float, placement: tuple[int, ...], obs) -> LiveJob:
        s = j.spec
        created = parse_time(j.body["metadata"].get("creationTimestamp")) or now
        prog = progress_of(j.status)
        return LiveJob(key=j.key, submit_time=created, min_workers=s.min_workers, max_workers=s.max_workers,
                       gpus_per_worker=s.gpus_per_worker, nodes=placement,
                       batch_size=j.batch_size if placement else s.batch_size, pinned_workers=s.pinned_workers,
                       bounds=s.bounds, observations=obs, attained_service=self._service(j, now),
                       restarts=j.generation, priority_class=s.priority_class, queue=j.team,
                       running_since=parse_time(j.status.get("admittedTime")) if placement else None,
                       gpu_models=s.gpu_models, cpu_milli=s.cpu_milli, memory_mib=s.memory_mib,
                       epoch=max(prog.epoch, 0), metrics=tuple(prog.history))

    async def _queue_status(self, book: QueueBook, bodies: Sequence[Mapping], jobs: Mapping[str, _Job],
                            now: float, admitted: Collection[str] = ()) -> None:
        """The waiting metrics of the cycle and each TrainingQueue's status (GPUs in
        use, borrowed, pending and running jobs, as this cycle read them, ``admitted``
        counted as started), written when it changes, with the per-queue metrics
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
                held.append((j.team, self._target(j) * j.spec.gpus_per_worker))
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

    async def _resize(self, j: _Job, t: LiveTarget, now: float) -> None:
        """A new generation at the allocator's size and batch: recorded first (with the
        GPU-seconds attained so far), then the old workers are stopped."""
        old, old_batch = self._target(j), j.batch_size
        await self.patch_status(j, {
            "targetWorkers": t.workers, "restartGeneration": j.generation + 1, "batchSize": t.batch_size,
            "attainedGpuSeconds": self._service(j, now), "attainedSince": format_time(now),
        })
        up = t.workers > old
        self.metrics.scaling_decisions.labels(direction="up" if up else "down").inc()
        self.metrics.restarts.labels(reason="Rescaled").inc()
        batch = f", global batch {old_batch} -> {t.batch_size}" if t.batch_size is not None else ""
        await self.event(j.body, "ScaledUp" if up else "ScaledDown",
                         f"workers {old} -> {t.workers}{batch} (generation {j.generation}, {self.allocation.name}, "
                         f"at epoch {progress_of(j.status).epoch})")
        await self.reconcile_pods(j, t.workers)

    async def _stop_reallocated(self, j: _Job, now: float) -> None:
        """The allocator gave the job no GPUs (others rank before it): back to the
        queue, recorded first, then its workers get the grace period to checkpoint."""
        self.metrics.preemptions.inc()
        before = j.status.get("preemptions")
        count = before if isinstance(before, int) and not isinstance(before, bool) and before >= 0 else 0
        await self.patch_status(j, {
            "phase": "Queued", "queue": "interrupt", "targetWorkers": 0, "workers": 0, "readyWorkers": 0,
            "preemptions": count + 1, "restartGeneration": j.generation + 1, "batchSize": None,
            "attainedGpuSeconds": self._service(j, now), "attainedSince": None,
            "conditions": set_condition(j.status.get("conditions"), "Running", "False", "Reallocated",
                                        f"{self.allocation.name} gave its GPUs to jobs ranked before it", now),
        })
        for p in j.live_pods():
            await self.delete_pod(j.ns, p["metadata"]["name"], self.config.grace_period_s)
        await self.event(j.body, "Preempted", f"preempted by {self.allocation.name}: its GPUs go to jobs ranked "
                                              f"before it; workers get {self.config.grace_period_s}s to checkpoint",
                         "Warning")

    def _hold_restarting(self, jobs: Sequence[_Job] | Any, listed: Mapping[str, int], state: ClusterState,
                         node_index: Mapping[str, int] | None = None) -> None:
        """A Starting or Running job whose generation is being replaced (the old workers
        gone, the new not all created yet, a failed generation waiting out its backoff)
        still holds its GPUs: charge the workers its listed pods do not hold where it
        last ran, else packed on nodes of the GPU models it may use
        (:func:`~rlsched.operator.snapshot.charge_packed`), so that admission and scaling
        do not give them away between two generations (found by the twin check) and a
        small job does not take the whole nodes a large gang needs. Mutates ``state``."""
        index = node_index or {}
        for j in jobs:
            if j.spec is None or j.status.get("phase") not in ("Starting", "Running"):
                continue
            done = sum(1 for w in j.workers() if w.generation == j.generation and w.finished and not w.stopping)
            missing = self._target(j) - listed.get(j.key, 0) - done
            if missing <= 0:
                continue
            ran = sorted(j.finished, key=pod_generation, reverse=True)  # the latest generation's nodes first
            prefer = [index[n] for p in ran if (n := (p.get("spec") or {}).get("nodeName")) in index]
            charge_packed(state, missing, j.spec.gpus_per_worker, prefer=list(dict.fromkeys(prefer)),
                          models=j.spec.gpu_models)

    def _place(self, job: JobView, state: ClusterState) -> list[int] | None:
        """Admission's room check: the gang's nodes as the extender's placement would
        choose them; a placement that fails (a policy bug) must not stop admission, so
        best fit decides instead and the error is logged."""
        try:
            return self.placement.place(job, state)
        except Exception:  # noqa: BLE001 - any policy bug; logged with its traceback
            log.exception("placement %s failed on job %s; admission checks room with bestfit",
                          self.placement.name, job.id)
            return self._fallback_placement.place(job, state)

    async def _each(self, fn, jobs, now: float) -> None:
        """Run ``fn(job)`` for every job, at most ``config.parallelism`` at a time; an
        error is contained to its job (:meth:`_contain`)."""
        sem = asyncio.Semaphore(max(1, self.config.parallelism))

        async def one(j: _Job) -> None:
            async with sem:
                await self._contain(j, fn, now)

        await asyncio.gather(*(one(j) for j in jobs))

    async def _contain(self, j: _Job, fn, now: float) -> None:
        """``await fn(j)``; what goes wrong stays with ``j``: a :class:`JobRejected`
        fails the job, an API or network error is retried next cycle, anything else
        (a bug) is logged with its traceback and reported on the job."""
        try:
            await fn(j)
            return
        except JobRejected as exc:
            self.metrics.job_errors.labels(kind="rejected").inc()
            failure = exc
        except ApiException as exc:
            self.metrics.job_errors.labels(kind="transient").inc()
            reason, message = api_error(exc)
            log.warning("%s: API %s %s: %s; retried next cycle", j.key, exc.status, reason, message)
            return
        except (OSError, asyncio.TimeoutError) as exc:
            self.metrics.job_errors.labels(kind="transient").inc()
            log.warning("%s: %r; retried next cycle", j.key, exc)
            return
        except Exception as exc:
            self.metrics.job_errors.labels(kind="unexpected").inc()
            log.exception("%s: unexpected error; the job is retried next cycle", j.key)
            msg = f"unexpected error, retried every cycle: {exc!r}"
            if self._errors.get(j.uid) != msg:  # one event per distinct error, not one per cycle
                self._errors[j.uid] = msg
                try:
                    await self.event(j.body, "ReconcileError", msg, "Warning")
                except Exception:
                    log.exception("%s: could not report the error", j.key)
            return
        try:
            await self.fail(j, failure.reason, failure.message, now, ctype=failure.ctype)
        except Exception:
            log.exception("%s: could not fail the job after %s: %s", j.key, failure.reason, failure.message)

    def _report_unreadable(self, problems: Mapping[str, str]) -> None:
        """Log each object the snapshot could not read once (while it lasts)."""
        for key in sorted(set(problems) - self._reported):
            log.warning("%s: %s", key, problems[key])
        self._reported = set(problems)

    def _priority(self, j: _Job) -> float:
        """The job's dynamic priority from its spec and request counter (never its status)."""
        return self.priority.expected(j.spec.priority_value, requests_count(j.body))

    async def _trust(self, j: _Job, now: float) -> None:
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
                                        start_at_min=self.allocation is None,
                                        start_timeout_s=self.config.start_timeout_s)
        if rec is None:
            self.record[j.uid] = {k: _stored(trusted.get(k)) for k in OWNED_FIELDS}
        if changed:
            status = j.status
            patch = {k: merge_diff(status.get(k), trusted.get(k)) if isinstance(status.get(k), Mapping)
                     and isinstance(trusted.get(k), Mapping) else trusted.get(k) for k in changed}
            self.metrics.status_resets.inc(len(changed))
            # the record holds what the status must say whether or not this write lands
            await self.patch_status(j, patch, forget_on_error=False)
            what = ", ".join(f"{k} {_short(old)} -> {_short(new)}" for k, (old, new) in sorted(changed.items()))
            await self.event(j.body, "StatusReset",
                             f"status fields the operator acts on were not as it left them or out of bounds; "
                             f"restored: {what}", "Warning")
        j.body["status"] = trusted

    async def _schedulable(self, j: _Job, why: str | None, now: float) -> None:
        """Condition ``Schedulable``: False (reason ``Unfittable``) while the gang cannot
        fit the whole cluster; back to True once it can."""
        old = get_condition(j.status.get("conditions"), "Schedulable")
        if why:
            s = j.spec
            msg = f"the gang of {s.min_workers} workers x {s.gpus_per_worker} GPUs cannot fit this cluster: {why}; " \
                  f"it waits in the queue without blocking it"
            if old and old.get("status") == "False" and old.get("message") == msg:
                return
            await self.patch_status(j, {"conditions": set_condition(
                j.status.get("conditions"), "Schedulable", "False", "Unfittable", msg, now)})
            await self.event(j.body, "Unfittable", msg, "Warning")
        elif old and old.get("status") != "True":
            await self.patch_status(j, {"conditions": set_condition(
                j.status.get("conditions"), "Schedulable", "True", "Fits", "the gang fits the cluster", now)})

    # ------------------------------------------------------------------ per phase
    async def _queue_entry(self, j: _Job, now: float) -> QueueEntry:
        st = j.status
        total = requests_count(j.body)
        pr = self._priority(j)
        interrupted = st.get("queue") == "interrupt"
        queue = self.priority.queue(j.spec.priority_class, pr, interrupted)
        old_pr, seen = st.get("effectivePriority"), st.get("priorityRequestsSeen")
        same_pr = isinstance(old_pr, (int, float)) and not isinstance(old_pr, bool) and abs(old_pr - pr) <= 1e-9 * max(1.0, abs(pr))
        if queue != st.get("queue") or not same_pr or seen != total:
            old = st.get("queue")
            await self.patch_status(j, {"queue": queue, "effectivePriority": pr, "priorityRequestsSeen": total})
            if old_pr is not None and not same_pr and seen == total:
                # no new request, yet another priority: not one DynamicPriority gives
                self.metrics.status_resets.inc()
                await self.event(j.body, "StatusReset",
                                 f"effectivePriority {_short(old_pr)} is not what spec.priority.value "
                                 f"{j.spec.priority_value:g} and {total} requests give; reset to {pr:g}", "Warning")
            if old and queue != old:
                await self.event(j.body, "Promoted" if queue == "urgent" else "Demoted",
                                 f"priority {pr:.3g}: queue {old} -> {queue}")
        submit = parse_time(st.get("queuedTime")) or parse_time(j.body["metadata"].get("creationTimestamp")) or now
        return QueueEntry(key=j.key, spec=j.spec, submit_time=submit, priority=pr, queue=queue,
                          nominated=bool(st.get("nominated")))

    def _target(self, j: _Job) -> int:
        """The worker count of the job's current generation (an allocator starts a job
        at the size it chose; admission at ``minWorkers``)."""
        if j.status.get("phase") == "Starting" and self.allocation is None:
            return j.spec.min_workers
        return j.spec.clamp_workers(j.status.get("targetWorkers"))

    async def _lifecycle(self, j: _Job, now: float) -> str:
        """Judge the current generation's workers (:func:`rlsched.core.lifecycle.judge`)
        and carry the verdict out; returns its action (``none`` when the job goes on
        as it is). Each verdict is written to the status before any pod is touched."""
        gen = j.generation
        v = judge(j.workers(), generation=gen, target=self._target(j),
                  running=j.status.get("phase") == "Running" and j.status.get("startedGeneration") == gen,
                  success_policy=j.spec.success_policy, failures=j.failures, backoff_limit=j.spec.backoff_limit,
                  checkpoint=checkpoint_path(j.body))
        if v.action == SUCCEED:
            await self.complete(j, v.reason, now, message=v.message)
        elif v.action == FAIL:
            await self.fail(j, v.reason, v.message, now, ctype="Failed", cstatus="True",
                            extra={"failures": v.failures, "lastFailure": self._failure_record(v, gen, now)})
        elif v.action == RESTART:
            await self.restart(j, v, now)
        return v.action

    @staticmethod
    def _failure_record(v: Verdict, gen: int, now: float) -> dict:
        return {"worker": v.worker or "", "exitCode": v.exit_code, "generation": gen, "reason": v.reason,
                "time": format_time(now)}

    async def restart(self, j: _Job, v: Verdict, now: float) -> None:
        """End the current generation and start the next after the backoff: the new
        generation (and the failure count) are recorded first, then the old workers
        get SIGTERM with the grace period."""
        gen = j.generation
        patch: dict[str, Any] = {
            "restartGeneration": gen + 1,
            "conditions": set_condition(j.status.get("conditions"), "Restarting", "True", v.reason, v.message, now),
        }
        if v.count:
            patch["failures"] = v.failures
            patch["lastFailure"] = self._failure_record(v, gen, now)
            patch["restartAfter"] = format_time(now + v.backoff_s)
        await self.patch_status(j, patch)
        self.metrics.restarts.labels(reason=v.reason).inc()
        await self.event(j.body, v.reason, v.message, "Warning")
        await self.reconcile_pods(j, self._target(j))

    async def _starting(self, j: _Job, now: float) -> None:
        if await self._lifecycle(j, now) in (SUCCEED, FAIL):
            return
        target = self._target(j)
        await self.reconcile_pods(j, target)
        gen = j.generation
        live = [p for p in j.live_pods() if pod_generation(p) == gen]
        running = [p for p in live if (p.get("status") or {}).get("phase") == "Running"]
        if len(running) >= target:
            created = parse_time(j.body["metadata"].get("creationTimestamp")) or now
            queued = parse_time(j.status.get("queuedTime")) or created
            wait = max(0.0, (parse_time(j.status.get("admittedTime")) or now) - queued)
            await self.patch_status(j, {
                "phase": "Running", "startTime": format_time(now), "workers": len(live),
                "readyWorkers": len(running), "admissionWaitSeconds": wait, "startedGeneration": gen,
                "conditions": set_condition(j.status.get("conditions"), "Running", "True", "GangStarted",
                                            f"all {target} workers running", now),
            })
            await self.event(j.body, "Started", f"gang of {target} workers running after {wait:.1f}s in the queue")
            return
        admitted = max(parse_time(j.status.get("admittedTime")) or now,
                       parse_time(j.status.get("restartAfter")) or 0.0)
        if self.queues.start_timed_out(admitted, now):
            await self.patch_status(j, {
                "phase": "Queued", "workers": 0, "readyWorkers": 0, "targetWorkers": 0,
                "restartGeneration": gen + 1,
                "conditions": set_condition(j.status.get("conditions"), "Running", "False", "GangTimeout",
                                            f"{target - len(running)} of {target} workers still not running after "
                                            f"{self.config.start_timeout_s:.0f}s; requeued", now),
            })
            for p in j.live_pods():
                await self.delete_pod(j.ns, p["metadata"]["name"], 0)
            j.pods = []
            await self.event(j.body, "GangTimeout", f"only {len(running)}/{target} workers running; pods deleted, requeued", "Warning")

    async def _running(self, j: _Job, placement: list[int], now: float) -> RunningJob | None:
        """The running job as the scaling planner sees it, after its workers' exits
        were judged; None when that ended the job or restarted its generation."""
        if await self._lifecycle(j, now) != "none":
            return None
        await self._check_batch(j, now)
        target = j.spec.clamp_workers(j.status.get("targetWorkers"))
        gen = j.generation
        sizes = {w.gang_size for w in j.workers() if w.generation == gen and not w.stopping and w.gang_size}
        if sizes and sizes != {target}:
            # the target moved without a new generation (a status adopted after a
            # restart of the operator): the workers' WORLD_SIZE is wrong, start anew
            await self.restart(j, Verdict(RESTART, "Rescaled", f"workers {max(sizes)} -> {target}: "
                                          f"generation {gen + 1} starts at the new size"), now)
            return None
        complete = await self.reconcile_pods(j, target)
        live = [p for p in j.live_pods() if pod_generation(p) == gen]
        ready = sum(1 for p in live if any(c.get("type") == "Ready" and c.get("status") == "True"
                                          for c in (p.get("status") or {}).get("conditions") or []))
        patch: dict[str, Any] = {}
        if j.status.get("workers") != len(live) or j.status.get("readyWorkers") != ready:
            patch.update({"workers": len(live), "readyWorkers": ready})
        if complete and j.status.get("startedGeneration") != gen:
            patch["startedGeneration"] = gen  # every worker of the generation exists: a loss is now a restart
        if patch:
            await self.patch_status(j, patch)
        prog = progress_of(j.status)
        state = ElasticState.from_status(j.status.get("rlpto"))
        start = parse_time(j.status.get("startTime")) or now
        state.observe(prog, target, now - start, j.spec.beta, j.spec.data_size)
        submit = parse_time(j.body["metadata"].get("creationTimestamp")) or now
        obs = await self._observe_goodput(j, placement) if placement else None
        return RunningJob(key=j.key, spec=j.spec, workers=target, progress=prog, state=state,
                          submit_time=submit, start_time=start, placement=placement,
                          observations=obs if obs is not None and obs.shapes else None,
                          local_batch=self._local_batch(j))

    @staticmethod
    def _local_batch(j: _Job) -> float | None:
        """Samples per GPU of a job's fixed per-worker batch, from its chief's last
        report (``globalBatchSize`` over its GPUs); None when it reported none."""
        prog = j.status.get("progress")
        if not isinstance(prog, Mapping):
            return None
        batch, workers = prog.get("globalBatchSize"), prog.get("workers")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in (batch, workers)):
            return None
        return float(batch) / (float(workers) * j.spec.gpus_per_worker)

    async def _check_batch(self, j: _Job, now: float) -> None:
        """Condition ``BatchSizeIgnored`` (and an Event when it changes): whether the
        chief's report of the running generation shows the global batch the operator
        set (:func:`~rlsched.core.contract.judge_batch`)."""
        check = judge_batch(j.batch_size, j.status.get("progress"), j.generation)
        if check is None:
            return
        old = get_condition(j.status.get("conditions"), "BatchSizeIgnored")
        status = "False" if check.followed else "True"
        if (old is None and check.followed) or (old is not None and old.get("status") == status
                                                 and old.get("message") == check.message):
            return
        await self.patch_status(j, {"conditions": set_condition(
            j.status.get("conditions"), "BatchSizeIgnored", status,
            "BatchSizeFollowed" if check.followed else "BatchSizeIgnored", check.message, now)})
        if check.followed:
            await self.event(j.body, "BatchSizeFollowed", check.message)
        else:
            await self.event(j.body, "BatchSizeIgnored", check.message, "Warning")

    async def _release_stopped(self, j: _Job, now: float) -> None:
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
                    await self.patch_status(j, {"conditions": set_condition(
                        j.status.get("conditions"), "StopUnclean", "False" if v.clean else "True", v.reason,
                        v.message, now)})
                if not v.clean:
                    self.metrics.unclean_stops.inc()
                    await self.event(j.body, "StopUnclean", v.message, "Warning")
            if await self._release_pod(p):
                gone.add(md["name"])
        if gone:  # released pods that were being deleted are gone: the next generation may start now
            j.pods = [p for p in j.pods if p["metadata"]["name"] not in gone]
            j.finished = [p for p in j.finished if p["metadata"]["name"] not in gone]

    async def _release_pod(self, pod: Mapping) -> bool:
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

    # ------------------------------------------------------------------ actions
    async def reconcile_pods(self, j: _Job, target: int) -> bool:
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
            await self.ensure_rbac(j)  # idempotent; the pods run under the job's account
            await self.ensure_service(j)  # the workers' stable names
        for idx in missing:
            try:
                pod = worker_pod(j.body, idx, j.spec.gpus_per_worker,
                                 scheduler_name=self.config.scheduler_name, grace_period_s=self.config.grace_period_s,
                                 gang_size=target, generation=gen, batch_size=j.batch_size,
                                 # a generation's whole gang ran: a checkpoint may exist
                                 resume=j.status.get("startedGeneration") is not None)
            except ValueError as exc:  # WorkerGPUError, ShapeError: the template cannot make a worker
                raise JobRejected("Valid", "InvalidSpec", str(exc)) from exc
            name = pod["metadata"]["name"]
            try:
                created = await self.create_ignoring_conflict(self.core.create_namespaced_pod(j.ns, pod))
            except ApiException as exc:
                reason, message = api_error(exc)
                if permanent_rejection(exc.status, message):
                    raise JobRejected("PodsCreated", reason,
                                      f"the API server refused worker pod {name} ({exc.status} {reason}): {message}") from exc
                self.metrics.job_errors.labels(kind="transient").inc()
                await self._pods_pending(j, reason, f"creating worker pod {name} failed ({exc.status} {reason}): "
                                                    f"{message}; retried next cycle")
                return False
            if created:
                j.pods.append(pod)
            else:
                await self._clear_finished(j.ns, name)
                return False
        old_cond = get_condition(j.status.get("conditions"), "PodsCreated")
        if missing and old_cond and old_cond.get("status") != "True":
            await self.patch_status(j, {"conditions": set_condition(
                j.status.get("conditions"), "PodsCreated", "True", "Created", f"workers 0..{target - 1} exist",
                self.clock())})
        return True

    async def _pods_pending(self, j: _Job, reason: str, message: str) -> None:
        """Condition ``PodsCreated=False`` (and a Warning Event when it changes)."""
        old = get_condition(j.status.get("conditions"), "PodsCreated")
        if old and old.get("status") == "False" and old.get("reason") == reason:
            log.warning("%s: %s", j.key, message)
            return
        await self.patch_status(j, {"conditions": set_condition(
            j.status.get("conditions"), "PodsCreated", "False", reason, message, self.clock())})
        await self.event(j.body, "PodsNotCreated", message, "Warning")

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
        """The job's report permission (:func:`~rlsched.operator.resources.trainer_rbac`),
        idempotent; a binding of the job's that names another account (made before the
        template named its own) is replaced: the grant follows the account the pods run
        under, which the spec cannot change (the CRD holds it)."""
        sa, role, binding = trainer_rbac(j.body)
        if sa is not None:
            await self.create_ignoring_conflict(self.core.create_namespaced_service_account(j.ns, sa))
        await self.create_ignoring_conflict(self.rbac.create_namespaced_role(j.ns, role))
        if await self.create_ignoring_conflict(self.rbac.create_namespaced_role_binding(j.ns, binding)):
            return
        name = binding["metadata"]["name"]
        have = await self.read_json(self.rbac.read_namespaced_role_binding(name, j.ns, _preload_content=False))
        def who(subjects: Any) -> list[tuple]:
            return [(x.get("kind"), x.get("name"), x.get("namespace")) for x in subjects or [] if isinstance(x, Mapping)]

        if who(have.get("subjects")) != who(binding["subjects"]) or \
                (have.get("roleRef") or {}).get("name") != binding["roleRef"]["name"]:
            owner = controlling_job(have)
            if owner is None or owner.uid != j.uid:
                raise JobRejected("PodsCreated", "RoleBindingTaken",
                                  f"RoleBinding {name} exists and is not this job's: rlsched cannot grant the "
                                  f"job's report permission")
            await self.rbac.delete_namespaced_role_binding(name, j.ns)
            await self.rbac.create_namespaced_role_binding(j.ns, binding)
            log.info("%s: RoleBinding %s now binds %s", j.key, name, binding["subjects"][0]["name"])

    async def ensure_service(self, j: _Job) -> None:
        """The job's headless Service (idempotent)."""
        await self.create_ignoring_conflict(self.core.create_namespaced_service(j.ns, worker_service(j.body)))

    async def admit(self, j: _Job, now: float, *, target: int | None = None, batch: int | None = None) -> None:
        """Start the job's gang: ``minWorkers`` workers, or (an allocator) ``target``
        workers at global batch ``batch``."""
        target = j.spec.min_workers if target is None else target
        queued = parse_time(j.status.get("queuedTime")) or parse_time(j.body["metadata"].get("creationTimestamp")) or now
        self.metrics.admission_wait.observe(max(0.0, now - queued))
        resumed = j.status.get("queue") == "interrupt"
        patch: dict[str, Any] = {
            "phase": "Starting", "targetWorkers": target, "admittedTime": format_time(now), "nominated": False,
            "waiting": None,
            "conditions": set_condition(j.status.get("conditions"), "Admitted", "True", "GangFits",
                                        f"{target} x {j.spec.gpus_per_worker} GPUs free", now),
        }
        if self.allocation is not None:
            patch.update({"batchSize": batch, "attainedSince": format_time(now)})
        await self.patch_status(j, patch)
        if resumed:  # a preempted job back from the interrupt queue (counted once the status says so)
            self.metrics.resumes.inc()
        await self.event(j.body, "Admitted",
                         f"starting gang of {target} workers x {j.spec.gpus_per_worker} GPUs from queue {j.status.get('queue')}"
                         + (" (resuming after a preemption)" if resumed else ""))
        await self.reconcile_pods(j, target)

    async def _waiting(self, j: _Job, why: WaitReason | None) -> None:
        """``status.waiting``: the job's place in the service order and why it is not
        running (what ``rlsched why`` prints), written when it changes."""
        if why is None:
            return
        new = why.to_status()
        if j.status.get("waiting") != new:
            await self.patch_status(j, {"waiting": new})

    async def _suspended(self, j: _Job, now: float, hold: WaitReason | None = None) -> None:
        """``spec.suspend`` (or ``hold``: Kueue has not admitted the job): a job holding
        workers goes back to the queue (recorded first, then its workers get the grace
        period to checkpoint, as a preemption); a queued one stays there. Condition
        ``Suspended=True`` (reason: the hold's) while it lasts and ``status.waiting``
        saying why, refreshed as the reason changes; the job is admitted as any other once
        ``spec.suspend`` is cleared (Kueue admits it)."""
        if j.spec.suspend or hold is None:
            hold = SUSPENDED
        old = get_condition(j.status.get("conditions"), "Suspended")
        patch: dict[str, Any] = {}
        if j.status.get("phase") in ("Starting", "Running"):
            patch.update({"phase": "Queued", "targetWorkers": 0, "workers": 0, "readyWorkers": 0,
                          "restartGeneration": j.generation + 1, "queuedTime": format_time(now)})
            if self.allocation is not None:
                patch.update({"attainedGpuSeconds": self._service(j, now), "attainedSince": None, "batchSize": None})
        if not old or old.get("status") != "True" or old.get("reason") != hold.reason:
            patch["conditions"] = set_condition(j.status.get("conditions"), "Suspended", "True", hold.reason,
                                                hold.message, now)
        if j.status.get("waiting") != hold.to_status():
            patch["waiting"] = hold.to_status()
        if patch:
            await self.patch_status(j, patch)
            if "phase" in patch or "conditions" in patch:
                await self.event(j.body, "Suspended", f"{hold.message}; workers stopped" if "phase" in patch
                                 else hold.message)
        for p in j.live_pods():
            await self.delete_pod(j.ns, p["metadata"]["name"], self.config.grace_period_s)

    # ------------------------------------------------------------------ Kueue
    async def _kueue_gate(self, jobs: Mapping[str, _Job], by_uid: Mapping[str, _Job]) -> None:
        """Kueue's decision on each labelled job (operator/kueue.py): held until its
        Workload is admitted, then run within the admitted count; a finished job's
        Workload is marked Finished (Kueue releases its quota)."""
        try:
            if self.config.namespace:
                call = self.custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, self.config.namespace,
                                                                 KUEUE_WORKLOAD_PLURAL, _preload_content=False)
            else:
                call = self.custom.list_cluster_custom_object(KUEUE_GROUP, KUEUE_VERSION, KUEUE_WORKLOAD_PLURAL,
                                                              _preload_content=False)
            workloads = (await self.read_json(call))["items"]
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
                await self._finish_workload(j, phase == "Succeeded")
                continue
            adm = kueue_admission_of(j.workload)
            if not adm.admitted:
                j.hold = WaitReason(0, adm.reason, adm.message)
            else:  # rlsched places and scales within what Kueue admitted
                top = max(j.spec.min_workers, min(j.spec.max_workers, adm.workers))
                j.spec = dataclasses.replace(j.spec, max_workers=top)

    async def _create_workload(self, j: _Job) -> None:
        body = workload_for(j.body, j.spec)
        try:
            await self.custom.create_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, j.ns, KUEUE_WORKLOAD_PLURAL,
                                                              body)
            await self.event(j.body, "WorkloadCreated", f"Kueue Workload {body['metadata']['name']} in LocalQueue "
                                                        f"{body['spec']['queueName']}: the job waits for its admission")
        except ApiException as exc:
            if exc.status != 409:  # 409: made by an earlier cycle, not listed yet
                raise

    async def _finish_workload(self, j: _Job, succeeded: bool) -> None:
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

    async def preempt(self, j: _Job, by: str, now: float) -> None:
        """Back to the interrupt queue: the next generation is recorded first, then the
        workers get SIGTERM with the grace period to checkpoint."""
        self.metrics.preemptions.inc()
        before = j.status.get("preemptions")
        count = before if isinstance(before, int) and not isinstance(before, bool) and before >= 0 else 0
        await self.patch_status(j, {
            "phase": "Queued", "queue": "interrupt", "targetWorkers": 0, "workers": 0, "readyWorkers": 0,
            "preemptions": count + 1, "queuedTime": format_time(now), "restartGeneration": j.generation + 1,
            "conditions": set_condition(j.status.get("conditions"), "Running", "False", "Preempted",
                                        f"preempted by {by}; resumes first from the interrupt queue", now),
        })
        for p in j.live_pods():
            await self.delete_pod(j.ns, p["metadata"]["name"], self.config.grace_period_s)
        await self.event(j.body, "Preempted",
                         f"preempted by highest-priority job {by}; workers get {self.config.grace_period_s}s to checkpoint",
                         "Warning")

    async def complete(self, j: _Job, why: str, now: float, *, message: str = "",
                       rj: RunningJob | None = None) -> None:
        """The job Succeeded: recorded first, then the workers still running get SIGTERM
        with the grace period (so a script stopped by the beta stop or maxEpochs saves
        its model); a crash in between leaves a finished job whose pods the next cycle
        stops, never a job run again."""
        created = parse_time(j.body["metadata"].get("creationTimestamp")) or now
        prog = rj.progress if rj is not None else progress_of(j.status)
        what = message or f"epoch {prog.epoch}, accuracy {prog.accuracy:.4f}"
        patch: dict[str, Any] = {
            "phase": "Succeeded", "reason": why, "completionTime": format_time(now), "jctSeconds": now - created,
            "targetWorkers": 0, "workers": 0, "readyWorkers": 0,
            "conditions": set_condition(j.status.get("conditions"), "Complete", "True", why, what, now),
        }
        if rj is not None:
            patch["rlpto"] = rj.state.to_status()
        if j.status.get("attainedSince") is not None:  # the service attained up to the end
            patch.update({"attainedGpuSeconds": self._service(j, now), "attainedSince": None})
        await self.patch_status(j, patch)
        for p in j.live_pods():
            await self.delete_pod(j.ns, p["metadata"]["name"], self.config.grace_period_s)
        self.metrics.completions.labels(reason=why).inc()
        await self.event(j.body, "Completed", f"{why}: {what}, JCT {now - created:.1f}s")

    async def fail(self, j: _Job, reason: str, message: str, now: float, *, ctype: str = "Valid",
                   cstatus: str = "False", extra: Mapping[str, Any] | None = None) -> None:
        """Fail the job for good: phase ``Failed`` with condition ``ctype=cstatus``
        (``reason``, ``message``) recorded first, then its pods are deleted at once
        (their GPUs freed), and a Warning Event."""
        await self.patch_status(j, {
            "phase": "Failed", "reason": reason, "message": message, "queue": "", "targetWorkers": 0,
            "workers": 0, "readyWorkers": 0, "nominated": False, **(extra or {}),
            "conditions": set_condition(j.status.get("conditions"), ctype, cstatus, reason, message, now),
        })
        for p in j.live_pods():
            await self.delete_pod(j.ns, p["metadata"]["name"], 0)
        self.metrics.failures.labels(reason=reason).inc()
        await self.event(j.body, reason, message, "Warning")

    async def sweep_rbac(self, uids: set[str]) -> None:
        """Delete the workers' Services and trainer ServiceAccounts/Roles/RoleBindings
        controlled by a TrainingJob that is gone (objects only labelled as the
        operator's are kept)."""
        sel = "app.kubernetes.io/managed-by=rlsched-operator"
        ns = self.config.namespace
        kinds = [
            (self.core.list_service_account_for_all_namespaces, self.core.list_namespaced_service_account,
             self.core.delete_namespaced_service_account),
            (self.core.list_service_for_all_namespaces, self.core.list_namespaced_service,
             self.core.delete_namespaced_service),
            (self.rbac.list_role_for_all_namespaces, self.rbac.list_namespaced_role, self.rbac.delete_namespaced_role),
            (self.rbac.list_role_binding_for_all_namespaces, self.rbac.list_namespaced_role_binding,
             self.rbac.delete_namespaced_role_binding),
        ]
        for list_all, list_ns, delete in kinds:
            call = list_ns(ns, label_selector=sel, _preload_content=False) if ns else list_all(
                label_selector=sel, _preload_content=False)
            for item in (await self.read_json(call))["items"]:
                owner = controlling_job(item)
                if owner is None or owner.uid in uids:
                    continue
                md = item["metadata"]
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
        m.unfittable.set(len(plan.unfittable))


def _short(v: Any) -> str:
    """A status value for a message, at most 60 characters."""
    text = json.dumps(v, sort_keys=True, default=str) if v is not None else "(unset)"
    return text if len(text) <= 60 else text[:57] + "..."
