"""The goodput model (core/goodput.py): Pollux's throughput and statistical-efficiency
models (Qiao et al., OSDI'21 §3), fitted from what a job reports.

Hand-computed step times; the fit on noiseless and noisy synthetic observations of the
model itself (tolerances measured, stated at each test); the prior alone; the
efficiency against the trainer's own gradient statistics; the batch optimiser against
brute force; honest properties of goodput and speedup; the non-clairvoyance of
:class:`JobObservations`; and one fit to the measured Pollux profiles of cifar10."""

from __future__ import annotations

import ast
import csv
import math
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlsched.core.batch import BatchBounds
from rlsched.core.goodput import (
    PROGRESS_FIELDS,
    EfficiencyModel,
    GoodputModel,
    JobObservations,
    ThroughputModel,
    ThroughputParams,
    ThroughputPrior,
)

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ hand-computed step times
#: T_grad(m) = 0.1 + 0.01 m; T_sync = 0.36 + 0.02 (K-2) on one node, 0.6 + 0.1 (K-2) across
HAND = ThroughputParams(alpha_grad=0.1, beta_grad=0.01, alpha_local=0.36, beta_local=0.02,
                        alpha_node=0.6, beta_node=0.1, gamma=2.0)


@pytest.mark.parametrize(
    "K, N, m, s, expected",
    [
        # one GPU: no synchronisation, T_iter = (s+1) T_grad
        (1, 1, 20, 0, 0.3),                       # T_grad(20) = 0.3
        (1, 1, 20, 2, 0.9),                       # 2·0.3 + 0.3
        # one node: K = 2 → T_sync = α_local = 0.36; T_grad(17) = 0.27 → √(0.27² + 0.36²) = 0.45
        (2, 1, 17, 0, 0.45),
        # K = 4 → T_sync = 0.36 + 0.02·2 = 0.40; T_grad(20) = 0.3 → √(0.09 + 0.16) = 0.5
        (4, 1, 20, 0, 0.5),
        (4, 1, 20, 1, 0.8),                       # + one accumulation step of 0.3
        # two nodes: K = 2 → T_sync = α_node = 0.6; T_grad(70) = 0.8 → 1.0
        (2, 2, 70, 0, 1.0),
        # K = 8 → T_sync = 0.6 + 0.1·6 = 1.2; T_grad(40) = 0.5 → √(0.25 + 1.44) = 1.3
        (8, 2, 40, 0, 1.3),
        (8, 2, 40, 3, 2.8),                       # 3·0.5 + 1.3
        (8, 4, 40, 0, 1.3),                       # the node terms do not depend on N ≥ 2
    ],
)
def test_iteration_time_by_hand(K, N, m, s, expected):
    tm = ThroughputModel(HAND)
    assert tm.iteration_time(K, N, m, s) == pytest.approx(expected, rel=1e-12)
    # THROUGHPUT = M / T_iter with M = K·m·(s+1)
    assert tm.throughput(K, N, m, s) == pytest.approx(K * m * (s + 1) / expected, rel=1e-12)


def test_overlap_exponent_limits():
    """γ = 1: compute and synchronisation add up; γ = 10: close to their maximum."""
    base = HAND.astuple()[:6]
    no_overlap = ThroughputModel(ThroughputParams(*base, gamma=1.0))
    assert no_overlap.iteration_time(4, 1, 20, 0) == pytest.approx(0.3 + 0.4, rel=1e-12)
    near_max = ThroughputModel(ThroughputParams(*base, gamma=10.0))
    assert near_max.iteration_time(4, 1, 20, 0) == pytest.approx((0.3**10 + 0.4**10) ** 0.1, rel=1e-12)
    assert 0.4 < near_max.iteration_time(4, 1, 20, 0) < 0.4 * 1.01


def test_iteration_time_vectorises_and_validates():
    tm = ThroughputModel(HAND)
    got = tm.iteration_time(np.array([1, 4, 8]), np.array([1, 1, 2]), np.array([20, 20, 40]), np.array([0, 1, 3]))
    np.testing.assert_allclose(got, [0.3, 0.8, 2.8], rtol=1e-12)
    assert tm.sync_time(1, 1) == 0.0 and tm.sync_time(2, 1) == pytest.approx(0.36)
    with pytest.raises(ValueError):
        tm.iteration_time(2, 3, 10, 0)  # more nodes than replicas
    with pytest.raises(ValueError):
        ThroughputParams(0.1, 0.01, 0.1, 0.0, 0.1, 0.0, gamma=0.5)
    with pytest.raises(ValueError):
        ThroughputParams(-0.1, 0.01, 0.1, 0.0, 0.1, 0.0, gamma=1.0)


# ------------------------------------------------------------------ fitting
TRUTH_A = ThroughputParams(0.02, 0.0007, 0.01, 0.004, 0.08, 0.02, 1.5)
TRUTH_B = ThroughputParams(0.05, 0.004, 0.03, 0.01, 0.3, 0.05, 1.2)
SHAPES = [(1, 1), (2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (8, 2), (16, 2), (4, 4), (8, 4), (16, 4)]
HELD_OUT = [(32, 8), (64, 16), (12, 3), (6, 1)]  # never observed: extrapolation
FLAT = ThroughputPrior(spread=100.0, gamma_spread=100.0)


def _observations(params: ThroughputParams) -> list[tuple]:
    tm = ThroughputModel(params)
    return [(K, N, m, s, tm.iteration_time(K, N, m, s))
            for K, N in SHAPES for m in (16, 32, 64, 128, 256) for s in (0, 2)]


def _rel(fitted: ThroughputParams, truth: ThroughputParams) -> np.ndarray:
    return np.abs(np.array(fitted.astuple()) / np.array(truth.astuple()) - 1)


def _worst_step_error(model: ThroughputModel, truth: ThroughputParams, shapes) -> float:
    tm = ThroughputModel(truth)
    return max(abs(model.iteration_time(K, N, m, 0) / tm.iteration_time(K, N, m, 0) - 1)
               for K, N in shapes for m in (16, 32, 128, 256))


@pytest.mark.parametrize("truth", [TRUTH_A, TRUTH_B], ids=["gamma1.5", "gamma1.2"])
def test_fit_recovers_parameters_from_noiseless_observations(truth):
    """110 noiseless observations generated by the model itself. With a flat prior
    (σ = 100) every parameter comes back within 1e-3 (measured: 1e-4 at worst, α_local
    of truth A). With the default prior, which also pulls towards its guesses, the
    measured worst is 6% on β_local (the least visible term, hidden by the overlap)
    and 1.1% on a step time: asserted 10% and 2%."""
    obs = _observations(truth)
    flat = ThroughputModel.fit(obs, FLAT)
    assert _rel(flat.params, truth).max() < 1e-3
    default = ThroughputModel.fit(obs)
    assert _rel(default.params, truth).max() < 0.10
    assert max(abs(default.iteration_time(*o[:4]) / o[4] - 1) for o in obs) < 0.02
    assert _worst_step_error(default, truth, HELD_OUT) < 0.02


def test_fit_is_deterministic():
    obs = _observations(TRUTH_A)
    assert ThroughputModel.fit(obs).params == ThroughputModel.fit(obs).params


@pytest.mark.parametrize("truth", [TRUTH_A, TRUTH_B], ids=["gamma1.5", "gamma1.2"])
@pytest.mark.parametrize("seed", range(4))
def test_fit_is_stable_under_5_percent_noise(truth, seed):
    """Every step time times exp(N(0, 0.05)), seeded. Measured over 20 seeds and both
    truths: predicted step times within 9.8% of the true ones on the observed shapes
    and 5.1% on the held-out larger ones (32 GPUs on 8 nodes, 64 on 16, ...); β_grad
    within 3.3%, α_grad/α_node within 12%, β_node within 6%, γ within 17%; the
    single-node sync terms are barely visible (α_local off by up to 66%), which
    changes no prediction by much. Asserted: 12% and 8% on step times; 5%, 15%, 10%
    and 25% on those parameters."""
    rng = np.random.default_rng(seed)
    noisy = [(K, N, m, s, t * float(np.exp(rng.normal(0.0, 0.05)))) for K, N, m, s, t in _observations(truth)]
    fit = ThroughputModel.fit(noisy)
    assert _worst_step_error(fit, truth, SHAPES) < 0.12
    assert _worst_step_error(fit, truth, HELD_OUT) < 0.08
    rel = dict(zip(("ag", "bg", "al", "bl", "an", "bn", "g"), _rel(fit.params, truth)))
    assert rel["bg"] < 0.05 and rel["ag"] < 0.15 and rel["an"] < 0.15 and rel["bn"] < 0.10 and rel["g"] < 0.25


def test_prior_alone_is_finite_and_sensible():
    """No observation at all: the prior's model. Finite and positive; slower with a
    larger batch and with accumulation; synchronisation across nodes dearer than
    within one; one GPU more on a node helps (fixed batch), crossing nodes costs."""
    obs = JobObservations(BatchBounds(128))
    g = obs.model()
    tm = g.throughput
    p = tm.params
    assert all(math.isfinite(v) and v >= 0 for v in p.astuple())
    # C = 1 s at the reference batch M0 = 128; 20% of it fixed overhead
    assert tm.grad_time(128) == pytest.approx(1.0) and p.alpha_grad == pytest.approx(0.2)
    assert tm.iteration_time(1, 1, 64, 0) < tm.iteration_time(1, 1, 128, 0) < tm.iteration_time(1, 1, 128, 1)
    assert tm.sync_time(4, 1) < tm.sync_time(4, 2)
    assert g.speedup(1, 1) == 1.0
    assert 1.0 < g.speedup(2, 1) < g.speedup(4, 1) < g.speedup(8, 1) < 8
    assert g.speedup(4, 2) < g.speedup(4, 1)
    assert g.optimize_batch(4, 1).batch == 128  # fixed batch: max_batch defaults to M0
    assert ThroughputModel.fit([]).params == ThroughputModel.from_prior().params


def test_single_gpu_data_leaves_sync_terms_at_the_prior():
    """Only one-GPU reports: compute terms from the data, every synchronisation term
    and γ exactly the prior's (as ratios of the fitted compute time at the reference
    batch): nothing observed moves them."""
    prior = ThroughputPrior()
    obs = JobObservations(BatchBounds(128, 4096, 16, 256))
    for batch, step in [(128, 0.2), (256, 0.38)]:
        obs = obs.record(1, 1, batch, step)
    p = obs.model().throughput.params
    c = p.alpha_grad + p.beta_grad * 128
    # two points, two compute terms; the prior's pull on the overhead fraction (0.2
    # against the data's 0.1) leaves 1.6% (measured): asserted 3%
    assert c == pytest.approx(0.2, rel=0.03)
    assert p.alpha_grad + p.beta_grad * 256 == pytest.approx(0.38, rel=0.03)
    assert (p.alpha_local / c, p.beta_local / c) == pytest.approx(prior.local_sync, rel=1e-6)
    assert (p.alpha_node / c, p.beta_node / c) == pytest.approx(prior.node_sync, rel=1e-6)
    assert p.gamma == pytest.approx(prior.gamma, abs=1e-9)


def test_optimistic_prior_makes_synchronisation_nearly_free():
    """Pollux's exploration prior (§4.1): with it, a job seen on one GPU is predicted to
    scale almost linearly until it has been observed on more."""
    obs = JobObservations(BatchBounds(128, 128), prior=ThroughputPrior.optimistic()).record(1, 1, 128, 0.2)
    assert obs.model().speedup(4, 2) > 0.95 * obs.model().speedup(4, 1)


# ------------------------------------------------------------------ statistical efficiency
def test_efficiency_is_the_noise_scale_formula():
    eff = EfficiencyModel(128, grad_sqr=2.0, grad_var=1000.0)  # φ = 500 samples
    assert eff.noise_scale == 500.0
    assert eff.efficiency(128) == 1.0
    M = np.array([128, 256, 512, 1024, 4096])
    np.testing.assert_allclose(eff.efficiency(M), (500 + 128) / (500 + M), rtol=1e-15)
    assert np.all(np.diff(eff.efficiency(M)) < 0)


def test_efficiency_agrees_with_what_the_trainer_reports():
    """The trainer (rlsched/trainer/gradstats.py) reports |G|² and the per-sample
    tr(Σ); built from known ones, its estimator gives back exactly the φ the model uses."""
    from rlsched.trainer.gradstats import noise_estimate

    g2, tr_sigma, b, big = 4.0, 200.0, 32, 128
    sqr, var = noise_estimate(g2 + tr_sigma / b, g2 + tr_sigma / big, b, big)  # E|g_b|² = |G|² + tr(Σ)/b
    eff = EfficiencyModel(64, sqr, var)
    assert eff.noise_scale == pytest.approx(tr_sigma / g2, rel=1e-12)
    assert eff.efficiency(256) == pytest.approx((50 + 64) / (50 + 256), rel=1e-12)


def test_efficiency_without_statistics_and_degenerate_ones():
    none = EfficiencyModel(100)
    assert none.noise_scale is None
    np.testing.assert_allclose(none.efficiency([50, 100, 200, 400]), [1.0, 1.0, 0.5, 0.25])
    all_noise = EfficiencyModel(100, grad_sqr=0.0, grad_var=3.0)  # trainer reports negatives as 0
    assert all_noise.noise_scale == math.inf and all_noise.efficiency(1000) == 1.0
    no_noise = EfficiencyModel(100, grad_sqr=3.0, grad_var=0.0)
    assert no_noise.noise_scale == 0.0 and no_noise.efficiency(400) == 0.25
    assert EfficiencyModel(100, 0.0, 0.0).noise_scale is None
    assert EfficiencyModel(100, float("nan"), 1.0).noise_scale is None


# ------------------------------------------------------------------ batch bounds and the trainer
def test_accumulation_steps_are_the_trainers():
    from rlsched.trainer.batching import plan_batch

    bounds = BatchBounds(16, 4096, 1, 48)
    for K in (1, 2, 3, 5, 8):
        for M in (16, 47, 48, 49, 97, 240, 1000, 4096):
            if M >= K:
                assert bounds.accumulation_steps(M, K) == plan_batch(M, K, 48).accumulation_steps - 1


def test_batch_range_and_infeasible_allocations():
    b = BatchBounds(128, 1024, 16, 64, accumulation=False)
    lo, hi = b.batch_range(np.array([1, 2, 4, 32, 128]))
    assert lo.tolist() == [128, 128, 128, 512, 2048] and hi.tolist() == [64, 128, 256, 1024, 1024]
    g = GoodputModel(ThroughputModel(HAND), EfficiencyModel(128), b)
    assert g.optimize_batch(1, 1) == (0, 0.0, 0, 0.0)       # 128 samples do not fit one GPU
    assert g.optimize_batch(128, 32).goodput == 0.0          # nor 128 GPUs at >= 16 samples each
    assert g.optimize_batch(2, 1).batch == 128
    assert g.goodput(1, 1, 128) == 0.0
    with pytest.raises(ValueError):
        g.speedup(2, 1)  # no one-GPU reference for this job
    for bad in [(128, 64), (128, 256, 1, 0), (0,), (128, 256, 8, 4)]:
        with pytest.raises(ValueError):
            BatchBounds(*bad)


def test_largest_local_batch_without_a_limit_is_the_largest_global_batch():
    b = BatchBounds(128, 4096, 32, 1024)
    assert (b.largest_local, b.reference_local_batch) == (1024, 128.0)
    assert (BatchBounds(128, 4096, 32).largest_local, BatchBounds(128).largest_local) == (4096, 128)


# ------------------------------------------------------------------ optimize_batch vs brute force
params_st = st.builds(
    ThroughputParams,
    alpha_grad=st.floats(1e-3, 1.0), beta_grad=st.floats(1e-5, 1e-2),
    alpha_local=st.floats(0.0, 1.0), beta_local=st.floats(0.0, 0.2),
    alpha_node=st.floats(0.0, 2.0), beta_node=st.floats(0.0, 0.5),
    gamma=st.floats(1.0, 10.0),
)
stats_st = st.one_of(
    st.just((None, None)),
    st.tuples(st.floats(0.0, 10.0), st.floats(0.0, 1e4)),
)


@st.composite
def bounds_st(draw):
    m0 = draw(st.integers(1, 512))
    max_batch = m0 + draw(st.integers(0, 2000))
    min_local = draw(st.integers(1, 16))
    max_local = draw(st.one_of(st.none(), st.integers(min_local, 512)))
    return BatchBounds(m0, max_batch, min_local, max_local, accumulation=draw(st.booleans()))


@st.composite
def placement_st(draw):
    K = draw(st.integers(1, 64))
    return K, draw(st.integers(1, min(K, 16)))


@settings(max_examples=150, deadline=None)
@given(params_st, bounds_st(), stats_st, placement_st())
def test_optimize_batch_is_the_brute_force_argmax(params, bounds, stats, placement):
    K, N = placement
    g = GoodputModel(ThroughputModel(params), EfficiencyModel(bounds.init_batch, *stats), bounds)
    choice = g.optimize_batch(K, N)
    lo, hi = (int(v) for v in bounds.batch_range(K))
    if lo > hi:
        assert choice == (0, 0.0, 0, 0.0)
        return
    every = np.arange(lo, hi + 1)
    brute = g.goodput(K, N, every)
    assert lo <= choice.batch <= hi
    assert choice.goodput == pytest.approx(brute.max(), rel=1e-9)
    assert g.goodput(K, N, choice.batch) == pytest.approx(choice.goodput, rel=1e-12)
    assert choice.accumulation == bounds.accumulation_steps(choice.batch, K)
    assert choice.local_batch == pytest.approx(choice.batch / (K * (choice.accumulation + 1)))


def test_optimize_batch_over_arrays_matches_scalar_calls():
    g = GoodputModel(ThroughputModel(TRUTH_A), EfficiencyModel(128, 1.0, 800.0), BatchBounds(128, 4096, 16, 256))
    K = np.array([1, 2, 4, 8, 16, 32, 64])
    N = np.array([1, 1, 1, 2, 4, 8, 16])
    many = g.optimize_batch(K, N)
    for i in range(K.size):
        one = g.optimize_batch(int(K[i]), int(N[i]))
        assert (many.batch[i], many.accumulation[i]) == (one.batch, one.accumulation)
        assert many.goodput[i] == pytest.approx(one.goodput, rel=1e-12)
    np.testing.assert_allclose(g.speedup(K, N), many.goodput / g.optimize_batch(1, 1).goodput)


# ------------------------------------------------------------------ properties
@settings(max_examples=150, deadline=None)
@given(params_st, bounds_st(), stats_st, placement_st(), st.integers(1, 3000))
def test_goodput_is_positive_where_feasible_and_zero_elsewhere(params, bounds, stats, placement, M):
    K, N = placement
    g = GoodputModel(ThroughputModel(params), EfficiencyModel(bounds.init_batch, *stats), bounds)
    value = g.goodput(K, N, M)
    if bounds.feasible(K, M):
        assert math.isfinite(value) and value > 0
    else:
        assert value == 0.0


@settings(max_examples=100, deadline=None)
@given(params_st, bounds_st(), stats_st)
def test_speedup_of_one_gpu_is_one(params, bounds, stats):
    lo, hi = bounds.batch_range(1)
    assume(lo <= hi)  # else the job cannot run on one GPU: speedup raises (tested above)
    g = GoodputModel(ThroughputModel(params), EfficiencyModel(bounds.init_batch, *stats), bounds)
    assert g.speedup(1, 1) == 1.0


@settings(max_examples=100, deadline=None)
@given(params_st, bounds_st(), stats_st, st.integers(2, 63), st.sampled_from([1, 2]))
def test_one_more_gpu_never_hurts_when_synchronisation_does_not_grow(params, bounds, stats, K, N):
    """With β_sync = 0 (synchronisation does not grow with K) on a fixed number of nodes
    and K ≥ 2 (already synchronising), SPEEDUP(K+1) ≥ SPEEDUP(K): the same global batch
    on one more replica has the same efficiency, a smaller share, no more accumulation
    steps and the same T_sync. Needs every batch feasible at K to stay feasible at K+1
    (``K + 1 <= M0``, per-GPU minimum 1). Not true in general: β_sync > 0 or the first
    GPU beyond one (T_sync from 0 to α) can make more GPUs slower (next test)."""
    flat_sync = ThroughputParams(params.alpha_grad, params.beta_grad, params.alpha_local, 0.0,
                                 params.alpha_node, 0.0, params.gamma)
    b = BatchBounds(bounds.init_batch, bounds.max_batch, 1, bounds.max_local_batch, bounds.accumulation)
    lo, hi = b.batch_range(1)
    assume(N <= K and K + 1 <= b.init_batch and lo <= hi)
    g = GoodputModel(ThroughputModel(flat_sync), EfficiencyModel(b.init_batch, *stats), b)
    assert g.speedup(K + 1, N) >= g.speedup(K, N) * (1 - 1e-9)


def test_more_gpus_can_be_slower():
    """The honest counterpart: a costly all-reduce makes two GPUs worse than one."""
    slow_sync = ThroughputParams(0.01, 0.001, 1.0, 0.0, 2.0, 0.0, 1.0)
    g = GoodputModel(ThroughputModel(slow_sync), EfficiencyModel(128), BatchBounds(128))
    assert g.speedup(2, 1) < 1.0


@settings(max_examples=100, deadline=None)
@given(params_st, bounds_st(), stats_st, placement_st())
def test_speedup_is_at_most_linear_without_accumulation(params, bounds, stats, placement):
    """Without a per-GPU limit (no accumulation), K replicas never do better than K
    single GPUs: one GPU at the per-replica share ``x = M/K`` (or at M0 if ``x < M0``)
    matches a replica's throughput without its synchronisation and has at least the
    efficiency; only rounding ``x`` to a whole batch costs up to a factor ``1 − 1/M0``.
    (With a per-GPU limit, superlinear speedups are real: 2 GPUs can avoid the
    accumulation step one GPU needs.)"""
    K, N = placement
    b = BatchBounds(bounds.init_batch, bounds.max_batch, bounds.min_local_batch, None)
    lo, hi = b.batch_range(1)
    assume(b.init_batch >= 2 and lo <= hi)
    g = GoodputModel(ThroughputModel(params), EfficiencyModel(b.init_batch, *stats), b)
    assert g.speedup(K, N) <= K / (1 - 1 / b.init_batch) * (1 + 1e-9)


# ------------------------------------------------------------------ observations (non-clairvoyance)
class RecordingProgress(Mapping):
    """A status.progress that records every key read and refuses to be iterated (so
    nothing can be read without being recorded)."""

    def __init__(self, data: dict) -> None:
        self._data, self.read = data, set()

    def __getitem__(self, key):
        self.read.add(key)
        return self._data[key]

    def __iter__(self):
        raise AssertionError("progress iterated")

    def __len__(self):
        return len(self._data)


def test_job_observations_read_only_the_reported_progress_fields():
    """A status.progress as the trainer writes it, plus fields no scheduler should
    model goodput from (including a simulator's private truth): only the documented
    step-time, shape and gradient fields are read, and the model is the same as from
    those fields alone."""
    reported = {"stepTimeSeconds": 0.25, "samplesPerSecond": 1024.0, "workers": 2, "globalBatchSize": 256,
                "gradSqr": 2.0, "gradVar": 900.0}
    extra = {"epoch": 3, "loss": 0.7, "maxLoss": 2.3, "accuracy": 0.8, "history": [0.5, 0.7, 0.8],
             "updateTime": "2026-01-01T00:00:00Z", "generation": 4, "metricName": "accuracy",
             "trueRemainingSeconds": 1234.0, "measuredStepTime": {"4": 0.1}}
    progress = RecordingProgress({**reported, **extra})
    bounds = BatchBounds(128, 4096, 16, 256)
    obs = JobObservations.from_progress(progress, nodes=1, bounds=bounds)
    assert progress.read <= set(PROGRESS_FIELDS)
    alone = JobObservations.from_progress(dict(reported), nodes=1, bounds=bounds)
    assert obs == alone
    assert obs.observations() == ((2, 1, 128.0, 0, 0.25),)
    assert obs.model().efficiency.noise_scale == 450.0
    assert obs.model().throughput.params == alone.model().throughput.params


def test_goodput_module_imports_nothing_but_numpy_scipy_and_the_standard_library():
    """The model needs nothing else of ours but its batched least-squares solver and the
    job's batch bounds, which need nothing but numpy."""
    allowed = {"__future__", "functools", "math", "dataclasses", "typing", "numpy", "scipy"}
    for name, ours in (("goodput.py", {(None, "batch_lsq"), ("batch", "BatchBounds")}), ("batch_lsq.py", set()),
                       ("batch.py", set())):
        tree = ast.parse((REPO / "core" / name).read_text())
        roots = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level:
                assert {(node.module, a.name) for a in node.names} <= ours, name
            elif isinstance(node, ast.ImportFrom):
                roots.add(node.module.split(".")[0])
        assert roots <= allowed, name


def test_observations_fold_reports_per_shape():
    bounds = BatchBounds(64, 1024, 8, 64)
    obs = JobObservations(bounds)
    obs = obs.update({"workers": 2, "globalBatchSize": 256, "samplesPerSecond": 512.0}, nodes=1)  # T = 0.5 s
    obs = obs.update({"workers": 2, "globalBatchSize": 256, "stepTimeSeconds": 0.7}, nodes=1)
    obs = obs.update({"workers": 4, "globalBatchSize": 256, "stepTimeSeconds": 0.3}, nodes=2)
    obs = obs.update({"gradSqr": 1.0, "gradVar": 64.0}, nodes=2)   # statistics only
    obs = obs.update({"workers": 4, "stepTimeSeconds": 0.3}, nodes=2)  # no batch: no shape
    # 256 over 2 replicas = 128 each > 64 per GPU: s = 1, m = 64; over 4: s = 0, m = 64
    assert obs.observations() == ((2, 1, 64.0, 1, pytest.approx(0.6)), (4, 2, 64.0, 0, 0.3))
    assert obs.shapes[0].reports == 2
    assert (obs.grad_sqr, obs.grad_var) == (1.0, 64.0)


def test_refit_only_when_observations_move():
    obs = JobObservations(BatchBounds(128)).record(1, 1, 128, 0.20)
    first = obs.model()
    jitter = obs.record(1, 1, 128, 0.21)   # running mean 0.205: 2.5% off the fitted 0.20
    assert jitter.fitted == obs.fitted and jitter.model().throughput is first.throughput
    moved = jitter.record(1, 1, 128, 0.30)  # mean 0.2367: 18% off
    assert moved.fitted != obs.fitted
    assert moved.model().throughput.iteration_time(1, 1, 128, 0) == pytest.approx(0.2367, rel=0.01)
    grown = jitter.record(2, 1, 128, 0.12)  # a new shape always refits
    assert len(grown.fitted) == 2


# ------------------------------------------------------------------ the measured profiles
def _traces() -> Path:
    d = os.environ.get("RLSCHED_DATA_DIR") or str(REPO.parent / "shared" / "data")
    return Path(d) / "pollux-osdi21" / "traces"


@pytest.mark.skipif(not _traces().is_dir(), reason=f"measured profiles not found at {_traces()}")
def test_fit_to_measured_cifar10_predicts_held_out_placements():
    """cifar10 (ResNet18) as a job would report it: step times on the placements "1",
    "2", "4" and "22" (2 + 2 GPUs on two nodes) at all 11 measured per-GPU batches
    (44 shapes); predicted: the 1,139 measurements on the 103 other placements (up to
    16 GPUs on 4 nodes, uneven ones such as "1244" included).

    Bound, chosen before measuring: median relative error <= 15% and RMSLE <= 0.25 —
    the model has seven parameters and no notion of how GPUs spread over nodes, the
    measured sync times are visibly noisy, and a scheduler choosing between
    allocations that differ by 1.3x or more can live with that.
    Measured: median 11.5%, RMSLE 0.180, 90th percentile 34%, worst 68%; in sample
    RMSLE 0.056. Fitted to all 1,183 measurements at once (flat prior) the form
    reaches median 4.1%, RMSLE 0.094: its floor. The errors are one-sided (signed
    median +10%: predicted too slow); the same pipeline on the other applications
    gives medians of 13.8% (deepspeech2), 21.1% (ncf), 21.8% (yolov3), 36.5%
    (imagenet) and 44.8% (bert), all too slow: from one multi-node shape the
    retrogression β_node comes from the prior (0.1 α_node), about 3–10 times what
    the measured profiles show. Not asserted here: reported, not tuned away."""
    rows = list(csv.DictReader(open(_traces() / "cifar10" / "placements.csv")))
    train = {"1", "2", "4", "22"}
    obs = JobObservations(BatchBounds(128, 4096, 32, 1024))
    for r in rows:
        if r["placement"] in train:
            K, N = sum(map(int, r["placement"])), len(r["placement"])
            obs = obs.record(K, N, K * int(r["local_bsz"]), float(r["step_time"]))
    assert len(obs.shapes) == 44
    tm = obs.model().throughput
    test = [r for r in rows if r["placement"] not in train]
    pred = np.array([tm.iteration_time(sum(map(int, r["placement"])), len(r["placement"]), float(r["local_bsz"]), 0)
                     for r in test])
    true = np.array([float(r["step_time"]) for r in test])
    rel = np.abs(pred / true - 1)
    rmsle = float(np.sqrt(np.mean(np.log(pred / true) ** 2)))
    assert len(test) == 1139
    assert np.median(rel) <= 0.15
    assert rmsle <= 0.25


# ------------------------------------------------------------------ one more worker, from reports
def test_marginal_of_a_fixed_global_batch_is_the_fitted_step_time_ratio():
    """spec.batchSize kept at every size: one more worker shortens the step (micro-batch
    M/K) and leaves the efficiency alone; the fit to noiseless reports is the truth."""
    obs = JobObservations(BatchBounds(128), prior=FLAT, fitted=tuple(_observations(TRUTH_A)))
    tm = ThroughputModel(TRUTH_A)
    s, x = obs.marginal(3, 1, 4, batch=128)
    assert s == pytest.approx(tm.iteration_time(3, 1, 128 / 3) / tm.iteration_time(4, 1, 32), rel=1e-3)
    assert x == 1.0
    # 4 replicas of one GPU fill a node: the fifth crosses to a second one
    s, _ = obs.marginal(4, 1, 4, batch=128)
    assert s == pytest.approx(tm.iteration_time(4, 1, 32) / tm.iteration_time(5, 2, 128 / 5), rel=1e-3)


def test_marginal_of_a_fixed_local_batch_grows_the_batch():
    """A fixed per-worker batch (records in units of one per GPU): throughput at one
    more worker of the same micro-batch; the efficiency from the reported noise scale
    φ (samples): (φ + K·g·b)/(φ + (K+1)·g·b)."""
    tm = ThroughputModel(TRUTH_A)
    units = tuple((K, N, 2.0, 0, tm.iteration_time(K, N, 2.0)) for K, N in SHAPES)
    obs = JobObservations(BatchBounds(1), prior=FLAT, fitted=units, grad_sqr=1.0, grad_var=1000.0)
    s, x = obs.marginal(2, 2, 4, local_batch=32)  # 4 GPUs on 1 node -> 6 GPUs on 2
    assert s == pytest.approx(tm.throughput(3, 2, 2.0) / tm.throughput(2, 1, 2.0), rel=1e-3)
    assert x == pytest.approx((1000 + 2 * 2 * 32) / (1000 + 3 * 2 * 32))


def test_marginal_is_unknown_until_reported():
    bare = JobObservations(BatchBounds(1))
    assert bare.marginal(2, 1, 4, local_batch=32) == (0.0, 0.0)  # no step time, no statistics
    assert bare.marginal(2, 1, 4, batch=64) == (0.0, 1.0)  # a kept batch: efficiency unchanged
    stepped = bare.record(2, 1, 2, 0.5)
    s, x = stepped.marginal(2, 1, 4)
    assert s > 0 and x == 0.0  # no noise scale, or no batch to weigh it with
    assert stepped.marginal(2, 1, 4, local_batch=32)[1] == 0.0
    noisy = JobObservations(BatchBounds(1), grad_sqr=0.0, grad_var=5.0)  # all noise: every sample counts
    assert noisy.marginal(1, 1, 4, local_batch=32) == (0.0, 1.0)
    with pytest.raises(ValueError):
        bare.marginal(0, 1, 4)
