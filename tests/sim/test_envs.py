"""Contract tests of the RL environments (Gymnasium and PettingZoo)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from pettingzoo.test import parallel_api_test

from rlsched.core import Topology
from rlsched.sim.envs import ENV_ID, DualAgentSchedulingEnv, EnvConfig, SchedulingCore, SchedulingEnv
from rlsched.sim.job import JobSpec


def small_workload(rng: np.random.Generator):
    """12 fixed-duration jobs on 4 nodes x 4 GPUs in 2 racks."""
    topo = Topology.uniform(4, gpus_per_node=4, racks=2)
    jobs, t = [], 0.0
    for k in range(12):
        t += float(rng.exponential(300))
        jobs.append(
            JobSpec(
                id=f"j{k}",
                submit_time=t,
                workers=int(rng.choice([1, 1, 2, 4])),
                gpus_per_worker=int(rng.choice([1, 2, 4])),
                duration=float(rng.lognormal(7, 1)),
                grad_gb=0.5,
            )
        )
    return jobs, topo


def test_gymnasium_env_checker():
    check_env(SchedulingEnv(small_workload), skip_render_check=True)


def test_registered_id_makes_the_env():
    env = gym.make(ENV_ID, workload=small_workload)
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    assert info["action_mask"].any()


def test_pettingzoo_parallel_api():
    parallel_api_test(DualAgentSchedulingEnv(small_workload), num_cycles=300)


def _run_gym(seed: int, policy=lambda mask: int(np.flatnonzero(mask)[0])):
    env = SchedulingEnv(small_workload)
    obs, info = env.reset(seed=seed)
    rewards, actions = [], []
    while True:
        a = policy(info["action_mask"])
        actions.append(a)
        obs, r, term, trunc, info = env.step(a)
        rewards.append(r)
        if term or trunc:
            return env, rewards, actions


def test_same_seed_same_episode_other_seed_differs():
    _, r1, _ = _run_gym(5)
    _, r2, _ = _run_gym(5)
    _, r3, _ = _run_gym(6)
    assert r1 == r2
    assert r1 != r3


def test_return_is_minus_total_jct_and_fee():
    env, rewards, _ = _run_gym(11)
    res = env.core.sim.result()
    assert len(res.records) == 12 and not res.unfinished
    cfg = env.config
    jct = sum(r.jct for r in res.records)
    fee = sum(r.fee for r in res.records)
    assert sum(rewards) == pytest.approx(-jct / cfg.time_scale - cfg.fee_weight * fee, rel=1e-9)


def test_every_decision_starts_a_fitting_job_and_mask_is_honest():
    env = SchedulingEnv(small_workload)
    _, info = env.reset(seed=2)
    p = len(env.config.placements)
    while True:
        mask = info["action_mask"]
        assert mask.any()
        slot = int(np.flatnonzero(mask)[-1]) // p
        job = env.core.window_jobs()[slot]
        _, _, term, _, info = env.step(int(np.flatnonzero(mask)[-1]))
        assert job.start_time is not None
        assert not info["invalid_action"]
        assert len(job.placement) == job.workers
        assert (env.core.sim.state.free >= 0).all()
        if term:
            break


def test_invalid_action_is_replaced_and_flagged():
    env = SchedulingEnv(small_workload)
    _, info = env.reset(seed=4)
    bad = int(np.flatnonzero(info["action_mask"] == 0)[0])
    _, _, _, _, info = env.step(bad)
    assert info["invalid_action"]


def test_dual_agent_turns_and_scores_place_on_best_nodes():
    env = DualAgentSchedulingEnv(small_workload)
    obs, _ = env.reset(seed=7)
    assert obs["ordering"]["my_turn"][0] == 1 and obs["placement"]["my_turn"][0] == 0
    slot = int(np.flatnonzero(obs["ordering"]["action_mask"])[0])
    obs, rew, *_ = env.step({"ordering": slot, "placement": np.zeros(4, np.float32)})
    assert rew["ordering"] == 0.0 and obs["placement"]["my_turn"][0] == 1
    job = env.core.window_jobs()[slot]
    scores = np.array([0.0, 0.0, 0.0, 5.0], dtype=np.float32)  # prefer the last node
    env.step({"ordering": 0, "placement": scores})
    assert job.placement[0] == 3
    s = env.state()
    assert env.state_space.contains(s)


def test_place_by_scores_fills_racks_then_nodes_in_score_order():
    core = SchedulingCore(small_workload, EnvConfig(window=4))
    core.reset(0)
    job = core.window_jobs()[0]
    # racks: {0, 1} and {2, 3}; rack 0 holds the best node (1), so node 0 comes before 2
    nodes = core.place_by_scores(job, np.array([0.0, 3.0, 2.0, 1.0]))
    per = 4 // job.gpus_per_worker
    expect = ([1] * per + [0] * per + [2] * per + [3] * per)[: job.workers]
    assert nodes == expect


def _first_fit_agent(core: SchedulingCore) -> None:
    """Start the oldest window job that fits, first fit, until the episode ends."""
    while not core.done:
        slot = int(np.flatnonzero(core.mask())[0])
        core.start(slot, core.place_by_policy(core.window_jobs()[slot], "firstfit"))


def test_env_decisions_go_through_the_engines_cycle_and_match_its_own_run():
    """The env only translates: an agent starting the oldest job that fits, first fit,
    gives exactly the episode of the engine's own FIFO + backfill run (the window holds
    every waiting job here), as every start is the engine's one allocator call (core's
    gang allocator) over the agent's pick."""
    from rlsched.core import make_ordering, make_placement
    from rlsched.sim import SimConfig, Simulator

    for seed in (0, 3):
        core = SchedulingCore(small_workload, EnvConfig(window=16))
        core.reset(seed)
        alloc = core.sim.allocation.allocator
        assert alloc.ordering is core.turn and alloc.placement is core.turn
        _first_fit_agent(core)
        jobs, topo = small_workload(np.random.default_rng(seed))
        ref = Simulator(jobs, topo, ordering=make_ordering("fifo"), placement=make_placement("firstfit"),
                        seed=0, config=SimConfig(backfill=True, record_series=False, decision_gap=0)).run()
        got = {r.id: (r.start, r.end, r.level) for r in core.sim.result().records}
        want = {r.id: (r.start, r.end, r.level) for r in ref.records}
        assert got == want and len(got) == 12
        # the fee is summed over event times, and the allocator's interval adds some
        fees = {r.id: r.fee for r in ref.records}
        assert all(r.fee == pytest.approx(fees[r.id], rel=1e-12) for r in core.sim.result().records)


def test_highest_job_preempts_in_the_env_as_live():
    """One node of 8 GPUs. A (normal, 100 s) is the agent's pick at t=0. B (highest,
    20 s) arrives at t=10 and does not fit: the cycle, with no agent decision, evicts A
    to the interrupt queue and starts B (10-30). At t=30 A is the agent's only choice
    again: it resumes with the 30 s restart and its 90 s left, ending at 150."""
    jobs = [JobSpec(id="A", submit_time=0, gpus_per_worker=8, duration=100),
            JobSpec(id="B", submit_time=10, gpus_per_worker=8, duration=20, priority_class="highest")]
    core = SchedulingCore(lambda _rng: (jobs, Topology.uniform(1, 8)), EnvConfig(window=4))
    core.reset(0)
    assert [j.id for j in core.window_jobs()] == ["A"]
    core.start(0, [0])
    assert core.sim.now == 30.0 and [j.id for j in core.window_jobs()] == ["A"]  # B ran 10-30 meanwhile
    assert core.sim.job("A").queue == "interrupt"
    core.start(0, [0])
    assert core.done and core.decisions == 2
    r = {x.id: x for x in core.sim.result().records}
    assert (r["A"].start, r["A"].end, r["A"].preemptions) == (0.0, 150.0, 1)
    assert (r["B"].start, r["B"].end, r["B"].preemptions) == (10.0, 30.0, 0)


def test_start_refuses_a_pick_the_cycle_cannot_start_and_keeps_the_job():
    """Two nodes of 4 GPUs, a gang of 2 workers x 4 GPUs (1 to 2 workers): both workers
    on node 0 cannot start, a third worker is outside its bounds; the job keeps waiting
    as it was, and the same job then starts on nodes 0 and 1."""
    jobs = [JobSpec(id="A", submit_time=0, workers=2, min_workers=1, max_workers=2, gpus_per_worker=4, duration=50)]
    core = SchedulingCore(lambda _rng: (jobs, Topology.uniform(2, 4)), EnvConfig(window=4))
    core.reset(0)
    job = core.window_jobs()[0]
    with pytest.raises(ValueError, match="not the gang of 2"):
        core.start(0, [0, 1, 1])
    with pytest.raises(ValueError, match="could not start"):
        core.start(0, [0, 0])
    assert job.start_time is None and job.workers == 2 and job in core.sim.pending
    assert core.sim.state.free.tolist() == [4, 4] and core.decisions == 0
    core.start(0, [1, 0])
    assert core.done and core.sim.result().records[0].end == 50.0
