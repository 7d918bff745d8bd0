"""The RLPTO scaling environment: its workload's epoch-budget models (make_jobs), the
PettingZoo parallel API, and that it is the event engine deciding through the one call
(core's gang allocator: admission, reservation for the blocked head, the planner)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rlsched.core import make_placement, make_scaling
from rlsched.core.live_allocation import LiveAllocation
from rlsched.sim.convergence import ConvergenceModel
from rlsched.sim.engine import Simulator
from rlsched.sim.scaling_env import (OVERPROVISION, ScalingEnv, ScalingEnvConfig, ScalingJob, engine_config, make_jobs,
                                     scaling_allocator)

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
        env.reset(seed=seed)
        want = make_jobs(np.random.default_rng(seed), 16, budget=budget)
        assert {jid: j.max_epochs for jid, j in env.jobs.items()} == {j.id: j.max_epochs for j in want}
        assert {jid: env.sim.spec(jid).max_epochs for jid in env.jobs} == {j.id: j.max_epochs for j in want}
    # a fixed-epoch job trains exactly its budget
    env = ScalingEnv(ScalingEnvConfig(nodes=12, beta=0.0003, budget="recipe", stop="epochs"))
    env.reset(seed=seed)
    res = env.run_policy(make_scaling("fs"))
    assert res.epochs == {j.id: j.max_epochs for j in make_jobs(np.random.default_rng(seed), 16, budget="recipe")}


def test_unknown_budget_is_a_clear_error():
    with pytest.raises(ValueError, match=r"budget must be one of \('oracle', 'recipe'\), not 'guess'"):
        make_jobs(np.random.default_rng(0), 3, budget="guess")
    with pytest.raises(ValueError, match="budget must be one of"):
        ScalingEnvConfig(budget="Recipe")
    with pytest.raises(ValueError, match="overprovision"):
        make_jobs(np.random.default_rng(0), 3, budget="recipe", overprovision=(0.5, 2.0))


def test_parallel_api():
    from pettingzoo.test import parallel_api_test

    env = ScalingEnv(ScalingEnvConfig(nodes=6, beta=0.001, n_jobs=5, mean_interarrival=200.0))
    parallel_api_test(env, num_cycles=5000)
    assert env.done and set(env.possible_agents) == set(env.jobs)


def test_agents_join_when_they_start_and_leave_when_they_finish():
    env = ScalingEnv(ScalingEnvConfig(nodes=4, beta=0.001, n_jobs=6, mean_interarrival=600.0))
    obs, infos = env.reset(seed=11)
    seen, ended = set(env.agents), set()
    while env.agents:
        before = set(env.agents)
        obs, rew, term, trunc, infos = env.step({a: 1 for a in env.agents})
        assert set(obs) == set(rew) == set(term) == set(infos) == before | set(env.agents)
        assert not any(trunc.values())
        gone = {a for a, t in term.items() if t}
        assert gone.isdisjoint(env.agents) and before - gone <= set(env.agents)
        assert all(env.sim.job(a).start_time is not None for a in set(env.agents) - before)  # joined: started
        assert not (gone & ended) and not (set(env.agents) & ended)  # never revived
        ended |= gone
        seen |= set(env.agents)
        for a in env.agents:
            assert env.observation_space(a).contains(obs[a])
    assert ended == seen == set(env.jobs)


def test_the_env_is_the_engine_making_the_one_decision_call():
    """An episode run with a core scaling policy is the event engine's own run with core's
    gang allocator (FIFO, first fit, that policy answering its planner) through the one
    decision call, job for job: same starts, ends, epochs and resizes. The environment
    only hands the planner's questions to its agents."""
    for policy, stop in (("beta", "beta"), ("fs", "epochs")):
        cfg = ScalingEnvConfig(nodes=8, beta=0.0005, n_jobs=8, mean_interarrival=60.0, stop=stop)
        env = ScalingEnv(cfg)
        env.reset(seed=1_000_002)
        res = env.run_policy(make_scaling(policy))
        assert res.rescales > 0
        mine = sorted((r.id, r.start, r.end, r.epochs, r.rescales, r.workers) for r in env.sim.result().records)
        sim = Simulator([env.sim.spec(j) for j in env.jobs], cfg.topology(), placement=make_placement("firstfit"),
                        allocation=LiveAllocation(scaling_allocator(cfg, make_scaling(policy))),
                        seed=env.engine_seed, config=engine_config(cfg))
        ref = sorted((r.id, r.start, r.end, r.epochs, r.rescales, r.workers) for r in sim.run().records)
        assert mine == ref


def test_an_episode_closed_midway_stops_its_engine():
    env = ScalingEnv(ScalingEnvConfig(nodes=6, beta=0.001, n_jobs=5, mean_interarrival=200.0))
    env.reset(seed=4)
    env.step({a: 2 for a in env.agents})
    thread = env._thread
    assert thread.is_alive() and env.agents
    env.reset(seed=5)  # a new episode: the old engine is stopped, not left waiting
    assert not thread.is_alive() and env._thread.is_alive()
    env.close()
    assert env._thread is None and not thread.is_alive()


def test_an_error_in_the_engine_is_raised_by_the_step_that_met_it():
    class Broken:
        name = "broken"

        def place(self, job, state, workers=None):
            raise ZeroDivisionError("the placement's bug")

    env = ScalingEnv(ScalingEnvConfig(nodes=6, beta=0.001, n_jobs=5, mean_interarrival=200.0))
    env.reset(seed=4)
    env.sim.placement = Broken()  # the engine waits for the agents: nothing runs meanwhile
    with pytest.raises(RuntimeError, match="the engine failed: the placement's bug"):
        for _ in range(200):
            env.step({a: 2 for a in env.agents})
    assert env.done and not env._thread.is_alive()


def test_a_failing_policy_is_a_clear_error_and_stops_the_engine():
    class Broken:
        name = "broken"

        def decide(self, running, state):
            raise ZeroDivisionError("the policy's bug")

    env = ScalingEnv(ScalingEnvConfig(nodes=6, beta=0.001, n_jobs=5, mean_interarrival=200.0))
    env.reset(seed=4)
    with pytest.raises(ZeroDivisionError, match="the policy's bug"):
        env.step_policy(Broken())
    env.reset(seed=4)  # the environment is usable again
    assert env.run_policy(make_scaling("fs")).finish


def _head_blocking_jobs(with_blocker: bool):
    # a (1 worker, may grow to 3) runs alone; b needs all 3 nodes and arrives at t = 1
    curve = {"acc_max": 0.9, "acc0": 0.1, "tau": 6.0, "gamma": 0.0, "noise": 0.0}
    a = ScalingJob(id="a", submit_time=0.0, workers=1, min_workers=1, max_workers=3, compute_time=0.2, grad_gb=0.0,
                   samples_per_epoch=9600, max_epochs=8, convergence=curve)
    b = ScalingJob(id="b", submit_time=1.0, workers=3, min_workers=3, max_workers=3, compute_time=0.2, grad_gb=0.0,
                   samples_per_epoch=9600, max_epochs=2, convergence=curve)
    return [a, b] if with_blocker else [a]


def test_scale_ups_leave_the_blocked_heads_gpus():
    """FIFO admission, head-of-line: b waits for 3 free nodes while a runs on one. a asks
    +1 at every evaluation; the planner refuses (2 spare GPUs minus b's 3), as the
    operator does, so b starts the moment a ends. Without b, a grows."""
    env = ScalingEnv(ScalingEnvConfig(nodes=3, beta=0.001, n_jobs=2), jobs=_head_blocking_jobs(True))
    env.reset(seed=0)
    asked = 0
    while "a" in env.agents:
        _, _, _, _, infos = env.step({"a": 2})
        if "a" in env.agents:
            assert env.sim.job("a").workers == 1
            assert [v.id for v in env.sim.pending] == ["b"]
            asked += infos["a"]["decides"]
    assert asked >= 5
    res = env.run_policy(make_scaling("none"))
    assert res.finish["a"] == pytest.approx(8 * 60.0) and env.sim.result().records[1].start == res.finish["a"]
    alone = ScalingEnv(ScalingEnvConfig(nodes=3, beta=0.001, n_jobs=1), jobs=_head_blocking_jobs(False))
    alone.reset(seed=0)
    while alone.agents:
        alone.step({"a": 2})
    assert alone.result().rescales == 2 and alone.sim.job("a").workers == 3


def test_cluster_reward_sums_to_minus_the_sum_of_jcts_over_an_episode():
    """Hand case: a runs 8 one-minute epochs alone (ends at 480 s); b (submitted at 1 s)
    waits for all 3 nodes, then does 2 epochs at 3 x 160 samples/s, 20 s each (ends at
    520 s). Sum of JCTs 480 + 519 = 999 s: the episode's cluster rewards, over cycles and
    over the agents that share them, add up to -999/3600."""
    env = ScalingEnv(ScalingEnvConfig(nodes=3, beta=0.001, n_jobs=2, reward="cluster"), jobs=_head_blocking_jobs(True))
    env.reset(seed=0)
    total, per_cycle = 0.0, 0.0
    while env.agents:
        _, rew, _, _, _ = env.step({})
        total += sum(rew.values())
        per_cycle += env.last_cluster_reward
    res = env.result()
    assert res.finish == {"a": pytest.approx(480.0), "b": pytest.approx(520.0)}
    assert total == pytest.approx(-999.0 / 3600, abs=1e-12) and per_cycle == pytest.approx(-999.0 / 3600, abs=1e-12)
    # a generated workload under FS, several loads: exact to rounding
    for ia in (150.0, 600.0):
        env = ScalingEnv(ScalingEnvConfig(nodes=12, beta=0.0003, reward="cluster", mean_interarrival=ia))
        env.reset(seed=7)
        total = 0.0
        while env.agents:
            _, rew, _, _, _ = env.step_policy(make_scaling("fs"))
            total += sum(rew.values())
        res = env.result()
        assert len(res.finish) == 16
        assert total == pytest.approx(-res.mean_jct * 16 / 3600, rel=1e-9)
    with pytest.raises(ValueError, match="reward must be one of"):
        ScalingEnvConfig(reward="jct")


def _grower(restart_cost: float):
    curve = {"acc_max": 0.9, "acc0": 0.1, "tau": 6.0, "gamma": 0.0, "noise": 0.0}
    a = ScalingJob(id="a", submit_time=0.0, workers=1, min_workers=1, max_workers=2, compute_time=0.2, grad_gb=0.0,
                   samples_per_epoch=9600, max_epochs=4, convergence=curve)
    env = ScalingEnv(ScalingEnvConfig(nodes=2, beta=0.001, n_jobs=1, restart_cost=restart_cost), jobs=[a])
    env.reset(seed=0)  # the first decision that asks a: its epoch 1 ended at 60 s (160 samples/s)
    assert env.time == pytest.approx(60.0) and env.asked[0].id == "a"
    env.step({"a": 2})  # +1 at t = 60
    while env.agents:
        env.step({})
    return env.result()


def test_a_resize_costs_the_engines_restart():
    """+1 worker at 60 s: the 3 epochs left take 28 800 samples / 320 samples/s = 90 s
    after the restart, so the job ends at 150 s without a restart cost and at 180 s with
    the engine's 30 s; the GPUs are held (and billed) through the restart."""
    free, paid = _grower(0.0), _grower(30.0)
    assert free.finish["a"] == pytest.approx(150.0) and paid.finish["a"] == pytest.approx(180.0)
    assert paid.rescales == 1 and paid.gpu_seconds - free.gpu_seconds == pytest.approx(2 * 30.0)


def test_a_shrink_admits_the_waiting_job_at_the_next_decision():
    """a holds 2 of 3 nodes, b waits for 2 (FIFO head, blocked). a gives a worker back at
    its first evaluation (t = 60); the GPUs it frees go to b at the allocator's next
    decision (its interval, at 120 s), as the operator admits into GPUs a shrink frees."""
    curve = {"acc_max": 0.9, "acc0": 0.1, "tau": 6.0, "gamma": 0.0, "noise": 0.0}
    a = ScalingJob(id="a", submit_time=0.0, workers=2, min_workers=1, max_workers=3, compute_time=0.2, grad_gb=0.0,
                   samples_per_epoch=19200, max_epochs=20, convergence=curve)
    b = ScalingJob(id="b", submit_time=1.0, workers=2, min_workers=2, max_workers=2, compute_time=0.2, grad_gb=0.0,
                   samples_per_epoch=9600, max_epochs=5, convergence=curve)
    env = ScalingEnv(ScalingEnvConfig(nodes=3, beta=0.001, n_jobs=2), jobs=[a, b])
    obs, infos = env.reset(seed=0)  # a (2 x 160 samples/s) finished epoch 1 at 60 s; b arrived and waits
    assert env.time == pytest.approx(60.0) and [v.id for v in env.sim.pending] == ["b"] and infos["a"]["decides"]
    # the queue is in the observation: 2 GPUs of 3 are asked by the waiting job
    assert obs["a"][3] == pytest.approx(1 / 3) and obs["a"][10] == pytest.approx((2 / 3) / 2)
    env.step({"a": 0})  # -1 at t = 60
    assert env.sim.job("a").workers == 1
    assert env.sim.job("b").start_time == pytest.approx(120.0)
    assert set(env.agents) == {"a", "b"} and not env.sim.pending


def test_views_carry_what_each_job_reported_and_nothing_else():
    """s and x come from the job's own reports through core (the operator's path):
    speed-up from a model fitted to the step times it reported, efficiency from its
    reported noise scale, as the planner shows each job it asks."""
    env = ScalingEnv(ScalingEnvConfig(nodes=12, beta=0.0003))
    env.reset(seed=3)
    checked = 0
    for _ in range(40):
        for v in env.asked:
            assert v.observations is not None  # a job is asked after an evaluation, which it reported
            w = v.workers
            s, x = v.observations.marginal(w, v.gpus_per_worker, env.cluster.max_gpus, local_batch=v.local_batch)
            assert (v.speedup, v.stat_efficiency) == (s, x)
            true = env.sim.ideal_throughput(v.id, w + 1) / env.sim.ideal_throughput(v.id, w)
            assert v.speedup == pytest.approx(true, rel=0.2) and v.speedup > 1
            conv, _ = env.sim.training_curve(v.id)  # the reported noise scale is the curve's
            assert v.stat_efficiency == pytest.approx(conv.efficiency(w + 1) / conv.efficiency(w))
            checked += 1
        env.step_policy(make_scaling("fs"))
    assert checked >= 10
