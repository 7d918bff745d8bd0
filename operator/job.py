"""One TrainingJob as the control loop reads it in a cycle, and its worker pods as the
lifecycle judges them (:func:`rlsched.core.lifecycle.judge`)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from rlsched.core import Progress
from rlsched.core.cluster import progress_from_report
from rlsched.core.contract import ANNOTATION_PRIORITY_REQUESTS as REQUESTS_ANNOTATION
from rlsched.core.contract import (ANNOTATION_GANG_SIZE, LABEL_GENERATION, LABEL_INDEX, ShapeError, gpu_model_rule,
                                   label_value)
from rlsched.core.lifecycle import WorkerState
from rlsched.core.planning import TrainingSpec, WaitReason

log = logging.getLogger(__name__)

#: the phases of a job that may hold or wait for workers
ACTIVE = ("Queued", "Starting", "Running")


def job_key(body: Mapping) -> str:
    md = body["metadata"]
    return f"{md['namespace']}/{md['name']}"


def progress_of(status: Mapping) -> Progress:
    return progress_from_report(status.get("progress") or {})


def requests_count(body: Mapping) -> int:
    """The user's priority-request counter (annotation); 0 when absent or not an integer."""
    v = ((body.get("metadata") or {}).get("annotations") or {}).get(REQUESTS_ANNOTATION, "0")
    try:
        return int(v)
    except (TypeError, ValueError):
        log.debug("%s: annotation %s=%r is not an integer; 0 requests", job_key(body), REQUESTS_ANNOTATION, v)
        return 0


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
class Job:
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
    def gpu_type(self) -> str | None:
        """The GPU type the current generation's workers are pinned to
        (``status.gpuType``, set by the allocator's plan); None: any node."""
        t = self.status.get("gpuType")
        if not isinstance(t, str) or not t:
            return None
        try:
            return label_value(t, "status.gpuType")
        except ShapeError:
            return None  # not the operator's writing: no pin

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
