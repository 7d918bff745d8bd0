"""HierRL: group assignment respects capacity, episodes finish, a tiny run updates."""

from __future__ import annotations

import argparse

import numpy as np
import torch

from rlsched.core import Topology
from rlsched.models import hierrl
from rlsched.sim.envs import EnvConfig, SchedulingCore
from rlsched.sim.job import JobSpec


def workload(rng):
    """4 nodes x 2 GPUs in 2 racks; some gangs need more than one rack (8 GPUs)."""
    topo = Topology.uniform(4, gpus_per_node=2, racks=2)
    jobs = []
    for k in range(10):
        w = int(rng.choice([1, 2, 4]))
        jobs.append(JobSpec(id=f"j{k}", submit_time=float(30 * k), workers=w, gpus_per_worker=2, duration=float(rng.choice([100.0, 1000.0]))))
    return jobs, topo


def test_groups_mask_gangs_larger_than_a_rack_and_every_job_finishes():
    net = hierrl.HierNet(16, SchedulingCore(workload, EnvConfig(window=4)).state_size())
    for seed in range(3):
        core = SchedulingCore(workload, EnvConfig(window=4))
        core.reset(seed)
        sched = hierrl.HierScheduler(net, core, np.random.default_rng(seed))
        assert sched.n_groups == 3  # two racks + any
        while not core.done:
            for job in core.window_jobs():
                _, mask = sched.group_features(job)
                # a rack holds 4 GPUs: an 8-GPU gang may only go to "any"
                assert mask.tolist() == ([False, False, True] if job.gpus > 4 else [True, True, True])
            sched.step()
        res = core.sim.result()
        assert len(res.records) == 10 and not res.unfinished
        for rec in sched.log:
            for x, m, g in rec["high"]:
                assert m[g]


def test_tiny_training_updates_parameters(tmp_path):
    p = argparse.ArgumentParser()
    hierrl.add_arguments(p)
    a = p.parse_args(["--iterations", "3", "--episodes-per-iter", "2", "--workers", "1", "--window", "4",
                      "--runs-dir", str(tmp_path), "--run", "h"])
    a.workload = workload
    torch.manual_seed(a.seed)
    before = {k: v.clone() for k, v in hierrl.HierNet(64, SchedulingCore(workload, EnvConfig(window=4)).state_size()).state_dict().items()}
    assert hierrl.train(a) == 0
    from rlsched.core.nn import load_policy_file

    w, _ = load_policy_file(tmp_path / "h" / "model.safetensors", policy="hierrl")
    assert any(not np.allclose(before[k].numpy(), w[k]) for k in before)
    assert all(np.isfinite(v).all() for v in w.values())
