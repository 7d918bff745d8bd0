"""The fields of Kubernetes Pods the extender needs, read from plain dicts.

Objects arrive as JSON (camelCase keys) from kube-scheduler, the API server or a
static file. The GPUs of pods and nodes and the names of labels and annotations are
the Kubernetes contract of :mod:`rlsched.core.contract`; bad types, and names no API
object can carry (a pod name that is not a DNS-1123 subdomain, a namespace that is not a
DNS-1123 label, a job label that is not a label value), raise its
:class:`~rlsched.core.contract.ShapeError` with the path of the offending field. The
extender answers such a pod as unschedulable (every node unresolvable, with the
reason), never as an error: kube-scheduler skips an ignorable extender that errs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ..core.contract import (
    ANNOTATION_GANG_SIZE,
    ANNOTATION_GPU_MODELS,
    ANNOTATION_OBSERVED_SPEED,
    ANNOTATION_REQUIRED_TOPOLOGY,
    LABEL_GPU_PRODUCT,
    LABEL_JOB,
    MAX_MODELS_TEXT,
    ShapeError,
    dns_label,
    dns_subdomain,
    field,
    gpu_model_rule,
    label_value,
    pod_gpus,
    str_map,
    whole_number,
)
from ..core.topology import Level

__all__ = ["PodInfo", "parse_pod", "MAX_MODELS_TEXT"]


_LEVELS = {"nvlink": Level.NVLINK, "node": Level.NODE, "rack": Level.RACK, "block": Level.BLOCK}
_DONE = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What scheduling needs of one pod."""

    key: str  # namespace/name
    uid: str
    gpus: int
    job: str | None  # namespace/job-label
    node: str | None  # spec.nodeName when bound
    phase: str
    allows_model: Callable[[str], bool]
    models_text: str  # the model constraint in words, for failure reasons
    required_level: Level | None
    gang_size: int | None
    observed_speed: float | None

    @property
    def holds_gpus(self) -> bool:
        """Bound and not finished: its GPUs are in use."""
        return self.node is not None and self.phase not in _DONE and self.gpus > 0


def parse_pod(pod: Any, where: str = "Pod") -> PodInfo:
    """Read a v1.Pod (raises :class:`ShapeError` on wrong types)."""
    if not isinstance(pod, dict):
        raise ShapeError(f"{where}: expected an object, got {type(pod).__name__}")
    meta = field(pod, "metadata", dict, where, {})
    spec = field(pod, "spec", dict, where, {})
    status = field(pod, "status", dict, where, {})
    name = dns_subdomain(field(meta, "name", str, f"{where}.metadata", ""), f"{where}.metadata.name")
    ns = dns_label(field(meta, "namespace", str, f"{where}.metadata", "") or "default", f"{where}.metadata.namespace")
    uid = field(meta, "uid", str, f"{where}.metadata", "")
    labels = str_map(meta, "labels", f"{where}.metadata")
    ann = str_map(meta, "annotations", f"{where}.metadata")
    gpus = pod_gpus(pod, where)
    allows, text = gpu_model_rule(spec, ann, f"{where}.spec")
    level = None
    if ANNOTATION_REQUIRED_TOPOLOGY in ann:
        v = ann[ANNOTATION_REQUIRED_TOPOLOGY].strip().lower()
        if v not in _LEVELS:
            raise ShapeError(
                f"{where}.metadata.annotations[{ANNOTATION_REQUIRED_TOPOLOGY!r}]: {v!r:.40} "
                f"is not one of {', '.join(_LEVELS)}"
            )
        level = _LEVELS[v]
    gang = None
    if ANNOTATION_GANG_SIZE in ann:
        gang = whole_number(ann[ANNOTATION_GANG_SIZE], f"{where}.metadata.annotations[{ANNOTATION_GANG_SIZE!r}]")
        gang = gang or None
    speed = None
    if ANNOTATION_OBSERVED_SPEED in ann:
        try:
            speed = float(ann[ANNOTATION_OBSERVED_SPEED])
        except ValueError:
            speed = None  # a bad measurement is ignored, not a scheduling error
        if speed is not None and not math.isfinite(speed):
            speed = None
    job = labels.get(LABEL_JOB)
    if job:
        label_value(job, f"{where}.metadata.labels[{LABEL_JOB!r}]")
    return PodInfo(
        key=f"{ns}/{name}",
        uid=uid,
        gpus=gpus,
        job=f"{ns}/{job}" if job else None,
        node=field(spec, "nodeName", str, f"{where}.spec") or None,
        phase=field(status, "phase", str, f"{where}.status", "Pending"),
        allows_model=allows,
        models_text=text,
        required_level=level,
        gang_size=gang,
        observed_speed=speed,
    )
