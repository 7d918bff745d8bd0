"""rlsched.core: the cluster model and every scheduling policy, pure Python + numpy.

Nothing here imports Kubernetes, aiohttp, kopf or torch (checked on the source by
``tests/unit/test_import_contracts.py``). The simulator, the extender and the operator
all decide through these objects; :mod:`rlsched.core.contract` is the one description
of the Kubernetes names and object shapes they translate.
"""

from .cluster import QUEUES, ClusterState, JobView, PlacementError, Progress
from .policy import (
    ORDERINGS,
    PLACEMENTS,
    SCALINGS,
    Ordering,
    Placement,
    Scaling,
    make_ordering,
    make_placement,
    make_scaling,
    scores_to_extender,
)
from .topology import Bandwidth, Level, NodeSpec, Topology, node_labels

__all__ = [
    "QUEUES",
    "ClusterState",
    "JobView",
    "PlacementError",
    "Progress",
    "ORDERINGS",
    "PLACEMENTS",
    "SCALINGS",
    "Ordering",
    "Placement",
    "Scaling",
    "make_ordering",
    "make_placement",
    "make_scaling",
    "scores_to_extender",
    "Bandwidth",
    "Level",
    "NodeSpec",
    "Topology",
    "node_labels",
]
