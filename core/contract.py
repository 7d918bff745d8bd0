"""The Kubernetes contract of rlsched in one place: names, and a pure parser of shapes.

Names of the TrainingJob CRD, the labels, annotations, worker environment and topology
labels rlsched reads and writes (the CRD manifests spell the same; a test holds them
equal); parsers of quantities, GPU requests and node shapes that raise
:class:`ShapeError` with the path of a bad field; name checks as the API server
validates them. Pure: no Kubernetes client, no I/O. Details: docs/design-notes.md.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable, Mapping

__all__ = [
    # CRD
    "GROUP",
    "VERSION",
    "API_VERSION",
    "PLURAL",
    "SINGULAR",
    "KIND",
    "SHORT_NAME",
    "CRD_NAME",
    # pods
    "DEFAULT_SCHEDULER_NAME",
    "RESOURCE_GPU",
    "LABEL_JOB",
    "LABEL_ROLE",
    "LABEL_INDEX",
    "LABEL_MANAGED_BY",
    "MANAGED_BY_OPERATOR",
    "ROLE_CHIEF",
    "ROLE_WORKER",
    "ANNOTATION_REQUIRED_TOPOLOGY",
    "ANNOTATION_GANG_SIZE",
    "ANNOTATION_GPU_MODELS",
    "gpu_model_rule",
    "PodRequests",
    "pod_requests",
    "container_requests",
    "parse_topology_levels",
    "MAX_MODELS_TEXT",
    "ANNOTATION_OBSERVED_SPEED",
    "ANNOTATION_PRIORITY_REQUESTS",
    "ANNOTATION_EVENT_TIME",
    "ANNOTATION_DURATION",
    "ANNOTATION_EXIT_CODE",
    "ANNOTATION_STOP_EXIT_CODE",
    "FINALIZER_WORKER_EXIT",
    "ANNOTATION_TRACE_JOB",
    "ENV_JOB",
    "ENV_NAMESPACE",
    "ENV_INDEX",
    "ENV_ROLE",
    # the worker contract (rendezvous, generations, batch size, checkpoints)
    "LABEL_GENERATION",
    "ENV_MASTER_ADDR",
    "ENV_MASTER_PORT",
    "ENV_WORLD_SIZE",
    "ENV_RANK",
    "ENV_LOCAL_RANK",
    "ENV_GENERATION",
    "ENV_BATCH_SIZE",
    "ENV_CHECKPOINT_DIR",
    "TORCHRUN_ENV",
    "DEFAULT_MASTER_PORT",
    "CHECKPOINT_VOLUME",
    "DEFAULT_CHECKPOINT_PATH",
    "SUCCESS_POLICIES",
    "DEFAULT_BACKOFF_LIMIT",
    "PRIORITY_CLASSES",
    "class_rank",
    "EXIT_SIGTERM",
    "EXIT_CHECKPOINT",
    "ENV_MICRO_BATCH_LIMIT",
    "ENV_RESUME",
    "parse_resume",
    "ENV_NPROC_PER_NODE",
    "ContractError",
    "WorkerContract",
    "service_name",
    "worker_hostname",
    "master_addr",
    # the trainer's identity and what it may write
    "TRAINER_ACCOUNT_SUFFIX",
    "trainer_account_name",
    "worker_account",
    "BatchCheck",
    "judge_batch",
    "TRAINER_STATUS_POLICY",
    # nodes
    "LABEL_BLOCK",
    "LABEL_RACK",
    "LABEL_HOSTNAME",
    "LABEL_GPU_COUNT",
    "LABEL_GPU_PRODUCT",
    "LABEL_GPU_CLIQUE",
    "LABEL_GPU_PRESENT",
    "LABEL_NVLINK_DOMAIN_SIZE",
    "LABEL_GPU_PRICE",
    "DEFAULT_TOPOLOGY_LEVELS",
    # GPU types
    "ENV_GPU_TYPE",
    "MAX_GPU_TYPES",
    "parse_gpu_types",
    "gpu_type_of",
    "products_of_type",
    # pod security
    "POD_SECURITY_PRIVILEGED",
    "POD_SECURITY_BASELINE",
    "POD_SECURITY_RESTRICTED",
    "POD_SECURITY_LEVELS",
    "LABEL_POD_SECURITY_ENFORCE",
    "LABEL_ALLOW_SECRET_MOUNTS",
    "ANNOTATION_APPARMOR_PREFIX",
    # parser
    "ShapeError",
    "MAX_GPUS",
    "field",
    "str_map",
    "parse_quantity",
    "gpu_count",
    "whole_number",
    "container_gpus",
    "pod_gpus",
    "NodeShape",
    "node_shape",
    "node_gpus",
    "JobOwner",
    "controlling_job",
    # names
    "MAX_SUBDOMAIN_CHARS",
    "MAX_LABEL_CHARS",
    "dns_subdomain",
    "dns_label",
    "label_value",
    "QUEUE_PLURAL",
    "QUEUE_KIND",
    "QUEUE_CRD_NAME",
    "VERB_RAISE_PRIORITY",
    "KUEUE_LABEL_QUEUE_NAME",
    "KUEUE_GROUP",
    "KUEUE_VERSION",
]

# --------------------------------------------------------------------------- the CRD
GROUP = "rlsched.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "trainingjobs"
SINGULAR = "trainingjob"
KIND = "TrainingJob"
SHORT_NAME = "tj"
CRD_NAME = f"{PLURAL}.{GROUP}"
#: the cluster-scoped TrainingQueue: one team's GPU quota, fair-share weight, classes
QUEUE_PLURAL = "trainingqueues"
QUEUE_KIND = "TrainingQueue"
QUEUE_CRD_NAME = f"{QUEUE_PLURAL}.{GROUP}"
#: the RBAC verb on a TrainingQueue (by name) a user needs to create or raise a job of
#: its queue above ``normal``/``urgent`` (class ``highest``, the priority annotation);
#: the chart's priority-guard admission policy asks the API server's authorizer for it
VERB_RAISE_PRIORITY = "raise-priority"

# --------------------------------------------------------------------------- Kueue
#: a TrainingJob with this label is admitted by Kueue (its LocalQueue), placed and
#: scaled by rlsched within what Kueue admitted (operator/kueue.py)
KUEUE_LABEL_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"

# --------------------------------------------------------------------------- pods
#: ``schedulerName`` of worker pods: kube-scheduler's profile that calls the extender
DEFAULT_SCHEDULER_NAME = "rlsched"
#: the extended resource of NVIDIA's device plugin
RESOURCE_GPU = "nvidia.com/gpu"

#: worker pods: name of their TrainingJob (also on gang pods the extender places together)
LABEL_JOB = "rlsched.dev/job"
#: worker pods: ``chief`` (index 0, reports progress) or ``worker``
LABEL_ROLE = "rlsched.dev/role"
#: worker pods: 0, 1, ... (the pod is ``<job>-worker-<index>``)
LABEL_INDEX = "rlsched.dev/worker-index"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_OPERATOR = "rlsched-operator"
ROLE_CHIEF = "chief"
ROLE_WORKER = "worker"

#: pods: every worker of the job within one ``nvlink``/``node``/``rack``/``block``
ANNOTATION_REQUIRED_TOPOLOGY = "rlsched.dev/required-topology"
#: pods: number of workers of the gang (for the required-topology room check)
ANNOTATION_GANG_SIZE = "rlsched.dev/gang-size"
#: pods: comma-separated GPU products the pod may run on
ANNOTATION_GPU_MODELS = "rlsched.dev/gpu-models"
#: pods: measured speed relative to nominal (1.0), fed to DAS's node-performance GP
ANNOTATION_OBSERVED_SPEED = "rlsched.dev/observed-speed"
#: TrainingJobs: user-incremented counter of priority requests (RLPTO's N)
ANNOTATION_PRIORITY_REQUESTS = "rlsched.dev/priority-requests"
#: Events posted by the operator: Unix time with microseconds
ANNOTATION_EVENT_TIME = "rlsched.dev/event-time"
#: pods on the local control plane (kwok): Succeeded after this many seconds
ANNOTATION_DURATION = "rlsched.dev/duration-seconds"
#: pods on the local control plane (kwok): with the duration, Failed with this exit code
ANNOTATION_EXIT_CODE = "rlsched.dev/exit-code"
#: pods on the local control plane (kwok): when deleted while running, Failed with this
#: exit code (as a script that exits so on SIGTERM) before they go away
ANNOTATION_STOP_EXIT_CODE = "rlsched.dev/stop-exit-code"
#: worker pods: kept after they terminate until the operator has read their exit code
#: (the exit of a worker it stopped is judged too), then removed by the operator
FINALIZER_WORKER_EXIT = "rlsched.dev/worker-exit"
#: TrainingJobs submitted by the demo: the id of the trace job they replay
ANNOTATION_TRACE_JOB = "rlsched.dev/trace-job"

#: environment of worker pods (the operator sets it; ``rlsched.trainer`` reads it)
ENV_JOB = "RLSCHED_JOB_NAME"
ENV_NAMESPACE = "RLSCHED_JOB_NAMESPACE"
ENV_INDEX = "RLSCHED_WORKER_INDEX"
ENV_ROLE = "RLSCHED_ROLE"

# --------------------------------------------------------------------------- the worker contract
# What every worker process finds in its environment: the rendezvous variables
# PyTorchJob and torchrun users know (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK,
# LOCAL_RANK; torchrun reads the PET_* twins of its flags), and rlsched's own: the
# restart generation, the global batch size and the checkpoint directory. One process
# per worker pod: RANK is the worker index, WORLD_SIZE the number of workers of the
# generation. A rescale, a resume after preemption or a restart after a failure ends
# the generation (every worker gets SIGTERM and the grace period) and starts the next
# one at the new size; pods carry their generation in LABEL_GENERATION.
#: pods: the restart generation they belong to (0, 1, ...)
LABEL_GENERATION = "rlsched.dev/generation"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_RANK = "RANK"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_GENERATION = "RLSCHED_GENERATION"
#: the job's global batch size (summed over workers) for this generation; absent when
#: neither the spec nor the scheduler sets one
ENV_BATCH_SIZE = "RLSCHED_GLOBAL_BATCH_SIZE"
#: where the job's checkpoints live (``spec.checkpoint.path``); absent without one
ENV_CHECKPOINT_DIR = "RLSCHED_CHECKPOINT_DIR"
#: the most samples one process takes in one forward/backward pass (the per-worker
#: micro-batch limit, ``spec.localBatchSize.max``); absent when the spec gives none
ENV_MICRO_BATCH_LIMIT = "RLSCHED_MICRO_BATCH_LIMIT"
#: ``1`` when an earlier generation of the job ran (a generation's whole gang was
#: running: ``status.startedGeneration`` is set), ``0`` when none did, so a checkpoint
#: can exist only at ``1``; absent from an operator that does not set it
ENV_RESUME = "RLSCHED_RESUME"
#: processes per worker pod (one per GPU under torchrun), torchrun's ``--nproc-per-node``
ENV_NPROC_PER_NODE = "PET_NPROC_PER_NODE"
#: torchrun's environment twins of its flags (torch.distributed.run reads ``PET_<FLAG>``)
TORCHRUN_ENV = ("PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE")
DEFAULT_MASTER_PORT = 29500
#: the pod volume that holds ``spec.checkpoint.volume``
CHECKPOINT_VOLUME = "rlsched-checkpoint"
DEFAULT_CHECKPOINT_PATH = "/var/run/rlsched/checkpoint"
#: ``spec.successPolicy``: the job Succeeds when its chief (worker 0) exits 0, or when
#: every worker of the generation has
SUCCESS_POLICIES = ("Chief", "AllWorkers")
#: ``spec.backoffLimit`` default: unexpected worker failures tolerated (as batch/v1 Job)
DEFAULT_BACKOFF_LIMIT = 6
#: ``spec.priority.class``: the service classes, most important first
PRIORITY_CLASSES = ("highest", "urgent", "normal")
#: exit code of a process ended by SIGTERM (128 + 15): an intentional stop's exit
EXIT_SIGTERM = 143
#: exit code of a worker whose checkpoint cannot be used: the directory is missing or
#: not writable, a restarted generation finds no checkpoint, or a checkpoint has an
#: unknown format or a bad checksum (sysexits' EX_IOERR)
EXIT_CHECKPOINT = 74


def class_rank(name: str) -> int:
    """How early service class ``name`` is served: higher first (``normal`` 0, ``urgent``
    1, ``highest`` 2). The one ranking of :data:`PRIORITY_CLASSES`; ValueError for any
    other name."""
    try:
        return len(PRIORITY_CLASSES) - 1 - PRIORITY_CLASSES.index(name)
    except ValueError:
        raise ValueError(f"unknown priority class {name!r}; one of {', '.join(PRIORITY_CLASSES)}") from None


class ContractError(ValueError):
    """A worker's environment does not hold the worker contract (a variable missing or
    malformed); the message names the variable."""


def service_name(job: str) -> str:
    """The headless Service of ``job``'s workers (the pods' ``subdomain``): the job name."""
    return job


def worker_hostname(job: str, index: int) -> str:
    """The stable hostname of worker ``index`` (also its pod name): ``<job>-worker-<i>``."""
    return f"{job}-worker-{index}"


def master_addr(job: str) -> str:
    """The chief's stable DNS name inside the namespace: ``<job>-worker-0.<service>``."""
    return f"{worker_hostname(job, 0)}.{service_name(job)}"


@dataclass(frozen=True, slots=True)
class WorkerContract:
    """One worker's view of its job: identity, rendezvous, generation, batch size and
    checkpoint directory. :meth:`env` is what the operator puts in the pod;
    :meth:`from_env` is what ``rlsched.trainer`` reads back."""

    job: str
    namespace: str
    index: int
    workers: int
    generation: int = 0
    master_addr: str = ""
    master_port: int = DEFAULT_MASTER_PORT
    batch_size: int | None = None
    checkpoint_dir: str | None = None
    micro_batch_limit: int | None = None
    procs_per_worker: int = 1
    resume: bool | None = None

    def __post_init__(self) -> None:
        if not self.master_addr:
            object.__setattr__(self, "master_addr", master_addr(self.job))
        if not (0 <= self.index < self.workers):
            raise ContractError(f"{ENV_RANK}: worker index {self.index} outside 0..{self.workers - 1}")
        if self.generation < 0:
            raise ContractError(f"{ENV_GENERATION}: generation {self.generation} < 0")
        if not (1 <= self.master_port <= 65535):
            raise ContractError(f"{ENV_MASTER_PORT}: port {self.master_port} outside 1..65535")
        if self.batch_size is not None and self.batch_size < 1:
            raise ContractError(f"{ENV_BATCH_SIZE}: batch size {self.batch_size} < 1")
        if self.micro_batch_limit is not None and self.micro_batch_limit < 1:
            raise ContractError(f"{ENV_MICRO_BATCH_LIMIT}: micro-batch limit {self.micro_batch_limit} < 1")
        if self.procs_per_worker < 1:
            raise ContractError(f"{ENV_NPROC_PER_NODE}: {self.procs_per_worker} processes per worker < 1")

    @property
    def rank(self) -> int:
        return self.index

    @property
    def world_size(self) -> int:
        return self.workers

    @property
    def is_chief(self) -> bool:
        return self.index == 0

    def env(self) -> dict[str, str]:
        """The worker's environment variables (the job and namespace are set by the
        operator separately: the namespace comes from the downward API)."""
        out = {
            ENV_MASTER_ADDR: self.master_addr,
            ENV_MASTER_PORT: str(self.master_port),
            ENV_WORLD_SIZE: str(self.workers),
            ENV_RANK: str(self.index),
            ENV_LOCAL_RANK: "0",
            "PET_MASTER_ADDR": self.master_addr,
            "PET_MASTER_PORT": str(self.master_port),
            "PET_NNODES": str(self.workers),
            "PET_NODE_RANK": str(self.index),
            ENV_NPROC_PER_NODE: str(self.procs_per_worker),
            ENV_INDEX: str(self.index),
            ENV_ROLE: ROLE_CHIEF if self.index == 0 else ROLE_WORKER,
            ENV_GENERATION: str(self.generation),
        }
        if self.batch_size is not None:
            out[ENV_BATCH_SIZE] = str(self.batch_size)
        if self.checkpoint_dir:
            out[ENV_CHECKPOINT_DIR] = self.checkpoint_dir
        if self.micro_batch_limit is not None:
            out[ENV_MICRO_BATCH_LIMIT] = str(self.micro_batch_limit)
        if self.resume is not None:
            out[ENV_RESUME] = "1" if self.resume else "0"
        return out

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> "WorkerContract":
        """The contract from a worker's environment; :class:`ContractError` naming the
        first variable that is missing or malformed."""

        def need(key: str) -> str:
            v = environ.get(key)
            if v is None or v == "":
                raise ContractError(f"{key} is not set: not started by the rlsched operator "
                                    f"(set it by hand to run outside a TrainingJob)")
            return v

        def num(key: str, default: str | None = None) -> int:
            v = environ.get(key) or default
            if v is None:
                need(key)
            try:
                return int(str(v).strip())
            except ValueError:
                raise ContractError(f"{key}={v!r:.40} is not a whole number") from None

        batch = environ.get(ENV_BATCH_SIZE)
        micro = environ.get(ENV_MICRO_BATCH_LIMIT)
        return cls(
            job=need(ENV_JOB),
            namespace=environ.get(ENV_NAMESPACE) or "",
            index=num(ENV_RANK),
            workers=num(ENV_WORLD_SIZE),
            generation=num(ENV_GENERATION, "0"),
            master_addr=need(ENV_MASTER_ADDR),
            master_port=num(ENV_MASTER_PORT, str(DEFAULT_MASTER_PORT)),
            batch_size=num(ENV_BATCH_SIZE) if batch else None,
            checkpoint_dir=environ.get(ENV_CHECKPOINT_DIR) or None,
            micro_batch_limit=num(ENV_MICRO_BATCH_LIMIT) if micro else None,
            procs_per_worker=num(ENV_NPROC_PER_NODE, "1"),
            resume=parse_resume(environ.get(ENV_RESUME)),
        )


def parse_resume(raw: str | None) -> bool | None:
    """``RLSCHED_RESUME``: True (``1``), False (``0``), None when unset or empty (an
    operator that does not set it); a :class:`ContractError` for anything else."""
    if raw is None or raw.strip() == "":
        return None
    if raw.strip() in ("0", "1"):
        return raw.strip() == "1"
    raise ContractError(f"{ENV_RESUME}={raw!r:.40} is neither 0 nor 1")


#: worker pods run under the ServiceAccount their template names, else ``<job>-trainer``
#: (made by the operator); a Role of the operator's may get and patch that one job's
#: status and is bound to that account; the trainer-status admission policy matches the
#: same account (the template's, else this name)
TRAINER_ACCOUNT_SUFFIX = "-trainer"
#: ValidatingAdmissionPolicy (and its binding) that lets a trainer write nothing of the
#: status but ``status.progress`` (``deploy/helm/rlsched/files/policies/trainer-status.yaml``;
#: the chart names its copy after the release)
TRAINER_STATUS_POLICY = "rlsched-trainer-status"


def trainer_account_name(job: str) -> str:
    """The ServiceAccount of ``job``'s pods: ``<job>-trainer``."""
    return f"{job}{TRAINER_ACCOUNT_SUFFIX}"


def worker_account(job: str, pod_spec: Any) -> str:
    """The ServiceAccount ``job``'s worker pods run under: the template's
    ``serviceAccountName`` when it names one, else :func:`trainer_account_name`."""
    name = pod_spec.get("serviceAccountName") if isinstance(pod_spec, Mapping) else None
    return name if isinstance(name, str) and name else trainer_account_name(job)


@dataclass(frozen=True, slots=True)
class BatchCheck:
    """Whether the chief's report of a generation shows the global batch the operator
    set for it (``followed``), and the words of it."""

    followed: bool
    message: str


def judge_batch(expected: Any, progress: Any, generation: int) -> BatchCheck | None:
    """The global batch ``expected`` (what :data:`ENV_BATCH_SIZE` gave the workers of
    ``generation``) against the chief's report ``progress`` (``status.progress``: its
    ``generation`` and ``globalBatchSize``). None when there is nothing to compare: no
    batch was set, the report is of another generation, or it carries no global batch."""
    def whole(v: Any) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None

    if whole(expected) is None or not isinstance(progress, Mapping) or whole(progress.get("generation")) != generation:
        return None
    got = progress.get("globalBatchSize")
    if isinstance(got, float) and got.is_integer():
        got = int(got)
    if whole(got) is None:
        return None
    if got == expected:
        return BatchCheck(True, f"generation {generation} trains at the global batch {expected} rlsched set")
    return BatchCheck(False, f"generation {generation} reports global batch {got}, rlsched set {expected} "
                             f"({ENV_BATCH_SIZE}): the script does not follow the batch the scheduler sets, so "
                             f"its throughput and statistical-efficiency model is off")


# --------------------------------------------------------------------------- nodes
LABEL_BLOCK = "topology.rlsched.dev/block"
LABEL_RACK = "topology.rlsched.dev/rack"
LABEL_HOSTNAME = "kubernetes.io/hostname"
#: NVIDIA GPU Feature Discovery labels
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_CLIQUE = "nvidia.com/gpu.clique"
LABEL_GPU_PRESENT = "nvidia.com/gpu.present"
#: GPUs per NVLink island of a node (default: all of the node's GPUs)
LABEL_NVLINK_DOMAIN_SIZE = "rlsched.dev/nvlink-domain-size"
LABEL_GPU_PRICE = "rlsched.dev/gpu-price-per-hour"
#: topology levels as node-label keys, coarse to fine (Kueue style)
DEFAULT_TOPOLOGY_LEVELS = (LABEL_BLOCK, LABEL_RACK, LABEL_HOSTNAME)

# --------------------------------------------------------------------------- GPU types
#: workers: the GPU type their generation is pinned to (set by the operator with the
#: pods' node affinity; a pod cannot read its node's labels through the downward API)
ENV_GPU_TYPE = "RLSCHED_GPU_TYPE"
#: entries of a product -> type map refused beyond this (a configuration, not data)
MAX_GPU_TYPES = 1024


def parse_gpu_types(value: Any, where: str = "gpu types") -> dict[str, str]:
    """The map from GPU Feature Discovery's product strings (:data:`LABEL_GPU_PRODUCT`,
    e.g. ``Tesla-T4``) to GPU type keys (the performance classes throughput is measured
    under, e.g. ``aws``): a mapping, or its JSON text (the operator's ``--gpu-types``, the
    chart's ``gpuTypes``); ``""`` or None: empty. ``ValueError`` naming the bad entry: a
    key or type that is not a label value, a type that is itself a product mapped to
    another type (a type read back through the map must stay itself), or too many."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not a JSON object of product -> type ({exc.msg} at {exc.pos})") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: expected an object of product -> type, got {type(value).__name__}")
    if len(value) > MAX_GPU_TYPES:
        raise ValueError(f"{where}: {len(value)} entries, at most {MAX_GPU_TYPES}")
    out: dict[str, str] = {}
    for product, gtype in value.items():
        for what, v in (("product", product), ("type", gtype)):
            if not isinstance(v, str) or not v or len(v) > MAX_LABEL_CHARS or not _LABEL_VALUE_RE.fullmatch(v):
                of = f" (of {product!r})" if what == "type" else ""
                raise ValueError(f"{where}: {what} {v!r}{of} is not a non-empty label value "
                                 f"(at most {MAX_LABEL_CHARS} alphanumerics, '-', '_', '.')")
        out[product] = gtype
    for product, gtype in out.items():
        if out.get(gtype, gtype) != gtype:
            raise ValueError(f"{where}: type {gtype!r} (of {product!r}) is also a product mapped to "
                             f"{out[gtype]!r}; name the type otherwise")
    return out


def gpu_type_of(product: str | None, types: Mapping[str, str]) -> str:
    """A node's GPU type from its :data:`LABEL_GPU_PRODUCT` value: the map's type, else
    the product string itself; ``""`` without a product (no GPU Feature Discovery)."""
    if not product or product == "unknown":
        return ""
    return types.get(product, product)


def products_of_type(gpu_type: str, types: Mapping[str, str]) -> tuple[str, ...]:
    """Every :data:`LABEL_GPU_PRODUCT` value whose nodes are of ``gpu_type``
    (:func:`gpu_type_of`): the products mapped to it, and the type itself when no entry
    maps it elsewhere (an unmapped product is its own type). Sorted."""
    out = {p for p, t in types.items() if t == gpu_type}
    if gpu_type not in types:
        out.add(gpu_type)
    return tuple(sorted(out))

# --------------------------------------------------------------------------- pod security
#: levels of the Kubernetes Pod Security Standards, least to most restrictive
#: (https://kubernetes.io/docs/concepts/security/pod-security-standards/)
POD_SECURITY_PRIVILEGED = "privileged"
POD_SECURITY_BASELINE = "baseline"
POD_SECURITY_RESTRICTED = "restricted"
POD_SECURITY_LEVELS = (POD_SECURITY_PRIVILEGED, POD_SECURITY_BASELINE, POD_SECURITY_RESTRICTED)
#: namespaces: the level Pod Security Admission enforces there; the operator holds
#: TrainingJob pod templates of the namespace to the same level
LABEL_POD_SECURITY_ENFORCE = "pod-security.kubernetes.io/enforce"
#: namespaces: ``"true"`` lets the namespace's TrainingJobs mount Secrets (refused by default)
LABEL_ALLOW_SECRET_MOUNTS = "rlsched.dev/allow-secret-mounts"
#: pods: ``<prefix><container name>`` names the AppArmor profile of a container (the
#: annotation form of ``securityContext.appArmorProfile``)
ANNOTATION_APPARMOR_PREFIX = "container.apparmor.security.beta.kubernetes.io/"


# =========================================================================== parser
class ShapeError(ValueError):
    """A Kubernetes object or quantity does not have the shape the contract expects;
    the message starts with the path of the offending field."""


#: GPU counts above this are refused as nonsense
MAX_GPUS = 1_000_000

#: the largest global batch (samples) a TrainingJob may ask for (``spec.batchSize``,
#: ``spec.maxBatchSize``, ``spec.localBatchSize``; the CRD's ``maximum``): 2^24, past the
#: largest published data-parallel batches (64k-sample ImageNet runs) by far, and exact
#: in float32, so a worker reading ``RLSCHED_GLOBAL_BATCH_SIZE`` never gets nonsense
MAX_BATCH_SIZE = 16_777_216


def field(obj: Any, key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    """``obj[key]`` when it is a ``kind``, ``default`` when absent or null; a
    :class:`ShapeError` when ``obj`` is not an object or the value has another type.
    ``dict`` stands for any mapping (JSON objects are dicts; client views are mappings)."""
    if not isinstance(obj, (dict, Mapping)):
        raise ShapeError(f"{where}: expected an object, got {type(obj).__name__}")
    v = obj.get(key)
    if v is None:
        return default
    if not isinstance(v, kind) and not (kind is dict and isinstance(v, Mapping)):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ShapeError(f"{where}.{key}: expected {name}, got {type(v).__name__}")
    return v


def str_map(obj: Any, key: str, where: str) -> dict[str, str]:
    """A ``map[string]string`` field (labels, annotations, nodeSelector); ``{}`` when absent."""
    m = field(obj, key, dict, where, {})
    for k, v in m.items():
        if not isinstance(v, str):
            raise ShapeError(f"{where}.{key}[{k!r}]: expected a string, got {type(v).__name__}")
    return m


# <signedNumber><suffix>, suffix one of binary SI, decimal SI or a decimal exponent
# (k8s.io/apimachinery/pkg/api/resource, "Quantity")
_QUANTITY = re.compile(
    r"(?P<sign>[+-])?(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<bin>[KMGTPE]i)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[mkMGTPE]))?"
)
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_MAX_QUANTITY_CHARS = 64
_MAX_EXPONENT = 1000


def parse_quantity(value: Any, where: str = "quantity") -> Fraction:
    """The exact value of a Kubernetes quantity: a string in the API's grammar
    (``"2"``, ``"1.5"``, ``"500m"``, ``"4k"``, ``"1Ki"``, ``"1e3"``, surrounding blanks
    ignored as the API's JSON decoder does) or a JSON number."""
    if isinstance(value, bool):
        raise ShapeError(f"{where}: expected a quantity, got a boolean")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ShapeError(f"{where}: {value!r} is not a quantity")
        return Fraction(value)
    if not isinstance(value, str):
        raise ShapeError(f"{where}: expected a quantity, got {type(value).__name__}")
    s = value.strip()
    m = _QUANTITY.fullmatch(s) if len(s) <= _MAX_QUANTITY_CHARS else None
    if m is None:
        raise ShapeError(f"{where}: {value!r:.40} is not a quantity")
    q = Fraction(Decimal(m["num"]))
    if m["bin"]:
        q *= _BINARY[m["bin"]]
    else:
        exp = int(m["exp"]) if m["exp"] is not None else _DECIMAL.get(m["dec"] or "", 0)
        if abs(exp) > _MAX_EXPONENT:
            raise ShapeError(f"{where}: {value!r:.40} is out of range")
        q *= Fraction(10) ** exp
    return -q if m["sign"] == "-" else q


def gpu_count(value: Any, where: str = "quantity") -> int:
    """A whole number of GPUs, 0..:data:`MAX_GPUS`, from a quantity (``2``, ``"2"``,
    ``"2000m"``, ``"1e3"``); ``"1.5"``, ``"500m"`` or anything not a quantity raise."""
    if isinstance(value, bool):
        raise ShapeError(f"{where}: expected a GPU count, got a boolean")
    if type(value) is str and 0 < len(value) <= 16 and value.isascii() and value.isdigit():
        n = int(value)  # the common spelling ("1", "8"): the grammar's value, without its parse
    else:
        try:
            q = parse_quantity(value, where)
        except ShapeError:
            q = None
        if q is None or q.denominator != 1:
            raise ShapeError(f"{where}: {value!r:.40} is not a whole number of GPUs")
        n = int(q)
    if n < 0 or n > MAX_GPUS:
        raise ShapeError(f"{where}: GPU count {n} out of range")
    return n


def whole_number(value: Any, where: str, *, maximum: int = MAX_GPUS) -> int:
    """A count written as plain digits (an annotation such as ``rlsched.dev/gang-size``),
    or a JSON integer; 0..``maximum``."""
    if isinstance(value, bool):
        raise ShapeError(f"{where}: expected a whole number, got a boolean")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float) and value == value and value not in (float("inf"), float("-inf")) and value.is_integer():
        n = int(value)
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        n = int(value.strip())
    else:
        raise ShapeError(f"{where}: {value!r:.40} is not a whole number")
    if n < 0 or n > maximum:
        raise ShapeError(f"{where}: {n} out of range")
    return n


def container_gpus(container: Any, where: str = "container") -> int:
    """GPUs of one container: ``requests`` if it names the GPU resource, else
    ``limits`` (for an extended resource the API server defaults requests to limits
    and allows no other value)."""
    res = field(container, "resources", dict, where, {})
    for part in ("requests", "limits"):
        q = field(res, part, dict, f"{where}.resources", {})
        if RESOURCE_GPU in q:
            return gpu_count(q[RESOURCE_GPU], f"{where}.resources.{part}[{RESOURCE_GPU!r}]")
    return 0


def pod_gpus(pod: Any, where: str = "Pod") -> int:
    """The GPU request of a pod (or of a pod template's ``{"spec": ...}``) by
    kube-scheduler's effective-request rule: ``max(sum(containers), max(initContainers))``
    (init containers run one at a time, before the containers)."""
    spec = field(pod, "spec", dict, where, {})
    containers = field(spec, "containers", list, f"{where}.spec", [])
    gpus = sum(container_gpus(c, f"{where}.spec.containers[{i}]") for i, c in enumerate(containers))
    inits = field(spec, "initContainers", list, f"{where}.spec", [])
    if inits:
        gpus = max(gpus, max(container_gpus(c, f"{where}.spec.initContainers[{i}]") for i, c in enumerate(inits)))
    return gpus


@dataclass(frozen=True, slots=True)
class PodRequests:
    """What a pod (or one worker of a TrainingJob) asks the scheduler for: GPUs,
    millicores of CPU and MiB of memory (rounded up, as kube-scheduler's fit counts a
    request: ``250m`` is 250, ``1Gi`` is 1024, ``1G`` is 954)."""

    gpus: int = 0
    cpu_milli: int = 0
    memory_mib: int = 0


def _quantity_units(value: Any, unit: Fraction, where: str, *, up: bool) -> int:
    """A non-negative quantity in whole ``unit`` s, rounded up (a request) or down (what a
    node offers)."""
    q = parse_quantity(value, where)
    if q < 0:
        raise ShapeError(f"{where}: {value!r:.40} is negative")
    n = q / unit
    return int(math.ceil(n)) if up else int(math.floor(n))


_MILLI = Fraction(1, 1000)
_MIB = Fraction(1 << 20)
#: the resources besides GPUs that scheduling counts, in the units it counts them
_OFFERED = (("cpu", _MILLI), ("memory", _MIB))


def container_requests(container: Any, where: str = "container") -> PodRequests:
    """GPUs (:func:`container_gpus`), CPU and memory of one container: each resource's
    ``requests``, else its ``limits`` (the API server defaults a missing request to
    the limit), else 0."""
    res = field(container, "resources", dict, where, {})
    req = field(res, "requests", dict, f"{where}.resources", {})
    lim = field(res, "limits", dict, f"{where}.resources", {})
    out = [container_gpus(container, where)]
    for name, unit in _OFFERED:
        part, q = ("requests", req) if name in req else ("limits", lim)
        out.append(_quantity_units(q[name], unit, f"{where}.resources.{part}[{name!r}]", up=True) if name in q else 0)
    return PodRequests(*out)


def pod_requests(pod: Any, where: str = "Pod") -> PodRequests:
    """A pod's (or a pod template's ``{"spec": ...}``) effective request per resource,
    kube-scheduler's rule: ``max(sum(containers) + sum(sidecars), max(initContainers))``
    plus ``spec.overhead`` (RuntimeClass) — init containers run one at a time before
    the containers; a sidecar (an init container with ``restartPolicy: Always``) runs
    beside them (counted with the containers, a slight over-count while later init
    containers run)."""
    spec = field(pod, "spec", dict, where, {})
    containers = field(spec, "containers", list, f"{where}.spec", [])
    inits = field(spec, "initContainers", list, f"{where}.spec", [])
    total = [0, 0, 0]
    peak = [0, 0, 0]
    for part, items in (("containers", containers), ("initContainers", inits)):
        for i, c in enumerate(items):
            r = container_requests(c, f"{where}.spec.{part}[{i}]")
            sidecar = part == "initContainers" and isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
            acc = total if part == "containers" or sidecar else None
            for k, v in enumerate((r.gpus, r.cpu_milli, r.memory_mib)):
                if acc is not None:
                    acc[k] += v
                else:
                    peak[k] = max(peak[k], v)
    over = field(spec, "overhead", dict, f"{where}.spec", {})
    extra = [0] + [_quantity_units(over[name], unit, f"{where}.spec.overhead[{name!r}]", up=True) if name in over else 0
                   for name, unit in _OFFERED]
    return PodRequests(*(max(t, p) + e for t, p, e in zip(total, peak, extra)))


@dataclass(frozen=True, slots=True)
class NodeShape:
    """What scheduling reads of a node: its name, labels (topology levels, GPU Feature
    Discovery), GPUs, and the CPU (millicores) and memory (MiB) it offers pods
    (``status.allocatable``, else ``status.capacity``; 0 when it reports none, as
    kube-scheduler counts it)."""

    name: str
    labels: dict[str, str]
    gpus: int
    cpu_milli: int = 0
    memory_mib: int = 0


def node_gpus(node: Any, where: str = "Node") -> int:
    """GPUs of a node: ``status.allocatable``, else ``status.capacity``, else the GFD
    label ``nvidia.com/gpu.count``, else 0."""
    status = field(node, "status", dict, where, {})
    for part in ("allocatable", "capacity"):
        q = field(status, part, dict, f"{where}.status", {})
        if RESOURCE_GPU in q:
            return gpu_count(q[RESOURCE_GPU], f"{where}.status.{part}[{RESOURCE_GPU!r}]")
    labels = str_map(field(node, "metadata", dict, where, {}), "labels", f"{where}.metadata")
    return gpu_count(labels.get(LABEL_GPU_COUNT, 0), f"{where}.metadata.labels[{LABEL_GPU_COUNT!r}]")


def node_shape(node: Any, where: str = "Node") -> NodeShape:
    """Name, labels, GPUs (:func:`node_gpus`), CPU and memory of a v1.Node."""
    meta = field(node, "metadata", dict, where, {})
    name = field(meta, "name", str, f"{where}.metadata", "")
    if not name:
        raise ShapeError(f"{where}.metadata.name: expected a non-empty string")
    labels = str_map(meta, "labels", f"{where}.metadata")
    status = field(node, "status", dict, where, {})
    offers = []
    for res, unit in _OFFERED:
        value = 0
        for part in ("allocatable", "capacity"):
            q = field(status, part, dict, f"{where}.status", {})
            if res in q:
                value = _quantity_units(q[res], unit, f"{where}.status.{part}[{res!r}]", up=False)
                break
        offers.append(value)
    return NodeShape(name=name, labels=labels, gpus=node_gpus(node, where), cpu_milli=offers[0], memory_mib=offers[1])


# --------------------------------------------------------------------------- owners
@dataclass(frozen=True, slots=True)
class JobOwner:
    """The TrainingJob a pod's controller ownerReference points to."""

    name: str
    uid: str


def controlling_job(obj: Any) -> JobOwner | None:
    """The TrainingJob controlling ``obj`` (a pod or any object dict): its
    ``metadata.ownerReferences`` entry with ``controller: true``, kind
    :data:`KIND` and an ``apiVersion`` of group :data:`GROUP`; None when there is none
    (a pod the operator did not create, whatever its labels say). Malformed
    references count as none."""
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if not isinstance(ref, Mapping) or ref.get("controller") is not True or ref.get("kind") != KIND:
            continue
        api_version, name, uid = ref.get("apiVersion"), ref.get("name"), ref.get("uid")
        if not isinstance(api_version, str) or api_version.split("/", 1)[0] != GROUP:
            continue
        if isinstance(name, str) and name and isinstance(uid, str) and uid:
            return JobOwner(name=name, uid=uid)
    return None


# =========================================================================== names
# The API server's name rules (k8s.io/apimachinery/pkg/util/validation: IsDNS1123Subdomain,
# IsDNS1123Label, IsValidLabelValue). Lengths are checked before the pattern, so a
# megabyte "name" costs nothing to refuse.
#: longest DNS-1123 subdomain (names of pods and nodes)
MAX_SUBDOMAIN_CHARS = 253
#: longest DNS-1123 label (namespaces) and label value
MAX_LABEL_CHARS = 63
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
_DNS_SUBDOMAIN_RE = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")
_LABEL_VALUE_RE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def _name(value: Any, where: str, pattern: re.Pattern, limit: int, what: str) -> str:
    if not isinstance(value, str):
        raise ShapeError(f"{where}: expected a string, got {type(value).__name__}")
    if len(value) > limit:
        raise ShapeError(f"{where}: {value[:40]!r}... has {len(value)} characters, more than {limit} ({what})")
    if pattern.fullmatch(value) is None:
        raise ShapeError(f"{where}: {value!r:.80} is not a valid {what}")  # short: checked above
    return value


def dns_subdomain(value: Any, where: str = "name") -> str:
    """``value`` if it is a DNS-1123 subdomain (the name of a pod or a node): at most
    253 characters, lowercase alphanumerics, ``-`` and ``.``; else :class:`ShapeError`."""
    return _name(value, where, _DNS_SUBDOMAIN_RE, MAX_SUBDOMAIN_CHARS, "DNS-1123 subdomain")


def dns_label(value: Any, where: str = "name") -> str:
    """``value`` if it is a DNS-1123 label (the name of a namespace): at most 63
    characters, lowercase alphanumerics and ``-``; else :class:`ShapeError`."""
    return _name(value, where, _DNS_LABEL_RE, MAX_LABEL_CHARS, "DNS-1123 label")


def label_value(value: Any, where: str = "label") -> str:
    """``value`` if it is a valid label value: empty, or at most 63 alphanumerics,
    ``-``, ``_`` and ``.`` beginning and ending with an alphanumeric; else
    :class:`ShapeError`."""
    return _name(value, where, _LABEL_VALUE_RE, MAX_LABEL_CHARS, "label value")


#: the model constraint is quoted in failure reasons at most this long (annotation and
#: affinity values are the user's and unbounded)
MAX_MODELS_TEXT = 200


def gpu_model_rule(spec: dict, annotations: dict[str, str], where: str) -> tuple[Callable[[str], bool], str]:
    """The GPU models a pod (or a worker template's pod ``spec`` and ``annotations``)
    accepts, from its nodeSelector and required node affinity on
    :data:`LABEL_GPU_PRODUCT` and the :data:`ANNOTATION_GPU_MODELS` annotation: a
    predicate on a node's model and the constraint in words ("" and always true without
    one). The extender filters nodes with it; the operator's admission checks room on
    the nodes it allows."""
    checks: list[Callable[[str], bool]] = []
    words: list[str] = []
    sel = str_map(spec, "nodeSelector", where)
    if LABEL_GPU_PRODUCT in sel:
        want = sel[LABEL_GPU_PRODUCT]
        checks.append(lambda m, w=want: m == w)
        words.append(f"nodeSelector {LABEL_GPU_PRODUCT}={want}")
    ann = annotations.get(ANNOTATION_GPU_MODELS)
    if ann:
        allowed = frozenset(x.strip() for x in ann.split(",") if x.strip())
        checks.append(lambda m, a=allowed: m in a)
        words.append(f"{ANNOTATION_GPU_MODELS}={','.join(sorted(allowed))}")
    aff = field(field(spec, "affinity", dict, where, {}), "nodeAffinity", dict, f"{where}.affinity", {})
    req = field(aff, "requiredDuringSchedulingIgnoredDuringExecution", dict, f"{where}.affinity.nodeAffinity", {})
    terms = field(req, "nodeSelectorTerms", list, f"{where}.affinity.nodeAffinity.required", [])
    term_rules = []
    for ti, term in enumerate(terms):
        exprs = field(term, "matchExpressions", list, f"{where}.affinity...nodeSelectorTerms[{ti}]", [])
        rules = []
        for ei, e in enumerate(exprs):
            ew = f"{where}.affinity...nodeSelectorTerms[{ti}].matchExpressions[{ei}]"
            key = field(e, "key", str, ew)
            op = field(e, "operator", str, ew, "")
            raw = field(e, "values", list, ew, [])
            if not all(isinstance(v, str) for v in raw):
                raise ShapeError(f"{ew}.values: expected an array of strings")
            if key != LABEL_GPU_PRODUCT:
                continue
            values = frozenset(raw)
            if op == "In":
                rules.append(lambda m, v=values: m in v)
            elif op == "NotIn":
                rules.append(lambda m, v=values: m not in v)
            elif op == "Exists":
                rules.append(lambda m: m != "unknown")
            elif op == "DoesNotExist":
                rules.append(lambda m: m == "unknown")
            else:
                continue  # Gt/Lt make no sense for a product name; kube-scheduler checks them
            words.append(f"affinity {LABEL_GPU_PRODUCT} {op} {sorted(values)}")
        term_rules.append(rules)
    if term_rules:  # terms are ORed, expressions within a term ANDed
        checks.append(lambda m, t=term_rules: any(all(r(m) for r in rules) for rules in t))
    if not checks:
        return (lambda m: True), ""
    text = "; ".join(words)
    if len(text) > MAX_MODELS_TEXT:
        text = text[: MAX_MODELS_TEXT - 3] + "..."
    return (lambda m: all(c(m) for c in checks)), text


def parse_topology_levels(text: str) -> tuple[str, ...]:
    """The ordered node-label keys of the topology (coarse to fine, the last the
    hostname level) from a comma list, as the extender's and the operator's
    ``--topology-levels`` and the chart's ``topology.levels`` give them; ``ValueError``
    naming a key that no Node label could have, or an empty or repeated list."""
    levels = tuple(x.strip() for x in str(text).split(",") if x.strip())
    if not levels:
        raise ValueError("topology levels: need at least the hostname level (e.g. kubernetes.io/hostname)")
    if len(set(levels)) != len(levels):
        raise ValueError(f"topology levels: a label key is repeated in {','.join(levels)}")
    for key in levels:
        prefix, _, name = key.rpartition("/")
        ok = bool(name) and bool(_LABEL_VALUE_RE.fullmatch(name)) and len(name) <= 63
        if prefix:
            ok = ok and len(prefix) <= 253 and bool(_DNS_SUBDOMAIN_RE.fullmatch(prefix))
        if not ok:
            raise ValueError(f"topology levels: {key!r} is not a Kubernetes label key ([prefix/]name)")
    return levels
