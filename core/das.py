"""DAS placement: a random-walk kernel over the topology graph and a GP over node speed.

The placement agent of DAS (Xing et al., "A Dual-Agent Scheduler for Distributed Deep
Learning Jobs on Public Cloud via Reinforcement Learning", KDD 2023) scores nodes with a
Random Walk Gaussian Process: the kernel ``(I - lambda P)^-1`` over the topology tree,
computed exactly on its quotient graph. :class:`DASPlacement` (placement ``das``) places
gangs greedily, all or nothing. Formulas: docs/design-notes.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from . import nn
from .cluster import ClusterState, JobView
from .nn import PolicyFileError, PolicyFileNotFound
from .placement import worker_slots
from .policy import Placement, register_placement
from .topology import Topology

__all__ = [
    "DASParams",
    "DASPlacement",
    "best_candidate",
    "TIE_TOLERANCE",
    "resolve_placement_model",
    "serving_placement",
    "PLACEMENT_FEATURES",
    "placement_features",
    "TopologyKernel",
    "QuotientSmoother",
    "gp_posterior",
    "random_walk_kernel",
    "symmetric_random_walk_kernel",
]


#: features of the learned linear mean, as the simulator's DAS environment computes them
PLACEMENT_FEATURES = ("feasible", "slots_norm", "pack", "free_frac", "rack_room", "empty")


def placement_features(job: JobView, state: ClusterState, candidates: np.ndarray) -> np.ndarray:
    """``[len(candidates), 6]`` :data:`PLACEMENT_FEATURES` for one more worker of
    ``job``: fits at all, worker slots (GPUs) over the gang's need, GPU fill after
    placing, free fraction, rack room for the gang, node empty."""
    cand = np.asarray(candidates, dtype=np.int64)
    q = job.gpus_per_worker
    slots = worker_slots(job, state)[cand]
    total = np.maximum(state.total[cand], 1).astype(float)
    free = state.free[cand]
    need = max(job.workers * q, 1)
    feasible = slots > 0
    return np.stack(
        [
            feasible.astype(float),
            np.minimum(slots * q, need) / need,
            np.where(feasible, (state.total[cand] - free + q) / total, 0.0),
            free / total,
            np.minimum(state.rack_free[state.rack_of[cand]] / need, 1.0),
            (free == state.total[cand]).astype(float),
        ],
        axis=1,
    )


# --------------------------------------------------------------------------- kernels
def _check_lambda(lam: float) -> float:
    lam = float(lam)
    if not 0.0 < lam < 1.0:
        raise ValueError(f"random-walk decay lambda must be in (0, 1), got {lam}")
    return lam


def _row_normalise(adjacency: np.ndarray) -> np.ndarray:
    a = np.asarray(adjacency, dtype=float)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"adjacency must be a square matrix, got shape {a.shape}")
    if (a < 0).any():
        raise ValueError("adjacency weights must be >= 0")
    deg = a.sum(axis=1)
    if (deg <= 0).any():
        raise ValueError("every vertex needs at least one edge")
    return a / deg[:, None]


def random_walk_kernel(adjacency: np.ndarray, lam: float) -> np.ndarray:
    """``sum_l lam^l P^l = (I - lam P)^-1`` for the row-normalised ``adjacency``.

    Dense and O(n^3): for reference and small graphs. Not symmetric unless all degrees
    are equal; see :func:`symmetric_random_walk_kernel`.
    """
    lam = _check_lambda(lam)
    p = _row_normalise(adjacency)
    return np.linalg.inv(np.eye(len(p)) - lam * p)


def symmetric_random_walk_kernel(adjacency: np.ndarray, lam: float) -> np.ndarray:
    """``D^1/2 (I - lam P)^-1 D^-1/2 = (I - lam D^-1/2 A D^-1/2)^-1``: symmetric and
    positive definite for a symmetric ``adjacency`` (its eigenvalues are
    ``1 / (1 - lam mu)`` with ``|mu| <= 1``). Equal to :func:`random_walk_kernel` on
    every pair of degree-1 vertices."""
    lam = _check_lambda(lam)
    a = np.asarray(adjacency, dtype=float)
    if not np.allclose(a, a.T):
        raise ValueError("adjacency must be symmetric")
    _row_normalise(a)  # validation
    d = 1.0 / np.sqrt(a.sum(axis=1))
    s = a * d[:, None] * d[None, :]
    k = np.linalg.inv(np.eye(len(a)) - lam * s)
    return (k + k.T) / 2.0


def _tree(topology: Topology) -> tuple[list[str], list[int], list[int]]:
    """The inner vertices of the topology tree, each with its parent, and the parent
    vertex of every leaf (node). Returns ``(inner_names, inner_parent, leaf_parent)``;
    the root is inner vertex 0 with parent -1."""
    names = ["/"]
    parent = [-1]
    ids: dict[tuple[str, str], int] = {}

    def vertex(kind: str, key: str, up: int) -> int:
        k = (kind, key)
        if k not in ids:
            ids[k] = len(names)
            names.append(f"{kind}:{key}")
            parent.append(up)
        return ids[k]

    leaf_parent = []
    for n in topology.nodes:
        b = vertex("block", n.block, 0)
        r = vertex("rack", n.rack, b)
        # a multi-node NVLink clique hangs off the rack of its first member
        leaf_parent.append(vertex("clique", n.clique, r) if n.clique else r)
    return names, parent, leaf_parent


def topology_adjacency(topology: Topology) -> tuple[np.ndarray, int]:
    """Adjacency matrix of the full topology tree, leaves (the nodes, in topology
    order) first, then the inner vertices. For tests and small clusters; returns
    ``(A, n_leaves)``."""
    _, parent, leaf_parent = _tree(topology)
    n, m = len(topology), len(parent)
    a = np.zeros((n + m, n + m))
    for i, p in enumerate(leaf_parent):
        a[i, n + p] = a[n + p, i] = 1.0
    for v, p in enumerate(parent):
        if p >= 0:
            a[n + v, n + p] = a[n + p, n + v] = 1.0
    return a, n


class TopologyKernel:
    """The random-walk kernel between the nodes of a topology, exact, in O(classes^3).

    Nodes are grouped by their parent vertex (clique or rack). ``value(i, j)`` is
    ``(I - lam P)^-1`` of the full tree at leaves ``i, j``; :meth:`normalised` gives
    the correlation form ``k(i,j) / sqrt(k(i,i) k(j,j))`` with a unit diagonal.
    """

    def __init__(self, topology: Topology, lam: float) -> None:
        self.lam = _check_lambda(lam)
        self.n = len(topology)
        _, parent, leaf_parent = _tree(topology)
        m = len(parent)
        groups = sorted(set(leaf_parent))
        gid = {v: k for k, v in enumerate(groups)}
        self.group = np.array([gid[p] for p in leaf_parent], dtype=np.int64)
        size = np.bincount(self.group, minlength=len(groups)).astype(float)
        g = len(groups)
        # quotient classes: inner vertices 0..m-1, then leaf groups m..m+g-1
        q = np.zeros((m + g, m + g))
        for v, p in enumerate(parent):
            if p >= 0:
                q[v, p] += 1.0
                q[p, v] += 1.0
        for k, v in enumerate(groups):
            q[m + k, v] = 1.0  # every leaf has its parent as only neighbour
            q[v, m + k] = size[k]  # the parent has size[k] leaves of this group
        q /= q.sum(axis=1, keepdims=True)
        kc = np.linalg.inv(np.eye(m + g) - self.lam * q)
        leaf = kc[m:, m:]  # leaf[g, h] = sum over j in h of k(i, j), i in g
        par = np.array(groups)
        #: k(i, i) per group, from k(i,i) = 1 + lam k(parent, i)
        self.diag = 1.0 + self.lam * kc[par, m + np.arange(g)] / size
        cross = leaf / size[None, :]
        same = np.where(size > 1, (np.diag(leaf) - self.diag) / np.maximum(size - 1, 1), 0.0)
        cross[np.arange(g), np.arange(g)] = same
        cross = (cross + cross.T) / 2.0  # equal up to rounding (leaves have degree 1)
        #: k(i, j) for i in group g, j in group h, i != j
        self.between = cross
        norm = 1.0 / np.sqrt(self.diag)
        self._nbetween = cross * norm[:, None] * norm[None, :]
        logk = np.log(np.clip(self._nbetween, 1e-300, 1.0))
        real = ~np.eye(g, dtype=bool) | np.diag(size > 1)  # pairs of distinct nodes
        floor = float(logk[real].min()) if real.any() else -1.0
        self._close = 1.0 + logk / -floor if floor < 0 else np.ones_like(logk)

    def matrix(self, idx: Sequence[int] | np.ndarray | None = None, normalised: bool = False) -> np.ndarray:
        """Dense kernel between the nodes ``idx`` (all nodes by default)."""
        idx = np.arange(self.n) if idx is None else np.asarray(idx, dtype=np.int64)
        return self.cross(idx, idx, normalised)

    def cross(self, a: np.ndarray, b: np.ndarray, normalised: bool = False) -> np.ndarray:
        """Kernel between node index arrays ``a`` (rows) and ``b`` (columns)."""
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        ga, gb = self.group[a], self.group[b]
        base = self._nbetween if normalised else self.between
        out = base[np.ix_(ga, gb)]
        eq = a[:, None] == b[None, :]
        if eq.any():
            diag = np.ones(len(self.diag)) if normalised else self.diag
            rows, cols = np.nonzero(eq)
            out[rows, cols] = diag[ga[rows]]
        return out

    def closeness(self, placed: Sequence[int], candidates: np.ndarray) -> np.ndarray:
        """Mean closeness of each candidate to the nodes in ``placed``, in [0, 1].

        Closeness is the normalised kernel on a log scale, ``1 + log k~(i,j) / -log
        k~_min`` (``k~_min``: the smallest normalised kernel value of the topology):
        1 on the same node, 0 between the farthest nodes, and evenly spread levels in
        between (raw values shrink geometrically with the rack and block sizes)."""
        placed = np.asarray(placed, dtype=np.int64)
        cand = np.asarray(candidates, dtype=np.int64)
        if len(placed) == 0:
            return np.zeros(len(cand))
        per_group = self._close[:, self.group[placed]].sum(axis=1)
        out = per_group[self.group[cand]]
        # a candidate that already hosts workers: those pairs are "same node" (1), not
        # "same group"
        counts = np.bincount(placed, minlength=self.n)[cand]
        out = out + counts * (1.0 - np.diag(self._close)[self.group[cand]])
        return out / len(placed)


class QuotientSmoother:
    """``S a`` for ``S = K (K + noise I)^-1``, ``K`` the normalised kernel of a
    :class:`TopologyKernel` (the RWGP posterior mean given a noisy observation ``a`` at
    every node), in O(nodes + groups^2) per product instead of O(nodes^2).

    ``K`` is constant on each pair of groups off its diagonal (leaves under one parent
    are interchangeable), so with ``P`` the node-by-group membership matrix,
    ``K = P B P^T + D`` with ``B`` the group-by-group kernel (:attr:`TopologyKernel.between`,
    normalised) and ``D`` diagonal, constant per group (``1 - B[g, g]``). With
    ``E = D + noise I`` and ``C = P^T E^-1 P = diag(size / e)``, Woodbury's identity gives
    ``(K + noise I)^-1 = E^-1 - E^-1 P (I + B C)^-1 B P^T E^-1``, hence
    ``S = I - noise (K + noise I)^-1`` and, per node ``i`` of group ``g``,
    ``(S a)_i = (1 - noise / e_g) a_i + noise / e_g * (M t)_g`` with ``t`` the group sums
    of ``a / e`` and ``M = (I + B C)^-1 B`` (groups x groups, once per topology).
    Equal to the dense :func:`~rlsched.core.das_agent.rwgp_smoother` up to rounding.
    """

    def __init__(self, kernel: TopologyKernel, noise: float) -> None:
        if not noise > 0:
            raise ValueError(f"the smoother needs noise > 0, got {noise}")
        self.kernel = kernel
        self.noise = float(noise)
        group = kernel.group
        self.group = group
        g = len(kernel.diag)
        size = np.bincount(group, minlength=g).astype(float)
        b = kernel._nbetween
        e = 1.0 - np.diag(b) + self.noise
        self._ratio = self.noise / e  # noise / e_g
        self._inv_e = 1.0 / e
        c = size / e
        self._m = np.linalg.solve(np.eye(g) + b * c[None, :], b)
        self._keep_node = (1.0 - self._ratio)[group]
        self._ratio_node = self._ratio[group]
        self._inv_e_node = self._inv_e[group]
        self._g = g

    def apply(self, a: np.ndarray) -> np.ndarray:
        """``S a`` for a vector ``a`` of one value per node."""
        a = np.asarray(a, dtype=float)
        t = np.bincount(self.group, weights=a * self._inv_e_node, minlength=self._g)
        u = self._m @ t
        return self._keep_node * a + self._ratio_node * u[self.group]

    def matrix(self) -> np.ndarray:
        """The dense ``S`` (tests, small clusters)."""
        n = len(self.group)
        p = np.zeros((n, self._g))
        p[np.arange(n), self.group] = 1.0
        return np.diag(self._keep_node) + (self._ratio_node[:, None] * (p @ self._m @ p.T)) * self._inv_e_node[None, :]


# --------------------------------------------------------------------------- GP
def gp_posterior(
    k_oo: np.ndarray,
    k_co: np.ndarray,
    k_cc: np.ndarray,
    y: np.ndarray,
    noise: float,
    mean: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """GP posterior at candidates given noisy observations ``y`` at observed points.

    ``k_oo`` (o x o), ``k_co`` (c x o), ``k_cc`` (c x c full covariance, or a length-c
    vector of prior variances for the diagonal only). Returns ``(mu, cov)`` where
    ``cov`` has the shape of ``k_cc``.
    """
    if noise < 0:
        raise ValueError(f"noise variance must be >= 0, got {noise}")
    k_oo = np.asarray(k_oo, dtype=float)
    k_co = np.asarray(k_co, dtype=float)
    y = np.asarray(y, dtype=float)
    k_cc = np.asarray(k_cc, dtype=float)
    if len(y) == 0:
        return np.full(len(k_cc), float(mean)), k_cc.copy()
    chol = np.linalg.cholesky(k_oo + noise * np.eye(len(y)))
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y - mean))
    mu = mean + k_co @ alpha
    v = np.linalg.solve(chol, k_co.T)  # o x c
    if k_cc.ndim == 1:
        cov = k_cc - np.einsum("ij,ij->j", v, v)
    else:
        cov = k_cc - v.T @ v
    return mu, cov


#: scores closer than this (relative to the best, and at least this much) are one score.
#: The kernel's and the GP posterior's linear algebra leave differences of ~1e-16 between
#: nodes that are equal in exact arithmetic (interchangeable nodes of one rack), and those
#: differences change with the numpy/BLAS build; real differences between candidates are
#: many orders larger (1e-3 and up on the synthetic and measured clusters).
TIE_TOLERANCE = 1e-9


def best_candidate(scores: np.ndarray) -> int:
    """Index of the best score, the first (lowest index) of those within
    :data:`TIE_TOLERANCE` of it, so that a placement does not depend on how a
    numpy/BLAS build rounds; ``argmax`` where no score is finite."""
    best = int(np.argmax(scores))
    top = float(scores[best])
    if not math.isfinite(top):
        return best
    return int(np.flatnonzero(scores >= top - TIE_TOLERANCE * max(1.0, abs(top)))[0])


# --------------------------------------------------------------------------- params
@dataclass(frozen=True)
class DASParams:
    """Parameters of :class:`DASPlacement`; these defaults are used without a model.

    - ``lam``: random-walk decay lambda in (0, 1); larger lets walks reach further.
    - ``noise``: GP observation noise variance sigma^2 (performance units squared).
    - ``signal``: GP prior variance of node performance.
    - ``prior_mean``: prior node performance (1.0 = nominal speed).
    - ``kappa``: UCB bonus on the posterior standard deviation (0 = mean only).
    - ``w_compact``: weight of the closeness to the job's placed workers
      (:meth:`TopologyKernel.closeness`: 1 same node ... 0 farthest).
    - ``w_room``: weight of "this node's rack can hold the rest of the gang".
    - ``w_perf``: weight of the standardised GP score ``(mu + kappa sd - m)/sqrt(signal)``.
    - ``w_pack``: weight of the node's GPU fill after placing (bin packing).
    - ``max_observations``: most recent observations kept for the GP.
    - ``mean_weights``/``mean_bias``: a learned linear score over
      :data:`PLACEMENT_FEATURES` (from a trained DAS policy file); when set it replaces
      the ``room`` and ``pack`` terms, min-max scaled over the request's feasible
      candidates and weighted by ``w_learned``.
    """

    lam: float = 0.9
    noise: float = 0.01
    signal: float = 0.04
    prior_mean: float = 1.0
    kappa: float = 0.0
    w_compact: float = 4.0
    w_room: float = 1.0
    w_perf: float = 1.0
    w_pack: float = 0.25
    max_observations: int = 256
    w_learned: float = 1.0
    mean_weights: tuple[float, ...] | None = None
    mean_bias: float = 0.0
    version: str = "default"

    def __post_init__(self) -> None:
        _check_lambda(self.lam)
        for name in ("noise", "signal", "kappa", "w_compact", "w_room", "w_perf", "w_pack", "w_learned"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"DAS parameter {name} must be a finite number >= 0, got {v!r}")
        if self.signal <= 0:
            raise ValueError("DAS parameter signal must be > 0")
        if not math.isfinite(self.prior_mean):
            raise ValueError("DAS parameter prior_mean must be finite")
        if int(self.max_observations) < 1:
            raise ValueError("DAS parameter max_observations must be >= 1")
        if self.mean_weights is not None:
            w = np.asarray(self.mean_weights, dtype=float)
            if w.shape != (len(PLACEMENT_FEATURES),) or not np.isfinite(w).all() or not math.isfinite(self.mean_bias):
                raise ValueError(
                    f"DAS mean_weights must be {len(PLACEMENT_FEATURES)} finite numbers "
                    f"({', '.join(PLACEMENT_FEATURES)}), got shape {w.shape}"
                )

    FIELDS = ("lam", "noise", "signal", "prior_mean", "kappa", "w_compact", "w_room", "w_perf", "w_pack", "w_learned")

    @classmethod
    def from_mapping(cls, values: dict, version: str = "unversioned") -> "DASParams":
        unknown = set(values) - set(cls.FIELDS) - {"max_observations"}
        if unknown:
            raise PolicyFileError(f"unknown DAS parameters {sorted(unknown)}")
        kw = {}
        for k, v in values.items():
            if isinstance(v, (bool, str)) or v is None:
                raise PolicyFileError(f"DAS parameter {k} must be a number, got {v!r:.40}")
            arr = np.asarray(v, dtype=float).reshape(-1)
            if arr.size != 1:
                raise PolicyFileError(f"DAS parameter {k} must be a scalar, got shape {np.shape(v)}")
            kw[k] = int(arr[0]) if k == "max_observations" else float(arr[0])
        try:
            return cls(**kw, version=str(version))
        except ValueError as exc:
            raise PolicyFileError(str(exc)) from exc

    @classmethod
    def load(cls, path: str | Path) -> "DASParams":
        """Read parameters from a model file (raises :class:`~rlsched.core.nn.PolicyFileError`).

        ``*.json``: ``{"policy": "das", "version": "...", "params": {name: value}}``.
        ``*.safetensors``: one scalar tensor per parameter name (``lam``, ``noise``,
        ``signal``, ``prior_mean``, ``kappa``, ``w_compact``, ``w_room``, ``w_perf``,
        ``w_pack``); version from the header metadata ``version`` or a sidecar
        ``<same name>.json`` (the metadata document), if any.
        """
        p = Path(path)
        if not p.is_file():
            raise PolicyFileNotFound(f"model file {p} does not exist")
        try:
            side = p.with_suffix(".json")
            if p.suffix == ".safetensors" and side.is_file():
                sdoc = json.loads(side.read_text())
                if isinstance(sdoc, dict) and sdoc.get("format") == nn.FORMAT:
                    return cls._from_policy_file(p)
            if p.suffix == ".json":
                doc = json.loads(p.read_text())
                if not isinstance(doc, dict) or not isinstance(doc.get("params"), dict):
                    raise PolicyFileError(f"{p}: expected an object with a 'params' object")
                if doc.get("policy", "das") != "das":
                    raise PolicyFileError(f"{p}: model is for policy {doc.get('policy')!r}, not 'das'")
                return cls.from_mapping(doc["params"], doc.get("version", "unversioned"))
            from safetensors import safe_open

            with safe_open(str(p), framework="numpy") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            side = p.with_suffix(".json")
            if side.is_file():
                sdoc = json.loads(side.read_text())
                if isinstance(sdoc, dict):
                    meta = {**{k: str(v) for k, v in sdoc.items()}, **meta}
            if meta.get("policy", "das") != "das":
                raise PolicyFileError(f"{p}: model is for policy {meta.get('policy')!r}, not 'das'")
            return cls.from_mapping(tensors, meta.get("version", "unversioned"))
        except PolicyFileError:
            raise
        except Exception as exc:  # any parse failure of a corrupt file is a PolicyFileError
            raise PolicyFileError(f"{p}: cannot read DAS model: {type(exc).__name__}: {exc}") from exc

    @classmethod
    def _from_policy_file(cls, path: Path) -> "DASParams":
        """A trained DAS policy file (:mod:`rlsched.core.nn` format, policy ``das``):
        ``lam`` from ``architecture.lam``, the learned linear mean from the tensors
        ``placement.score.weight`` / ``placement.score.bias``, any ``placement.<param>``
        scalar overriding a default."""
        try:
            weights, meta = nn.load_policy_file(path, policy="das")
        except PolicyFileError as exc:
            raise PolicyFileError(f"{path}: cannot read DAS model: {type(exc).__name__}: {exc}") from exc
        feats = (meta.get("observation") or {}).get("placement_features")
        if feats is not None and tuple(feats) != PLACEMENT_FEATURES:
            raise PolicyFileError(f"{path}: placement features {feats} differ from {list(PLACEMENT_FEATURES)}")
        values: dict = {}
        lam = (meta.get("architecture") or {}).get("lam")
        if lam is not None:
            values["lam"] = lam
        for k, v in weights.items():
            if k.startswith("placement.") and k[len("placement."):] in cls.FIELDS:
                values[k[len("placement."):]] = v
        base = cls.from_mapping(values, str(meta.get("version", "unversioned")))
        w = weights.get("placement.score.weight")
        if w is None:
            return base
        b = weights.get("placement.score.bias", np.zeros(1))
        try:
            return dataclasses.replace(
                base,
                mean_weights=tuple(float(x) for x in np.asarray(w, dtype=float).reshape(-1)),
                mean_bias=float(np.asarray(b, dtype=float).reshape(-1)[0]),
            )
        except ValueError as exc:
            raise PolicyFileError(f"{path}: {exc}") from exc


#: The committed trained DAS policy (placement parameters: λ and the learned linear
#: mean); the extender serves it by default.
DEFAULT_MODEL = Path(__file__).resolve().parent / "weights" / "das.safetensors"


# --------------------------------------------------------------------------- policy
class DASPlacement(Placement):
    """RWGP placement scoring (see the module docstring); placement name ``das``.

    ``model``: optional model-file path. When it cannot be read the documented
    defaults are used and :attr:`fallback` holds the reason (``None`` otherwise), so
    a caller can log and count it. Node observations are fed with :meth:`observe`.
    """

    name = "das"

    def __init__(
        self,
        params: DASParams | None = None,
        model: str | Path | None = None,
        *,
        rng: np.random.Generator | None = None,
    ) -> None:
        # Scoring is deterministic (the GP posterior mean); ``rng`` is accepted so
        # every registered placement is built the same way (make_placement(name, rng=...)).
        self.rng = rng
        self.fallback_reason: str | None = None
        if params is None and model is not None:
            try:
                params = DASParams.load(model)
            except PolicyFileError as exc:
                self.fallback_reason = str(exc)
        self.params = params or DASParams()
        self._obs: deque[tuple[str, float]] = deque(maxlen=int(self.params.max_observations))
        self._obs_version = 0
        self._kernel: tuple[int, Topology, TopologyKernel] | None = None
        self._posterior: tuple | None = None

    # ---------------------------------------------------------------- observations
    def observe(self, node: str, performance: float) -> None:
        """Record one measured performance of ``node`` (by name; 1.0 = nominal)."""
        v = float(performance)
        if not math.isfinite(v):
            raise ValueError(f"performance must be finite, got {performance!r}")
        self._obs.append((str(node), v))
        self._obs_version += 1

    @property
    def observations(self) -> list[tuple[str, float]]:
        return list(self._obs)

    @property
    def model_version(self) -> str:
        return self.params.version

    # ---------------------------------------------------------------- caches
    def kernel(self, topology: Topology) -> TopologyKernel:
        """The kernel of ``topology``, computed once per topology object."""
        cached = self._kernel
        if cached is None or cached[1] is not topology:
            cached = (id(topology), topology, TopologyKernel(topology, self.params.lam))
            self._kernel = cached
        return cached[2]

    def posterior(self, topology: Topology) -> tuple[np.ndarray, np.ndarray]:
        """GP posterior mean and variance of every node's performance (cached)."""
        key = (id(topology), self._obs_version)
        if self._posterior is not None and self._posterior[0] == key and self._posterior[1] is topology:
            return self._posterior[2], self._posterior[3]
        p = self.params
        n = len(topology)
        idx = [(topology.index[name], y) for name, y in self._obs if name in topology.index]
        if not idx:
            mu, var = np.full(n, p.prior_mean), np.full(n, p.signal)
        else:
            kern = self.kernel(topology)
            o = np.array([i for i, _ in idx], dtype=np.int64)
            y = np.array([v for _, v in idx])
            k_oo = p.signal * kern.matrix(o, normalised=True)
            k_no = p.signal * kern.cross(np.arange(n), o, normalised=True)
            mu, var = gp_posterior(k_oo, k_no, np.full(n, p.signal), y, p.noise, p.prior_mean)
            var = np.maximum(var, 0.0)
        self._posterior = (key, topology, mu, var)
        return mu, var

    # ---------------------------------------------------------------- scoring
    def components(self, job: JobView, candidates: Sequence[int], state: ClusterState) -> dict[str, np.ndarray]:
        """The unweighted score terms per candidate, plus ``feasible`` (bool)."""
        p = self.params
        cand = np.asarray(candidates, dtype=np.int64)
        q = job.gpus_per_worker
        free = state.free[cand]
        total = state.total[cand]
        feasible = free >= q
        if job.gpu_models is not None:
            allowed = np.array([state.topology.nodes[i].gpu_model in job.gpu_models for i in cand], dtype=bool)
            feasible &= allowed
        kern = self.kernel(state.topology)
        compact = kern.closeness(job.placement, cand)
        remaining = max(job.workers - len(job.placement), 1) * q
        room = np.minimum(state.rack_free[state.rack_of[cand]] / remaining, 1.0)
        mu, var = self.posterior(state.topology)
        perf = (mu[cand] + p.kappa * np.sqrt(var[cand]) - p.prior_mean) / math.sqrt(p.signal)
        pack = np.where(total > 0, (total - free + q) / np.maximum(total, 1), 0.0)
        out = {"feasible": feasible, "compact": compact, "room": room, "perf": perf, "pack": pack}
        if p.mean_weights is not None:
            raw = placement_features(job, state, cand) @ np.asarray(p.mean_weights) + p.mean_bias
            ok = feasible & np.isfinite(raw)
            lo, hi = (raw[ok].min(), raw[ok].max()) if ok.any() else (0.0, 0.0)
            out["learned"] = np.where(ok, (raw - lo) / (hi - lo), 0.0) if hi - lo > 1e-12 else np.where(ok, 1.0, 0.0)
        return out

    def combine(self, comp: dict[str, np.ndarray]) -> np.ndarray:
        p = self.params
        s = p.w_compact * comp["compact"] + p.w_perf * comp["perf"]
        if "learned" in comp:
            s = s + p.w_learned * comp["learned"]
        else:
            s = s + p.w_room * comp["room"] + p.w_pack * comp["pack"]
        return np.where(comp["feasible"], s, -np.inf)

    def score(self, job: JobView, candidates: Sequence[int], state: ClusterState) -> np.ndarray:
        return self.combine(self.components(job, candidates, state))

    def score_terms(
        self, job: JobView, candidates: Sequence[int], state: ClusterState
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        comp = self.components(job, candidates, state)
        return self.combine(comp), comp

    def parameters(self) -> dict:
        return dict(vars(self.params))

    def place(self, job: JobView, state: ClusterState, workers: int | None = None) -> list[int] | None:
        """Greedy gang placement by :meth:`score`; all ``workers`` or ``None``.

        Allocates tentatively while it decides and releases before returning."""
        need = job.workers if workers is None else int(workers)
        if need <= 0:
            return []
        q = job.gpus_per_worker
        view = dataclasses.replace(job, placement=list(job.placement))
        chosen: list[int] = []
        try:
            for _ in range(need):
                cand = state.candidates(q, job.gpu_models)
                if len(cand) == 0:
                    return None
                s = self.score(view, cand, state)
                best = best_candidate(s)
                if not np.isfinite(s[best]):
                    return None
                node = int(cand[best])
                state.allocate(node, q)
                chosen.append(node)
                view.placement.append(node)
            return chosen
        finally:
            for node in chosen:
                state.release(node, q)


@register_placement("das")
def _make_das(**kwargs) -> DASPlacement:
    return DASPlacement(**kwargs)


#: served placements that read a model file (both from the committed DAS weights)
MODEL_PLACEMENTS = ("das", "das-agent")


def resolve_placement_model(policy: str, model: str | Path | None) -> str | None:
    """The weights a served placement reads: ``model`` as given (``"none"``: no file),
    the committed trained DAS weights when ``das`` runs without one, nothing for a
    heuristic. The extender (which places) and the operator (whose admission plans with
    the same placement) both resolve it here."""
    if model is not None:
        return None if str(model).lower() == "none" else str(model)
    return str(DEFAULT_MODEL) if policy.lower() in MODEL_PLACEMENTS else None


def serving_placement(policy: str, model: str | Path | None = None) -> Placement:
    """The placement policy ``policy`` as served, with ``model`` (see
    :func:`resolve_placement_model`) for DAS. A DAS model that cannot be read leaves DAS
    on its documented default parameters (``fallback_reason`` says why); a model for a
    heuristic is an error."""
    name = policy.lower()
    if name == "das":
        return DASPlacement(model=model)
    from .policy import make_placement

    if name in MODEL_PLACEMENTS:
        return make_placement(name, model=model)
    if model is not None:
        raise ValueError(f"a model file applies to placements {', '.join(MODEL_PLACEMENTS)}, not {policy!r}")
    return make_placement(name)
