"""rlsched.extender: the kube-scheduler extender serving rlsched placement policies.

``wire`` decodes and encodes kube-scheduler's ``extender/v1`` JSON, ``objects`` reads
the fields of Pods and Nodes the extender needs, ``cache`` keeps the cluster snapshot
(bound and assumed pods) up to date, ``service`` decides filter and prioritize under one
lock, ``app`` is the aiohttp layer, ``watch`` feeds the cache from the API server, and
``cli`` adds ``rlsched extender serve``.
"""

from .app import make_app
from .cache import ClusterCache
from .service import Extender

__all__ = ["make_app", "ClusterCache", "Extender"]
