"""The batched bounded least-squares solver (core/batch_lsq.py) and the throughput fits
and batch searches that run on it in one batch per decision (core/goodput.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import least_squares

from rlsched.core import batch_lsq
from rlsched.core.batch import BatchBounds
from rlsched.core.goodput import (
    EfficiencyModel,
    FitProblem,
    GoodputModel,
    ThroughputModel,
    ThroughputParams,
    ThroughputPrior,
    _X_LOWER,
    _X_UPPER,
    _FitData,
    _fit_residuals,
    _params_of,
    _prior_x,
    fit_many,
    optimize_many,
)
from rlsched.core.job_goodput import JobGoodput


def _linear(A: np.ndarray, y: np.ndarray):
    def fun(x, rows):
        return np.einsum("bik,bk->bi", A[rows], x) - y[rows], A[rows].copy()
    return fun


def test_linear_problems_solve_to_the_normal_equations_answer():
    rng = np.random.default_rng(3)
    A = rng.normal(size=(5, 9, 3))
    y = rng.normal(size=(5, 9))
    x, cost = batch_lsq.minimize(_linear(A, y), np.zeros((5, 3)), -1e9, 1e9)
    for b in range(5):
        want = np.linalg.lstsq(A[b], y[b], rcond=None)[0]
        np.testing.assert_allclose(x[b], want, rtol=1e-9, atol=1e-9)
        assert cost[b] == pytest.approx(0.5 * np.sum((A[b] @ want - y[b]) ** 2), rel=1e-12)


def test_a_bound_the_gradient_pushes_against_holds_and_the_rest_is_optimal():
    # minimise (x0 - 3)^2 + (x1 + 2)^2 with x0 <= 1, x1 >= -5: x = (1, -2) exactly
    A = np.broadcast_to(np.eye(2), (1, 2, 2)).copy()
    y = np.array([[3.0, -2.0]])
    x, cost = batch_lsq.minimize(_linear(A, y), np.zeros((1, 2)), [-5.0, -5.0], [1.0, 5.0])
    assert x[0, 0] == 1.0
    assert x[0, 1] == pytest.approx(-2.0, abs=1e-10)
    assert cost[0] == pytest.approx(2.0)


def test_rosenbrock_in_residual_form_reaches_its_minimum():
    def fun(x, rows):
        r = np.stack([10 * (x[:, 1] - x[:, 0] ** 2), 1 - x[:, 0]], axis=1)
        J = np.zeros((x.shape[0], 2, 2))
        J[:, 0, 0], J[:, 0, 1], J[:, 1, 0] = -20 * x[:, 0], 10.0, -1.0
        return r, J

    x, cost = batch_lsq.minimize(fun, np.array([[-1.2, 1.0], [0.5, 0.5]]), -10.0, 10.0)
    np.testing.assert_allclose(x, 1.0, atol=1e-8)
    assert np.all(cost < 1e-16)


def test_a_start_outside_the_box_is_refused():
    with pytest.raises(ValueError, match="within the bounds"):
        batch_lsq.minimize(_linear(np.ones((1, 1, 1)), np.ones((1, 1))), np.array([[2.0]]), 0.0, 1.0)
    with pytest.raises(ValueError, match="B x P"):
        batch_lsq.minimize(_linear(np.ones((1, 1, 1)), np.ones((1, 1))), np.array([0.5]), 0.0, 1.0)


# ------------------------------------------------------------------ throughput fits
def _observations(rng: np.random.Generator, truth: ThroughputParams, shapes, noise: float = 0.03):
    model = ThroughputModel(truth)
    out = []
    for K, N, m, s in shapes:
        t = float(model.iteration_time(K, N, m, s)) * float(np.exp(rng.normal(0, noise)))
        out.append((K, N, float(m), s, t))
    return tuple(out)


PROBLEMS_SHAPES = [
    [(1, 1, 64, 0)],
    [(1, 1, 64, 0), (2, 1, 64, 0), (4, 1, 48, 0)],
    [(1, 1, 32, 0), (4, 1, 64, 1), (8, 2, 64, 0), (16, 4, 32, 0)],
    [(2, 2, 128, 0), (6, 2, 100, 0), (12, 3, 80, 2)],
]


def _problems(seed: int = 0) -> list[FitProblem]:
    rng = np.random.default_rng(seed)
    truth = ThroughputParams(0.02, 0.002, 0.03, 0.004, 0.2, 0.01, 2.0)
    return [FitProblem(_observations(rng, truth, shapes), ThroughputPrior(), 64.0) for shapes in PROBLEMS_SHAPES]


def _objective(problem: FitProblem, params: ThroughputParams) -> float:
    """½‖r‖² of the fit at ``params`` (the coordinates inverted from the parameters)."""
    ag, bg, al, bl, an, bn, g = params.astuple()
    ref = problem.reference_batch
    c = ag + bg * ref
    f = ag / c
    x = np.array([np.log(c), np.log(f / (1 - f)), *np.log(np.array([al, bl, an, bn]) / c), g])
    return _cost(problem, x)


def _residuals(problem: FitProblem, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    obs = np.array(problem.observations, dtype=float)
    mean, sd = _prior_x(problem.prior)
    d = _FitData.of(obs[None, :, 0], obs[None, :, 1], obs[None, :, 3], obs[None, :, 2] / problem.reference_batch,
                    np.log(obs[None, :, 4]), np.zeros((1, len(obs)), bool), np.ones((1, len(obs))), mean[None],
                    sd[None], np.array([problem.prior.step_time_noise]))
    r, J = _fit_residuals(np.asarray(x, dtype=float)[None], d)
    return r[0], J[0]


def _cost(problem: FitProblem, x: np.ndarray) -> float:
    r, _ = _residuals(problem, x)
    return 0.5 * float(r @ r)


def test_the_batched_fit_is_at_least_as_good_as_scipys_least_squares_from_the_same_starts():
    span = _X_UPPER - _X_LOWER
    for problem in _problems():
        mean, _ = _prior_x(problem.prior)
        ours = fit_many([problem])[0]
        best = None
        for gamma in (mean[6], 1.0, 4.0):  # scipy's trust-region reflective method, tight, same starts
            x0 = np.r_[np.log(problem.observations[0][4]), mean[1:6], gamma]
            x0 = np.clip(x0, _X_LOWER + 1e-6 * span, _X_UPPER - 1e-6 * span)
            res = least_squares(lambda x: _residuals(problem, x)[0], x0, jac=lambda x: _residuals(problem, x)[1],
                                bounds=(_X_LOWER, _X_UPPER), xtol=1e-12, ftol=1e-12, gtol=1e-12)
            best = res if best is None or res.cost < best.cost else best
        assert _objective(problem, ours.params) <= best.cost + 1e-9


def test_a_fit_in_a_batch_is_the_fit_alone_to_rounding():
    problems = _problems(1)
    together = fit_many(problems)
    for problem, fit in zip(problems, together):
        alone = ThroughputModel.fit(problem.observations, problem.prior, problem.reference_batch)
        assert fit_many([problem])[0].params == alone.params  # deterministic
        np.testing.assert_allclose(alone.params.astuple(), fit.params.astuple(), rtol=1e-9)


def test_the_fit_recovers_the_model_it_was_measured_on():
    truth = ThroughputParams(0.02, 0.002, 0.03, 0.004, 0.2, 0.01, 2.0)
    shapes = [(K, N, m, 0) for K, N in ((1, 1), (2, 1), (4, 1), (8, 2), (16, 4)) for m in (32, 64, 128)]
    obs = _observations(np.random.default_rng(0), truth, shapes, noise=0.0)
    fit = ThroughputModel.fit(obs, ThroughputPrior(step_time_noise=0.01), 64.0)
    K, N, m, s, t = np.array(obs).T
    np.testing.assert_allclose(fit.iteration_time(K, N, m, s), t, rtol=0.01)


def test_prepared_fits_are_the_ones_model_makes_alone():
    jobs = _jobs()
    ready, alone = JobGoodput(), JobGoodput()
    ready.prepare(jobs)
    fitted = len(ready._fits)
    assert fitted >= 2
    for job in jobs:
        np.testing.assert_allclose(ready.model(job).throughput.params.astuple(),
                                   alone.model(job).throughput.params.astuple(), rtol=1e-9)
    assert len(ready._fits) == fitted  # prepare fitted them all: model() fitted nothing more


def _jobs():
    from rlsched.core.allocation import AllocJob, ProfileSample

    bounds = BatchBounds(128, 4096, 16, 256)
    out = []
    for i, samples in enumerate([
        [(1, 1, 128, 0, 0.30)],
        [(1, 1, 128, 0, 0.30), (2, 1, 64, 0, 0.18), (4, 1, 64, 0, 0.20)],
        [(4, 1, 128, 0, 0.35), (8, 2, 128, 0, 0.60)],
    ]):
        profile = tuple(ProfileSample(num_nodes=N, num_replicas=K, atomic_bsz=m, accum_steps=s, step_time=t,
                                      sync_time=0.0) for K, N, m, s, t in samples)
        out.append(AllocJob(id=f"j{i}", submit_time=0.0, application="app", age=600.0, attained_service=0.0,
                            num_restarts=0, allocation=(), target_replicas=None, target_batch_size=None,
                            min_replicas=1, max_replicas=16, bounds=bounds, profile=profile, grad_sqr=1.0,
                            grad_var=5.0 * (i + 1)))
    return out


# ------------------------------------------------------------------ batch searches
def test_optimize_many_answers_exactly_as_each_model_alone():
    rng = np.random.default_rng(5)
    models, Ks, Ns = [], [], []
    for i in range(12):
        params = ThroughputParams(*rng.uniform(0.001, 0.05, 6), float(rng.uniform(1, 5)))
        bounds = BatchBounds(int(rng.integers(32, 256)), int(rng.integers(512, 8192)), int(rng.integers(1, 16)),
                             None if i % 4 == 0 else int(rng.integers(64, 512)), accumulation=i % 3 != 0)
        eff = EfficiencyModel(bounds.init_batch, *([None, None] if i % 5 == 0 else [1.0, float(rng.uniform(10, 5000))]))
        models.append(GoodputModel(ThroughputModel(params), eff, bounds))
        K = np.arange(1, 33)
        Ks.append(K)
        Ns.append(np.where(K <= 4, 1, 2))
    together = optimize_many(models, Ks, Ns)
    for gm, K, N, got in zip(models, Ks, Ns, together):
        alone = GoodputModel(gm.throughput, gm.efficiency, gm.bounds).optimize_batch(K, N)
        for a, b in zip(alone, got):
            np.testing.assert_array_equal(a, b)
        assert gm.optimize_batch(3, 1) == GoodputModel(gm.throughput, gm.efficiency, gm.bounds).optimize_batch(3, 1)


def test_prepared_packed_columns_are_the_ones_packed_computes_alone():
    jobs = _jobs()
    ready, alone = JobGoodput(), JobGoodput()
    ready.prepare_packed(jobs, width=17, node_gpus=4)
    for job in jobs:
        a, _ = ready.packed(job, 17, 4)
        b, _ = alone.packed(job, 17, 4)
        np.testing.assert_array_equal(a, b)
        assert not a.flags.writeable


def test_params_of_round_trips_the_fitted_coordinates():
    mean, _ = _prior_x(ThroughputPrior())
    p = ThroughputParams(*_params_of(mean, 64.0))
    assert _objective(FitProblem(((1, 1, 64.0, 0, 1.0),), ThroughputPrior(), 64.0), p) == pytest.approx(
        _cost(FitProblem(((1, 1, 64.0, 0, 1.0),), ThroughputPrior(), 64.0), mean))
