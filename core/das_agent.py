"""The trained DAS ordering agent, served with numpy (ordering ``das``).

DAS (Xing et al., KDD 2023) orders pending jobs with a transformer encoder over a window
of jobs and starts the job with the highest logit among those that fit. Every feature is
what a live operator knows (observation layout 2). Weights default to
``core/weights/das.safetensors``; missing or corrupt weights fall back to FIFO with a
warning. Architecture, windows and cost: docs/design-notes.md.
"""

from __future__ import annotations

import bisect
import logging
import math
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from . import nn
from . import das as _das
from .cluster import QUEUES, ClusterState, JobView
from .estimate import duration_key
from .ordering import remaining_time
from .policy import Placement, register_ordering, register_placement

__all__ = [
    "JOB_FEATURES",
    "NODE_FEATURES",
    "CLUSTER_FEATURES",
    "DEFAULT_WEIGHTS",
    "OBSERVATION_LAYOUT",
    "ObservationMismatch",
    "check_observation",
    "job_features",
    "node_features",
    "cluster_summary",
    "positional_encoding",
    "fits_now",
    "select_window",
    "WINDOW_SELECT",
    "das_logits",
    "DASOrdering",
    "las_thresholds",
    "placement_features",
    "rack_first_fill",
    "rwgp_smoother",
    "DASAgentPlacement",
]

log = logging.getLogger(__name__)

#: Per-job features, in column order.
JOB_FEATURES = (
    "gpus_norm",  # workers * gpus_per_worker / GPUs of the largest node
    "workers_norm",  # workers / 8
    "gpus_per_worker_norm",  # gpus_per_worker / GPUs of the largest node
    "log_runtime",  # log1p(estimated remaining run time s, 0 if unknown) / 10
    "log_gpu_seconds",  # log1p(estimated run time * GPUs) / 12
    "log_wait",  # log1p(now - submit time) / 10
    "fits_now",  # 1 when the job's gang fits the free GPUs now
    "share_of_free",  # GPUs asked / free GPUs (capped at 4) / 4
    "queue_rank",  # 0 interrupt, 0.5 urgent, 1 normal
    "priority",  # tanh(priority / 10)
    "log_attained",  # log1p(attained service, GPU-seconds it has held) / 14
    "log_executed",  # log1p(seconds it has run, attained service / GPUs) / 12
    "log_epochs",  # log1p(evaluations the job reported, progress.epoch) / 5
    "has_estimate",  # 1 when the remaining time is known (user's estimate or progress)
)
#: Version of the observation layout (:data:`JOB_FEATURES`, :data:`NODE_FEATURES`,
#: :data:`CLUSTER_FEATURES` and the placement features): a model file records the
#: features it was trained on, and serving refuses (falls back, logged) a file whose
#: recorded features differ from these. Layout 1 had the first 10 job features only
#: (models trained while the simulator exposed true run times).
OBSERVATION_LAYOUT = 2
#: Per-node features (the squeeze pools them over nodes).
NODE_FEATURES = ("free_frac", "used_frac", "rack_free_frac", "empty")
#: Cluster-wide scalars appended to the pooled node features.
CLUSTER_FEATURES = ("utilization", "pending_over_window", "log_pending", "running_over_nodes")

#: Where the trained weights live by default (beside this module).
DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "das.safetensors"

_QUEUE_RANK = {q: i / max(len(QUEUES) - 1, 1) for i, q in enumerate(QUEUES)}


def fits_now(job: JobView, state: ClusterState) -> bool:
    """Whether ``job.workers`` workers fit the free capacity now (several workers may
    share a node; CPU and memory count when the job asks for them). Read from the
    state's incremental :class:`~rlsched.core.cluster.FitIndex`: the sum of
    :func:`~rlsched.core.placement.worker_slots` without a pass over the nodes."""
    return state.fit_index().fits(job)


#: Ways to pick the window of pending jobs (see the module docstring).
WINDOW_SELECT = ("oldest", "mixed", "shortest")


def _age_key(job: JobView) -> tuple:
    return (job.submit_time, job.id)


def select_window(pending: Sequence[JobView], state: ClusterState, window: int, mode: str = "oldest") -> list[JobView]:
    """The (at most ``window``) pending jobs the agent chooses from, oldest first."""
    if mode not in WINDOW_SELECT:
        raise ValueError(f"window_select must be one of {WINDOW_SELECT}, not {mode!r}")
    fifo = sorted(pending, key=_age_key)
    if mode == "oldest" or len(fifo) <= window:
        return fifo[:window]
    n_old = (window + 1) // 2 if mode == "mixed" else 0
    rest = fifo[n_old:]
    fits = state.fit_index().fits
    short = sorted(rest, key=lambda j: (not fits(j), duration_key(remaining_time(j)), _age_key(j)))
    return sorted(fifo[:n_old] + short[: window - n_old], key=_age_key)


def job_features(job: JobView, state: ClusterState, fit: bool | None = None) -> np.ndarray:
    """The :data:`JOB_FEATURES` row of one pending job (``fit``: :func:`fits_now`, when
    the caller has it)."""
    big = max(state.max_gpus, 1)
    gpus = job.workers * job.gpus_per_worker
    runtime = max(remaining_time(job), 0.0)  # an estimate; 0 when unknown
    wait = max(state.time - job.submit_time, 0.0)
    attained = max(job.attained_service, 0.0)
    free = state.free_gpus
    share = min(gpus / free, 4.0) / 4.0 if free > 0 else 1.0
    return np.array(
        [
            gpus / big,
            job.workers / 8.0,
            job.gpus_per_worker / big,
            math.log1p(runtime) / 10.0,
            math.log1p(runtime * gpus) / 12.0,
            math.log1p(wait) / 10.0,
            1.0 if (fits_now(job, state) if fit is None else fit) else 0.0,
            share,
            _QUEUE_RANK.get(job.queue, 1.0),
            math.tanh(job.priority / 10.0),
            math.log1p(attained) / 14.0,
            math.log1p(attained / max(gpus, 1)) / 12.0,
            math.log1p(max(job.progress.epoch, 0)) / 5.0,
            1.0 if runtime > 0 else 0.0,
        ],
        dtype=np.float32,
    )


class ObservationMismatch(ValueError):
    """A model file recorded other observation features than serving computes."""


def check_observation(metadata: Mapping) -> None:
    """Raise :class:`ObservationMismatch` unless ``metadata["observation"]`` lists
    exactly this module's job, node, cluster and placement features (a model trained
    on another layout would read wrong columns, or fail on a shape)."""
    obs = metadata.get("observation")
    if not isinstance(obs, Mapping):
        raise ObservationMismatch("model metadata has no observation record")
    want = {
        "job_features": list(JOB_FEATURES),
        "node_features": list(NODE_FEATURES),
        "cluster_features": list(CLUSTER_FEATURES),
        "placement_features": list(_das.PLACEMENT_FEATURES),
    }
    for key, names in want.items():
        got = obs.get(key)
        if got is not None and list(got) != names:
            raise ObservationMismatch(
                f"model observation layout differs from serving's (layout {OBSERVATION_LAYOUT}): "
                f"{key} {list(got)} != {names}; retrain or promote a model of this layout"
            )
    if obs.get("job_features") is None:
        raise ObservationMismatch("model metadata lists no job_features")


def node_features(state: ClusterState) -> np.ndarray:
    """``[nodes, len(NODE_FEATURES)]`` float32."""
    total = np.maximum(state.total, 1).astype(np.float64)
    free = state.free / total
    rack_total = np.bincount(state.rack_of, weights=state.total, minlength=len(state.rack_free))
    rack_free = state.rack_free / np.maximum(rack_total, 1)
    return np.stack(
        [free, 1.0 - free, rack_free[state.rack_of], (state.free == state.total).astype(float)], axis=1
    ).astype(np.float32)


def cluster_summary(state: ClusterState, n_pending: int, window: int) -> np.ndarray:
    """Squeeze: node features average-pooled, then :data:`CLUSTER_FEATURES`."""
    pooled = node_features(state).mean(axis=0) if len(state.total) else np.zeros(len(NODE_FEATURES))
    extra = [
        state.utilization(),
        min(n_pending / max(window, 1), 4.0) / 4.0,
        math.log1p(n_pending) / 8.0,
        min(len(state.running) / max(len(state.total), 1), 4.0) / 4.0,
    ]
    return np.concatenate([pooled, np.asarray(extra)]).astype(np.float32)


def positional_encoding(length: int, d_model: int) -> np.ndarray:
    """Sinusoidal encoding of Vaswani et al. (2017): ``PE[p, 2i] = sin(p / 10000^(2i/d))``,
    ``PE[p, 2i+1] = cos(...)``; ``[length, d_model]`` float32."""
    pos = np.arange(length, dtype=np.float64)[:, None]
    i = np.arange(0, d_model, 2, dtype=np.float64)
    angle = pos / np.power(10000.0, i / d_model)
    pe = np.zeros((length, d_model))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d_model // 2])
    return pe.astype(np.float32)


def das_logits(
    weights: Mapping[str, np.ndarray],
    jobs: np.ndarray,
    cluster: np.ndarray,
    valid: np.ndarray,
    *,
    num_heads: int,
    num_layers: int,
) -> np.ndarray:
    """The ordering network's logits. ``jobs``: ``[B, W, F]``; ``cluster``: ``[B, C]``;
    ``valid``: ``[B, W]`` bool (False = padding). Weight names are those of
    ``rlsched.models.das.OrderingNet.state_dict()``. Padding gets ``-inf``."""
    jobs = np.asarray(jobs, dtype=np.float32)
    cluster = np.asarray(cluster, dtype=np.float32)
    valid = np.asarray(valid, dtype=bool)
    b, w, _ = jobs.shape
    d = weights["embed.weight"].shape[0]
    h = nn.linear(jobs, weights["embed.weight"], weights["embed.bias"]) + positional_encoding(w, d)[None]
    gate = nn.sigmoid(nn.linear(cluster, weights["gate.weight"], weights["gate.bias"]))
    h = h * gate[:, None, :]
    pad = ~valid
    # a row with no valid job would attend to nothing; let it attend everywhere instead
    pad = np.where(pad.all(axis=1, keepdims=True), False, pad)
    for k in range(num_layers):
        h = nn.transformer_encoder_layer(h, weights, num_heads, prefix=f"layers.{k}.", key_padding_mask=pad)
    out = nn.linear(h, weights["head.weight"], weights["head.bias"])[..., 0]
    return np.where(valid, out, -np.inf)


class DASOrdering:
    """Ordering ``das``: the trained DAS ordering agent (numpy inference).

    ``model`` is the ``.safetensors`` file (default :data:`DEFAULT_WEIGHTS`); when it
    cannot be loaded the policy ranks FIFO, logs a warning once and keeps the reason in
    :attr:`fallback`.
    """

    name = "das"

    def __init__(self, model: str | Path | None = None, *, las_thresholds: Sequence[float] | None = None,
                 rng: np.random.Generator | None = None) -> None:
        del rng  # deterministic at serving time
        self.path = Path(model) if model is not None else DEFAULT_WEIGHTS
        self.fallback_reason: str | None = None
        self.weights: dict[str, np.ndarray] = {}
        self.metadata: dict = {}
        try:
            self.weights, self.metadata = nn.load_policy_file(self.path, policy="das")
            arch = self.metadata.get("architecture", {})
            self.window = int(arch["window"])
            self.num_heads = int(arch["num_heads"])
            self.num_layers = int(arch["num_layers"])
            self.window_select = str(arch.get("window_select", "oldest"))
            if self.window_select not in WINDOW_SELECT:
                raise ValueError(f"unknown window_select {self.window_select!r}")
            check_observation(self.metadata)
            if np.shape(self.weights["embed.weight"])[-1] != len(JOB_FEATURES):
                raise ObservationMismatch(
                    f"embed.weight reads {np.shape(self.weights['embed.weight'])[-1]} job features, serving computes {len(JOB_FEATURES)}"
                )
            self.thresholds = _las_thresholds(arch.get("las_thresholds", ()) if las_thresholds is None else las_thresholds)
        except (nn.PolicyFileError, KeyError, TypeError, ValueError) as exc:
            self.fallback_reason = f"{type(exc).__name__}: {exc}"
            self.window, self.num_heads, self.num_layers = 0, 1, 0
            self.window_select = "oldest"
            self.thresholds = ()
            log.warning("DAS ordering: cannot load %s (%s); falling back to FIFO", self.path, self.fallback_reason)
        #: preemptive (a waiting job of a lower attained-service queue evicts) when the
        #: model has attained-service queues
        self.preemptive = bool(self.thresholds)
        self._memo: tuple[tuple, np.ndarray] | None = None

    def observe(self, pending: Sequence[JobView], state: ClusterState) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[JobView]]:
        """``(jobs [W, F], cluster [C], valid [W], window_jobs)`` for the window of
        pending jobs (:func:`select_window`)."""
        head = select_window(pending, state, self.window, self.window_select)
        feats, clus, valid = self._inputs(head, [fits_now(j, state) for j in head], state, len(pending))
        return feats, clus, valid, head

    def _inputs(self, head: Sequence[JobView], fits: Sequence[bool], state: ClusterState, n_pending: int):
        feats = np.zeros((self.window, len(JOB_FEATURES)), dtype=np.float32)
        for k, job in enumerate(head):
            feats[k] = job_features(job, state, fits[k])
        valid = np.zeros(self.window, dtype=bool)
        valid[: len(head)] = True
        return feats, cluster_summary(state, n_pending, self.window), valid

    def _logits(self, feats: np.ndarray, clus: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """:func:`das_logits` of one window, remembered for the last inputs (a pure
        function of them: a second ranking of the same queue at the same instant, as
        the simulator's preemption and scaling passes ask, costs no forward pass)."""
        key = (feats.tobytes(), clus.tobytes(), valid.tobytes())
        memo = self._memo
        if memo is not None and memo[0] == key:
            return memo[1]
        logits = das_logits(
            self.weights, feats[None], clus[None], valid[None], num_heads=self.num_heads, num_layers=self.num_layers
        )[0]
        self._memo = (key, logits)
        return logits

    def rank(self, pending: Sequence[JobView], state: ClusterState) -> list[JobView]:
        if len(pending) == 1:  # a window of one: nothing to order, no transformer
            return list(pending)
        fifo = sorted(pending, key=_age_key)
        if self.fallback_reason is not None or not fifo:
            return fifo
        head = select_window(fifo, state, self.window, self.window_select)
        fit = state.fit_index().fits
        fits = [fit(j) for j in head]
        keys = [(_QUEUE_RANK.get(j.queue, 1.0), -j.priority, self.las_queue(j), not f) for j, f in zip(head, fits)]
        # the logits only order jobs of equal queue class, priority, attained-service
        # queue and fit: without such a tie the transformer is not run (one pending job,
        # or one that fits)
        if len(set(keys)) == len(keys):
            order = sorted(range(len(head)), key=lambda k: (keys[k], k))
        else:
            logits = self._logits(*self._inputs(head, fits, state, len(fifo)))
            order = sorted(range(len(head)), key=lambda k: (keys[k], -logits[k], k))
        if len(head) == len(fifo):
            return [head[k] for k in order]
        chosen = {id(j) for j in head}
        return [head[k] for k in order] + [j for j in fifo if id(j) not in chosen]

    # ------------------------------------------------ attained-service queues (layout 2)
    def las_queue(self, job: JobView) -> int:
        """The job's attained-service queue: how many of :attr:`thresholds` its
        attained service (GPU-seconds) has reached; 0 without thresholds."""
        return bisect.bisect_right(self.thresholds, job.attained_service) if self.thresholds else 0

    def preempts(self, job: JobView, victim: JobView, state: ClusterState) -> bool:
        """Waiting ``job`` outranks running ``victim`` when it is in a strictly lower
        attained-service queue (never without thresholds; ties never preempt)."""
        return bool(self.thresholds) and self.las_queue(job) < self.las_queue(victim)

    def outranked(self, job: JobView, others: Sequence[JobView], state: ClusterState) -> list[JobView]:
        if not self.thresholds:
            return []
        q = self.las_queue(job)
        return [o for o in others if q < self.las_queue(o)]

    def demotes_at(self, job: JobView, now: float) -> float | None:
        """When a job running with ``job.gpus`` GPUs from ``now`` reaches its next
        threshold (None past the last, or without thresholds)."""
        k = self.las_queue(job)
        if k >= len(self.thresholds) or job.gpus <= 0:
            return None
        return now + (self.thresholds[k] - job.attained_service) / job.gpus

    def __repr__(self) -> str:
        return f"DASOrdering(model={str(self.path)!r}{', fallback=FIFO' if self.fallback_reason else ''})"


def las_thresholds(values) -> tuple[float, ...]:
    """Attained-service thresholds of a model file (GPU-seconds, positive, strictly
    ascending); ``ValueError`` otherwise."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ValueError(f"las_thresholds must be a list of GPU-seconds, got {values!r}")
    th = tuple(float(v) for v in values)
    if any(not math.isfinite(t) or t <= 0 for t in th) or any(b <= a for a, b in zip(th, th[1:])):
        raise ValueError(f"las_thresholds must be positive and strictly ascending, got {list(values)}")
    return th


_las_thresholds = las_thresholds  # DASOrdering's keyword shadows the name


@register_ordering("das")
def _make_das_ordering(**kwargs) -> DASOrdering:
    return DASOrdering(**kwargs)


# ============================================================================ placement
def placement_features(job: JobView, state: ClusterState, slots: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(features [N, len(das.PLACEMENT_FEATURES)], feasible [N])`` for placing ``job``'s
    gang on ``state``; ``slots`` = :func:`~rlsched.core.placement.worker_slots` when the caller has it."""
    q = job.gpus_per_worker
    slots = state.fit_index().slots(job) if slots is None else slots
    total_i, free = state.total, state.free
    total = np.maximum(total_i, 1).astype(float)
    need = job.workers * q
    per = max(need, 1)
    feasible = slots > 0
    # column by column into float32 (each value rounded once, as a float64 stack cast)
    feats = np.empty((len(free), 6), dtype=np.float32)
    feats[:, 0] = feasible
    feats[:, 1] = np.minimum(slots * q, need) / per
    feats[:, 2] = np.where(feasible, (total_i - free + q) / total, 0.0)
    feats[:, 3] = free / total
    feats[:, 4] = np.minimum(state.rack_free / per, 1.0)[state.rack_of]
    feats[:, 5] = free == total_i
    return feats, feasible


def rack_first_fill(
    job: JobView, state: ClusterState, scores: np.ndarray, workers: int | None = None, slots: np.ndarray | None = None
) -> list[int] | None:
    """Place ``workers`` (default ``job.workers``) workers by node scores, rack first:
    racks in order of their best feasible node's score, nodes inside a rack by score
    (ties: lowest index; scores are compared at 1e-6 so that float32 and float64
    evaluations of one policy place alike), as many workers per node as fit. ``None``
    if they do not fit. ``slots``: :func:`~rlsched.core.placement.worker_slots` when the caller has it."""
    need = job.workers if workers is None else int(workers)
    slots = state.fit_index().slots(job) if slots is None else slots
    if int(slots.sum()) < need:
        return None
    if need <= 0:
        return []
    # only nodes with room take workers: order those alone (the same order as
    # among all nodes, as the sort ends on the node index)
    feas = np.flatnonzero(slots > 0)
    s = np.round(np.asarray(scores, dtype=float)[feas], 6)
    racks = state.rack_of[feas]
    if need == 1:
        # the first node of that order: a best-scored one, of the lowest rack id
        # among the racks holding one, the lowest index inside it
        top = np.flatnonzero(s == s.max())
        k = top[np.lexsort((feas[top], racks[top]))[0]]
        return [int(feas[k])]
    rack_best = np.full(int(state.rack_of.max()) + 1, -np.inf)
    np.maximum.at(rack_best, racks, s)
    order = feas[np.lexsort((feas, -s, racks, -rack_best[racks]))]
    nodes: list[int] = []
    for i in order:
        if len(nodes) == need:
            break
        nodes.extend([int(i)] * min(int(slots[i]), need - len(nodes)))
    return nodes


def rwgp_smoother(topology, lam: float, noise: float) -> np.ndarray:
    """``S = K (K + noise I)^-1``: the RWGP posterior mean of node utilities given a
    noisy observation at every node (``mu = S a``), ``K`` the normalised random-walk
    kernel of :mod:`rlsched.core.das`."""
    k = _das.TopologyKernel(topology, lam).matrix(normalised=True)
    smoother, _ = _das.gp_posterior(k, k, np.diag(k), np.eye(len(k)), noise)
    return smoother


class DASAgentPlacement(Placement):
    """Placement ``das-agent``: the trained DAS placement agent (RWGP posterior mean of
    a learned linear node score, rack-first fill), read from the same weights file as
    :class:`DASOrdering`. Falls back to first-fit scores (logged) without weights.
    Clusters above ``max_smooth_nodes`` skip the GP smoothing (the limit of the dense
    O(n^3) solve it was computed with; the smoother is now applied on the topology's
    quotient graph, :class:`~rlsched.core.das.QuotientSmoother`, in O(nodes) per job)."""

    name = "das-agent"

    def __init__(self, model: str | Path | None = None, *, max_smooth_nodes: int = 2048, rng: np.random.Generator | None = None) -> None:
        del rng
        self.path = Path(model) if model is not None else DEFAULT_WEIGHTS
        self.max_smooth_nodes = max_smooth_nodes
        self.fallback_reason: str | None = None
        self.model_version = ""
        self._smoother: tuple[object, _das.QuotientSmoother | None] | None = None
        try:
            weights, meta = nn.load_policy_file(self.path, policy="das")
            check_observation(meta)
            arch = meta.get("architecture", {})
            self.w = np.asarray(weights["placement.score.weight"], dtype=np.float64)[0]
            self.b = float(np.asarray(weights["placement.score.bias"]).reshape(-1)[0])
            self.lam = float(arch["lam"])
            self.noise = float(arch.get("gp_noise", 1.0))
            self.model_version = str(meta.get("version", "unversioned"))
        except (nn.PolicyFileError, KeyError, TypeError, ValueError, IndexError) as exc:
            self.fallback_reason = f"{type(exc).__name__}: {exc}"
            log.warning("DAS placement agent: cannot load %s (%s); falling back to first fit", self.path, self.fallback_reason)

    def _smooth(self, topology) -> _das.QuotientSmoother | None:
        hit = self._smoother
        if hit is None or hit[0] is not topology:
            sm = None
            if len(topology) <= self.max_smooth_nodes:
                sm = _das.QuotientSmoother(_das.TopologyKernel(topology, self.lam), self.noise)
            hit = self._smoother = (topology, sm)
        return hit[1]

    def node_scores(self, job: JobView, state: ClusterState, slots: np.ndarray | None = None) -> np.ndarray:
        """The posterior-mean score of every node for ``job`` (``slots``:
        :func:`~rlsched.core.placement.worker_slots`, when the caller has it)."""
        if self.fallback_reason is not None:
            return -np.arange(len(state.total), dtype=float)
        feats, _ = placement_features(job, state, slots)
        a = feats.astype(np.float64) @ self.w + self.b
        sm = self._smooth(state.topology)
        return a if sm is None else sm.apply(a)

    def place(self, job: JobView, state: ClusterState, workers: int | None = None) -> list[int] | None:
        need = job.workers if workers is None else int(workers)
        slots = state.fit_index().slots_if_fit(job, need)
        if slots is None:  # what rack_first_fill would find, without scoring
            return None
        return rack_first_fill(job, state, self.node_scores(job, state, slots), workers, slots)

    def score(self, job: JobView, candidates: Sequence[int], state: ClusterState) -> np.ndarray:
        cand = np.asarray(candidates, dtype=np.int64)
        slots = state.fit_index().slots(job)
        s = self.node_scores(job, state, slots)[cand]
        return np.where(slots[cand] > 0, s, -np.inf)

    def __repr__(self) -> str:
        return f"DASAgentPlacement(model={str(self.path)!r}{', fallback=firstfit' if self.fallback_reason else ''})"


@register_placement("das-agent")
def _make_das_agent_placement(**kwargs) -> DASAgentPlacement:
    return DASAgentPlacement(**kwargs)
