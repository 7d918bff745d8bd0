"""The epoch-budget models of the RLPTO scaling environment's workload (make_jobs)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rlsched.core import make_scaling
from rlsched.sim.convergence import ConvergenceModel
from rlsched.sim.scaling_env import OVERPROVISION, ScalingEnv, ScalingEnvConfig, make_jobs

# make_jobs(default_rng(3), 16) before the budget parameter existed (commit 6614f21):
# the "oracle" model must keep giving exactly these jobs
ORACLE_SEED3_EPOCHS = [56, 24, 51, 53, 45, 28, 30, 51, 55, 50, 27, 65, 43, 26, 47, 37]
ORACLE_SEED3_SUBMIT = [0.0, 30.778, 185.583, 453.91, 1100.971]
ORACLE_SEED3_LAST = (643419028, 52805, 2)  # convergence seed, samples per epoch, workers of job-015


def _without_budget(job):
    return dataclasses.replace(job, max_epochs=0)


def test_oracle_budget_is_the_workload_of_before():
    jobs = make_jobs(np.random.default_rng(3), 16, budget="oracle")
    assert [j.max_epochs for j in jobs] == ORACLE_SEED3_EPOCHS
    assert [round(j.submit_time, 3) for j in jobs[:5]] == ORACLE_SEED3_SUBMIT
    last = jobs[-1]
    assert (last.convergence["seed"], last.samples_per_epoch, last.workers) == ORACLE_SEED3_LAST
    assert make_jobs(np.random.default_rng(3), 16) == jobs  # oracle stays the default


def test_recipe_budget_over_provisions_the_same_jobs_reproducibly():
    lo, hi = OVERPROVISION
    for seed in (3, 1_000_000, 1_000_007):
        oracle = make_jobs(np.random.default_rng(seed), 16, budget="oracle")
        recipe = make_jobs(np.random.default_rng(seed), 16, budget="recipe")
        # same jobs (arrivals, sizes, curves); only the user's epoch budget differs
        assert [_without_budget(j) for j in recipe] == [_without_budget(j) for j in oracle]
        for o, r in zip(oracle, recipe):
            assert o.max_epochs <= r.max_epochs <= math.ceil(o.max_epochs * hi)
            assert r.max_epochs >= math.ceil(o.max_epochs * lo)
        assert sum(r.max_epochs for r in recipe) > 1.2 * sum(o.max_epochs for o in oracle)
        assert make_jobs(np.random.default_rng(seed), 16, budget="recipe") == recipe
    a = make_jobs(np.random.default_rng(11), 16, budget="recipe")
    b = make_jobs(np.random.default_rng(12), 16, budget="recipe")
    assert [j.max_epochs for j in a] != [j.max_epochs for j in b]
    # factors are drawn from the Generator passed in: a fixed range pins the budget exactly
    fixed = make_jobs(np.random.default_rng(3), 16, budget="recipe", overprovision=(2.0, 2.0))
    assert [j.max_epochs for j in fixed] == [math.ceil(2.0 * e) for e in ORACLE_SEED3_EPOCHS]


def test_recipe_budget_is_past_convergence_so_fixed_epochs_over_train():
    jobs = make_jobs(np.random.default_rng(5), 16, budget="recipe", overprovision=(1.5, 1.5))
    for j in jobs:
        m = ConvergenceModel(j.samples_per_epoch, **j.convergence)
        # at 1.5x the oracle budget the curve is flat: the last third gains < 0.1 points
        gained = m.accuracy(j.max_epochs * j.samples_per_epoch, j.workers) - m.accuracy(
            math.ceil(j.max_epochs / 1.5) * j.samples_per_epoch, j.workers)
        assert 0 <= gained <= 0.001


def test_env_config_selects_the_budget():
    seed = 1_000_003
    for budget in ("oracle", "recipe"):
        env = ScalingEnv(ScalingEnvConfig(nodes=12, beta=0.0003, budget=budget, stop="epochs"))
        env.reset(seed)
        want = make_jobs(np.random.default_rng(seed), 16, budget=budget)
        assert {jid: r.spec.max_epochs for jid, r in env.runs.items()} == {j.id: j.max_epochs for j in want}
    # a fixed-epoch job trains exactly its budget
    env = ScalingEnv(ScalingEnvConfig(nodes=12, beta=0.0003, budget="recipe", stop="epochs"))
    env.reset(seed)
    res = env.run_policy(make_scaling("fs"))
    assert res.epochs == {j.id: j.max_epochs for j in make_jobs(np.random.default_rng(seed), 16, budget="recipe")}


def test_unknown_budget_is_a_clear_error():
    with pytest.raises(ValueError, match=r"budget must be one of \('oracle', 'recipe'\), not 'guess'"):
        make_jobs(np.random.default_rng(0), 3, budget="guess")
    with pytest.raises(ValueError, match="budget must be one of"):
        ScalingEnvConfig(budget="Recipe")
    with pytest.raises(ValueError, match="overprovision"):
        make_jobs(np.random.default_rng(0), 3, budget="recipe", overprovision=(0.5, 2.0))
