"""DQN: dueling aggregation, prioritized-replay probabilities and weights, tiny run."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from rlsched.core import Topology
from rlsched.models import dqn
from rlsched.sim.job import JobSpec


def test_dueling_aggregation_is_exact():
    v = torch.tensor([[1.0], [-2.0]])
    a = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 6.0]])
    q = dqn.dueling_aggregate(v, a)
    # Q = V + A - mean(A): means are 2 and 2
    assert torch.equal(q, torch.tensor([[0.0, 1.0, 2.0], [-4.0, -4.0, 2.0]]))


def test_dueling_net_mean_advantage_is_zero_so_value_is_mean_q():
    net = dqn.DuelingQNet(window=4, n_placements=2, hidden=8)
    obs = {"jobs": torch.randn(3, 4, len(dqn.JOB_FEATURES)), "valid": torch.ones(3, 4), "cluster": torch.randn(3, dqn.CLUSTER_DIM)}
    q = net(obs)
    torch.testing.assert_close(q.mean(-1), net.value(net.features(obs)).squeeze(-1))


def test_prioritized_replay_probabilities_exact():
    rb = dqn.PrioritizedReplay(capacity=4, alpha=0.5, beta=1.0, eps=0.0)
    for k in range(4):
        rb.add(k)
    rb.update(np.arange(4), np.array([1.0, 4.0, 9.0, 16.0]))
    # p^alpha = 1, 2, 3, 4  ->  P = 0.1, 0.2, 0.3, 0.4
    np.testing.assert_allclose(rb.probabilities(), [0.1, 0.2, 0.3, 0.4])
    rng = np.random.default_rng(0)
    counts = np.zeros(4)
    for _ in range(2000):
        idx, items, w = rb.sample(4, rng)
        counts += np.bincount(idx, minlength=4)
        assert items == [int(i) for i in idx]
        # w_i = (N P_i)^-1 / max_j (N P_j)^-1 = P_min / P_i with beta = 1
        np.testing.assert_allclose(w, 0.1 / rb.probabilities()[idx])
    np.testing.assert_allclose(counts / counts.sum(), [0.1, 0.2, 0.3, 0.4], atol=0.01)


def test_sum_tree_find_and_new_items_get_max_priority():
    rb = dqn.PrioritizedReplay(capacity=3, alpha=1.0, eps=0.0)
    rb.add("a")
    rb.add("b")
    rb.update(np.array([0, 1]), np.array([2.0, 5.0]))
    rb.add("c")  # max priority so far: 5
    np.testing.assert_allclose(rb.probabilities(), np.array([2.0, 5.0, 5.0]) / 12.0)
    t = rb.tree
    assert [t.find(m) for m in (0.0, 1.99, 2.0, 6.99, 7.0, 11.99)] == [0, 0, 1, 1, 2, 2]
    rb.add("d")  # overwrites the oldest
    assert rb.data[0] == "d" and len(rb) == 3


def test_apex_epsilons():
    np.testing.assert_allclose(dqn.apex_epsilons(3, 0.4, 7.0), [0.4, 0.4**4.5, 0.4**8])
    assert dqn.apex_epsilons(1, 0.3).tolist() == [0.3]


def _wl(rng):
    topo = Topology.uniform(2, gpus_per_node=2)
    jobs = [JobSpec(id=f"j{k}", submit_time=float(k * 10), duration=float(rng.choice([50.0, 900.0]))) for k in range(8)]
    return jobs, topo


def test_tiny_training_loss_finite_and_parameters_change(tmp_path):
    p = argparse.ArgumentParser()
    dqn.add_arguments(p)
    a = p.parse_args(["--iterations", "3", "--episodes-per-iter", "2", "--workers", "1", "--batch", "8", "--updates-per-iter", "5",
                      "--runs-dir", str(tmp_path), "--run", "dqn"])
    a.workload = _wl
    torch.manual_seed(a.seed)
    before = {k: v.clone() for k, v in dqn.DuelingQNet(a.window, 4, 128).state_dict().items()}
    assert dqn.train(a) == 0
    from rlsched.core.nn import load_policy_file

    w, meta = load_policy_file(tmp_path / "dqn" / "model.safetensors", policy="dqn")
    assert any(not np.allclose(before[k].numpy(), w[k]) for k in before)
    rows = (tmp_path / "dqn" / "train.csv").read_text().splitlines()[1:]
    losses = [float(r.split(",")[5]) for r in rows]
    assert np.isfinite(losses[-1])


def test_max_wall_stops_the_process_engine_after_the_round_that_passes_it(tmp_path):
    p = argparse.ArgumentParser()
    dqn.add_arguments(p)
    a = p.parse_args(["--iterations", "5", "--episodes-per-iter", "1", "--workers", "1", "--batch", "8", "--updates-per-iter", "2",
                      "--max-wall", "1e-9", "--runs-dir", str(tmp_path), "--run", "dqn"])
    a.workload = _wl
    assert dqn.train(a) == 0
    assert len((tmp_path / "dqn" / "train.csv").read_text().splitlines()) == 1 + 1
    assert (tmp_path / "dqn" / "model.safetensors").is_file()
