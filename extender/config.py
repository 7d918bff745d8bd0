"""Assemble an :class:`~rlsched.extender.service.Extender` from its options, and
the node and pod lists it may load once from a file instead of an API server."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import yaml

from ..core.das import DASPlacement, serving_placement
from ..core.policy import Placement, make_placement
from ..core.contract import DEFAULT_TOPOLOGY_LEVELS, RESOURCE_GPU
from ..core.topology import node_labels
from .cache import ClusterCache
from .metrics import ExtenderMetrics
from .service import DEFAULT_DEBUG_BYTES, INDEX_CACHE_BYTES, Extender

__all__ = ["build_extender", "load_static", "node_list", "POLICIES"]

log = logging.getLogger(__name__)

POLICIES = ("das", "das-agent", "firstfit", "bestfit", "loadbalance", "topology", "fgd", "random")
#: heuristic used when the configured policy raises while scoring
FALLBACK_POLICY = "bestfit"


def _fallback() -> Placement:
    try:
        return make_placement(FALLBACK_POLICY)
    except ValueError:  # heuristics not available: DAS with its default parameters
        return DASPlacement()


def build_extender(
    policy: str = "das",
    model: str | Path | None = None,
    levels: tuple[str, ...] = DEFAULT_TOPOLOGY_LEVELS,
    assume_ttl: float = 30.0,
    settle_timeout: float = 0.0,
    debug_bytes: int = DEFAULT_DEBUG_BYTES,
    index_cache_bytes: int = INDEX_CACHE_BYTES,
) -> Extender:
    """An extender with an empty cache. A DAS ``model`` that cannot be read leaves DAS
    on its documented default parameters; the reason is logged, exported as
    ``rlsched_extender_policy_fallbacks_total{reason="model_load"}`` and returned by
    ``/version``."""
    name = policy.lower()
    placement = serving_placement(name, model)
    reason = placement.fallback_reason
    version = placement.model_version
    if reason:
        instead = "default parameters" if isinstance(placement, DASPlacement) else "first fit"
        log.warning("%s model not used, falling back to %s: %s", placement.name, instead, reason)
    cache = ClusterCache(levels=levels, assume_ttl=assume_ttl)
    return Extender(
        cache,
        placement,
        fallback=_fallback(),
        metrics=ExtenderMetrics(),
        model_version=version,
        policy_fallback=reason,
        settle_timeout=settle_timeout,
        debug_bytes=debug_bytes,
        index_cache_bytes=index_cache_bytes,
    )


def _documents(path: Path) -> list:
    text = path.read_bytes()
    if path.suffix == ".json":
        return [orjson.loads(text)]
    return [d for d in yaml.safe_load_all(text) if d is not None]


def load_static(path: str | Path, cache: ClusterCache) -> tuple[int, int]:
    """Load nodes (and optional pods) from a file into ``cache`` once.

    The file holds a ``NodeList``, or a ``List`` of Nodes and Pods, or several YAML
    documents (``NodeList``/``PodList``/``Node``/``Pod``). Returns ``(nodes, pods)``.
    """
    p = Path(path)
    nodes: list = []
    pods: list = []
    for doc in _documents(p):
        if not isinstance(doc, dict):
            raise ValueError(f"{p}: expected Kubernetes objects, got {type(doc).__name__}")
        kind = doc.get("kind", "")
        items = doc.get("items") if kind.endswith("List") or "items" in doc else [doc]
        if not isinstance(items, list):
            raise ValueError(f"{p}: {kind or 'document'} items must be a list")
        default = {"NodeList": "Node", "PodList": "Pod"}.get(kind, "")
        for it in items:
            k = it.get("kind", default) if isinstance(it, dict) else ""
            if k == "Node":
                nodes.append(it)
            elif k == "Pod":
                pods.append(it)
            else:
                raise ValueError(f"{p}: cannot use an object of kind {k!r} (want Node or Pod)")
    cache.replace_nodes(nodes)
    cache.replace_pods(pods)
    return len(nodes), len(pods)


def node_list(topology) -> dict:
    """A ``NodeList`` for a :class:`~rlsched.core.topology.Topology` (labels as the
    fake nodes of the integration tests carry them), e.g. for ``--static-nodes``."""
    items = []
    for n in topology.nodes:
        gpus = str(n.gpus)
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": n.name, "labels": node_labels(n)},
                "status": {
                    "capacity": {RESOURCE_GPU: gpus, "cpu": f"{n.cpu_milli}m", "memory": f"{n.memory_mib}Mi"},
                    "allocatable": {RESOURCE_GPU: gpus, "cpu": f"{n.cpu_milli}m", "memory": f"{n.memory_mib}Mi"},
                },
            }
        )
    return {"apiVersion": "v1", "kind": "NodeList", "items": items}
