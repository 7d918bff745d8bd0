"""TrainingJob spec: parsing and the checks the OpenAPI schema cannot express.

The API server rejects most bad specs (CRD schema, CEL rules); what remains is checked
here in pure code, so the create handler and the control loop agree on a valid job: the
pod template must not fight the operator (scheduler name, GPU requests other than
``gpusPerWorker``) and worker pod names must stay valid labels.
Details: docs/design-notes.md.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import copy

from rlsched.core.contract import (
    CHECKPOINT_VOLUME,
    DEFAULT_BACKOFF_LIMIT,
    DEFAULT_MASTER_PORT,
    DEFAULT_SCHEDULER_NAME,
    MAX_BATCH_SIZE,
    PRIORITY_CLASSES,
    SUCCESS_POLICIES,
    RESOURCE_GPU,
    ShapeError,
    container_gpus,
    dns_label,
    PodRequests,
    pod_gpus,
    pod_requests,
)
from rlsched.core.planning import TrainingSpec

from .resources import set_worker_gpus, worker_name

__all__ = ["SpecError", "parse_spec"]


class SpecError(ValueError):
    """The TrainingJob spec is invalid; ``problems`` lists every reason."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _int(spec: Mapping, key: str, default: Any, problems: list[str]) -> Any:
    v = spec.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or float(v) != int(v):
        problems.append(f"spec.{key} must be an integer, got {v!r}")
        return default
    return int(v)


def _num(v: Any, where: str, default: float, problems: list[str]) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        problems.append(f"{where} must be a finite number, got {v!r}")
        return default
    return float(v)


def parse_spec(
    spec: Mapping[str, Any] | None, *, scheduler_name: str = DEFAULT_SCHEDULER_NAME, name: str | None = None
) -> TrainingSpec:
    """Parse and validate ``spec`` (of the job called ``name``, when given: its worker
    pod names are checked too); raise :class:`SpecError` listing every problem."""
    problems: list[str] = []
    if not isinstance(spec, Mapping):
        raise SpecError(["spec is missing"])
    mn, mx, gpw, pinned = _worker_counts(spec, problems)
    max_epochs, data_size, beta, est = _training(spec, problems)

    batch = _int(spec, "batchSize", None, problems)
    if batch is not None and batch < 1:
        problems.append(f"spec.batchSize must be >= 1, got {batch}")
    max_batch = _int(spec, "maxBatchSize", None, problems)
    for key, v in (("batchSize", batch), ("maxBatchSize", max_batch)):
        if v is not None and v > MAX_BATCH_SIZE:
            problems.append(f"spec.{key} must be at most {MAX_BATCH_SIZE} samples, got {v}")
    if max_batch is not None and batch is None:
        problems.append("spec.maxBatchSize needs spec.batchSize (the batch the job was tuned for)")
    elif max_batch is not None and batch is not None and max_batch < batch:
        problems.append(f"spec.maxBatchSize ({max_batch}) must be >= spec.batchSize ({batch})")
    local = spec.get("localBatchSize") or {}
    if not isinstance(local, Mapping):
        problems.append("spec.localBatchSize must be an object {min, max}")
        local = {}
    lmin = _int({"localBatchSize.min": local.get("min")}, "localBatchSize.min", None, problems)
    lmax = _int({"localBatchSize.max": local.get("max")}, "localBatchSize.max", None, problems)
    for what, v in (("min", lmin), ("max", lmax)):
        if v is not None and v < 1:
            problems.append(f"spec.localBatchSize.{what} must be >= 1, got {v}")
        elif v is not None and v > MAX_BATCH_SIZE:
            problems.append(f"spec.localBatchSize.{what} must be at most {MAX_BATCH_SIZE} samples, got {v}")
    if lmin is not None and lmax is not None and lmin > lmax:
        problems.append(f"spec.localBatchSize.min ({lmin}) must be <= spec.localBatchSize.max ({lmax})")
    suspend, queue_name = _queueing(spec, problems)
    port = _int(spec, "masterPort", DEFAULT_MASTER_PORT, problems)
    if port is not None and not (1 <= port <= 65535):
        problems.append(f"spec.masterPort must lie in 1..65535, got {port}")
    backoff = _int(spec, "backoffLimit", DEFAULT_BACKOFF_LIMIT, problems)
    if backoff is not None and backoff < 0:
        problems.append(f"spec.backoffLimit must be >= 0, got {backoff}")
    policy = spec.get("successPolicy", "Chief")
    if policy not in SUCCESS_POLICIES:
        problems.append(f"spec.successPolicy must be one of {', '.join(SUCCESS_POLICIES)}, got {policy!r}")
        policy = "Chief"
    _check_checkpoint(spec.get("checkpoint"), spec.get("template"), problems)
    seed = _seed_profile(spec.get("seedProfile"), problems)

    klass, value = _priority(spec, problems)
    worker = _check_template(spec.get("template"), gpw or 1, scheduler_name, problems)
    if name is not None:
        _check_name(name, mx, problems)
    if problems:
        raise SpecError(problems)
    return TrainingSpec(
        min_workers=mn,
        max_workers=mx,
        gpus_per_worker=gpw,
        priority_class=klass,
        priority_value=value,
        beta=beta,
        max_epochs=max_epochs,
        data_size=data_size,
        estimated_runtime=est,
        pinned_workers=pinned,
        success_policy=policy,
        backoff_limit=DEFAULT_BACKOFF_LIMIT if backoff is None else backoff,
        batch_size=batch,
        max_batch_size=max_batch,
        local_batch_size=(lmin, lmax),
        suspend=suspend,
        queue_name=queue_name,
        cpu_milli=worker.cpu_milli if worker is not None else 0,
        memory_mib=worker.memory_mib if worker is not None else 0,
        seed_profile=seed,
    )


#: rows of ``spec.seedProfile`` at most (the CRD's ``maxItems``)
MAX_SEED_ROWS = 256


def _seed_profile(rows: Any, problems: list[str]) -> tuple[tuple[str, int, float], ...]:
    """``spec.seedProfile`` as ``(gpuType, localBatchSize, stepTimeSeconds)`` rows;
    problems appended."""
    if rows is None:
        return ()
    if not isinstance(rows, list) or len(rows) > MAX_SEED_ROWS:
        problems.append(f"spec.seedProfile must be a list of at most {MAX_SEED_ROWS} rows")
        return ()
    out = []
    for i, row in enumerate(rows):
        where = f"spec.seedProfile[{i}]"
        if not isinstance(row, Mapping):
            problems.append(f"{where} must be an object {{gpuType, localBatchSize, stepTimeSeconds}}")
            continue
        gtype, m, t = row.get("gpuType"), row.get("localBatchSize"), row.get("stepTimeSeconds")
        ok = True
        if not isinstance(gtype, str) or not gtype:
            problems.append(f"{where}.gpuType must be a GPU type or product name, got {gtype!r}")
            ok = False
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= MAX_BATCH_SIZE:
            problems.append(f"{where}.localBatchSize must be an integer in 1..{MAX_BATCH_SIZE}, got {m!r}")
            ok = False
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
            problems.append(f"{where}.stepTimeSeconds must be a finite number > 0, got {t!r}")
            ok = False
        if ok:
            out.append((gtype, int(m), float(t)))
    return tuple(out)


def _worker_counts(spec: Mapping[str, Any], problems: list[str]) -> tuple:
    """``(minWorkers, maxWorkers, gpusPerWorker, workers)``; problems appended."""
    mn = _int(spec, "minWorkers", None, problems)
    mx = _int(spec, "maxWorkers", None, problems)
    if mn is None:
        problems.append("spec.minWorkers is required")
    elif mn < 1:
        problems.append(f"spec.minWorkers must be >= 1, got {mn}")
    if mx is None:
        problems.append("spec.maxWorkers is required")
    if mn is not None and mx is not None and mn > mx:
        problems.append(f"spec.minWorkers ({mn}) must be <= spec.maxWorkers ({mx})")
    gpw = _int(spec, "gpusPerWorker", 1, problems)
    if gpw is not None and gpw < 1:
        problems.append(f"spec.gpusPerWorker must be >= 1, got {gpw}")
    pinned = _int(spec, "workers", None, problems)
    if pinned is not None and mn is not None and mx is not None and not (mn <= pinned <= mx):
        problems.append(f"spec.workers ({pinned}) must lie within [minWorkers, maxWorkers] = [{mn}, {mx}]")
    return mn, mx, gpw, pinned


def _training(spec: Mapping[str, Any], problems: list[str]) -> tuple:
    """``(maxEpochs, dataSize, beta, estimatedRuntime)``; problems appended."""
    max_epochs = _int(spec, "maxEpochs", 100, problems)
    if max_epochs is not None and max_epochs < 1:
        problems.append(f"spec.maxEpochs must be >= 1, got {max_epochs}")
    data_size = _int(spec, "dataSize", 0, problems)
    if data_size is not None and data_size < 0:
        problems.append(f"spec.dataSize must be >= 0, got {data_size}")
    beta = _num(spec.get("beta", 0.001), "spec.beta", 0.001, problems)
    if not (0.0 < beta < 1.0):
        problems.append(f"spec.beta must satisfy 0 < beta < 1, got {beta}")
    est = _num(spec.get("estimatedRuntime", 0.0), "spec.estimatedRuntime", 0.0, problems)
    if est < 0:
        problems.append(f"spec.estimatedRuntime must be >= 0, got {est}")
    return max_epochs, data_size, beta, est


def _queueing(spec: Mapping[str, Any], problems: list[str]) -> tuple[bool, str | None]:
    """``(suspend, queueName)``; problems appended."""
    suspend = spec.get("suspend", False)
    if not isinstance(suspend, bool):
        problems.append(f"spec.suspend must be true or false, got {suspend!r}")
        suspend = False
    queue_name = spec.get("queueName")
    if queue_name is not None and (not isinstance(queue_name, str) or not queue_name):
        problems.append(f"spec.queueName must be a TrainingQueue's name, got {queue_name!r}")
        queue_name = None
    return suspend, queue_name


def _priority(spec: Mapping[str, Any], problems: list[str]) -> tuple[str, float]:
    """``(class, value)`` of ``spec.priority``; problems appended."""
    prio = spec.get("priority") or {}
    if not isinstance(prio, Mapping):
        problems.append("spec.priority must be an object {class, value}")
        prio = {}
    klass = prio.get("class", "normal")
    if klass not in PRIORITY_CLASSES:
        problems.append(f"spec.priority.class must be one of {', '.join(PRIORITY_CLASSES)}, got {klass!r}")
        klass = "normal"
    return klass, _num(prio.get("value", 0.0), "spec.priority.value", 0.0, problems)


def _check_name(name: str, mx: int | None, problems: list[str]) -> None:
    """The job name names the headless Service and, with ``maxWorkers``, the worker pods."""
    try:
        dns_label(name, "the job name")
        if not name[:1].isalpha():
            raise ShapeError(f"the job name {name!r} must start with a letter: it names the workers' "
                             f"headless Service (an RFC 1035 label)")
        if mx is not None and mx >= 1:
            try:
                dns_label(worker_name(name, mx - 1), "worker pod name")
            except ShapeError as exc:
                raise ShapeError(f"{exc} (from the job name and spec.maxWorkers {mx}); shorten the name") from None
    except ShapeError as exc:
        problems.append(str(exc))


def _check_checkpoint(ckpt: Any, template: Any, problems: list[str]) -> None:
    """``spec.checkpoint``: ``{path, volume?}``; the path absolute, the volume a volume
    source (an object without a ``name``: the operator names it), and the template
    not already using the volume's name."""
    if ckpt is None:
        return
    if not isinstance(ckpt, Mapping):
        problems.append("spec.checkpoint must be an object {path, volume}")
        return
    path = ckpt.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        problems.append(f"spec.checkpoint.path must be an absolute path, got {path!r}")
    vol = ckpt.get("volume")
    if vol is None:
        return
    if not isinstance(vol, Mapping) or not vol:
        problems.append("spec.checkpoint.volume must be a volume source such as "
                        "{persistentVolumeClaim: {claimName: ...}}")
        return
    if "name" in vol:
        problems.append(f"spec.checkpoint.volume must not have a name: the operator mounts it as {CHECKPOINT_VOLUME!r}")
    pod = template.get("spec") if isinstance(template, Mapping) else None
    vols = pod.get("volumes") if isinstance(pod, Mapping) else None
    if isinstance(vols, list) and any(isinstance(v, Mapping) and v.get("name") == CHECKPOINT_VOLUME for v in vols):
        problems.append(f"spec.template.spec.volumes already has a volume named {CHECKPOINT_VOLUME!r}; "
                        f"rename it (the operator mounts spec.checkpoint.volume under that name)")


def _check_template(template: Any, gpw: int, scheduler_name: str, problems: list[str]) -> PodRequests | None:
    """Check the worker template; what one worker pod built from it asks for (GPUs, CPU,
    memory: :func:`~rlsched.core.contract.pod_requests`), None when it is invalid."""
    if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
        problems.append("spec.template.spec is required (a pod spec)")
        return None
    pod = template["spec"]
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        problems.append("spec.template.spec.containers must list at least one container")
        return None
    sched = pod.get("schedulerName")
    if sched not in (None, "", scheduler_name):
        problems.append(
            f"spec.template.spec.schedulerName is {sched!r}; the operator places workers with "
            f"{scheduler_name!r}, leave it unset"
        )
    if pod.get("restartPolicy") not in (None, "", "Never"):
        problems.append(f"spec.template.spec.restartPolicy is {pod.get('restartPolicy')!r}; workers run with "
                        f"'Never': the operator restarts the whole generation (spec.backoffLimit)")
    if pod.get("hostname") or pod.get("subdomain"):
        problems.append("spec.template.spec.hostname and subdomain must be unset: the operator gives each worker "
                        "its stable name under the job's headless Service")
    if pod.get("nodeName"):
        problems.append("spec.template.spec.nodeName must be unset: the scheduler places workers")
    if not all(isinstance(c, Mapping) for c in containers):
        problems.append("spec.template.spec.containers entries must be objects")
        return None
    try:
        total = pod_gpus(template, "spec.template")
    except ShapeError as exc:
        problems.append(str(exc))
        return None
    if total and total != gpw:
        problems.append(
            f"the pod template asks for {total} {RESOURCE_GPU} but spec.gpusPerWorker is {gpw}; "
            f"set the GPUs in gpusPerWorker only"
        )
        return None
    before = len(problems)
    for i, c in enumerate(containers[1:], 1):
        n = container_gpus(c, f"spec.template.spec.containers[{i}]")
        if n:
            problems.append(
                f"spec.template.spec.containers[{i}] asks for {n} {RESOURCE_GPU}: the operator gives "
                f"the first container spec.gpusPerWorker ({gpw}) GPUs, other containers may not ask for any"
            )
    inits = pod.get("initContainers") or []
    for i, c in enumerate(inits if isinstance(inits, list) else []):
        n = container_gpus(c, f"spec.template.spec.initContainers[{i}]")
        if n > gpw:
            problems.append(
                f"spec.template.spec.initContainers[{i}] asks for {n} {RESOURCE_GPU}, more than "
                f"spec.gpusPerWorker ({gpw}): each worker would hold {n}"
            )
    built = set_worker_gpus(copy.deepcopy(dict(pod)), gpw)
    try:
        worker = pod_requests({"spec": built}, "spec.template")
    except ShapeError as exc:
        problems.append(str(exc))
        return None
    if worker.gpus != gpw and len(problems) == before:
        problems.append(f"a worker pod would ask for {worker.gpus} {RESOURCE_GPU}, spec.gpusPerWorker is {gpw}")
    return worker if len(problems) == before else None
