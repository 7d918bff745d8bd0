"""kube-scheduler's ``k8s.io/kube-scheduler/extender/v1`` wire types, decoded and encoded.

The extender types carry no JSON tags, so their keys are the Go field names
(PascalCase): ``ExtenderArgs{Pod, Nodes, NodeNames}``, ``ExtenderFilterResult{Nodes,
NodeNames, FailedNodes, FailedAndUnresolvableNodes, Error}``, ``HostPriorityList =
[{Host, Score}]``. The embedded ``v1.Pod`` and ``v1.NodeList`` are ordinary API objects
with camelCase keys. With ``nodeCacheCapable: true`` kube-scheduler sends ``NodeNames``
and ``"Nodes": null`` and reads ``NodeNames`` back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import orjson

from ..core.contract import ShapeError, dns_subdomain

__all__ = [
    "WireError",
    "ExtenderArgs",
    "BindingArgs",
    "decode_args",
    "decode_binding",
    "encode_filter",
    "encode_priorities",
    "encode_binding",
    "PriorityEncoder",
    "MAX_PRIORITY",
]

#: kube-scheduler's MaxExtenderPriority
MAX_PRIORITY = 10
#: refuse requests naming more nodes than this (a 50k-node cluster is far beyond it)
MAX_NODES = 100_000


class WireError(ShapeError):
    """The request body is not a valid ExtenderArgs, or names a node no API object can
    be called (answered with HTTP 400). A pod that cannot be read is not one: it is
    answered as unschedulable."""


@dataclass(slots=True)
class ExtenderArgs:
    """A decoded request: the pod and the candidate node names, in request order.

    ``node_objects`` holds the Node objects when kube-scheduler sent ``Nodes`` (not
    node-cache-capable mode); the reply then carries ``Nodes`` too.
    """

    pod: dict
    names: list[str]
    node_objects: list[dict] | None


def _node_name(obj: Any, where: str) -> str:
    if not isinstance(obj, dict):
        raise WireError(f"{where}: expected a Node object, got {type(obj).__name__}")
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise WireError(f"{where}.metadata.name: expected a non-empty string")
    try:
        return dns_subdomain(meta["name"], f"{where}.metadata.name")
    except ShapeError as exc:
        raise WireError(str(exc)) from None


def decode_args(body: bytes) -> ExtenderArgs:
    """Parse and validate an ``ExtenderArgs`` body (raises :class:`WireError`). The
    names of ``Nodes`` must be DNS-1123 subdomains; ``NodeNames`` are checked by the
    extender against its node cache (a name it does not know must be one), which
    costs nothing for the lists kube-scheduler sends again and again. The pod is only
    checked to be an object: a pod that cannot be read is unschedulable, not a bad
    request."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WireError(f"ExtenderArgs must be a JSON object, got {type(doc).__name__}")
    pod = doc.get("Pod")
    if pod is None:
        raise WireError("ExtenderArgs.Pod is required")
    if not isinstance(pod, dict):
        raise WireError(f"ExtenderArgs.Pod must be an object, got {type(pod).__name__}")
    names = doc.get("NodeNames")
    nodes = doc.get("Nodes")
    node_objects = None
    if names is not None:
        if not isinstance(names, list):
            raise WireError(f"ExtenderArgs.NodeNames must be an array of strings or null, got {type(names).__name__}")
        if len(names) > MAX_NODES:
            raise WireError(f"ExtenderArgs.NodeNames has {len(names)} entries, more than {MAX_NODES}")
        # fast path in C: all of type str and none empty
        if not set(map(type, names)) <= {str} or "" in names:
            for i, n in enumerate(names):
                if not isinstance(n, str) or not n:
                    raise WireError(f"ExtenderArgs.NodeNames[{i}] must be a non-empty string, got {n!r:.80}")
    if nodes is not None:
        if not isinstance(nodes, dict):
            raise WireError(f"ExtenderArgs.Nodes must be a NodeList object or null, got {type(nodes).__name__}")
        items = nodes.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise WireError("ExtenderArgs.Nodes.items must be an array")
        if len(items) > MAX_NODES:
            raise WireError(f"ExtenderArgs.Nodes.items has {len(items)} entries, more than {MAX_NODES}")
        node_names = [_node_name(o, f"ExtenderArgs.Nodes.items[{i}]") for i, o in enumerate(items)]
        if names is None:  # not node-cache-capable: answer with Nodes too
            names, node_objects = node_names, items
    if names is None:
        raise WireError("ExtenderArgs needs NodeNames (nodeCacheCapable) or Nodes; both are null")
    return ExtenderArgs(pod=pod, names=names, node_objects=node_objects)


def encode_filter(
    args: ExtenderArgs,
    passed: Sequence[int],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str] | None = None,
    error: str = "",
) -> bytes:
    """An ``ExtenderFilterResult``; ``passed`` are positions in ``args.names``."""
    out: dict[str, Any] = {
        "Nodes": None,
        "NodeNames": [args.names[i] for i in passed],
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable or {}),
        "Error": error,
    }
    if args.node_objects is not None:
        out["Nodes"] = {"metadata": {}, "items": [args.node_objects[i] for i in passed]}
    return orjson.dumps(out)


def encode_priorities(names: Sequence[str], scores: Sequence[int]) -> bytes:
    """A ``HostPriorityList``: ``[{"Host": name, "Score": 0..10}, ...]``."""
    return orjson.dumps([{"Host": h, "Score": s} for h, s in zip(names, scores)])


class PriorityEncoder:
    """:func:`encode_priorities` for hot paths: the JSON of each ``{"Host": name,
    "Score":`` prefix is kept per node name (at most ``max_names`` names and about
    ``max_bytes`` bytes: all are forgotten when either is exceeded), so a reply is one
    byte join instead of a dict per node."""

    _SUFFIX = [f"{s}}}".encode() for s in range(MAX_PRIORITY + 1)]
    #: bookkeeping per kept name beyond the lengths of the name and its prefix
    _ENTRY_BYTES = 150

    def __init__(self, max_names: int = 200_000, max_bytes: int = 16 * 1024 * 1024) -> None:
        self._prefix: dict[str, bytes] = {}
        self._max = max_names
        self._max_bytes = max_bytes
        self.bytes = 0

    def _miss(self, names: Sequence[str]) -> dict[str, bytes]:
        """The prefixes of ``names``; kept for next time while within the budget."""
        prefix = self._prefix
        wanted = set(names)
        new = {n: b'{"Host":' + orjson.dumps(n) + b',"Score":' for n in wanted if n not in prefix}
        size = sum(2 * len(n) + self._ENTRY_BYTES for n in new)
        if len(prefix) + len(new) <= self._max and self.bytes + size <= self._max_bytes:
            prefix.update(new)
            self.bytes += size
            return prefix
        # over budget: start again from this request's names, if they fit alone
        fresh = {n: prefix[n] if n in prefix else new[n] for n in wanted}
        fresh_size = sum(2 * len(n) + self._ENTRY_BYTES for n in fresh)
        if len(fresh) <= self._max and fresh_size <= self._max_bytes:
            self._prefix, self.bytes = fresh, fresh_size
        return fresh

    def __call__(self, names: Sequence[str], scores: Sequence[int]) -> bytes:
        prefix, suffix = self._prefix, self._SUFFIX
        try:
            parts = [prefix[n] + suffix[s] for n, s in zip(names, scores)]
        except KeyError:
            prefix = self._miss(names)
            parts = [prefix[n] + suffix[s] for n, s in zip(names, scores)]
        return b"[" + b",".join(parts) + b"]"


@dataclass(slots=True)
class BindingArgs:
    """``ExtenderBindingArgs{PodName, PodNamespace, PodUID, Node}``."""

    name: str
    namespace: str
    uid: str
    node: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def decode_binding(body: bytes) -> BindingArgs:
    """Parse and validate an ``ExtenderBindingArgs`` body (raises :class:`WireError`)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise WireError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise WireError(f"ExtenderBindingArgs must be a JSON object, got {type(doc).__name__}")
    vals = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        v = doc.get(key)
        if not isinstance(v, str) or (key != "PodUID" and not v):
            raise WireError(f"ExtenderBindingArgs.{key} must be a non-empty string")
        vals[key] = v
    return BindingArgs(vals["PodName"], vals["PodNamespace"], vals["PodUID"], vals["Node"])


def encode_binding(error: str = "") -> bytes:
    """An ``ExtenderBindingResult``."""
    return orjson.dumps({"Error": error})
