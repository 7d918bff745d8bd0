"""rlsched.core: the cluster model and every scheduling policy, pure Python + numpy.

Nothing here imports Kubernetes, aiohttp, kopf or torch (checked on the source by
``tests/unit/test_import_contracts.py``). The simulator, the extender and the operator
all decide through these objects; :mod:`rlsched.core.contract` is the one description
of the Kubernetes names and object shapes they translate.

The package imports lazily (PEP 562): ``import rlsched.core.contract`` loads the
standard library only — what ``rlsched.trainer`` needs inside a training image without
numpy — and each name of ``__all__`` loads its submodule on first access
(``from rlsched.core import ClusterState`` works as before).
"""

from __future__ import annotations

import importlib
from typing import Any

#: exported name -> the submodule that defines it
_EXPORTS = {
    "QUEUES": "cluster",
    "ClusterState": "cluster",
    "JobView": "cluster",
    "PlacementError": "cluster",
    "Progress": "cluster",
    "progress_from_report": "cluster",
    "ORDERINGS": "policy",
    "PLACEMENTS": "policy",
    "SCALINGS": "policy",
    "Ordering": "policy",
    "Placement": "policy",
    "Scaling": "policy",
    "make_ordering": "policy",
    "make_placement": "policy",
    "make_scaling": "policy",
    "scores_to_extender": "policy",
    "Bandwidth": "topology",
    "Level": "topology",
    "NodeSpec": "topology",
    "Topology": "topology",
    "node_labels": "topology",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    """An exported name loads its submodule; any other name that is a submodule
    (``rlsched.core.heuristics``) is imported, as an eager package would have had it."""
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
