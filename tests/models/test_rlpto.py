"""RLPTO: environment dynamics and reward on hand-computed cases (the simulator engine's
clock, throughput and restart cost), the served policy, its fallback, and a smoke
training run that must move the policy."""

import math

import numpy as np
import pytest
import torch

from rlsched.core import make_scaling
from rlsched.core.learned import RLPTO_FEATURES, RLPTOScaling, rlpto_observation
from rlsched.models import rlpto as R
from rlsched.models.cli import run
from rlsched.sim.scaling_env import K_W, ScalingEnv, ScalingEnvConfig, ScalingJob, make_jobs

CURVE = {"acc_max": 0.9, "acc0": 0.1, "tau": 6.0, "gamma": 0.0, "noise": 0.0, "seed": 0}


def one_job(**kw):
    # 1 worker: 32 samples / 0.2 s = 160 samples/s -> 9600 samples per 60 s = one epoch
    base = dict(id="a", submit_time=0.0, workers=1, min_workers=1, max_workers=3, compute_time=0.2, grad_gb=0.0,
                samples_per_epoch=9600, max_epochs=50, convergence=CURVE)
    base.update(kw)
    return ScalingJob(**base)


def test_reward_is_rlpto_formula_on_a_hand_case():
    env = ScalingEnv(ScalingEnvConfig(nodes=2, beta=0.0003, n_jobs=1), jobs=[one_job()])
    obs, infos = env.reset(seed=0)
    assert list(obs) == ["a"] and env.agents == ["a"] and env.possible_agents == ["a"]
    assert infos["a"]["decides"] and env.time == 60.0  # first asked after its first evaluation
    _, rew, term, trunc, infos = env.step({"a": 1})  # keep 1 worker; epoch 2 at t = 120
    va = 0.8 * (math.exp(-1 / 6) - math.exp(-2 / 6))  # accuracy gained in the second epoch
    assert rew["a"] == pytest.approx(va + 1.0 * 1 * K_W, abs=1e-12)  # v_a > beta0: + T w k_w
    assert not term["a"] and not trunc["a"] and infos["a"]["decides"] and env.time == 120.0
    # +1 worker: the engine charges its 30 s restart, then 2 workers (no communication,
    # gamma 0) do the other 30 s at 320 samples/s: one epoch in this step, not two
    _, rew, _, _, infos = env.step({"a": 2})
    v = env.sim.job("a")
    assert v.workers == 2 and v.progress.epoch == 3 and infos["a"]["epoch"] == 3 and env.time == 180.0
    va3 = 0.8 * (math.exp(-2 / 6) - math.exp(-3 / 6))
    assert rew["a"] == pytest.approx(va3 + 1.0 * 2 * K_W, abs=1e-12)  # 2 workers held for 1 minute
    # beta0 above any gain: the worker term turns into a cost
    env2 = ScalingEnv(ScalingEnvConfig(nodes=2, beta=0.0003, beta0=1.0, n_jobs=1), jobs=[one_job()])
    env2.reset(seed=0)
    _, rew, _, _, _ = env2.step({"a": 1})
    assert rew["a"] == pytest.approx(va - K_W, abs=1e-12)


def test_beta_rule_and_epoch_budget_stop_at_hand_computed_times():
    # beta = 1: every gain after the first evaluation is below it -> patience 3 -> epoch 4
    env = ScalingEnv(ScalingEnvConfig(nodes=1, beta=1.0, n_jobs=1), jobs=[one_job()])
    env.reset(seed=0)
    while env.agents:
        _, _, term, _, _ = env.step({"a": 1})
    assert term == {"a": True} and env.done
    res = env.result()
    assert res.epochs["a"] == 4
    assert res.total_time == pytest.approx(240.0)
    assert res.mean_accuracy == pytest.approx(0.9 - 0.8 * math.exp(-4 / 6))
    # the traditional stop ignores beta and trains the full budget
    env = ScalingEnv(ScalingEnvConfig(nodes=1, beta=1.0, n_jobs=1, stop="epochs"), jobs=[one_job(max_epochs=6)])
    env.reset(seed=0)
    res = env.run_policy(make_scaling("none"))
    assert res.epochs["a"] == 6 and res.total_time == pytest.approx(360.0)


def test_actions_respect_bounds_capacity_and_one_decision_per_evaluation():
    jobs = [one_job(id="a", workers=2), one_job(id="b", submit_time=0.0, workers=1)]
    env = ScalingEnv(ScalingEnvConfig(nodes=3, n_jobs=2), jobs=jobs)
    _, infos = env.reset(seed=0)  # admitted at t = 0; first asked at the 60 s decision
    assert env.time == 60.0 and env.cluster.free_gpus == 0 and env.agents == ["a", "b"]
    assert infos["a"]["decides"] and infos["b"]["decides"]  # a at epoch 2, b at epoch 1
    assert [v.id for v in env.asked] == ["a", "b"]
    _, _, _, _, infos = env.step({"a": 2, "b": 2})  # no free node: +1 is a no-op
    assert env.sim.job("a").workers == 2 and env.sim.job("b").workers == 1
    assert env.time == 120.0 and [v.id for v in env.asked] == ["a", "b"]
    _, _, _, _, infos = env.step({"a": 0, "b": 0})  # b is at min_workers: stays; a gives one back
    assert env.sim.job("a").workers == 1 and env.sim.job("b").workers == 1
    assert env.cluster.free_gpus == 1
    # a lost 30 s to the restart: half an epoch at 1 worker by t = 180, no new evaluation,
    # so its +1 is not acted on although a node is free
    assert env.time == 180.0 and not infos["a"]["decides"] and infos["b"]["decides"]
    assert [v.id for v in env.asked] == ["b"]
    env.step({"a": 2})
    assert env.sim.job("a").workers == 1
    with pytest.raises(ValueError, match="0, 1 or 2"):
        env.step({"a": 3})


NEW = dict(speedup=0.0, stat_efficiency=0.0, rank=0.0, queued_gpus=0.0, total_gpus=12)


def test_observation_encoding():
    o = rlpto_observation(free=3, total=12, epoch=7, loss=0.5, max_loss=2.0, pending=4, accuracy=0.8, gain=0.0006,
                          beta=0.0003, workers=4, speedup=1.25, stat_efficiency=0.9, rank=0.5, queued_gpus=6,
                          total_gpus=12)
    np.testing.assert_allclose(o, [0.25, 0.07, 0.25, 4 / 12, 0.8, 0.2, 0.25, 0.25, 0.9, 0.5, 0.25], atol=1e-7)
    first = rlpto_observation(free=0, total=12, epoch=1, loss=float("nan"), max_loss=float("nan"), pending=0,
                              accuracy=0.1, gain=float("inf"), beta=0.0003, workers=1, **NEW)
    assert first[2] == 1.0 and first[5] == 1.0
    # unknown speed-up and efficiency (nobody measured them): no gain, full efficiency
    assert first[7] == 0.0 and first[8] == 1.0


def test_make_jobs_budget_reaches_convergence():
    jobs = make_jobs(np.random.default_rng(3), 5)
    assert [j.id for j in jobs] == [f"job-00{k}" for k in range(5)]
    assert jobs[0].submit_time == 0 and all(a.submit_time <= b.submit_time for a, b in zip(jobs, jobs[1:]))
    from rlsched.sim.convergence import ConvergenceModel

    for j in jobs:
        m = ConvergenceModel(j.samples_per_epoch, **j.convergence)
        gap = m.acc_max - m.accuracy(j.max_epochs * j.samples_per_epoch, j.workers)
        assert 0 <= gap <= 0.001


def _tiny_train(tmp_path, *extra):
    argv = ["--iterations", "4", "--episodes", "2", "--workers", "0", "--nodes", "4", "--n-jobs", "3", "--betas", "0.001",
            "--val-every", "100", "--val-seeds", "1", "--minibatch", "256", "--lr", "3e-3", "--runs-dir", str(tmp_path),
            "--run", "out", *extra]
    assert run("train", "rlpto", argv) == 0
    return tmp_path / "out" / "model.safetensors"


def test_smoke_training_learns_that_plus_one_costs(tmp_path):
    # k_w huge and beta0 above any gain: every worker-minute costs 1.0, and a resize holds
    # the job's workers idle for 10 minutes, so growing is wrong
    w = _tiny_train(tmp_path, "--k-w", "1.0", "--beta0", "10", "--restart-cost", "600", "--iterations", "8", "--seed", "1")
    pol = RLPTOScaling(path=w)
    assert pol.fallback_reason is None
    rng = np.random.default_rng(0)
    obs = np.stack([rlpto_observation(free=rng.integers(0, 4), total=4, epoch=rng.integers(1, 30), loss=1.0, max_loss=2.3,
                                      pending=0, accuracy=rng.uniform(0.2, 0.9), gain=rng.uniform(0, 0.01),
                                      beta=0.001, workers=rng.integers(1, 4), speedup=rng.uniform(1.0, 1.5),
                                      stat_efficiency=rng.uniform(0.9, 1.0), rank=rng.uniform(), queued_gpus=0,
                                      total_gpus=4) for _ in range(64)])
    z = pol._actor.logits(obs)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    # the initial policy is uniform to within 1% (last layer scaled by 0.01)
    assert p[:, 2].mean() < 0.2
    log = (tmp_path / "out" / "train.csv").read_text().splitlines()
    assert len(log) == 9


def test_exported_actor_numpy_equals_torch(tmp_path):
    import argparse

    args = argparse.Namespace(hidden=16, step=1)
    torch.manual_seed(0)
    model = R._build(args)
    from rlsched.models.export import export_policy

    m = R._meta(args)
    path = tmp_path / "rlpto.safetensors"
    export_policy(path, R._actor_state(model), policy="rlpto", version="1", observation=m["observation"],
                  architecture=m["architecture"], training={}, trained_on={})
    pol = RLPTOScaling(path=path)
    x = torch.randn(32, len(RLPTO_FEATURES)) * 2
    with torch.no_grad():
        ref = model.actor(x).numpy()
    np.testing.assert_allclose(pol._actor.logits(x.numpy()), ref, atol=1e-5)


def test_fallback_to_fs_beta_on_missing_or_corrupt_file(tmp_path):
    missing = RLPTOScaling(path=tmp_path / "none.safetensors")
    assert missing.fallback_reason and "not found" in missing.fallback_reason and "'fs'" in missing.fallback_reason
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"junk")
    bad.with_suffix(".json").write_text('{"format": "rlsched-policy/1", "policy": "rlpto"}')
    corrupt = RLPTOScaling(path=bad)
    assert corrupt.fallback_reason and "corrupt" in corrupt.fallback_reason
    # it decides exactly like FS (FS+beta: the planner applies the β stop) on the same snapshot
    env = ScalingEnv(ScalingEnvConfig(nodes=6, beta=0.001, n_jobs=4))
    env.reset(seed=5)
    fs = make_scaling("fs")
    for _ in range(30):
        assert corrupt.decide(env.running(), env.cluster) == fs.decide(env.running(), env.cluster)
        env.step_policy(fs)


def test_committed_policy_loads_and_decides_within_bounds():
    pol = make_scaling("rlpto")
    if pol.fallback_reason:
        pytest.skip(f"no committed weights: {pol.fallback_reason}")
    assert pol.metadata["policy"] == "rlpto"
    env = ScalingEnv(ScalingEnvConfig(nodes=12, beta=0.0003))
    env.reset(seed=123)
    for _ in range(60):
        before = env.cluster.free.copy()
        d = pol.decide(env.running(), env.cluster)
        np.testing.assert_array_equal(env.cluster.free, before)  # decide leaves the snapshot as it was
        grow = sum(v for v in d.values() if v > 0)
        shrink = -sum(v for v in d.values() if v < 0)
        assert grow <= env.cluster.free_gpus + shrink
        for jid, delta in d.items():
            v = env.cluster.running[jid]
            assert v.min_workers <= v.workers + delta <= v.max_workers
        env.step_policy(pol)
        if env.done:
            break


def test_slaq_baseline_fills_the_cluster_by_loss_reduction():
    env = ScalingEnv(ScalingEnvConfig(nodes=8, n_jobs=3, mean_interarrival=1.0))
    env.reset(seed=2)
    while len(env.cluster.running) < 3:
        env.step({})
    slaq = R.SLAQScaling(env)
    d = slaq.decide(env.running(), env.cluster)
    after = {j.id: j.workers + d.get(j.id, 0) for j in env.running()}
    assert sum(after.values()) == 8  # every slot handed out (max_workers 8 each)
    # greedy optimality: no single move from one job to another raises the total reduction
    tot = lambda a: sum(slaq._reduction(k, w) for k, w in a.items())  # noqa: E731
    for x in after:
        for y in after:
            if x != y and after[x] > 1:
                moved = dict(after, **{x: after[x] - 1, y: after[y] + 1})
                assert tot(moved) <= tot(after) + 1e-12


def test_config_file_sets_defaults_and_rejects_unknown_keys(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("iterations: 1\nepisodes: 1\nworkers: 0\nnodes: [3]\nn-jobs: 2\nval_every: 1\nval-seeds: 1\n"
                   f"runs-dir: {tmp_path}\nrun: w\nbetas: [0.001]\n")
    assert run("train", "rlpto", ["--config", str(cfg), "--seed", "3"]) == 0
    meta = RLPTOScaling(path=tmp_path / "w" / "model.safetensors").metadata
    assert meta["training"]["iterations"] == 1 and meta["training"]["seed"] == 3
    assert meta["trained_on"]["nodes"] == [3]
    bad = tmp_path / "bad.yaml"
    bad.write_text("iterashuns: 3\n")
    with pytest.raises(SystemExit):
        run("train", "rlpto", ["--config", str(bad)])


def test_rollout_pool_results_do_not_depend_on_worker_count():
    import argparse

    from rlsched.models.export import to_numpy_state
    from rlsched.models.rollout import RolloutPool

    args = argparse.Namespace(hidden=8, step=1)
    torch.manual_seed(0)
    model = R._build(args)
    payload = {"weights": to_numpy_state(R._actor_state(model)), "meta": R._meta(args), "episodes": 1, "nodes": [4],
               "betas": [0.001], "env": {"n_jobs": 3}}
    with RolloutPool(workers=0, seed=7) as p0:
        a = p0.run(R.rollout, [payload, payload])
    with RolloutPool(workers=2, seed=7) as p2:
        b = p2.run(R.rollout, [payload, payload])
    assert a[0]["stats"] != a[1]["stats"]  # each task has its own seed
    for x, y in zip(a, b):
        assert x["stats"] == y["stats"]
        for tx, ty in zip(x["trajs"], y["trajs"]):
            np.testing.assert_array_equal(tx["act"], ty["act"])


def test_budget_flag_reaches_training_evaluation_and_metadata(tmp_path):
    import json

    from rlsched.models.cli import build_algo_parser

    args = build_algo_parser("train", "rlpto", R).parse_args(["--budget", "recipe"])
    assert R._env_for(R._env_cfg(args), 4, 0.001).config.budget == "recipe"
    assert build_algo_parser("train", "rlpto", R).parse_args([]).budget == "oracle"  # old results stay reproducible
    with pytest.raises(SystemExit):
        run("eval", "rlpto", ["--budget", "guess"])
    w = _tiny_train(tmp_path, "--budget", "recipe")
    meta = RLPTOScaling(path=w).metadata
    assert meta["training"]["budget"] == "recipe" and meta["trained_on"]["budget"].startswith("recipe")
    res = tmp_path / "res"
    argv = ["--model", str(w), "--budget", "recipe", "--results", str(res), "--policies", "RLPTO", "FS", "FS+beta",
            "--nodes", "4", "--n-jobs", "3", "--betas", "0.001", "--eval-seeds", "2", "--workers", "0"]
    assert run("eval", "rlpto", argv) == 0
    assert "--budget recipe" in (res / "rlpto_tables_recipe.md").read_text()
    assert (res / "rlpto_eval_episodes_recipe.csv").is_file() and not (res / "rlpto_tables_oracle.md").exists()
    summary = json.loads((res / "rlpto_tables_recipe.json").read_text())
    assert summary["budget"] == "recipe"
    h = summary["headline"]["4nodes_beta0.001"]
    c = summary["cells"]
    assert h["fs_beta_sum_jct_vs_fs_pct"] == pytest.approx(100 * (c["FS+beta|4|0.001"]["sum_jct_h"] / c["FS|4|0.001"]["sum_jct_h"] - 1))
    # the decomposition multiplies back: (RLPTO/FS) = (FS+beta/FS) * (RLPTO/FS+beta)
    assert 1 + h["sum_jct_vs_fs_pct"] / 100 == pytest.approx(
        (1 + h["fs_beta_sum_jct_vs_fs_pct"] / 100) * (1 + h["sum_jct_vs_fs_beta_pct"] / 100))
    ev = RLPTOScaling(path=w).metadata["evaluation"]["rlpto_tables_recipe"]
    assert ev["budget"].startswith("recipe") and ev["vs_fs"]["4nodes_beta0.001"] == h
