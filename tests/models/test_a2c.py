"""A2C: a tiny run that must learn SJF (its multi-step TD targets: tests/models/test_ppo.py)."""

from __future__ import annotations

import argparse

import numpy as np
import torch

from rlsched.core import Topology
from rlsched.models import a2c
from rlsched.models.scheduling import gym_mask, load_state, masked_sample, stack_obs
from rlsched.sim.job import JobSpec


def sjf_workload(rng):
    topo = Topology.uniform(1, gpus_per_node=1)
    d = rng.permutation([60.0, 60.0, 60.0, 3600.0, 3600.0, 3600.0])
    # the users tell the run times (exact estimates): what the agent learns to sort on
    return [JobSpec(id=f"j{k}", submit_time=0.0, duration=float(x), estimated_runtime=float(x)) for k, x in enumerate(d)], topo


def test_a2c_learns_shortest_job_first(tmp_path):
    p = argparse.ArgumentParser()
    a2c.add_arguments(p)
    a = p.parse_args(["--iterations", "20", "--episodes-per-iter", "8", "--workers", "1", "--window", "8", "--lr", "1e-2", "--minibatch", "8",
                      "--runs-dir", str(tmp_path), "--run", "a2c"])
    a.workload = sjf_workload
    assert a2c.train(a) == 0
    from rlsched.core.nn import load_policy_file
    from rlsched.sim.envs import EnvConfig, SchedulingCore

    w, meta = load_policy_file(tmp_path / "a2c" / "model.safetensors", policy="a2c")
    net = load_state(a2c.make_net(meta["architecture"]), w)
    firsts = []
    for seed in range(20):
        core = SchedulingCore(sjf_workload, EnvConfig(window=8))
        core.reset(seed)
        with torch.no_grad():
            logits, _ = net(stack_obs([core.gym_obs()]))
        act = masked_sample(logits[0].numpy(), gym_mask(core), None)
        firsts.append(core.window_jobs()[act // 4].est_runtime)
    assert np.mean(np.array(firsts) < 100) >= 0.9  # starts a short job first
