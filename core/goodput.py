"""Goodput: what GPUs are worth to a job, modelled from what the job itself reports.

The job model of Pollux (Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for
Goodput-Optimized Deep Learning", OSDI 2021, §3): a throughput model fitted to the step
times a job reported, its statistical efficiency from its gradient noise scale, and
goodput, their product, maximised over batch sizes. Non-clairvoyant; pure numpy.
Formulas and where this differs from the paper: docs/design-notes.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from . import batch_lsq
from .batch import BatchBounds

__all__ = [
    "ThroughputParams",
    "ThroughputPrior",
    "ThroughputModel",
    "EfficiencyModel",
    "BatchChoice",
    "GoodputModel",
    "FitProblem",
    "fit_many",
    "optimize_many",
    "ShapeRecord",
    "JobObservations",
    "PROGRESS_FIELDS",
]

#: the throughput fit's stopping tolerances (:func:`rlsched.core.batch_lsq.minimize`):
#: tight, since every fit of a decision runs in one batch (a further iteration costs the
#: batch one array pass, not a Python call per job)
_FIT_XTOL, _FIT_FTOL, _FIT_GTOL, _FIT_MAX_ITER = 1e-10, 1e-12, 1e-10, 200

#: γ is kept in [1, 10]: 10 is already max(T_grad, T_sync) within 7% (2^(1/10)).
GAMMA_RANGE = (1.0, 10.0)


# ------------------------------------------------------------------------ throughput
@dataclass(frozen=True, slots=True)
class ThroughputParams:
    """The seven parameters of Pollux's throughput model (§3.2), in seconds
    (``beta_grad`` in seconds per sample; the sync ``beta``s per replica beyond 2)."""

    alpha_grad: float
    beta_grad: float
    alpha_local: float
    beta_local: float
    alpha_node: float
    beta_node: float
    gamma: float

    def __post_init__(self) -> None:
        values = (self.alpha_grad, self.beta_grad, self.alpha_local, self.beta_local,
                  self.alpha_node, self.beta_node)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError(f"throughput parameters must be finite and >= 0, got {values}")
        if self.alpha_grad + self.beta_grad <= 0:
            raise ValueError("alpha_grad + beta_grad must be > 0 (a step takes time)")
        if not GAMMA_RANGE[0] <= self.gamma <= GAMMA_RANGE[1]:
            raise ValueError(f"gamma must lie in {GAMMA_RANGE}, got {self.gamma}")

    def astuple(self) -> tuple[float, ...]:
        return (self.alpha_grad, self.beta_grad, self.alpha_local, self.beta_local,
                self.alpha_node, self.beta_node, self.gamma)


def _iteration_time(p: tuple, K, N, m, s):
    """T_iter of the module docstring, vectorised over broadcastable K, N, m, s."""
    ag, bg, al, bl, an, bn, g = p
    tg = ag + bg * m
    ts = np.where(K <= 1, 0.0, np.where(N <= 1, al + bl * (K - 2), an + bn * (K - 2)))
    # (tg^γ + ts^γ)^(1/γ) as big·(1 + (small/big)^γ)^(1/γ): no overflow at γ = 10
    big, small = np.maximum(tg, ts), np.minimum(tg, ts)
    ratio = np.divide(small, big, out=np.zeros(np.shape(big)), where=big > 0)
    return s * tg + big * (1.0 + ratio ** g) ** (1.0 / g)


@dataclass(frozen=True, slots=True)
class ThroughputPrior:
    """What the throughput model assumes before (and besides) the job's own data.

    The prior is stated relative to ``C``, the compute time of one micro-batch at the
    reference per-GPU batch ``m_ref`` (the job's initial batch, clipped to its per-GPU
    bounds), so it holds for a model of any speed:

    * ``overhead_fraction``: ``α_grad / C`` (0.2: a fifth of a step is fixed overhead —
      kernel launches, optimizer step, input pipeline — and the rest scales with ``m``);
    * ``local_sync``: ``(α_sync^local, β_sync^local) / C`` = (0.1, 0.01): an all-reduce
      within a node (NVLink/PCIe) costs about a tenth of a step, +1% per extra replica;
    * ``node_sync``: ``(α_sync^node, β_sync^node) / C`` = (0.5, 0.05): across nodes
      (Ethernet/InfiniBand) about half a step, +5% per extra replica;
    * ``gamma``: 1.5, partial overlap (PyTorch DDP all-reduces buckets during backward);
    * ``step_time``: ``C`` in seconds while the job has reported nothing (1 s: with no
      data only ratios — speedups, the best batch — mean anything).

    These defaults are engineering guesses, deliberately neither Pollux's optimistic
    exploration prior (all synchronisation free until observed, §4.1 "prior-driven
    exploration"; :meth:`optimistic`) nor pessimistic: a wrong guess costs restarts.

    The fit minimises ``Σ_shapes ((log T̂ − log T)/step_time_noise)²`` plus
    ``((x − x̂)/σ)²`` for each parameter in its fitted coordinates: the logarithms of
    ``C`` (σ = 10, practically free) and of the four sync ratios (σ = ``spread``), the
    logit of the overhead fraction (σ = ``spread``) and γ itself (σ = ``gamma_spread``).
    A parameter the observations do not determine (the sync terms of a job seen only
    on one GPU) thus stays at the prior, and one they do is set by the data: with
    ``step_time_noise`` = 0.1 a single placement shape weighs like a prior σ of 10%."""

    overhead_fraction: float = 0.2
    local_sync: tuple[float, float] = (0.1, 0.01)
    node_sync: tuple[float, float] = (0.5, 0.05)
    gamma: float = 1.5
    step_time: float = 1.0
    spread: float = 1.5
    gamma_spread: float = 1.0
    step_time_noise: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 < self.overhead_fraction < 1.0:
            raise ValueError(f"overhead_fraction must lie in (0, 1), got {self.overhead_fraction}")
        ratios = (*self.local_sync, *self.node_sync)
        if len(ratios) != 4 or not all(math.isfinite(r) and r >= 0 for r in ratios):
            raise ValueError(f"sync ratios must be pairs of finite numbers >= 0, got {ratios}")
        if not GAMMA_RANGE[0] <= self.gamma <= GAMMA_RANGE[1]:
            raise ValueError(f"gamma must lie in {GAMMA_RANGE}, got {self.gamma}")
        for name in ("step_time", "spread", "gamma_spread", "step_time_noise"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be finite and > 0, got {v}")

    @classmethod
    def optimistic(cls) -> "ThroughputPrior":
        """Pollux's exploration prior (§4.1): synchronisation free (ratios at the fit's
        lower bound, 1e-6) until the job has been observed on the placements that
        reveal it — optimistic, so the scheduler tries larger allocations."""
        return cls(local_sync=(0.0, 0.0), node_sync=(0.0, 0.0))


# fitted coordinates: x = (log C, logit f, log a_l, log b_l, log a_n, log b_n, γ)
_RATIO_FLOOR = 1e-6
_X_LOWER = np.array([math.log(1e-7), math.log(1e-4 / (1 - 1e-4)), *[math.log(_RATIO_FLOOR)] * 4, GAMMA_RANGE[0]])
_X_UPPER = np.array([math.log(1e5), math.log((1 - 1e-4) / 1e-4), *[math.log(1e3)] * 4, GAMMA_RANGE[1]])
_GAMMA_STARTS = (1.0, 4.0)  # extra deterministic starts once γ matters: T_iter is not convex in γ


@functools.lru_cache(maxsize=64)
def _prior_x(prior: ThroughputPrior) -> tuple[np.ndarray, np.ndarray]:
    """The prior's mean and sd in fitted coordinates (read-only: shared by every fit)."""
    f = prior.overhead_fraction
    ratios = np.maximum([*prior.local_sync, *prior.node_sync], _RATIO_FLOOR)
    mean = np.array([math.log(prior.step_time), math.log(f / (1 - f)), *np.log(ratios), prior.gamma])
    sd = np.array([10.0, prior.spread, *[prior.spread] * 4, prior.gamma_spread])
    mean = np.clip(mean, _X_LOWER, _X_UPPER)
    mean.setflags(write=False)
    sd.setflags(write=False)
    return mean, sd


class FitProblem(NamedTuple):
    """One throughput fit (:func:`fit_many`): ``(K, N, m, s, step_seconds)``
    ``observations`` (one per placement shape), the ``prior`` and the per-GPU
    ``reference_batch`` its ``C`` refers to, and optionally ``compute``: ``(m,
    compute_seconds)`` rows, measured ``T_grad(m)`` fitted beside the step times (one more
    residual each, same noise; ``pollux-paper``'s rule A3)."""

    observations: tuple
    prior: "ThroughputPrior"
    reference_batch: float
    compute: tuple = ()


class _FitData(NamedTuple):
    """A batch of :func:`fit_many` as :func:`_fit_residuals` reads it, one row per
    problem and start, observations padded with weight 0: per observation ``obs`` (``K −
    2``, ``s``, ``u = m/m_ref``, ``1 − u``, ``log T``, weight over noise) and ``masks``
    (``K ≥ 2``, ``N ≤ 1``, both, ``K ≥ 2`` on several nodes, a compute row); per row
    ``prior`` (the prior's mean and sd) and ``prior_jac`` (its residuals' Jacobian,
    ``diag(1/sd)``); ``compute``: whether any row is a compute row."""

    obs: np.ndarray
    masks: np.ndarray
    prior: np.ndarray
    prior_jac: np.ndarray
    compute: bool

    @classmethod
    def of(cls, K, N, s, u, log_t, compute, weight, mean, sd, noise) -> "_FitData":
        """From per observation ``K``, ``N``, ``s``, ``u``, ``log T``, ``compute`` (a
        compute row) and ``weight`` (``b × rows``), per row ``mean``, ``sd`` (``b × 7``)
        and ``noise`` (``b``)."""
        multi, local = K >= 2, N <= 1
        return cls(np.stack([K - 2, s, u, 1 - u, log_t, weight / noise[:, None]]),
                   np.stack([multi, local, multi & local, multi & ~local, compute]), np.stack([mean, sd]),
                   np.eye(7) / sd[:, None, :], bool(np.any(compute)))

    def take(self, rows: np.ndarray) -> "_FitData":
        """The batch's ``rows`` (increasing, as :func:`batch_lsq.minimize` asks them)."""
        if rows.size == self.prior_jac.shape[0]:
            return self
        return _FitData(self.obs[:, rows], self.masks[:, rows], self.prior[:, rows], self.prior_jac[rows],
                        self.compute)


def _fit_residuals(x: np.ndarray, d: _FitData) -> tuple[np.ndarray, np.ndarray]:
    """Residuals of :func:`fit_many`'s objective and their Jacobian d r / d x,
    analytically (the chain rule through T_iter = s·T_grad + O, O = B·(1 + r^γ)^(1/γ),
    B = max(T_grad, T_sync), r = min/max), for a batch of problems: ``x`` is ``b × 7``
    and ``d`` has the batch's rows."""
    c = np.exp(x[:, 0])[:, None]
    f = (1.0 / (1.0 + np.exp(-x[:, 1])))[:, None]
    al, bl, an, bn = (np.exp(x[:, i])[:, None] for i in (2, 3, 4, 5))
    g = x[:, 6][:, None]
    K2, s, u, one_u, log_t, scale = d.obs
    multi, local, on_local, on_node, comp = d.masks
    tg = c * (f + (1 - f) * u)
    ts = np.where(multi, c * np.where(local, al + bl * K2, an + bn * K2), 0.0)
    big, small = np.maximum(tg, ts), np.minimum(tg, ts)
    r = small / big
    rg = r ** g
    o = big * (1.0 + rg) ** (1.0 / g)
    t = s * tg + o
    d_tg = s + (tg / o) ** (g - 1.0)                       # dT/dT_grad
    d_ts = np.where(multi, (ts / o) ** (g - 1.0), 0.0)     # dT/dT_sync
    log_r = np.log(np.where(r > 0, r, 1.0))
    d_g = o * (-np.log1p(rg) / g ** 2 + rg * log_r / (g * (1.0 + rg)))
    pred = np.where(comp, tg, t) if d.compute else t
    rows = t.shape[1]
    res = np.empty((x.shape[0], rows + 7))
    res[:, :rows] = scale * (np.log(pred) - log_t)
    res[:, rows:] = (x - d.prior[0]) / d.prior[1]
    jac = np.empty((x.shape[0], rows + 7, 7))
    st = np.where(comp, 0.0, scale / t) if d.compute else scale / t   # d log T / dT, weighted
    dtg_x1 = c * one_u * f * (1 - f)
    if d.compute:
        jac[:, :rows, 0] = np.where(comp, scale, st * (d_tg * tg + d_ts * ts))  # C scales every time
        jac[:, :rows, 1] = np.where(comp, scale * dtg_x1 / tg, st * d_tg * dtg_x1)
    else:
        jac[:, :rows, 0] = st * (d_tg * tg + d_ts * ts)
        jac[:, :rows, 1] = st * d_tg * dtg_x1
    sync = st * d_ts
    jac[:, :rows, 2] = sync * np.where(on_local, c * al, 0.0)
    jac[:, :rows, 3] = sync * np.where(on_local, c * bl * K2, 0.0)
    jac[:, :rows, 4] = sync * np.where(on_node, c * an, 0.0)
    jac[:, :rows, 5] = sync * np.where(on_node, c * bn * K2, 0.0)
    jac[:, :rows, 6] = st * d_g
    jac[:, rows:, :] = d.prior_jac
    return res, jac


def _params_of(x: np.ndarray, m_ref: float) -> tuple:
    c = math.exp(x[0])
    f = 1.0 / (1.0 + math.exp(-x[1]))
    return (f * c, (1 - f) * c / m_ref, c * math.exp(x[2]), c * math.exp(x[3]),
            c * math.exp(x[4]), c * math.exp(x[5]), float(x[6]))


class ThroughputModel:
    """Seconds per step and samples per second of a job (§3.2; module docstring).

    Every method takes numbers or broadcastable arrays and answers in kind."""

    __slots__ = ("params", "_p")

    def __init__(self, params: ThroughputParams) -> None:
        self.params = params
        self._p = params.astuple()

    def __repr__(self) -> str:
        return f"ThroughputModel({self.params!r})"

    def grad_time(self, m):
        """``T_grad(m)``: one micro-batch of ``m`` samples on one GPU."""
        return _scalar_or(self.params.alpha_grad + self.params.beta_grad * np.asarray(m, dtype=float))

    def sync_time(self, K, N):
        """``T_sync(K, N)``: gradient synchronisation over ``K`` replicas on ``N`` nodes."""
        p, K, N = self.params, np.asarray(K), np.asarray(N)
        return _scalar_or(np.where(K <= 1, 0.0, np.where(N <= 1, p.alpha_local + p.beta_local * (K - 2),
                                                         p.alpha_node + p.beta_node * (K - 2))))

    def iteration_time(self, K, N, m, s=0):
        """``T_iter``: seconds per optimizer step with ``K`` replicas on ``N`` nodes,
        ``m`` samples per micro-batch and ``s`` accumulation steps."""
        K, N = _check_placement(K, N)
        return _scalar_or(_iteration_time(self._p, K, N, np.asarray(m, dtype=float), np.asarray(s, dtype=float)))

    def throughput(self, K, N, m, s=0):
        """``THROUGHPUT = K·m·(s+1) / T_iter``, samples per second."""
        t = self.iteration_time(K, N, m, s)
        return _scalar_or(np.asarray(K) * np.asarray(m, dtype=float) * (np.asarray(s) + 1) / t)

    # ------------------------------------------------------------------ fitting
    @classmethod
    def from_prior(cls, prior: ThroughputPrior | None = None, reference_batch: float = 1.0) -> "ThroughputModel":
        """The prior's model (no observations): ``C = prior.step_time`` at the per-GPU
        ``reference_batch``."""
        prior = prior or ThroughputPrior()
        mean, _ = _prior_x(prior)
        return cls(ThroughputParams(*_params_of(mean, float(reference_batch))))

    @classmethod
    def fit(cls, observations: Iterable[tuple[float, float, float, float, float]],
            prior: ThroughputPrior | None = None, reference_batch: float | None = None) -> "ThroughputModel":
        """Fit to ``(K, N, m, s, step_seconds)`` observations (one per placement shape:
        average repeated reports first, :class:`JobObservations` does).

        :func:`fit_many` with this one problem (its docstring says how). ``reference_batch``: the
        per-GPU batch the prior's ``C`` refers to (default: the geometric mean of the
        observed ``m``; :meth:`JobObservations.model` passes the job's initial batch,
        :attr:`BatchBounds.reference_local_batch`)."""
        return fit_many([FitProblem(tuple(observations), prior or ThroughputPrior(), reference_batch)])[0]


def _problem_arrays(problem: FitProblem) -> tuple[np.ndarray, np.ndarray, float]:
    """A problem's observations and compute rows as arrays, checked, and its reference
    batch (default: the geometric mean of the observed ``m``)."""
    obs = np.array(problem.observations, dtype=float).reshape(-1, 5)
    comp = np.array([tuple(map(float, c)) for c in problem.compute], dtype=float).reshape(-1, 2)
    K, N, m, s, t = obs.T
    if obs.size:
        _check_placement(K, N)
        if not (np.all(np.isfinite(obs)) and np.all(m > 0) and np.all(s >= 0) and np.all(t > 0)):
            raise ValueError("observations need finite m > 0, s >= 0 and step time > 0")
    if comp.size and not (np.all(np.isfinite(comp)) and np.all(comp > 0)):
        raise ValueError("compute observations need finite m > 0 and seconds > 0")
    ref = problem.reference_batch
    if ref is None:
        ref = float(np.exp(np.mean(np.log(m)))) if obs.size else 1.0
    if not ref > 0:
        raise ValueError(f"reference_batch must be > 0, got {ref}")
    return obs, comp, float(ref)


def fit_many(problems: Iterable[FitProblem]) -> list["ThroughputModel"]:
    """Fit every problem's throughput model (:meth:`ThroughputModel.fit`), all at once.

    Bounded least squares (:func:`rlsched.core.batch_lsq.minimize`, Levenberg–Marquardt
    with active bounds, analytic Jacobian, one batch for every problem and start) on
    ``log T_iter`` plus the prior's regulariser (:class:`ThroughputPrior`). Each problem
    is started from its prior's mean with ``C`` matched to its data and, once some
    observation has ``K >= 2`` (before, γ does not enter), also from that point with γ =
    1 and γ = 4; the lowest cost wins (the objective is not convex in γ; ties: the
    first start). A problem without observations is its prior's model. Deterministic;
    a problem fitted in a batch agrees with the same problem fitted alone to rounding
    (:mod:`rlsched.core.batch_lsq`)."""
    problems = list(problems)
    out: list[ThroughputModel | None] = [None] * len(problems)
    starts, owner, rows = [], [], []
    span = _X_UPPER - _X_LOWER
    for i, pb in enumerate(problems):
        obs, comp, ref = _problem_arrays(pb)
        mean, sd = _prior_x(pb.prior)
        if not obs.size and not comp.size:
            out[i] = ThroughputModel(ThroughputParams(*_params_of(mean, ref)))
            continue
        K, N, m, s, t = obs.T
        start = mean.copy()
        if obs.size:
            unit = _iteration_time(_params_of(np.r_[0.0, mean[1:]], ref), K, N, m, s)
            start[0] = float(np.mean(np.log(t) - np.log(unit)))  # C matched to the data
        n = obs.shape[0] + comp.shape[0]
        data = np.ones((n, 7))  # K, N, m, s, log t, compute?, weight
        data[:, 4] = 0.0
        data[:, 6] = 1.0
        data[:obs.shape[0], :4] = obs[:, :4]
        data[:obs.shape[0], 4] = np.log(t)
        data[:obs.shape[0], 5] = 0.0
        if comp.size:
            data[obs.shape[0]:, 0:2] = 1.0
            data[obs.shape[0]:, 2] = comp[:, 0]
            data[obs.shape[0]:, 3] = 0.0
            data[obs.shape[0]:, 4] = np.log(comp[:, 1])
            data[obs.shape[0]:, 5] = 1.0
        for gamma in (mean[6], *(_GAMMA_STARTS if np.any(K >= 2) else ())):
            x0 = start.copy()
            x0[6] = gamma
            starts.append(np.clip(x0, _X_LOWER + 1e-6 * span, _X_UPPER - 1e-6 * span))
            owner.append(i)
            rows.append((data, mean, sd, ref, pb.prior.step_time_noise))
    if not starts:
        return out  # type: ignore[return-value]
    width = max(r[0].shape[0] for r in rows)
    B = len(starts)
    pad = np.zeros((B, width, 7))
    pad[:, :, 0:3] = 1.0  # padding: K = N = m = 1, weight 0
    for b, (data, *_rest) in enumerate(rows):
        pad[b, :data.shape[0]] = data
    ref = np.array([r[3] for r in rows])
    data = _FitData.of(pad[:, :, 0], pad[:, :, 1], pad[:, :, 3], pad[:, :, 2] / ref[:, None], pad[:, :, 4],
                       pad[:, :, 5] > 0.5, pad[:, :, 6], np.array([r[1] for r in rows]),
                       np.array([r[2] for r in rows]), np.array([r[4] for r in rows]))

    taken: list = [None, data]  # the rows last asked for and their data (asked again while none stop)

    def fun(x: np.ndarray, sel: np.ndarray):
        if sel is not taken[0]:
            taken[:] = sel, data.take(sel)
        return _fit_residuals(x, taken[1])

    x, cost = batch_lsq.minimize(fun, np.array(starts), _X_LOWER, _X_UPPER,
                                 ftol=_FIT_FTOL, xtol=_FIT_XTOL, gtol=_FIT_GTOL, max_iter=_FIT_MAX_ITER)
    best: dict[int, int] = {}
    for b, i in enumerate(owner):
        if i not in best or cost[b] < cost[best[i]] - 1e-12:
            best[i] = b
    for i, b in best.items():
        out[i] = ThroughputModel(ThroughputParams(*_params_of(x[b], rows[b][3])))
    return out  # type: ignore[return-value]


def _check_placement(K, N):
    K, N = np.asarray(K), np.asarray(N)
    if np.any(K < 1) or np.any(N < 1) or np.any(N > K):
        raise ValueError("need 1 <= N <= K (nodes at most replicas)")
    return K, N


def _scalar_or(a):
    a = np.asarray(a)
    return float(a) if a.ndim == 0 else a


# ------------------------------------------------------------------------ efficiency
@dataclass(frozen=True, slots=True)
class EfficiencyModel:
    """Statistical efficiency of a global batch ``M`` relative to ``M0`` (§3.1).

    ``grad_sqr`` ≈ ``|G|²`` and ``grad_var`` ≈ ``tr(Σ)`` are exactly what
    ``rlsched.trainer`` reports as ``status.progress.gradSqr`` / ``gradVar``
    (``rlsched/trainer/gradstats.py``, docs/trainer.md "Gradient statistics"): the
    squared norm of the true gradient and the trace of the *per-sample* gradient
    covariance (McCandlish et al. 2018, A.2–A.3), so the noise scale is
    ``φ = grad_var / grad_sqr`` in samples with no rescaling. (AdaptDL's own
    ``grad_var`` is the variance at the initial batch, ``tr(Σ)/M0``; the formula below
    is the same once that is undone.)

    ``efficiency(M) = (φ + M0)/(φ + M)``: 1 at ``M0``, falling with ``M``.

    Degenerate reports: the trainer reports a negative smoothed estimate as 0.
    ``grad_sqr <= 0 < grad_var`` (the gradient drowned in noise) is ``φ = ∞``:
    efficiency 1 at every batch, as Pollux's code treats it; ``grad_var <= 0 <
    grad_sqr`` is ``φ = 0``: ``M0/M``.

    No statistics yet (None, non-finite, or both <= 0): ``min(1, M0/M)`` — the
    conservative limit ``φ → 0`` in which a batch larger than ``M0`` buys no progress
    per step at all (every sample beyond ``M0`` is wasted), so goodput never favours
    a larger batch on faith; below ``M0`` it is 1, not the formula's ``> 1``."""

    init_batch: float
    grad_sqr: float | None = None
    grad_var: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.init_batch) and self.init_batch > 0):
            raise ValueError(f"init_batch must be > 0, got {self.init_batch}")

    @property
    def noise_scale(self) -> float | None:
        """``φ`` in samples; ``math.inf`` when the gradient is all noise; None unknown."""
        g, v = self.grad_sqr, self.grad_var
        if g is None or v is None or not (math.isfinite(g) and math.isfinite(v)):
            return None
        g, v = max(g, 0.0), max(v, 0.0)
        if g == 0.0:
            return math.inf if v > 0 else None
        return v / g

    def efficiency(self, M):
        """EFFICIENCY(M), vectorised."""
        M = np.asarray(M, dtype=float)
        phi, m0 = self.noise_scale, float(self.init_batch)
        if phi is None:
            return _scalar_or(np.minimum(1.0, m0 / M))
        if math.isinf(phi):
            return _scalar_or(np.ones(M.shape))
        return _scalar_or((phi + m0) / (phi + M))


# ------------------------------------------------------------------------ goodput
class BatchChoice(NamedTuple):
    """The best batch for an allocation: global ``batch`` M, mean micro-batch
    ``local_batch`` m, ``accumulation`` steps s and its ``goodput`` (samples at the
    initial batch's efficiency per second). All 0 where no batch is feasible."""

    batch: Any
    local_batch: Any
    accumulation: Any
    goodput: Any


class GoodputModel:
    """GOODPUT(K, N, M) = THROUGHPUT × EFFICIENCY within the job's batch bounds.

    Immutable; results of :meth:`optimize_batch` for scalar ``(K, N)`` are memoised
    (a scheduler asks the same job about the same shapes many times in a cycle)."""

    __slots__ = ("throughput", "efficiency", "bounds", "_memo")

    def __init__(self, throughput: ThroughputModel, efficiency: EfficiencyModel, bounds: BatchBounds) -> None:
        self.throughput, self.efficiency, self.bounds = throughput, efficiency, bounds
        self._memo: dict[tuple[int, int], BatchChoice] = {}

    def __repr__(self) -> str:
        return f"GoodputModel({self.throughput!r}, {self.efficiency!r}, {self.bounds!r})"

    def _goodput_at(self, K, N, M, s):
        """Goodput with the accumulation steps given (vectorised, no bounds check)."""
        m = M / (K * (s + 1.0))
        t = _iteration_time(self.throughput._p, K, N, m, s)
        return M / t * np.asarray(self.efficiency.efficiency(M), dtype=float)

    def goodput(self, K, N, M):
        """GOODPUT at global batch ``M`` split as the trainer splits it; 0 where the
        bounds forbid ``M`` on ``K`` replicas. Vectorised."""
        K, N = _check_placement(K, N)
        M = np.asarray(M, dtype=np.int64)
        K, N, M = np.broadcast_arrays(K.astype(np.int64), N.astype(np.int64), M)
        ok = self.bounds.feasible(K, M)
        Msafe = np.where(ok, M, 1).astype(float)
        s = np.asarray(self.bounds.accumulation_steps(np.where(ok, M, 1), K), dtype=float)
        return _scalar_or(np.where(ok, self._goodput_at(K, N, Msafe, s), 0.0))

    def optimize_batch(self, K, N) -> BatchChoice:
        """The global batch that maximises goodput on ``K`` replicas over ``N`` nodes,
        over every whole ``M`` in :meth:`BatchBounds.batch_range` — exactly, not on a
        grid: for a fixed ``s`` the step time is convex in ``M`` (a p-norm of affine
        functions plus an affine one) and ``M·EFFICIENCY(M)`` concave, so goodput is
        quasi-concave on each range of ``M`` with the same ``s``; an integer ternary
        search per range (vectorised over ranges and over array ``K``, ``N``) finds
        each range's best, and the best range wins (ties: the smaller batch). Cost
        ``O(ranges · log(max_batch))`` evaluations, ranges = accumulation counts."""
        if np.ndim(K) == 0 and np.ndim(N) == 0:
            key = (int(K), int(N))
            hit = self._memo.get(key)
            if hit is None:
                hit = BatchChoice(*(a.item() for a in self._optimize(np.array([key[0]]), np.array([key[1]]))))
                self._memo[key] = hit
            return hit
        K, N = np.broadcast_arrays(np.asarray(K, dtype=np.int64), np.asarray(N, dtype=np.int64))
        shape = K.shape
        out = self._optimize(K.ravel(), N.ravel())
        if K.size <= 256:  # remember them for the scalar questions that follow (a decision's decode)
            for key, *vals in zip(zip(K.ravel().tolist(), N.ravel().tolist()), *(a.tolist() for a in out)):
                self._memo.setdefault(key, BatchChoice(*vals))
        return BatchChoice(*(a.reshape(shape) for a in out))

    def _optimize(self, K: np.ndarray, N: np.ndarray):
        return _optimize_many([self], np.zeros(K.size, dtype=np.int64), K, N)

    def speedup(self, K, N):
        """SPEEDUP(K, N): best goodput at ``(K, N)`` over the best on one GPU (what
        Pollux's fairness compares, §4.2); a :class:`ValueError` when the job cannot
        train on one GPU (its bounds forbid every batch there)."""
        base = self.optimize_batch(1, 1).goodput
        if not base > 0:
            raise ValueError("speedup is relative to one GPU, where this job's batch bounds allow no batch")
        return _scalar_or(np.asarray(self.optimize_batch(K, N).goodput) / base)


def optimize_many(models: Sequence[GoodputModel], K: Sequence, N: Sequence) -> list[BatchChoice]:
    """:meth:`GoodputModel.optimize_batch` for many models at once: ``K[i]``, ``N[i]``
    (arrays) are model ``i``'s placements; one vectorised search over every model's
    ranges (a decision asks this of every job). Each answer is the one the model's own
    :meth:`~GoodputModel.optimize_batch` gives, and is remembered there as it would be."""
    models = list(models)
    Ks = [np.asarray(k, dtype=np.int64).ravel() for k in K]
    Ns = [np.asarray(n, dtype=np.int64).ravel() for n in N]
    if not (len(models) == len(Ks) == len(Ns)):
        raise ValueError("one K and one N array per model")
    Ns = [np.broadcast_to(n, k.shape) if n.size == 1 else n for k, n in zip(Ks, Ns)]
    # a model's placements all remembered (as optimize_batch remembers them): no search
    known = [0 < k.size <= 256 and all(key in gm._memo for key in zip(k.tolist(), n.tolist()))
             for gm, k, n in zip(models, Ks, Ns)]
    todo = [i for i, hit in enumerate(known) if not hit]
    owner = np.repeat(np.arange(len(todo)), [Ks[i].size for i in todo])
    flatK = np.concatenate([Ks[i] for i in todo]) if todo else np.zeros(0, dtype=np.int64)
    flatN = np.concatenate([Ns[i] for i in todo]) if todo else np.zeros(0, dtype=np.int64)
    flatK, flatN = np.broadcast_arrays(flatK, flatN)
    out = _optimize_many([models[i] for i in todo], owner, flatK, flatN)
    answers, start = [], 0
    for gm, k, n, hit in zip(models, Ks, Ns, known):
        if hit:
            rows = [gm._memo[key] for key in zip(k.tolist(), n.tolist())]
            answers.append(BatchChoice(*(np.array(v, dtype=a.dtype) for v, a in zip(zip(*rows), out))))
            continue
        part = [a[start:start + k.size] for a in out]
        start += k.size
        if k.size <= 256:  # as optimize_batch remembers them
            for key, *vals in zip(zip(k.tolist(), n.tolist()), *(a.tolist() for a in part)):
                gm._memo.setdefault(key, BatchChoice(*vals))
        answers.append(BatchChoice(*part))
    return answers


def _optimize_many(models: Sequence[GoodputModel], owner: np.ndarray, K: np.ndarray, N: np.ndarray):
    """The search of :meth:`GoodputModel.optimize_batch` over rows ``(K[i], N[i])`` of
    model ``models[owner[i]]``: every row's ranges of equal accumulation steps, an
    integer ternary search on all of them at once, the best range per row."""
    _check_placement(K, N)
    n = K.size
    batch = np.zeros(n, dtype=np.int64)
    good, local, accum = np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64)
    if n == 0:
        return batch, local, accum, good
    # per model: bounds, throughput parameters, efficiency (phi: nan unknown, inf all noise)
    b = [gm.bounds for gm in models]
    init = np.array([x.init_batch for x in b], dtype=np.int64)[owner]
    largest = np.array([x.largest for x in b], dtype=np.int64)[owner]
    min_local = np.array([x.min_local_batch for x in b], dtype=np.int64)[owner]
    has_max = np.array([x.max_local_batch is not None for x in b])[owner]
    max_local = np.array([x.max_local_batch or 1 for x in b], dtype=np.int64)[owner]
    no_accum = np.array([not x.accumulation for x in b])[owner]
    params = np.array([gm.throughput._p for gm in models], dtype=float)[owner]
    phis = [gm.efficiency.noise_scale for gm in models]
    phi = np.array([np.nan if v is None else v for v in phis], dtype=float)[owner]
    m0 = np.array([float(gm.efficiency.init_batch) for gm in models])[owner]
    # BatchBounds.batch_range and accumulation_steps, row by row
    lo = np.maximum(init, K * min_local)
    hi = np.where(has_max & no_accum, np.minimum(largest, K * max_local), largest)
    ok = lo <= hi

    def steps(M):
        share = -(-M // K)
        return np.where(has_max, np.maximum(-(-share // max_local) - 1, 0), 0)

    s_lo, s_hi = steps(np.where(ok, lo, 1)), steps(np.where(ok, hi, 1))
    count = np.where(ok, s_hi - s_lo + 1, 0)
    pair = np.repeat(np.arange(n), count)
    first = np.cumsum(count) - count
    s = s_lo[pair] + (np.arange(pair.size) - first[pair])
    Kp, Np = K[pair], N[pair]
    a, z = lo[pair].copy(), hi[pair].copy()
    cap = Kp * max_local[pair]
    limited = has_max[pair]
    a = np.where(limited, np.maximum(a, cap * s + 1), a)
    z = np.where(limited, np.minimum(z, cap * (s + 1)), z)
    # goodput on each range: the parts fixed by (K, N, s) computed once
    ag, bg, al, bl, an, bn, g = params[pair].T
    ts = np.where(Kp <= 1, 0.0, np.where(Np <= 1, al + bl * (Kp - 2), an + bn * (Kp - 2)))
    per_micro = bg / (Kp * (s + 1.0))
    sf = s.astype(float)
    ph, m0p = phi[pair], m0[pair]
    unknown, noise = np.isnan(ph), np.isinf(ph)
    ph_safe = np.where(unknown | noise, 0.0, ph)

    def f(M: np.ndarray, ag, per_micro, ts, g, sf, unknown, noise, ph_safe, m0p) -> np.ndarray:
        M = M.astype(float)
        tg = ag + per_micro * M
        big, small = np.maximum(tg, ts), np.minimum(tg, ts)
        t = sf * tg + big * (1.0 + (small / big) ** g) ** (1.0 / g)
        eff = np.where(unknown, np.minimum(1.0, m0p / M), np.where(noise, 1.0, (ph_safe + m0p) / (ph_safe + M)))
        return M / t * eff

    every = (ag, per_micro, ts, g, sf, unknown, noise, ph_safe, m0p)

    def search(ranges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """An integer ternary search on ``ranges`` at once (each while wider than 3),
        then the best of its last three: ``(M, goodput)`` per range."""
        live, part = ranges, tuple(x[ranges] for x in every)
        while True:
            wide = z[live] - a[live] > 2
            if not wide.all():
                live, part = live[wide], tuple(x[wide] for x in part)
            if not live.size:
                break
            al_, zl = a[live], z[live]
            third = (zl - al_) // 3
            m1, m2 = al_ + third, zl - third
            g1, g2 = f(np.stack([m1, m2]), *part)
            right = g1 < g2
            a[live] = np.where(right, m1 + 1, al_)
            z[live] = np.where(right, zl, m2 - 1)
        a_, z_ = a[ranges], z[ranges]
        cands = np.stack([a_, np.minimum(a_ + 1, z_), np.minimum(a_ + 2, z_)])
        vals = f(cands, *(x[ranges] for x in every))
        pick = np.argmax(vals, axis=0)
        return cands[pick, np.arange(ranges.size)], vals[pick, np.arange(ranges.size)]

    # each row's first range first; then only the ranges that could beat it: on a range
    # of one s, M / T_iter does not fall as M grows and efficiency does not rise, so
    # (z / T_iter(z)) · efficiency(a) bounds its goodput (a margin for rounding)
    head = first[count > 0]
    head_M, head_g = search(head)
    rest = np.flatnonzero(np.arange(pair.size) != first[pair])
    above = np.full(n, -np.inf)
    above[pair[head]] = head_g
    zr, ar = z[rest].astype(float), a[rest].astype(float)
    tgz = ag[rest] + per_micro[rest] * zr
    tz = sf[rest] * tgz + (tgz ** g[rest] + ts[rest] ** g[rest]) ** (1.0 / g[rest])
    ph_r, m0_r = ph_safe[rest], m0p[rest]
    eff_a = np.where(unknown[rest], np.minimum(1.0, m0_r / ar), np.where(noise[rest], 1.0, (ph_r + m0_r) / (ph_r + ar)))
    rest = rest[~(zr / tz * eff_a * (1.0 + 1e-9) < above[pair[rest]])]
    rest_M, rest_g = search(rest)
    ranges = np.concatenate([head, rest])
    seg_M, seg_g = np.concatenate([head_M, rest_M]), np.concatenate([head_g, rest_g])
    if ranges.size:
        owner_row = pair[ranges]
        order = np.lexsort((seg_M, -seg_g, owner_row))
        lead = order[np.r_[True, owner_row[order][1:] != owner_row[order][:-1]]]
        who, sl = owner_row[lead], s[ranges[lead]]
        batch[who], good[who], accum[who] = seg_M[lead], seg_g[lead], sl
        local[who] = seg_M[lead] / (K[who] * (sl + 1.0))
    return batch, local, accum, good


# ------------------------------------------------------------------------ observations
#: the ``status.progress`` fields :meth:`JobObservations.update` reads — nothing else
PROGRESS_FIELDS = ("stepTimeSeconds", "samplesPerSecond", "workers", "globalBatchSize", "gradSqr", "gradVar")


@dataclass(frozen=True, slots=True)
class ShapeRecord:
    """The step time a job reported on one placement shape: ``workers`` replicas on
    ``nodes`` nodes at global batch ``batch`` with ``accumulation`` steps, on GPUs of
    type ``gpu_type`` (``""``: not said); ``step_time`` the running mean of its
    ``reports`` (over the last ``JobObservations.WINDOW``, exponentially beyond)."""

    workers: int
    nodes: int
    batch: int
    accumulation: int
    step_time: float
    reports: int = 1
    gpu_type: str = ""

    @property
    def key(self) -> tuple[str, int, int, int, int]:
        return (self.gpu_type, self.workers, self.nodes, self.batch, self.accumulation)

    @property
    def local_batch(self) -> float:
        return self.batch / (self.workers * (self.accumulation + 1))


def _number(progress: Mapping[str, Any], key: str) -> float | None:
    v = progress.get(key)
    if v is None or isinstance(v, bool):
        return None
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


@dataclass(frozen=True, slots=True)
class JobObservations:
    """What a live scheduler keeps per job to model its goodput: the step times it
    reported per placement shape, and its latest gradient statistics. Immutable and
    hashable; :meth:`update` returns the record with one more report folded in.

    ``fitted``: the observations the throughput model is fitted to — the current ones
    as of the last report that added a shape or moved a shape's mean step time by
    more than :attr:`REFIT_TOLERANCE` (5%) from them. Reports that only jitter keep
    the same fit (and its memoised result): a fit takes milliseconds, a scheduler
    asks every cycle.

    Its inputs are only what the job reports (``status.progress``, the fields of
    :data:`PROGRESS_FIELDS`), the number of nodes its workers ran on (the scheduler
    placed them) and its batch bounds (its spec) — nothing the job did not say."""

    bounds: BatchBounds
    shapes: tuple[ShapeRecord, ...] = ()
    grad_sqr: float | None = None
    grad_var: float | None = None
    prior: ThroughputPrior = field(default_factory=ThroughputPrior)
    fitted: tuple[tuple[int, int, float, int, float], ...] = ()
    #: the GPU type of the latest step time: the type :meth:`observations` (one
    #: throughput model) is of; ``""``: not said
    gpu_type: str = ""

    #: reports averaged with equal weight per shape before the mean turns exponential
    WINDOW = 8
    #: refit only when a shape is new or a mean step time moved by more than this
    REFIT_TOLERANCE = 0.05

    @classmethod
    def from_progress(cls, progress: Mapping[str, Any], nodes: int, bounds: BatchBounds,
                      previous: "JobObservations | None" = None) -> "JobObservations":
        """Fold one ``status.progress`` report (as the trainer writes it,
        ``rlsched/trainer/reporting.py``) into ``previous`` (or a fresh record for a
        job of these ``bounds``); ``nodes``: how many nodes its workers ran on."""
        base = previous if previous is not None else cls(bounds)
        return base.update(progress, nodes)

    def update(self, progress: Mapping[str, Any], nodes: int, gpu_type: str = "") -> "JobObservations":
        """This record with one report folded in. Reads only :data:`PROGRESS_FIELDS`:
        ``workers`` and ``globalBatchSize`` give the shape, ``stepTimeSeconds`` the
        step time (else ``globalBatchSize / samplesPerSecond``), ``gradSqr``/``gradVar``
        replace the statistics (they are the trainer's own moving averages). A report
        without a shape or a positive step time adds no step time. ``gpu_type``: the
        type of GPU it ran on (the caller reads it: the report's, or its nodes')."""
        out = self
        sqr, var = _number(progress, "gradSqr"), _number(progress, "gradVar")
        if sqr is not None and var is not None:
            out = _replace(out, grad_sqr=sqr, grad_var=var)
        workers, batch = _number(progress, "workers"), _number(progress, "globalBatchSize")
        if workers is None or batch is None or workers < 1 or batch < 1:
            return out
        step = _number(progress, "stepTimeSeconds")
        if step is None or step <= 0:
            rate = _number(progress, "samplesPerSecond")
            step = batch / rate if rate is not None and rate > 0 else None
        if step is None:
            return out
        return out.record(int(workers), int(nodes), int(batch), step, gpu_type)

    def record(self, workers: int, nodes: int, batch: int, step_time: float, gpu_type: str = "") -> "JobObservations":
        """This record with one step time on ``workers`` replicas over ``nodes`` nodes
        at global batch ``batch`` (accumulation steps as the trainer derives them) on
        GPUs of ``gpu_type``."""
        if not (1 <= nodes <= workers):  # _check_placement's rule, on one shape
            raise ValueError("need 1 <= N <= K (nodes at most replicas)")
        if not (math.isfinite(step_time) and step_time > 0) or batch < 1:
            raise ValueError(f"need batch >= 1 and a step time > 0, got {batch}, {step_time}")
        s = int(self.bounds.accumulation_steps(batch, workers))
        key = (gpu_type, workers, nodes, batch, s)
        shapes = list(self.shapes)
        for i, r in enumerate(shapes):
            if r.key == key:
                n = r.reports + 1
                mean = r.step_time + (step_time - r.step_time) / min(n, self.WINDOW)
                shapes[i] = ShapeRecord(workers, nodes, batch, s, mean, n, gpu_type)
                break
        else:
            shapes.append(ShapeRecord(workers, nodes, batch, s, float(step_time), 1, gpu_type))
            shapes.sort(key=lambda r: r.key)
        out = _replace(self, shapes=tuple(shapes), gpu_type=gpu_type)
        now = out.observations()
        if _moved(now, self.fitted, self.REFIT_TOLERANCE):
            out = _replace(out, fitted=now)
        return out

    def observations(self) -> tuple[tuple[int, int, float, int, float], ...]:
        """``(K, N, m, s, step_time)`` per shape of the type of its latest step time
        (:attr:`gpu_type`): the throughput fit's input (one model per type)."""
        return tuple((r.workers, r.nodes, r.local_batch, r.accumulation, r.step_time) for r in self.shapes
                     if r.gpu_type == self.gpu_type)

    def model(self) -> GoodputModel:
        """The job's goodput model: the throughput fitted to :attr:`fitted` (the prior
        alone before any step time), the efficiency from its latest gradient
        statistics, its batch bounds. Memoised."""
        b = self.bounds
        throughput = _fit(self.fitted, self.prior, b.reference_local_batch)
        return _goodput_model(throughput, EfficiencyModel(b.init_batch, self.grad_sqr, self.grad_var), b)

    def marginal(self, workers: int, gpus_per_worker: int, node_gpus: int, *, batch: int | None = None,
                 local_batch: float | None = None) -> tuple[float, float]:
        """What one more worker is worth to the job, from what it reported alone:
        ``(speedup, stat_efficiency)``, throughput at ``workers + 1`` over throughput
        now and the efficiency of a sample there over now (RLPTO's measured ``s`` and
        ``x``, :attr:`rlsched.core.cluster.JobView.speedup`); 0 where unknown.

        Both placements are the tightest, ``ceil(GPUs / node_gpus)`` nodes. The
        throughput is the model fitted to the step times it reported (unknown before it
        reported one: the prior is not a measurement). Two kinds of job:

        * ``batch`` given: it trains that global batch (``spec.batchSize``) at every
          size, so a worker changes only the step time (micro-batch ``batch / K``,
          accumulation as the trainer splits it) and the efficiency ratio is 1;
        * ``batch`` None: a fixed per-worker batch, recorded in units of one per GPU
          (how the operator and the engine fold such a job's reports); the global batch
          grows with the workers, and the efficiency ratio comes from the reported
          gradient noise scale (in samples) with ``local_batch`` samples per GPU
          (unknown without both)."""
        if workers < 1 or gpus_per_worker < 1 or node_gpus < 1:
            raise ValueError(f"need workers, gpus_per_worker and node_gpus >= 1, got {workers}, "
                             f"{gpus_per_worker}, {node_gpus}")
        g = gpus_per_worker
        shapes = [(k, -(-k * g // node_gpus)) for k in (workers, workers + 1)]
        speedup = 0.0
        if self.fitted:
            tm = self.model().throughput
            if batch is not None:
                steps = [(k, n, int(self.bounds.accumulation_steps(batch, k))) for k, n in shapes]
                now, more = (tm.iteration_time(k, n, batch / (k * (s + 1)), s) for k, n, s in steps)
                speedup = float(now / more)
            else:
                now, more = (tm.throughput(k, n, float(g)) for k, n in shapes)
                speedup = float(more / now) if now > 0 else 0.0
        if batch is not None:
            return speedup, 1.0
        phi = EfficiencyModel(1.0, self.grad_sqr, self.grad_var).noise_scale
        if phi is None or local_batch is None or not local_batch > 0:
            return speedup, 0.0
        if math.isinf(phi):
            return speedup, 1.0
        samples = [k * g * float(local_batch) for k, _ in shapes]
        return speedup, float((phi + samples[0]) / (phi + samples[1]))


def _replace(obs: JobObservations, **changes: Any) -> JobObservations:
    fields = {"bounds": obs.bounds, "shapes": obs.shapes, "grad_sqr": obs.grad_sqr,
              "grad_var": obs.grad_var, "prior": obs.prior, "fitted": obs.fitted, "gpu_type": obs.gpu_type}
    fields.update(changes)
    return JobObservations(**fields)


def _moved(now: tuple, fitted: tuple, tolerance: float) -> bool:
    """Whether ``now`` differs from ``fitted`` in its shapes or by more than
    ``tolerance`` (relative) in a step time."""
    if [o[:4] for o in now] != [o[:4] for o in fitted]:
        return True
    limit = math.log1p(tolerance)
    return any(abs(math.log(a[4] / b[4])) > limit for a, b in zip(now, fitted))


@functools.lru_cache(maxsize=256)
def _fit(observations: tuple, prior: ThroughputPrior, reference_batch: float) -> ThroughputModel:
    return ThroughputModel.fit(observations, prior, reference_batch)


@functools.lru_cache(maxsize=1024)
def _goodput_model(throughput: ThroughputModel, efficiency: EfficiencyModel, bounds: BatchBounds) -> GoodputModel:
    return GoodputModel(throughput, efficiency, bounds)
