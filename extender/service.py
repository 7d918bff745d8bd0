"""Filter and prioritize decisions: read the cache, ask the policy, commit assumptions.

Each call runs read-decide-commit under one asyncio lock with no ``await`` inside, so two
pods scored concurrently never see the same free GPUs; encoding happens after, from an
immutable node table. The hot path has no Python code per candidate node. Fail closed: a
pod the extender cannot read is unschedulable, never an error. Memory kept across
requests is bounded by bytes. Details: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from itertools import repeat
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import numpy as np

from ..core.cluster import ClusterState, JobView
from ..core.contract import RESOURCE_GPU, ShapeError, dns_label, dns_subdomain
from ..core.policy import Placement, scores_to_extender
from ..core.planning import required_topology
from .cache import ClusterCache
from .memory import ByteLRU
from .metrics import ExtenderMetrics
from .objects import PodInfo, parse_pod
from .wire import MAX_PRIORITY, BindingArgs, ExtenderArgs, NodeTable, WireError, decode_args

__all__ = ["Extender", "FilterOutcome", "Rejection", "Scored", "MAX_REASON", "DEFAULT_DEBUG_BYTES", "UNKNOWN_NODE"]

log = logging.getLogger(__name__)

#: longest failure reason or bind error sent back (and kept for /debug)
MAX_REASON = 512
#: default byte budget of the /debug explanations kept
DEFAULT_DEBUG_BYTES = 16 * 1024 * 1024
#: byte budget of the per-topology node table beyond its names and score heads (the
#: whole score entries of every node, kept when they fit)
INDEX_CACHE_BYTES = 16 * 1024 * 1024
#: the reason of every candidate the node cache does not know (one string, shared)
UNKNOWN_NODE = "node is not in the rlsched extender's node cache (unknown node)"
#: at most this many (node: reason) examples kept per filter call for /debug
DEBUG_FAILED = 50
#: byte budget of the pods read, kept under their JSON text (filter, then prioritize
#: and retries send the same pod)
POD_CACHE_BYTES = 2 * 1024 * 1024


#: bytes of a str object beyond its characters, plus its slot in a tuple
_STR_BYTES = 57
#: bookkeeping of one /debug entry or part: dicts, small ints, floats
_ENTRY_BYTES = 1024
#: a small numpy array beyond its data (``sys.getsizeof`` of its header)
_ARRAY_BYTES = 128
#: upper bound of one ``_gpus`` entry: a pod key and a job of valid names, a tuple
_GPUS_ENTRY_BYTES = 1024


def bounded(text: str, limit: int = MAX_REASON) -> str:
    """``text`` cut to ``limit`` characters."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def policy_choice(raw: np.ndarray, cand: np.ndarray) -> int | None:
    """Position (in ``cand``) of the node the placement policy picks for the pod: the
    best finite score, the lowest node index among equal scores, as
    ``Placement.place`` picks (``np.argmax`` over candidates in index order) and so
    as the simulator places; None when no node is feasible."""
    raw = np.asarray(raw, dtype=float)
    finite = np.isfinite(raw)
    if not finite.any():
        return None
    top = np.flatnonzero(finite & (raw == raw[finite].max()))
    return int(top[np.argmin(np.asarray(cand)[top])])


def sole_top(ints: np.ndarray, pick: int) -> np.ndarray:
    """``ints`` with the policy's pick alone at the top score: any other node that
    rounded to the same integer gets one less. kube-scheduler picks at random among
    nodes of equal total score, so without this a tie (two nodes the policy scores
    alike, or scores a hair apart) put the pod where the policy would not, and where
    the extender did not assume it (found by the twin check, docs/twin.md)."""
    out = np.array(ints, dtype=np.int64, copy=True)
    if out[pick] > 0:
        tied = out == out[pick]
        tied[pick] = False
        out[tied] -= 1
    return out


def _groups(keys: np.ndarray, pos: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``pos`` split by ``keys`` (same length): ``[(key, positions), ...]``, positions
    in their order within each group; vectorised (one stable sort)."""
    if len(pos) == 0:
        return []
    if keys.min() == keys.max():
        return [(int(keys[0]), pos)]
    order = np.argsort(keys, kind="stable")
    k, p = keys[order], pos[order]
    cut = np.flatnonzero(k[1:] != k[:-1]) + 1
    return [(int(k[a]), members) for a, members in zip(np.r_[0, cut].tolist(), np.split(p, cut))]


@dataclass(slots=True)
class Rejection:
    """One class of rejected candidates: one reason, shared by all of them."""

    kind: str  # the metric label: capacity, gpu_model, topology, unknown_node, invalid_pod
    reason: str
    unresolvable: bool  # FailedAndUnresolvableNodes (preemption cannot help)
    positions: np.ndarray  # positions in the request's names, in request order


class FilterOutcome:
    """A filter decision: ``passed`` (positions in the request's names) and the
    rejected candidates by class. ``failed`` / ``unresolvable`` (node name -> reason,
    the wire's maps) are built on first use, after the lock, with the same ``str``
    object for every node of a class."""

    __slots__ = ("passed", "rejected", "_names", "_maps", "_table", "_idx")

    def __init__(self, passed: list[int], rejected: list[Rejection] | None = None,
                 names: list[str] | None = None, table: NodeTable | None = None,
                 idx: np.ndarray | None = None) -> None:
        self.passed = passed
        self.rejected = rejected or []
        self._names = names or []
        self._maps: tuple[dict[str, str], dict[str, str]] | None = None
        self._table = table
        self._idx = idx

    def sent(self, raw: bytes) -> None:
        """The JSON text of the passed names as encoded: kept by the node table, so
        that the prioritize request carrying it back is not parsed again."""
        if self._table is not None and self._idx is not None and len(self.passed) >= NodeTable.RECENT_MIN:
            self._table.remember(raw, self._idx[self.passed])

    def _build(self) -> tuple[dict[str, str], dict[str, str]]:
        if self._maps is None:
            failed: dict[str, str] = {}
            unres: dict[str, str] = {}
            get = self._names.__getitem__
            for r in self.rejected:  # per class; the nodes of a class in C
                (unres if r.unresolvable else failed).update(dict.fromkeys(map(get, r.positions.tolist()), r.reason))
            self._maps = (failed, unres)
        return self._maps

    @property
    def failed(self) -> dict[str, str]:
        return self._build()[0]

    @property
    def unresolvable(self) -> dict[str, str]:
        return self._build()[1]

    def classes(self) -> list[dict[str, Any]]:
        """One row per class of rejected nodes: kind, reason, node count."""
        return [{"kind": r.kind, "reason": r.reason, "nodes": int(len(r.positions)), "unresolvable": r.unresolvable}
                for r in self.rejected]

    def examples(self, limit: int = DEBUG_FAILED) -> dict[str, str]:
        """Up to ``limit`` (node: reason) pairs, failed classes first."""
        out: dict[str, str] = {}
        for r in sorted(self.rejected, key=lambda r: r.unresolvable):
            for pos in r.positions[: limit - len(out)].tolist():
                out[self._names[pos]] = r.reason
            if len(out) >= limit:
                break
        return out


@dataclass(slots=True)
class Scored:
    """A prioritize decision: ``scores`` (0..10, request order) and what encodes them:
    the candidates' ``idx`` in ``table`` (-1: unknown) and the request's names."""

    names: list[str]
    idx: np.ndarray
    scores: np.ndarray
    table: NodeTable

    def encode(self) -> bytes:
        return self.table.encode_priorities(self.names, self.idx, self.scores)


@dataclass(slots=True)
class _Snapshot:
    """What the extender derives once per topology: the wire table, and per node its
    GPU model and block as small integers (for grouping rejected nodes)."""

    topology: Any
    table: NodeTable
    models: list[str]
    model_code: np.ndarray
    block_code: np.ndarray

    @classmethod
    def of(cls, topology, max_bytes: int) -> "_Snapshot":
        models = sorted({n.gpu_model for n in topology.nodes})
        mid = {m: k for k, m in enumerate(models)}
        bid = {b: k for k, b in enumerate(topology.blocks)}
        return cls(
            topology,
            NodeTable([n.name for n in topology.nodes], max_bytes),
            models,
            np.array([mid[n.gpu_model] for n in topology.nodes], dtype=np.int64),
            np.array([bid[b] for b in topology.block_of], dtype=np.int64),
        )


class Extender:
    """The decisions of the extender over a :class:`ClusterCache` and a placement.

    ``fallback`` scores when ``policy`` raises; ``policy_fallback`` is the reason the
    configured policy is not the one requested (e.g. an unreadable model file).
    """

    def __init__(
        self,
        cache: ClusterCache,
        policy: Placement,
        fallback: Placement | None = None,
        metrics: ExtenderMetrics | None = None,
        model_version: str = "",
        policy_fallback: str | None = None,
        debug_entries: int = 1024,
        debug_bytes: int = DEFAULT_DEBUG_BYTES,
        index_cache_bytes: int = INDEX_CACHE_BYTES,
        binder: Callable[[BindingArgs], Awaitable[None]] | None = None,
        settle_timeout: float = 0.0,
    ) -> None:
        self.cache = cache
        self.policy = policy
        self.fallback = fallback
        self.metrics = metrics or ExtenderMetrics()
        self.lock = asyncio.Lock()
        self.model_version = model_version
        self.policy_fallback = policy_fallback
        #: pod key -> its last filter/prioritize explanation (for /debug)
        self._debug: ByteLRU[str, dict] = ByteLRU(debug_bytes, debug_entries)
        self._debug_entries = debug_entries
        #: pod key -> (GPUs, job) of recently scored pods, for bind (keys and jobs are
        #: valid Kubernetes names, so an entry is a few hundred bytes)
        self._gpus: OrderedDict[str, tuple[int, str | None]] = OrderedDict()
        #: the wire table (name -> index, reply fragments) of the current topology,
        #: rebuilt when the topology is; its score entries within ``index_cache_bytes``
        self._table_bytes = index_cache_bytes
        self._snap: _Snapshot | None = None
        #: pods read, under the JSON text they were read from
        self._pods: ByteLRU[bytes, PodInfo] = ByteLRU(POD_CACHE_BYTES, 256)
        #: creates the Binding in the API server (``None``: bind verb unavailable)
        self.binder = binder
        #: wait up to this long for the job's assumed pods to show up bound before
        #: scoring the next worker (kube-scheduler binds asynchronously; 0: never wait)
        self.settle_timeout = settle_timeout
        if cache.on_observation is None:
            cache.on_observation = policy.observe
        self.metrics.bind_sources(cache.age, lambda: len(cache.assumed), cache.overcommitted_gpus, self.retained_bytes)
        self.metrics.model.info(
            {"policy": policy.name, "version": model_version or "none", "fallback": "true" if policy_fallback else "false"}
        )
        if policy_fallback:
            self.metrics.fallbacks.labels(reason="model_load").inc()

    # ------------------------------------------------------------------ helpers
    async def _settle(self, pod: PodInfo) -> None:
        """Give the binding of the job's other pods (assumed, not yet seen bound) up to
        ``settle_timeout`` seconds to arrive, so this worker is scored against where
        they really went rather than where the extender guessed."""
        if self.settle_timeout <= 0 or pod.job is None:
            return
        deadline = time.monotonic() + self.settle_timeout
        while time.monotonic() < deadline:
            if not any(j == pod.job and k != pod.key for k, (_, _, j, _) in self.cache.assumed.items()):
                return
            await asyncio.sleep(0.005)

    def decode(self, body: bytes) -> ExtenderArgs:
        """:func:`~rlsched.extender.wire.decode_args`, with the node table's remembered
        candidate lists (a list seen before is not parsed again)."""
        snap = self._snap
        return decode_args(body, snap.table.names_for if snap is not None else None)

    def _pod(self, args: ExtenderArgs) -> PodInfo:
        """``parse_pod(args.pod)``, kept under the pod's JSON text when it has one (the
        same bytes are the same pod; a pod that cannot be read is not kept)."""
        key = args.pod_bytes
        if key is None:
            return parse_pod(args.pod)
        pod = self._pods.get(key)
        if pod is None:
            pod = parse_pod(args.pod)
            self._pods.put(key, pod, 2 * len(key) + _ENTRY_BYTES)
        return pod

    def _snapshot(self, st: ClusterState) -> _Snapshot:
        """The per-topology table of ``st`` (built on the first request after the
        topology changed)."""
        snap = self._snap
        if snap is None or snap.topology is not st.topology:
            snap = self._snap = _Snapshot.of(st.topology, self._table_bytes)
        return snap

    def _prepare(self, args: ExtenderArgs, pod: PodInfo) -> tuple[PodInfo, ClusterState, np.ndarray, list[int]]:
        self.cache.expire()
        idx = self._indices(self.cache.state(), args)  # a bad request changes nothing
        self.cache.forget(pod.key)  # a new scheduling attempt replaces an old guess
        st = self.cache.state()
        index = st.topology.index
        placed = [index[n] for n in self.cache.job_placement(pod.job, exclude=pod.key) if n in index]
        return pod, st, idx, placed

    def _indices(self, st: ClusterState, args: ExtenderArgs) -> np.ndarray:
        """Node index per candidate name (-1: unknown): one C-level pass over the
        topology's name -> index table, with no per-request cache to keep up.

        A name the cache does not know must be a valid node name (a DNS-1123
        subdomain) or the request is refused (:class:`WireError`); names the cache
        knows came from Node objects, so kube-scheduler's requests cost no check."""
        names = args.names
        table = self._snapshot(st).table
        idx = table.lookup(names)
        unknown = np.flatnonzero(idx < 0).tolist()
        if not unknown and args.names_bytes is not None:
            table.remember(args.names_bytes, idx)
        if unknown:
            where = "ExtenderArgs.Nodes.items[{}].metadata.name" if args.node_objects is not None else "ExtenderArgs.NodeNames[{}]"
            for pos in unknown:
                try:
                    dns_subdomain(names[pos], where.format(pos))
                except ShapeError as exc:
                    raise WireError(str(exc)) from None
        return idx

    def _validated(self, args: ExtenderArgs) -> np.ndarray:
        """Check the candidate names (see :meth:`_indices`) before answering for a pod
        that cannot be read, so a bad request is refused whatever its pod."""
        return self._indices(self.cache.state(), args)

    def _unreadable(self, verb: str, args: ExtenderArgs, exc: ShapeError) -> str:
        """The reason a pod that cannot be read is unschedulable; logged and counted."""
        reason = bounded(f"rlsched cannot schedule this pod: {exc}")
        self.metrics.invalid_pods.labels(verb=verb).inc()
        log.info("%s: pod refused as unschedulable on %d nodes: %s", verb, len(args.names), bounded(str(exc), 200))
        return reason

    def _top(self, st: ClusterState, cand, raw, ints, comp, k: int = 20) -> tuple:
        """The best ``k`` candidates' names, scores and terms (kept for /debug, small
        so that remembering many pods costs little)."""
        key = np.where(np.isfinite(raw), raw, -1e300)
        if len(key) > k:
            part = np.argpartition(-key, k)[:k]
            sel = part[np.argsort(-key[part], kind="stable")]
        else:
            sel = np.argsort(-key, kind="stable")
        names = self._snapshot(st).table.names[cand[sel]].tolist()
        terms = {name: v[sel] for name, v in comp.items()} if comp is not None else {}
        return names, ints[sel], raw[sel], terms

    def _remember(self, pod: PodInfo, part: str, doc: dict, size: int) -> None:
        """Keep ``doc`` (about ``size`` bytes) as the ``part`` ("filter", "prioritize")
        of the pod's /debug explanation, within the byte budget."""
        self._gpus[pod.key] = (pod.gpus, pod.job)
        self._gpus.move_to_end(pod.key)
        while len(self._gpus) > self._debug_entries:
            self._gpus.popitem(last=False)
        old = self._debug.get(pod.key, {}, touch=False)
        sizes = {**old.get("_sizes", {}), part: size}
        entry = {**old, part: doc, "time": time.time(), "_sizes": sizes}
        self._debug.put(pod.key, entry, _ENTRY_BYTES + 2 * len(pod.key) + sum(sizes.values()))

    # ------------------------------------------------------------------ filter
    async def filter(self, args: ExtenderArgs) -> FilterOutcome:
        """Decide under the lock; the caller encodes the outcome after it."""
        try:
            pod = self._pod(args)
        except ShapeError as exc:
            return self._filter_unreadable(args, exc)
        await self._settle(pod)
        async with self.lock:
            return self.filter_now(args, pod)

    def _filter_unreadable(self, args: ExtenderArgs, exc: ShapeError) -> FilterOutcome:
        self._validated(args)
        reason = self._unreadable("filter", args, exc)
        self.metrics.filtered.labels(reason="invalid_pod").inc(len(args.names))
        everyone = np.arange(len(args.names))
        return FilterOutcome([], [Rejection("invalid_pod", reason, True, everyone)], args.names)

    def filter_now(self, args: ExtenderArgs, pod: PodInfo | None = None) -> FilterOutcome:
        """Filter ``args`` (``pod``: its pod, already parsed); a pod that cannot be read
        fails everywhere, unresolvable."""
        if pod is None:
            try:
                pod = self._pod(args)
            except ShapeError as exc:
                return self._filter_unreadable(args, exc)
        pod, st, idx, placed = self._prepare(args, pod)
        snap = self._snapshot(st)
        topo = st.topology
        known = idx >= 0
        safe = np.where(known, idx, 0)
        q = pod.gpus
        # capacity against bound pods and the extender's own bindings; a guess (the
        # node an earlier pod scored best on) never makes a node look full: kube-scheduler
        # counts GPUs itself and may have bound that pod elsewhere, and a wrongly full
        # node would leave this pod pending until kube-scheduler retries it
        free_nodes = st.free
        guessed = self.cache.guessed()
        if guessed:  # the pods scored and not yet seen bound (a burst's worth when the watch lags)
            free_nodes = st.free.copy()
            names = list(guessed)
            at = np.fromiter(map(topo.index.get, names, repeat(-1)), dtype=np.int64, count=len(names))
            gpus = np.fromiter(guessed.values(), dtype=np.int64, count=len(names))
            ok = at >= 0
            # free is total - used where used <= total, so without the guesses it is
            # free + guess (names are unique, so the fancy add counts each once) ...
            free_nodes[at[ok]] += gpus[ok]
            # ... and where more is in use than the node has, free was clamped at 0
            for name, (used, total) in self.cache.overcommit().items():
                g = guessed.get(name, 0)
                i = topo.index.get(name)
                if g and i is not None:
                    free_nodes[i] = max(0, total - (used - g))
        free = free_nodes[safe]
        cap_ok = free >= q
        allowed_models = frozenset(m for m in st.models if pod.allows_model(m))
        model_mask = np.zeros(len(st.total), dtype=bool)
        model_mask[st.candidates_total(0, allowed_models)] = True
        model_ok = model_mask[safe] if len(st.total) else np.zeros(len(idx), dtype=bool)
        topo_ok, topo_why = required_topology(
            pod.required_level, job=pod.job, gpus=pod.gpus, gang_size=pod.gang_size,
            state=st, candidates=safe, placed=placed,
        )
        ok = known & cap_ok & model_ok & topo_ok
        passed = np.flatnonzero(ok)
        rejected: list[Rejection] = []
        if len(passed) < len(idx):
            rejected = self._reject(pod, st, snap, idx, known, free, cap_ok, model_ok, topo_ok, topo_why, placed)
        out = FilterOutcome(passed.tolist(), rejected, args.names, snap.table, idx)
        counts: dict[str, int] = {}
        for r in rejected:
            counts[r.kind] = counts.get(r.kind, 0) + len(r.positions)
        for reason, n in counts.items():
            self.metrics.filtered.labels(reason=reason).inc(n)
        if len(out.passed) == 1 and q > 0:
            # kube-scheduler skips scoring when one node is left: it will be that one
            self.cache.assume(pod.key, args.names[out.passed[0]], q, pod.job)
        examples = out.examples()
        classes = out.classes()[:DEBUG_FAILED]
        self._remember(
            pod,
            "filter",
            {"candidates": len(args.names), "passed": len(out.passed), "failed": examples, "classes": classes},
            _ENTRY_BYTES + sum(2 * (len(k) + len(v)) + 2 * _STR_BYTES for k, v in examples.items())
            + sum(_ENTRY_BYTES + 2 * len(c["reason"]) for c in classes),
        )
        return out

    def _reject(self, pod: PodInfo, st: ClusterState, snap: _Snapshot, idx: np.ndarray, known: np.ndarray,
                free: np.ndarray, cap_ok: np.ndarray, model_ok: np.ndarray, topo_ok: np.ndarray,
                topo_why, placed: list[int]) -> list[Rejection]:
        """The rejected candidates grouped into classes, each reason formatted once.
        A node fails for the first rule it breaks: unknown, GPU model, capacity,
        topology."""
        out: list[Rejection] = []
        unknown = np.flatnonzero(~known)
        if len(unknown):
            out.append(Rejection("unknown_node", UNKNOWN_NODE, False, unknown))
        pos = np.flatnonzero(known & ~model_ok)
        for code, members in _groups(snap.model_code[idx[pos]], pos):
            reason = bounded(f"GPU model {snap.models[code]} does not match the pod's constraint ({pod.models_text})")
            out.append(Rejection("gpu_model", reason, True, members))
        pos = np.flatnonzero(known & model_ok & ~cap_ok)
        if len(pos):
            q = pod.gpus
            nodes = idx[pos]
            total = st.total[nodes]
            # the true count, not total - free: free is clamped at 0, and an
            # over-commit (more GPUs bound than the node has) must show
            used_all = st.total - st.free
            for name, used in self.cache.overcommit_used().items():
                i = st.topology.index.get(name)
                if i is not None:
                    used_all[i] = used
            used = used_all[nodes]
            shift = np.int64(1 << 20)
            key = (free[pos] * shift + total) * shift + used
            for _, members in _groups(key, pos):
                p0 = int(members[0])
                i = int(idx[p0])
                t, u, f = int(st.total[i]), int(used_all[i]), int(free[p0])
                over = f"; over-committed by {u - t}" if u > t else ""
                msg = (f"insufficient {RESOURCE_GPU}: pod requests {q}, node has {f} free of {t} "
                       f"({u} used by bound or assumed pods{over})")
                out.append(Rejection("capacity", msg, t < q, members))
        pos = np.flatnonzero(known & model_ok & cap_ok & ~topo_ok)
        if len(pos):
            level = pod.required_level
            if placed:  # the reason names where the job is: the same for every node
                keys = np.zeros(len(pos), dtype=np.int64)
            elif level is not None and level.name == "RACK":
                keys = st.rack_of[idx[pos]]
            elif level is not None and level.name == "BLOCK":
                keys = snap.block_code[idx[pos]]
            else:  # node / NVLink domain: the node's own room
                keys = idx[pos]
            by_text: dict[str, list[np.ndarray]] = {}
            for _, members in _groups(keys, pos):
                by_text.setdefault(bounded(topo_why(int(members[0]))), []).append(members)
            for reason, parts in by_text.items():
                members = parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts))
                out.append(Rejection("topology", reason, False, members))
        return out

    # ------------------------------------------------------------------ prioritize
    async def prioritize(self, args: ExtenderArgs) -> Scored:
        """Decide under the lock; the caller encodes the scores after it."""
        try:
            pod = self._pod(args)
        except ShapeError as exc:
            return self._prioritize_unreadable(args, exc)
        await self._settle(pod)
        async with self.lock:
            return self.score_now(args, pod)

    def _prioritize_unreadable(self, args: ExtenderArgs, exc: ShapeError) -> Scored:
        idx = self._validated(args)
        self._unreadable("prioritize", args, exc)
        return Scored(args.names, idx, np.zeros(len(idx), dtype=np.int64), self._snapshot(self.cache.state()).table)

    def prioritize_now(self, args: ExtenderArgs, pod: PodInfo | None = None) -> list[int]:
        """Scores for ``args`` in request order (see :meth:`score_now`)."""
        return self.score_now(args, pod).scores.tolist()

    def score_now(self, args: ExtenderArgs, pod: PodInfo | None = None) -> Scored:
        """Scores for ``args`` in request order (``pod``: its pod, already parsed); a
        pod that cannot be read scores 0 everywhere."""
        if pod is None:
            try:
                pod = self._pod(args)
            except ShapeError as exc:
                return self._prioritize_unreadable(args, exc)
        pod, st, idx, placed = self._prepare(args, pod)
        known = idx >= 0
        cand = idx[known]
        workers = max(pod.gang_size or 0, len(placed) + 1)
        job = JobView(
            id=pod.job or pod.key,
            submit_time=0.0,
            gpus_per_worker=max(pod.gpus, 1),
            workers=workers,
            max_workers=workers,
            placement=placed,
        )
        used = self.policy
        try:
            raw, comp = self.policy.score_terms(job, cand, st)
        except Exception as exc:  # a policy bug must not stop scheduling
            log.exception("policy %s failed on pod %s; using fallback", self.policy.name, pod.key)
            self.metrics.fallbacks.labels(reason="policy_error").inc()
            if self.fallback is None:
                raise
            used, comp = self.fallback, None
            raw = self.fallback.score(job, cand, st)
        raw = np.asarray(raw, dtype=float)
        ints = scores_to_extender(raw, MAX_PRIORITY)
        pick = policy_choice(raw, cand)
        if pick is not None:
            ints = sole_top(ints, pick)
        if len(cand) == len(idx):
            full = np.asarray(ints, dtype=np.int64)
        else:
            full = np.zeros(len(idx), dtype=np.int64)
            full[known] = ints
        self.metrics.count_scores(full)
        assumed = None
        if pick is not None and pod.gpus > 0:
            best = int(cand[pick])
            assumed = st.topology.nodes[best].name
            self.cache.assume(pod.key, assumed, pod.gpus, pod.job)
        top = self._top(st, cand, raw, ints, comp)
        self._remember(
            pod,
            "prioritize",
            {
                "policy": used.name,
                "job": pod.job,
                "gpus": pod.gpus,
                "placed_workers": [st.topology.nodes[i].name for i in placed],
                "assumed_node": assumed,
                "candidates": len(args.names),
                "unknown_nodes": int(len(idx) - len(cand)),
                "_top": top,
            },
            # node names are the topology's own strings: a pointer each
            2 * _ENTRY_BYTES + 2 * len(pod.job or "") + 8 * (len(placed) + len(top[0]))
            + sum(a.nbytes + _ARRAY_BYTES for a in (top[1], top[2], *top[3].values())) + _STR_BYTES * len(top[3]),
        )
        return Scored(args.names, idx, full, self._snapshot(st).table)

    # ------------------------------------------------------------------ bind
    async def bind(self, args: BindingArgs) -> str:
        """Bind the pod to ``args.node`` through the API server; returns an error
        message ("" on success), never raises: kube-scheduler reads the error and
        retries the pod. Capacity is checked and the pod counted on the node under the
        lock first, so two binds can never share the same free GPUs."""
        if self.binder is None:
            return "this extender has no API access (static nodes): bind is not available"
        try:
            dns_subdomain(args.name, "ExtenderBindingArgs.PodName")
            dns_label(args.namespace, "ExtenderBindingArgs.PodNamespace")
            dns_subdomain(args.node, "ExtenderBindingArgs.Node")
        except ShapeError as exc:
            self.metrics.invalid_pods.labels(verb="bind").inc()
            log.info("bind refused: %s", bounded(str(exc), 200))
            return bounded(f"cannot bind: {exc}")
        try:
            return await self._bind(args)
        except Exception as exc:  # a bug: logged, and answered as a failed binding
            log.exception("binding %s to %s failed", args.key, args.node)
            return bounded(f"binding {args.key} to {args.node} failed: internal error: {type(exc).__name__}: {exc}")

    async def _bind(self, args: BindingArgs) -> str:
        async with self.lock:
            gpus, job = self._gpus.get(args.key, (0, None))
            pod = self.cache.pods.get(args.key)
            if pod is not None:
                gpus, job = pod.gpus, pod.job
            self.cache.forget(args.key)
            st = self.cache.state()
            i = st.topology.index.get(args.node)
            if i is None:
                return f"cannot bind {args.key}: node {args.node} is not in the extender's node cache"
            free = int(st.free[i])
            guess = self.cache.guessed().get(args.node, 0)
            if guess:  # guesses do not hold GPUs against a real binding
                free = max(0, int(st.total[i]) - (int(self.cache.used.get(args.node, 0)) - guess))
            if gpus > free:
                return (
                    f"cannot bind {args.key} to {args.node}: it needs {gpus} {RESOURCE_GPU}, "
                    f"{free} free (taken since filter)"
                )
            if gpus:
                self.cache.assume(args.key, args.node, gpus, job, firm=True)
        try:
            await self.binder(args)
        except Exception as exc:  # reported back to kube-scheduler, which retries the pod
            log.warning("binding %s to %s failed: %s", args.key, args.node, bounded(str(exc), 300))
            async with self.lock:
                self.cache.forget(args.key)
            return bounded(f"binding {args.key} to {args.node} failed: {exc}")
        self._remember_bind(args)
        return ""

    def _remember_bind(self, args: BindingArgs) -> None:
        entry = self._debug.get(args.key, touch=False)
        if entry is not None:
            entry["bound_node"] = args.node

    # ------------------------------------------------------------------ debug
    def retained_bytes(self) -> int:
        """Estimated bytes kept across requests: /debug explanations, the node table
        of the current topology, the GPUs of recently scored pods."""
        table = self._snap.table.retained_bytes() if self._snap is not None else 0
        return self._debug.bytes + table + self._pods.bytes + len(self._gpus) * _GPUS_ENTRY_BYTES

    def overcommit(self) -> list[dict[str, Any]]:
        """Nodes with more GPUs in use (bound and assumed pods) than they have."""
        return [{"node": n, "used": used, "total": total, "overcommitted": used - total}
                for n, (used, total) in sorted(self.cache.overcommit().items())]

    def explain(self, key: str) -> dict[str, Any] | None:
        """The last filter/prioritize answers for pod ``namespace/name``: filter counts
        and up to 50 failure reasons, the best 20 nodes with every score term."""
        entry = self._debug.get(key, touch=False)
        if entry is None:
            return None
        out: dict[str, Any] = {"pod": key, "time": entry["time"]}
        if "filter" in entry:
            out["filter"] = entry["filter"]
        if "bound_node" in entry:
            out["bound_node"] = entry["bound_node"]
        pr = entry.get("prioritize")
        if pr is not None:
            pub = {k: v for k, v in pr.items() if not k.startswith("_")}
            names, ints, raw, terms = pr["_top"]
            nodes = []
            for k, name in enumerate(names):
                row = {"node": name, "score": int(ints[k]), "raw": float(raw[k]) if np.isfinite(raw[k]) else None}
                for term, v in terms.items():
                    row[term] = bool(v[k]) if v.dtype == bool else float(v[k])
                nodes.append(row)
            pub["top"] = nodes
            params = self.policy.parameters() if pr["policy"] == self.policy.name else None
            if params is not None:
                pub["params"] = params
            out["prioritize"] = pub
        return out

