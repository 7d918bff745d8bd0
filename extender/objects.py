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
    ShapeError,
    dns_label,
    dns_subdomain,
    field,
    label_value,
    pod_gpus,
    str_map,
    whole_number,
)
from ..core.topology import Level

__all__ = ["PodInfo", "parse_pod", "MAX_MODELS_TEXT"]

#: the model constraint is quoted in failure reasons at most this long (annotation and
#: affinity values are the user's and unbounded)
MAX_MODELS_TEXT = 200

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


def _model_rule(spec: dict, annotations: dict[str, str], where: str) -> tuple[Callable[[str], bool], str]:
    """GPU-model constraint from nodeSelector, required node affinity and annotation."""
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
    allows, text = _model_rule(spec, ann, f"{where}.spec")
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
