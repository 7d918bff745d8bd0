"""The Ray engine (ray==2.60.0, installed by `make test`): the rollout pool on Ray actors
gives the process pool's results for the same seeds (PPO's RLPTO through ``run``,
MAPPO's DAS through ``map``), a tiny Ape-X run on a real local runtime, and the clear
errors when Ray is missing or does not start.

One local runtime, ``ray.init(num_cpus=2)``, serves the whole module; the engines use it
as it is (and leave it running). This module's own functions travel to the Ray workers
by value (the workers cannot import a test module)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import types

import numpy as np
import pytest
import torch

from rlsched.core import Topology
from rlsched.models import das, dqn
from rlsched.models import rlpto as R
from rlsched.models.cli import run
from rlsched.models.rollout import EngineUnavailable, RayRolloutPool, RayRuntime, RolloutPool, make_pool, task_seeds
from rlsched.sim.envs import EnvConfig, SchedulingCore
from rlsched.sim.job import JobSpec


@pytest.fixture(scope="module")
def ray_cpu2():
    import ray
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    yield ray
    ray.shutdown()


def _echo(task):
    return {"task": [task]}


def _seeded(payload, seed):
    return (payload, seed)


def small_workload(rng: np.random.Generator):
    """8 jobs of one or two 1-GPU workers, short or long, on 2 nodes of 2 GPUs."""
    topo = Topology.uniform(2, gpus_per_node=2)
    jobs = [JobSpec(id=f"j{k}", submit_time=float(10 * k), workers=int(rng.choice([1, 2])), duration=float(rng.choice([60.0, 900.0])))
            for k in range(8)]
    return jobs, topo


# ============================================================================ rollout pool
def test_map_and_run_on_ray_equal_the_process_pool(ray_cpu2):
    tasks = [1, 2, 3]
    with RolloutPool(0, seed=5) as p0, make_pool("ray", 2, seed=5) as pr:
        assert isinstance(pr, RayRolloutPool)
        assert pr.map(_echo, tasks) == p0.map(_echo, tasks) == [{"task": [t]} for t in tasks]
        for round_ in range(2):  # each call is a new round with new seeds, on both engines
            assert pr.run(_seeded, tasks) == p0.run(_seeded, tasks) == list(zip(tasks, task_seeds(5, 3, round_)))
    with pytest.raises(RuntimeError, match="after close"):
        pr.map(_echo, tasks)
    assert ray_cpu2.is_initialized()  # a runtime the pool did not start is left running


def test_ppo_rlpto_rollouts_on_ray_equal_the_process_pool(ray_cpu2):
    args = argparse.Namespace(hidden=8, step=1)
    torch.manual_seed(0)
    model = R._build(args)
    from rlsched.models.export import to_numpy_state

    payload = {"weights": to_numpy_state(R._actor_state(model)), "meta": R._meta(args), "episodes": 1, "nodes": [4],
               "betas": [0.001], "env": {"n_jobs": 3}}
    with RolloutPool(0, seed=7) as p0, RayRolloutPool(2, seed=7) as pr:
        a = p0.run(R.rollout, [payload, payload, payload])
        b = pr.run(R.rollout, [payload, payload, payload])
    assert a[0]["stats"] != a[1]["stats"]  # each task has its own seed
    for x, y in zip(a, b):
        assert x["stats"] == y["stats"]
        assert len(x["trajs"]) == len(y["trajs"]) > 0
        for tx, ty in zip(x["trajs"], y["trajs"]):
            assert tx.keys() == ty.keys()
            for k in tx:
                np.testing.assert_array_equal(np.asarray(tx[k]), np.asarray(ty[k]), err_msg=k)


def test_mappo_das_rollouts_on_ray_equal_the_process_pool(ray_cpu2):
    agent = das.DASAgent(SchedulingCore(small_workload, EnvConfig(window=8)).state_size(), 16, 2, 1, 8)
    env = {"window": 8, "fee_weight": 0.02, "time_scale": 3600.0, "workload": small_workload}
    arch = {**agent.ordering.architecture(), "lam": 0.5, "gp_noise": 1.0}
    tasks = [{"weights": agent.numpy_weights(), "arch": arch, "env": env, "seed": s, "episodes": 2} for s in (1, 2, 3)]
    with RolloutPool(0) as p0, RayRolloutPool(2) as pr:
        a = p0.map(das.collect_das, tasks)
        b = pr.map(das.collect_das, tasks)
    assert a[0]["reward"] != a[1]["reward"]
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert len(x[k]) == len(y[k]) > 0, k
            for u, v in zip(x[k], y[k]):
                np.testing.assert_array_equal(np.asarray(u), np.asarray(v), err_msg=k)


# ============================================================================ Ape-X
def test_replay_server_keeps_actor_priorities_and_drops_stale_updates():
    rs = dqn.ReplayServer(capacity=2, alpha=1.0, beta=0.4, seed=0)
    assert rs.add(0, 1, ["a", "b"], np.array([1.0, 3.0]), [{"episode_return": 1.0}]) is True
    eps = rs.replay.eps
    np.testing.assert_allclose(rs.replay.probabilities(), np.array([1.0 + eps, 3.0 + eps]) / (4.0 + 2 * eps))
    idx, ids, items, w = rs.sample(2, beta=1.0)
    assert items == [["a", "b"][i] for i in idx] and list(ids) == list(idx)
    rs.add(1, 2, ["c"], np.array([5.0]), [])  # overwrites slot 0: an update sampled before is dropped for it
    rs.update_priorities(np.array([0, 1]), np.array([0, 1]), np.array([9.0, 2.0]))
    np.testing.assert_allclose(rs.replay.tree.leaf(np.arange(2)), [5.0 + eps, 2.0 + eps])
    st = rs.stats()
    assert st["by_actor"] == {0: 2, 1: 1} and st["actor_version"] == {0: 1, 1: 2}
    assert st["priority_updates"] == 1 and st["priorities_changed"] == 1 and st["added"] == 3
    assert rs.latest(0) == (0, None)
    rs.publish(["ref"], 3)
    assert rs.latest(1) == (3, ["ref"]) and rs.latest(3) == (3, None)
    assert rs.take_episodes() == [{"episode_return": 1.0}] and rs.take_episodes() == []
    rs.stop()
    assert rs.add(0, 3, [], np.array([]), []) is False


def test_tiny_apex_run_on_ray(ray_cpu2, tmp_path):
    p = argparse.ArgumentParser()
    dqn.add_arguments(p)
    a = p.parse_args(["--engine", "ray", "--workers", "2", "--iterations", "3", "--updates-per-iter", "5", "--batch", "8",
                      "--warmup", "16", "--push-every", "8", "--sync-every", "10", "--publish-every", "2", "--target-every", "4",
                      "--runs-dir", str(tmp_path), "--run", "apex"])
    a.workload = small_workload
    assert dqn.train(a) == 0
    s = json.loads((tmp_path / "apex" / "apex.json").read_text())
    # the replay was filled by both actors, each exploring at its own epsilon
    assert sorted(s["by_actor"]) == ["0", "1"] and min(s["by_actor"].values()) > 0
    assert s["epsilons"] == pytest.approx([0.4, 0.4**8])
    assert s["transitions"] == sum(s["by_actor"].values()) >= 16
    # the learner made its updates, published weights, and the actors pulled them
    assert s["updates"] == 15
    assert s["weight_version"] == 1 + 15 // 2 + 1  # the initial weights, one per 2 updates, the final ones
    assert s["actor_versions"] == [s["weight_version"]] * 2
    # the learner's TD errors replaced actor-computed priorities
    assert s["priority_updates"] > 0 and s["priorities_changed"] > 0
    rows = (tmp_path / "apex" / "train.csv").read_text().splitlines()
    assert len(rows) == 1 + 3
    from rlsched.core.nn import load_policy_file

    w, meta = load_policy_file(tmp_path / "apex" / "model.safetensors", policy="dqn")
    assert meta["training"]["engine"] == "ray"
    assert ray_cpu2.is_initialized()


# ============================================================================ errors
def test_missing_ray_gives_the_install_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(EngineUnavailable, match=r"pip install 'rlsched\[ray\]'"):
        make_pool("ray", 2)
    # on the command line: one line, not a traceback, for the pool (RLPTO) and Ape-X (DQN)
    with pytest.raises(SystemExit, match=r"rlsched train dqn: .*rlsched\[ray\]"):
        run("train", "dqn", ["--engine", "ray", "--iterations", "0", "--runs-dir", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"rlsched train rlpto: .*rlsched\[ray\]"):
        run("train", "rlpto", ["--engine", "ray", "--runs-dir", str(tmp_path)])


def _fake_ray(init):
    return types.SimpleNamespace(is_initialized=lambda: False, init=init, shutdown=lambda: None)


def test_ray_runtime_is_sized_from_workers_without_dashboard(monkeypatch):
    calls = []
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(lambda **kw: calls.append(kw)))
    rt = RayRuntime(3)
    assert rt.owned
    assert calls == [{"address": "local", "num_cpus": 3, "include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False,
                      "configure_logging": True}]


def test_ray_that_fails_to_start_is_a_clear_error(monkeypatch):
    def init(**kw):
        raise ConnectionError("could not start the GCS server")

    monkeypatch.setitem(sys.modules, "ray", _fake_ray(init))
    with pytest.raises(EngineUnavailable, match=r"Ray failed to start a local runtime \(ConnectionError: could not start the GCS server\)"):
        make_pool("ray", 2)
