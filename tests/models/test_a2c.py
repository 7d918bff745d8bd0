"""A2C: multi-step TD targets by hand, and a tiny run that must learn SJF."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from rlsched.core import Topology
from rlsched.models import a2c
from rlsched.sim.job import JobSpec


def test_n_step_returns_by_hand():
    r = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    v = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    d = np.array([0, 0, 1, 0, 0])  # the first episode ends after step 2
    g = 0.5
    got = a2c.n_step_returns(r, v, d, n=2, gamma=g)
    expect = [
        1 + g * 2 + g * g * 30,  # bootstrap from V(s_2)
        2 + g * 3,  # ends at step 2: no bootstrap
        3,
        4 + g * 5,  # the rollout ends at step 4 without done: nothing to bootstrap from
        5,
    ]
    np.testing.assert_allclose(got, expect)
    # n = 1 is one-step TD
    np.testing.assert_allclose(a2c.n_step_returns(r, v, d, 1, g), [1 + g * 20, 2 + g * 30, 3, 4 + g * 50, 5])


def sjf_workload(rng):
    topo = Topology.uniform(1, gpus_per_node=1)
    d = rng.permutation([60.0, 60.0, 60.0, 3600.0, 3600.0, 3600.0])
    return [JobSpec(id=f"j{k}", submit_time=0.0, duration=float(x)) for k, x in enumerate(d)], topo


def test_a2c_learns_shortest_job_first(tmp_path):
    p = argparse.ArgumentParser()
    a2c.add_arguments(p)
    a = p.parse_args(["--iterations", "20", "--episodes-per-iter", "8", "--workers", "1", "--window", "8", "--lr", "1e-2", "--minibatch", "8",
                      "--out", str(tmp_path / "a2c.safetensors"), "--results", str(tmp_path)])
    a.workload = sjf_workload
    assert a2c.train(a) == 0
    from rlsched.core.nn import load_policy_file
    from rlsched.sim.envs import EnvConfig, SchedulingCore

    w, meta = load_policy_file(a.out, policy="a2c")
    net = a2c.load_net("a2c", meta["architecture"], w)
    firsts = []
    for seed in range(20):
        core = SchedulingCore(sjf_workload, EnvConfig(window=8))
        core.reset(seed)
        with torch.no_grad():
            logits, _ = net(a2c.stack_obs([core.gym_obs()]))
        act = a2c.masked_sample(logits[0].numpy(), a2c.gym_mask(core), None)
        firsts.append(core.window_jobs()[act // 4].est_runtime)
    assert np.mean(np.array(firsts) < 100) >= 0.9  # starts a short job first
