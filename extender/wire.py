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
from itertools import repeat
from typing import Any, Callable, Mapping, Sequence

import numpy as np
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
    "NodeTable",
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
    #: the request's JSON text before ``NodeNames`` (``{"Pod":...,"Nodes":null``) when
    #: the body had kube-scheduler's layout and it is small: the same bytes are the same
    #: pod, so what was read from it can be kept under them
    pod_bytes: bytes | None = None
    #: the JSON text of ``NodeNames`` (same condition)
    names_bytes: bytes | None = None


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


_NAMES_KEY = b',"NodeNames":'
#: the head of a body (the pod) is kept as a cache key only up to this size
MAX_KEY_BYTES = 64 * 1024


def _split(body: bytes) -> tuple[dict, bytes, bytes] | None:
    """``(document without NodeNames, its JSON text, the JSON text of NodeNames)``
    when ``body`` is ``<object>,"NodeNames":<value>}`` as Go's encoding/json writes
    an ExtenderArgs (NodeNames last, no spaces); None otherwise.

    The split is at the last ``,"NodeNames":``, which cannot lie inside a JSON string
    (a quote in a string is escaped). It is at the top level when the text before it,
    closed with ``}``, is a JSON object by itself: any object nesting at the cut would
    leave that text unbalanced. The value is parsed by the caller, which falls back to
    a whole parse when it is not JSON."""
    k = body.rfind(_NAMES_KEY)
    if k <= 0:
        return None
    end = len(body)
    while end and body[end - 1] in b" \t\r\n":
        end -= 1
    if body[end - 1:end] != b"}":
        return None
    head = body[:k]
    try:
        doc = orjson.loads(head + b"}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    return doc, head, body[k + len(_NAMES_KEY):end - 1]


def decode_args(body: bytes, known_names: Callable[[bytes], list[str] | None] | None = None) -> ExtenderArgs:
    """Parse and validate an ``ExtenderArgs`` body (raises :class:`WireError`). The
    names of ``Nodes`` must be DNS-1123 subdomains; ``NodeNames`` are checked by the
    extender against its node cache (a name it does not know must be one), which
    costs nothing for the lists kube-scheduler sends again and again. The pod is only
    checked to be an object: a pod that cannot be read is unschedulable, not a bad
    request.

    A body in kube-scheduler's layout (see :func:`_split`) is parsed in two parts, the
    pod and ``NodeNames``, whose texts are kept on the result; ``known_names`` may
    answer the list for a ``NodeNames`` text seen before (a list of valid names), so
    it is not parsed again. Anything else is parsed whole, with the same result."""
    doc = None
    pod_bytes = names_bytes = None
    split = _split(body)
    if split is not None:
        head_doc, head, raw = split
        names = known_names(raw) if known_names is not None else None
        if names is None:
            try:
                names = orjson.loads(raw)
            except orjson.JSONDecodeError:
                names = doc = None  # parsed whole below, for the error
            else:
                doc = head_doc
        else:
            doc = head_doc
        if doc is not None:
            doc["NodeNames"] = names
            if len(head) <= MAX_KEY_BYTES:
                pod_bytes, names_bytes = head, raw
    if doc is None:
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
        # fast path in C: all of type str (join refuses anything else) and none empty
        try:
            "".join(names)
            bad = "" in names
        except TypeError:
            bad = True
        if bad:
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
    if node_objects is not None:
        names_bytes = None
    return ExtenderArgs(pod=pod, names=names, node_objects=node_objects, pod_bytes=pod_bytes, names_bytes=names_bytes)


def encode_filter(
    args: ExtenderArgs,
    passed: Sequence[int],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str] | None = None,
    error: str = "",
    sent: Callable[[bytes], None] | None = None,
) -> bytes:
    """An ``ExtenderFilterResult``; ``passed`` are positions in ``args.names``. The
    bytes are orjson's of the result object; ``sent`` gets the JSON text of its
    ``NodeNames`` (what kube-scheduler sends back to prioritize)."""
    names = args.names
    # no per-node bytecode: all passed is the request's own list, else a C-level gather
    kept = names if len(passed) == len(names) else list(map(names.__getitem__, passed))
    nodes = None
    if args.node_objects is not None:
        objs = args.node_objects
        nodes = {"metadata": {}, "items": objs if kept is names else list(map(objs.__getitem__, passed))}
    kept_raw = orjson.dumps(kept)
    if sent is not None:
        sent(kept_raw)
    return b"".join((
        b'{"Nodes":', orjson.dumps(nodes), b',"NodeNames":', kept_raw,
        b',"FailedNodes":', orjson.dumps(failed),
        b',"FailedAndUnresolvableNodes":', orjson.dumps(unresolvable or {}),
        b',"Error":', orjson.dumps(error), b"}",
    ))


def encode_priorities(names: Sequence[str], scores: Sequence[int]) -> bytes:
    """A ``HostPriorityList``: ``[{"Host": name, "Score": 0..10}, ...]`` (the plain
    reference of :meth:`NodeTable.encode_priorities`)."""
    return orjson.dumps([{"Host": h, "Score": int(s)} for h, s in zip(names, scores)])


def _score_head(name: str) -> bytes:
    return b'{"Host":' + orjson.dumps(name) + b',"Score":'


_TAILS = [f"{s}}}".encode() for s in range(MAX_PRIORITY + 1)]
_TAILS_COMMA = np.array([t + b"," for t in _TAILS], dtype=object)


class NodeTable:
    """The wire fragments of one node set (one topology snapshot), built once and
    read by every request on it, so that a reply is a gather and one byte join, with
    no Python code per node.

    ``names``: the node names (an object array, index -> name), ``index``: name ->
    index. With ``max_bytes`` room, every node's whole ``{"Host":name,"Score":s}``
    entry is kept for each score 0..10 (a prioritize reply is then one gather and one
    join); else only its ``{"Host":name,"Score":`` head (heads and score tails are
    interleaved, still without a per-node loop). The bytes are those of
    :func:`encode_priorities` exactly. Immutable: a request may encode from it after
    the topology it was built from has been replaced.
    """

    __slots__ = ("names", "index", "_entries", "_heads", "bytes", "_recent", "_raw")

    #: candidate lists remembered for :meth:`lookup` (kube-scheduler sends the same
    #: list to filter and prioritize, and again for the next pod of a quiet cluster)
    RECENT = 4
    #: shorter lists are looked up directly
    RECENT_MIN = 64

    #: bookkeeping of one kept bytes object beyond its length (object header, array slot)
    _OBJ_BYTES = 41

    def __init__(self, names: Sequence[str], max_bytes: int = 16 * 1024 * 1024) -> None:
        self.names = np.empty(len(names), dtype=object)
        self.names[:] = list(names)
        self.index = {n: i for i, n in enumerate(names)}
        heads = [_score_head(n) for n in names]
        head_bytes = sum(map(len, heads)) + self._OBJ_BYTES * len(heads)
        entry_bytes = (MAX_PRIORITY + 1) * (head_bytes + 2 * len(heads))
        self._heads = np.empty(len(heads), dtype=object)
        self._heads[:] = heads
        self._entries: np.ndarray | None = None
        #: (the table's own name strings, their indices) of recent all-known lists
        self._recent: list[tuple[list[str], np.ndarray]] = []
        #: JSON text of a recent all-known list -> the list (the table's strings)
        self._raw: dict[bytes, list[str]] = {}
        self.bytes = head_bytes + sum(map(len, names)) + 2 * self._OBJ_BYTES * len(names)
        if entry_bytes <= max_bytes:
            self._entries = np.empty(len(heads) * (MAX_PRIORITY + 1), dtype=object)
            self._entries[:] = [h + t for h in heads for t in _TAILS]
            self.bytes += entry_bytes

    def __len__(self) -> int:
        return len(self.names)

    def lookup(self, names: Sequence[str]) -> np.ndarray:
        """Index of each name (-1: not in this table), read-only: one C-level pass.

        A list equal to one of the last few all-known lists is answered from it: list
        equality compares the request's strings with the table's own (a length check
        and a memcmp each, no hashing) and stops at the first difference, so a list
        that differs costs next to nothing. What is kept is a list of pointers to the
        table's strings and the index array: 16 bytes per name, at most
        ``RECENT`` lists of names this table knows."""
        n = len(names)
        recent = self._recent
        if n >= self.RECENT_MIN:
            for k, (known, idx) in enumerate(recent):
                if known is names or (len(known) == n and known == names):
                    if k:
                        recent.insert(0, recent.pop(k))
                    return idx
        idx = np.fromiter(map(self.index.get, names, repeat(-1)), dtype=np.int64, count=n)
        idx.flags.writeable = False
        if n >= self.RECENT_MIN and (idx >= 0).all():
            recent.insert(0, (self.names[idx].tolist(), idx))
            del recent[self.RECENT:]
        return idx

    def names_for(self, raw: bytes) -> list[str] | None:
        """The list whose JSON text is ``raw``, if it is one remembered (see
        :meth:`remember`): no parsing, and :meth:`lookup` then finds it by identity."""
        return self._raw.get(raw)

    def remember(self, raw: bytes, idx: np.ndarray) -> None:
        """Keep ``raw`` (the JSON text of a list of names) as the names at ``idx``, all
        of them in this table: kube-scheduler sends the filter's answer back to
        prioritize, and the same list again for the next pod of a quiet cluster."""
        if len(idx) < self.RECENT_MIN or raw in self._raw or not (idx >= 0).all():
            return
        names = None
        for known, kidx in self._recent:
            if kidx is idx:
                names = known
                break
        if names is None:
            names = self.names[idx].tolist()
            idx = np.array(idx, dtype=np.int64)
            idx.flags.writeable = False
            self._recent.insert(0, (names, idx))
            del self._recent[self.RECENT:]
        self._raw[raw] = names
        while len(self._raw) > self.RECENT:
            del self._raw[next(iter(self._raw))]

    def retained_bytes(self) -> int:
        """Bytes of the table and its remembered lists (both estimated)."""
        return (self.bytes + sum(16 * len(k) + 120 for k, _ in self._recent)
                + sum(len(r) + 8 * len(v) + 120 for r, v in self._raw.items()))

    def encode_priorities(self, names: Sequence[str], idx: np.ndarray, scores: np.ndarray) -> bytes:
        """The ``HostPriorityList`` of ``names`` (request order) with ``scores``;
        ``idx``: their indices in this table (-1: unknown, encoded from the name)."""
        scores = np.asarray(scores, dtype=np.int64)
        n = len(scores)
        if n != len(idx) or n != len(names):
            raise ValueError(f"{len(names)} names, {len(idx)} indices, {n} scores")
        if n == 0:
            return b"[]"
        if int(scores.min()) < 0 or int(scores.max()) > MAX_PRIORITY:
            raise ValueError(f"scores must be 0..{MAX_PRIORITY}")
        idx = np.asarray(idx, dtype=np.int64)
        unknown = np.flatnonzero(idx < 0).tolist()
        if self._entries is not None:
            keys = idx * (MAX_PRIORITY + 1) + scores
            if unknown:
                parts = np.empty(n, dtype=object)
                known = np.flatnonzero(idx >= 0)
                parts[known] = self._entries[keys[known]]
                parts = parts.tolist()
                for pos in unknown:
                    parts[pos] = _score_head(names[pos]) + _TAILS[int(scores[pos])]
            else:
                parts = self._entries[keys].tolist()
            return b"[" + b",".join(parts) + b"]"
        inter = np.empty(2 * n, dtype=object)
        if unknown:
            known = np.flatnonzero(idx >= 0)
            inter[2 * known] = self._heads[idx[known]]
            for pos in unknown:
                inter[2 * pos] = _score_head(names[pos])
        else:
            inter[0::2] = self._heads[idx]
        inter[1::2] = _TAILS_COMMA[scores]
        inter[-1] = _TAILS[int(scores[-1])]
        return b"[" + b"".join(inter.tolist()) + b"]"


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
