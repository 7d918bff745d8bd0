"""Filter and prioritize decisions: read the cache, ask the policy, commit assumptions.

Each call runs read-decide-commit under one asyncio lock with no ``await`` inside, so
two pods scored concurrently never see the same free GPUs: the first commits its
assumption (its best node) before the second reads the state.

Fail closed: a pod the extender cannot read (a bad annotation, a GPU quantity it
refuses, a name no API object can carry) is unschedulable, answered with every
candidate in ``FailedAndUnresolvableNodes`` and the reason, and scored 0 everywhere;
it is never an error, because kube-scheduler skips an ignorable extender that errs and
would place the pod without it. Only a request that is not an ExtenderArgs at all (or
names a node no API object can be called) raises :class:`~rlsched.extender.wire.WireError`.

Memory kept across requests (the ``/debug`` explanations, cached candidate lists) is
bounded by bytes (:class:`~rlsched.extender.memory.ByteLRU`), and every name kept is a
valid Kubernetes name, so it cannot grow with the size of requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import chain, islice, repeat
from typing import Any, Awaitable, Callable

import numpy as np

from ..core.cluster import ClusterState, JobView
from ..core.contract import RESOURCE_GPU, ShapeError, dns_label, dns_subdomain
from ..core.policy import Placement, scores_to_extender
from ..core.planning import required_topology
from .cache import ClusterCache
from .memory import ByteLRU, approx_bytes
from .metrics import ExtenderMetrics
from .objects import PodInfo, parse_pod
from .wire import MAX_PRIORITY, BindingArgs, ExtenderArgs, PriorityEncoder, WireError

__all__ = ["Extender", "FilterOutcome", "MAX_REASON", "DEFAULT_DEBUG_BYTES"]

log = logging.getLogger(__name__)

#: longest failure reason or bind error sent back (and kept for /debug)
MAX_REASON = 512
#: default byte budget of the /debug explanations kept
DEFAULT_DEBUG_BYTES = 16 * 1024 * 1024
#: byte budget of the cached candidate lists (node name -> index)
INDEX_CACHE_BYTES = 16 * 1024 * 1024


#: bytes of a str object beyond its characters, plus its slot in a tuple
_STR_BYTES = 57
#: bookkeeping of one /debug entry or part: dicts, small ints, floats
_ENTRY_BYTES = 1024
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


@dataclass(slots=True)
class FilterOutcome:
    passed: list[int]  # positions in the request's names
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)


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
        #: candidate list -> node indices, and node name -> JSON of its score entry
        #: (kube-scheduler sends the same lists again and again), each within
        #: ``index_cache_bytes``
        self._idx_cache: ByteLRU[tuple, np.ndarray] = ByteLRU(index_cache_bytes, 32)
        self.encoder = PriorityEncoder(max_bytes=index_cache_bytes)
        self._idx_topology = None
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

    def _prepare(self, args: ExtenderArgs, pod: PodInfo) -> tuple[PodInfo, ClusterState, np.ndarray, list[int]]:
        self.cache.expire()
        idx = self._indices(self.cache.state(), args)  # a bad request changes nothing
        self.cache.forget(pod.key)  # a new scheduling attempt replaces an old guess
        st = self.cache.state()
        index = st.topology.index
        placed = [index[n] for n in self.cache.job_placement(pod.job, exclude=pod.key) if n in index]
        return pod, st, idx, placed

    def _indices(self, st: ClusterState, args: ExtenderArgs) -> np.ndarray:
        """Node index per candidate name (-1: unknown). kube-scheduler sends the same
        candidate lists again and again, so recent answers are kept per topology.

        A name the cache does not know must be a valid node name (a DNS-1123
        subdomain) or the request is refused (:class:`WireError`); names the cache
        knows came from Node objects and a list seen before was checked then, so
        kube-scheduler's requests cost no check."""
        if self._idx_topology is not st.topology:
            self._idx_cache.clear()
            self._idx_topology = st.topology
        names = args.names
        key = tuple(names)
        idx = self._idx_cache.get(key)
        if idx is None:
            index = st.topology.index
            idx = np.fromiter(map(index.get, names, repeat(-1)), dtype=np.int64, count=len(names))
            where = "ExtenderArgs.Nodes.items[{}].metadata.name" if args.node_objects is not None else "ExtenderArgs.NodeNames[{}]"
            for pos in np.flatnonzero(idx < 0).tolist():
                try:
                    dns_subdomain(names[pos], where.format(pos))
                except ShapeError as exc:
                    raise WireError(str(exc)) from None
            idx.flags.writeable = False
            # the key's strings and tuple slots, the array: counted at C speed
            self._idx_cache.put(key, idx, sum(map(len, names)) + _STR_BYTES * len(names) + idx.nbytes)
        return idx

    def _validated(self, args: ExtenderArgs) -> None:
        """Check the candidate names (see :meth:`_indices`) before answering for a pod
        that cannot be read, so a bad request is refused whatever its pod."""
        self._indices(self.cache.state(), args)

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
        names = [st.topology.nodes[int(i)].name for i in cand[sel]]
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
        try:
            pod = parse_pod(args.pod)
        except ShapeError as exc:
            return self._filter_unreadable(args, exc)
        await self._settle(pod)
        async with self.lock:
            return self.filter_now(args, pod)

    def _filter_unreadable(self, args: ExtenderArgs, exc: ShapeError) -> FilterOutcome:
        self._validated(args)
        reason = self._unreadable("filter", args, exc)
        self.metrics.filtered.labels(reason="invalid_pod").inc(len(args.names))
        return FilterOutcome(passed=[], unresolvable=dict.fromkeys(args.names, reason))

    def filter_now(self, args: ExtenderArgs, pod: PodInfo | None = None) -> FilterOutcome:
        """Filter ``args`` (``pod``: its pod, already parsed); a pod that cannot be read
        fails everywhere, unresolvable."""
        if pod is None:
            try:
                pod = parse_pod(args.pod)
            except ShapeError as exc:
                return self._filter_unreadable(args, exc)
        pod, st, idx, placed = self._prepare(args, pod)
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
        if guessed:  # few: the pods scored and not yet seen bound
            free_nodes = st.free.copy()
            for name, g in guessed.items():
                i = topo.index.get(name)
                if i is not None:
                    free_nodes[i] = max(0, int(st.total[i]) - (int(self.cache.used.get(name, 0)) - g))
        free = free_nodes[safe]
        cap_ok = free >= q
        never = st.total[safe] < q
        allowed_models = frozenset(m for m in st.models if pod.allows_model(m))
        model_mask = np.zeros(len(st.total), dtype=bool)
        model_mask[st.candidates_total(0, allowed_models)] = True
        model_ok = model_mask[safe] if len(st.total) else np.zeros(len(idx), dtype=bool)
        topo_ok, topo_why = required_topology(
            pod.required_level, job=pod.job, gpus=pod.gpus, gang_size=pod.gang_size,
            state=st, candidates=safe, placed=placed,
        )
        ok = known & cap_ok & model_ok & topo_ok
        out = FilterOutcome(passed=np.flatnonzero(ok).tolist())
        counts = {"unknown_node": 0, "gpu_model": 0, "capacity": 0, "topology": 0}
        for pos in np.flatnonzero(~ok):
            name = args.names[pos]
            if not known[pos]:
                out.failed[name] = f"node {name} is not in the rlsched extender's node cache (unknown node)"
                counts["unknown_node"] += 1
                continue
            i = int(idx[pos])
            if not model_ok[pos]:
                out.unresolvable[name] = bounded(
                    f"GPU model {topo.nodes[i].gpu_model} does not match the pod's constraint ({pod.models_text})"
                )
                counts["gpu_model"] += 1
            elif not cap_ok[pos]:
                # the true count, not total - free: free is clamped at 0, and an
                # over-commit (more GPUs bound than the node has) must show
                total = int(st.total[i])
                used = int(self.cache.used.get(name, 0))
                over = f"; over-committed by {used - total}" if used > total else ""
                msg = (f"insufficient {RESOURCE_GPU}: pod requests {q}, node has {int(free[pos])} free of {total} "
                       f"({used} used by bound or assumed pods{over})")
                if never[pos]:
                    out.unresolvable[name] = msg
                else:
                    out.failed[name] = msg
                counts["capacity"] += 1
            else:
                out.failed[name] = bounded(topo_why(pos))
                counts["topology"] += 1
        for reason, n in counts.items():
            if n:
                self.metrics.filtered.labels(reason=reason).inc(n)
        if len(out.passed) == 1 and q > 0:
            # kube-scheduler skips scoring when one node is left: it will be that one
            self.cache.assume(pod.key, args.names[out.passed[0]], q, pod.job)
        failed = dict(islice(chain(out.failed.items(), out.unresolvable.items()), 50))
        self._remember(
            pod,
            "filter",
            {"candidates": len(args.names), "passed": len(out.passed), "failed": failed},
            _ENTRY_BYTES + sum(2 * (len(k) + len(v)) + 2 * _STR_BYTES for k, v in failed.items()),
        )
        return out

    # ------------------------------------------------------------------ prioritize
    async def prioritize(self, args: ExtenderArgs) -> list[int]:
        try:
            pod = parse_pod(args.pod)
        except ShapeError as exc:
            return self._prioritize_unreadable(args, exc)
        await self._settle(pod)
        async with self.lock:
            return self.prioritize_now(args, pod)

    def _prioritize_unreadable(self, args: ExtenderArgs, exc: ShapeError) -> list[int]:
        self._validated(args)
        self._unreadable("prioritize", args, exc)
        return [0] * len(args.names)

    def prioritize_now(self, args: ExtenderArgs, pod: PodInfo | None = None) -> list[int]:
        """Scores for ``args`` in request order (``pod``: its pod, already parsed); a
        pod that cannot be read scores 0 everywhere."""
        if pod is None:
            try:
                pod = parse_pod(args.pod)
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
            + sum(approx_bytes(a) for a in (top[1], top[2], *top[3].values())) + _STR_BYTES * len(top[3]),
        )
        return full.tolist()

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
        """Estimated bytes kept across requests: /debug explanations, cached candidate
        lists and score-entry prefixes, the GPUs of recently scored pods."""
        return self._debug.bytes + self._idx_cache.bytes + self.encoder.bytes + len(self._gpus) * _GPUS_ENTRY_BYTES

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

