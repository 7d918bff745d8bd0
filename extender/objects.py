"""The fields of Kubernetes Pods and Nodes the extender needs, read from plain dicts.

Objects arrive as JSON (camelCase keys) from kube-scheduler, the API server or a
static file. Bad types raise :class:`~rlsched.extender.wire.WireError` with the path
of the offending field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from ..core.topology import LABEL_GPU_COUNT, LABEL_GPU_PRODUCT, RESOURCE_GPU, Level
from .wire import WireError

__all__ = [
    "PodInfo",
    "NodeInfo",
    "parse_pod",
    "parse_node",
    "LABEL_JOB",
    "ANNOTATION_REQUIRED_TOPOLOGY",
    "ANNOTATION_GANG_SIZE",
    "ANNOTATION_GPU_MODELS",
    "ANNOTATION_OBSERVED_SPEED",
]

LABEL_JOB = "rlsched.dev/job"
ANNOTATION_REQUIRED_TOPOLOGY = "rlsched.dev/required-topology"
ANNOTATION_GANG_SIZE = "rlsched.dev/gang-size"
ANNOTATION_GPU_MODELS = "rlsched.dev/gpu-models"
ANNOTATION_OBSERVED_SPEED = "rlsched.dev/observed-speed"

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


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: dict[str, str]
    gpus: int


def _get(obj: Any, key: str, kind: type, where: str, default: Any = None) -> Any:
    if not isinstance(obj, dict):
        raise WireError(f"{where}: expected an object, got {type(obj).__name__}")
    v = obj.get(key)
    if v is None:
        return default
    if not isinstance(v, kind):
        raise WireError(f"{where}.{key}: expected {kind.__name__}, got {type(v).__name__}")
    return v


def _str_map(obj: Any, key: str, where: str) -> dict[str, str]:
    m = _get(obj, key, dict, where, {})
    for k, v in m.items():
        if not isinstance(v, str):
            raise WireError(f"{where}.{key}[{k!r}]: expected a string, got {type(v).__name__}")
    return m


def gpu_quantity(value: Any, where: str) -> int:
    """A whole number of GPUs from a resource quantity (``2``, ``"2"``)."""
    if isinstance(value, bool):
        raise WireError(f"{where}: expected a GPU count, got a boolean")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        n = int(value)
    elif isinstance(value, str) and value.strip().isdigit() and value.strip().isascii():
        n = int(value.strip())
    else:
        raise WireError(f"{where}: {value!r:.40} is not a whole number of GPUs")
    if n < 0 or n > 1_000_000:
        raise WireError(f"{where}: GPU count {n} out of range")
    return n


def _container_gpus(c: Any, where: str) -> int:
    res = _get(c, "resources", dict, where, {})
    for part in ("requests", "limits"):  # extended resources: requests == limits
        q = _get(res, part, dict, f"{where}.resources", {})
        if RESOURCE_GPU in q:
            return gpu_quantity(q[RESOURCE_GPU], f"{where}.resources.{part}[{RESOURCE_GPU!r}]")
    return 0


def _model_rule(spec: dict, annotations: dict[str, str], where: str) -> tuple[Callable[[str], bool], str]:
    """GPU-model constraint from nodeSelector, required node affinity and annotation."""
    checks: list[Callable[[str], bool]] = []
    words: list[str] = []
    sel = _str_map(spec, "nodeSelector", where)
    if LABEL_GPU_PRODUCT in sel:
        want = sel[LABEL_GPU_PRODUCT]
        checks.append(lambda m, w=want: m == w)
        words.append(f"nodeSelector {LABEL_GPU_PRODUCT}={want}")
    ann = annotations.get(ANNOTATION_GPU_MODELS)
    if ann:
        allowed = frozenset(x.strip() for x in ann.split(",") if x.strip())
        checks.append(lambda m, a=allowed: m in a)
        words.append(f"{ANNOTATION_GPU_MODELS}={','.join(sorted(allowed))}")
    aff = _get(_get(spec, "affinity", dict, where, {}), "nodeAffinity", dict, f"{where}.affinity", {})
    req = _get(aff, "requiredDuringSchedulingIgnoredDuringExecution", dict, f"{where}.affinity.nodeAffinity", {})
    terms = _get(req, "nodeSelectorTerms", list, f"{where}.affinity.nodeAffinity.required", [])
    term_rules = []
    for ti, term in enumerate(terms):
        exprs = _get(term, "matchExpressions", list, f"{where}.affinity...nodeSelectorTerms[{ti}]", [])
        rules = []
        for ei, e in enumerate(exprs):
            ew = f"{where}.affinity...nodeSelectorTerms[{ti}].matchExpressions[{ei}]"
            key = _get(e, "key", str, ew)
            op = _get(e, "operator", str, ew, "")
            raw = _get(e, "values", list, ew, [])
            if not all(isinstance(v, str) for v in raw):
                raise WireError(f"{ew}.values: expected an array of strings")
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
    return (lambda m: all(c(m) for c in checks)), "; ".join(words)


def parse_pod(pod: Any, where: str = "Pod") -> PodInfo:
    """Read a v1.Pod (raises :class:`WireError` on wrong types)."""
    if not isinstance(pod, dict):
        raise WireError(f"{where}: expected an object, got {type(pod).__name__}")
    meta = _get(pod, "metadata", dict, where, {})
    spec = _get(pod, "spec", dict, where, {})
    status = _get(pod, "status", dict, where, {})
    name = _get(meta, "name", str, f"{where}.metadata", "")
    ns = _get(meta, "namespace", str, f"{where}.metadata", "") or "default"
    uid = _get(meta, "uid", str, f"{where}.metadata", "")
    labels = _str_map(meta, "labels", f"{where}.metadata")
    ann = _str_map(meta, "annotations", f"{where}.metadata")
    containers = _get(spec, "containers", list, f"{where}.spec", [])
    gpus = sum(_container_gpus(c, f"{where}.spec.containers[{i}]") for i, c in enumerate(containers))
    inits = _get(spec, "initContainers", list, f"{where}.spec", [])
    if inits:
        gpus = max(gpus, max(_container_gpus(c, f"{where}.spec.initContainers[{i}]") for i, c in enumerate(inits)))
    allows, text = _model_rule(spec, ann, f"{where}.spec")
    level = None
    if ANNOTATION_REQUIRED_TOPOLOGY in ann:
        v = ann[ANNOTATION_REQUIRED_TOPOLOGY].strip().lower()
        if v not in _LEVELS:
            raise WireError(
                f"{where}.metadata.annotations[{ANNOTATION_REQUIRED_TOPOLOGY!r}]: {v!r:.40} "
                f"is not one of {', '.join(_LEVELS)}"
            )
        level = _LEVELS[v]
    gang = None
    if ANNOTATION_GANG_SIZE in ann:
        gang = gpu_quantity(ann[ANNOTATION_GANG_SIZE], f"{where}.metadata.annotations[{ANNOTATION_GANG_SIZE!r}]")
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
    return PodInfo(
        key=f"{ns}/{name}",
        uid=uid,
        gpus=gpus,
        job=f"{ns}/{job}" if job else None,
        node=_get(spec, "nodeName", str, f"{where}.spec") or None,
        phase=_get(status, "phase", str, f"{where}.status", "Pending"),
        allows_model=allows,
        models_text=text,
        required_level=level,
        gang_size=gang,
        observed_speed=speed,
    )


def parse_node(node: Any, where: str = "Node") -> NodeInfo:
    """Read a v1.Node: name, labels and allocatable ``nvidia.com/gpu``."""
    meta = _get(node, "metadata", dict, where, {})
    name = _get(meta, "name", str, f"{where}.metadata", "")
    if not name:
        raise WireError(f"{where}.metadata.name: expected a non-empty string")
    labels = _str_map(meta, "labels", f"{where}.metadata")
    status = _get(node, "status", dict, where, {})
    gpus = None
    for part in ("allocatable", "capacity"):
        q = _get(status, part, dict, f"{where}.status", {})
        if RESOURCE_GPU in q:
            gpus = gpu_quantity(q[RESOURCE_GPU], f"{where}.status.{part}[{RESOURCE_GPU!r}]")
            break
    if gpus is None:
        gpus = gpu_quantity(labels.get(LABEL_GPU_COUNT, 0), f"{where}.metadata.labels[{LABEL_GPU_COUNT!r}]")
    return NodeInfo(name=name, labels=labels, gpus=gpus)
