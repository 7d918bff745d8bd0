"""DAS: numpy inference equals torch, RWGP log-density, and tiny MAPPO runs that learn."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
import torch

from rlsched.core import Topology, make_ordering
from rlsched.core import das as core_das
from rlsched.core.das_agent import DASOrdering, das_logits
from rlsched.models import das
from rlsched.models.rollout import make_pool
from rlsched.sim.envs import EnvConfig, SchedulingCore
from rlsched.sim.job import JobSpec


def _args(tmp_path, **over):
    p = argparse.ArgumentParser()
    das.add_arguments(p)
    a = p.parse_args(["--workers", "1", "--runs-dir", str(tmp_path), "--run", "das"])
    for k, v in over.items():
        setattr(a, k, v)
    return a


def model(args):
    """The model a training run of ``args`` exports."""
    return args.runs_dir / args.run / "model.safetensors"


def sjf_workload(rng: np.random.Generator):
    """One 1-GPU node, 6 jobs at time 0: 3 short and 3 long, shuffled. Starting the
    short ones first (SJF) is optimal for mean JCT."""
    topo = Topology.uniform(1, gpus_per_node=1)
    durations = rng.permutation([60.0, 60.0, 60.0, 3600.0, 3600.0, 3600.0])
    # the users tell the run times (exact estimates): what SJF and the agent sort on
    jobs = [JobSpec(id=f"j{k}", submit_time=0.0, duration=float(d), estimated_runtime=float(d)) for k, d in enumerate(durations)]
    return jobs, topo


@pytest.mark.parametrize("layers,heads", [(1, 2), (2, 4)])
def test_numpy_forward_equals_torch(layers, heads):
    torch.manual_seed(layers)
    net = das.OrderingNet(d_model=16, num_heads=heads, num_layers=layers, window=8).eval()
    rng = np.random.default_rng(0)
    jobs = rng.normal(size=(3, 8, len(das.JOB_FEATURES))).astype(np.float32)
    clus = rng.normal(size=(3, das.CLUSTER_DIM)).astype(np.float32)
    valid = np.ones((3, 8), dtype=bool)
    valid[1, 5:] = False
    valid[2, 1:] = False
    with torch.no_grad():
        ref = net(torch.from_numpy(jobs), torch.from_numpy(clus), torch.from_numpy(valid)).numpy()
    w = {k: v.numpy() for k, v in net.state_dict().items()}
    got = das_logits(w, jobs, clus, valid, num_heads=heads, num_layers=layers)
    assert np.array_equal(np.isinf(got), ~valid)
    np.testing.assert_allclose(got[valid], ref[valid], atol=1e-5)


def test_rwgp_posterior_and_log_prob_are_the_gp_and_normal_formulas():
    topo = Topology.uniform(6, gpus_per_node=4, racks=2)
    pol = das.PlacementRWGP(lam=0.5, noise=0.5)
    with torch.no_grad():
        pol.log_std.fill_(math.log(0.7))
    smoother, chol = pol.gp(topo)
    # GP posterior with every node observed, by hand: S = K (K + s2 I)^-1, Sigma = K - S K
    k = core_das.TopologyKernel(topo, 0.5).matrix(normalised=True)
    s_ref = k @ np.linalg.inv(k + 0.5 * np.eye(6))
    np.testing.assert_allclose(smoother, s_ref, atol=1e-10)
    cov = k - s_ref @ k
    np.testing.assert_allclose(chol @ chol.T, cov + 1e-3 * np.eye(6), atol=1e-10)
    # nodes of one rack share more of each other's observation than nodes across racks
    assert smoother[0, 1] > smoother[0, 4] > 0
    feats = torch.randn(1, 6, len(das.PLACEMENT_FEATURES))
    s = torch.randn(1, 6)
    sm = torch.from_numpy(smoother).float()[None]
    white = torch.from_numpy(np.linalg.inv(chol)).float()[None]
    got = pol.log_prob(feats, sm, s, white)
    with torch.no_grad():
        mu = pol.mean(feats, sm)
        a = pol.score(feats).squeeze(-1)
    torch.testing.assert_close(mu[0], torch.from_numpy(s_ref).float() @ a[0], atol=1e-5, rtol=1e-5)
    full = torch.from_numpy(0.49 * (cov + 1e-3 * np.eye(6))).float()
    ref = torch.distributions.MultivariateNormal(mu, covariance_matrix=full).log_prob(s)
    assert float(got.detach()) == pytest.approx(float(ref), abs=1e-3)


def test_tiny_training_changes_parameters_and_exports_loadable_weights(tmp_path):
    args = _args(tmp_path, iterations=2, episodes_per_iter=2, minibatch=16, workload=sjf_workload)
    torch.manual_seed(0)
    assert das.train(args) == 0
    order = DASOrdering(model(args))
    assert order.fallback_reason is None
    rows = (tmp_path / "das" / "train.csv").read_text().splitlines()
    assert len(rows) == 3
    # the exported ordering differs from a freshly initialised one
    torch.manual_seed(args.seed)
    fresh = das.OrderingNet(args.d_model, args.heads, args.layers, args.window)
    w0 = {k: v.numpy() for k, v in fresh.state_dict().items()}
    assert any(not np.allclose(w0[k], order.weights[k]) for k in w0)
    assert all(np.isfinite(v).all() for v in order.weights.values())


def test_table1_names_the_best_heuristic_and_records_the_evaluation(tmp_path):
    # an empty data folder: the table then has exactly the one synthetic trace asked for,
    # whether or not the real trace is on this machine (RLSCHED_DATA_DIR)
    (tmp_path / "nodata").mkdir()
    args = _args(tmp_path, iterations=1, episodes_per_iter=1, minibatch=16, workload=sjf_workload,
                 eval_traces="synthetic:small,jobs=24", eval_seeds=1, data_dir=tmp_path / "nodata")
    das.train(args)
    assert das.evaluate(args) == 0
    import json

    table = json.loads((tmp_path / "das" / "das_table1.json").read_text())
    (line,) = table
    heur = [h for h in line if "/" in h and " vs best" not in h and h not in das.REFERENCE_BASELINES]
    assert len(heur) == 10  # five Table 1 heuristics, with and without backfill
    assert all(r in line for r in das.REFERENCE_BASELINES)  # shown, never the best heuristic
    best = min(heur, key=lambda h: (round(line[h]["jct_mean"], 6), line[h]["fee_total"]))
    assert line["best_heuristic"] == best
    for learned in ("DAS (MAPPO)", "DAS ordering + das-agent placement", "DAS ordering + firstfit", "DAS ordering + das placement"):
        d = line[f"{learned} vs best"]["jct"]
        assert d == pytest.approx(line[learned]["jct_mean"] / line[best]["jct_mean"] - 1)
    from rlsched.core.nn import load_policy_file

    _, meta = load_policy_file(model(args), policy="das")
    assert meta["evaluation"]["table1"][0]["best_heuristic"] == best


def test_mappo_learns_shortest_job_first_on_a_toy_cluster(tmp_path):
    """Six jobs, one GPU: the ordering agent must learn to start short jobs first."""
    args = _args(tmp_path, iterations=25, episodes_per_iter=8, minibatch=64, lr=3e-3, workload=sjf_workload, window=8, seed=1)
    das.train(args)
    from rlsched.sim import Simulator, compute_metrics

    def jct(name_or_policy, seed):
        jobs, topo = sjf_workload(np.random.default_rng(seed))
        o = make_ordering(name_or_policy) if isinstance(name_or_policy, str) else name_or_policy
        from rlsched.core import make_placement

        return compute_metrics(Simulator(jobs, topo, ordering=o, placement=make_placement("firstfit")).run())["jct_mean"]

    seeds = range(100, 110)
    learned = np.mean([jct(DASOrdering(model(args)), s) for s in seeds])
    fifo = np.mean([jct("fifo", s) for s in seeds])
    sjf = np.mean([jct("sjf", s) for s in seeds])
    # FIFO on shuffled jobs is half-way on average; the agent must close most of the gap
    assert learned < sjf + 0.25 * (fifo - sjf)


def test_rollouts_are_a_function_of_the_seed():
    agent = das.DASAgent(SchedulingCore(sjf_workload, EnvConfig(window=8)).state_size(), 16, 2, 1, 8)
    env = {"window": 8, "fee_weight": 0.02, "time_scale": 3600.0, "workload": sjf_workload}
    arch = {**agent.ordering.architecture(), "lam": 0.5, "gp_noise": 1.0}
    task = lambda s: {"weights": agent.numpy_weights(), "arch": arch, "env": env, "seed": s, "episodes": 2}  # noqa: E731
    with make_pool("process", 1) as pool:
        a, b, c = pool.map(das.collect_das, [task(1), task(1), task(2)])
    assert a["slot"] == b["slot"] and a["reward"] == b["reward"]
    assert a["slot"] != c["slot"] or a["reward"] != c["reward"]


def racked_workload(rng: np.random.Generator):
    topo = Topology.uniform(6, gpus_per_node=4, racks=3)
    jobs = [
        JobSpec(id=f"j{k}", submit_time=float(20 * k), workers=int(rng.choice([1, 2, 3])), gpus_per_worker=int(rng.choice([1, 2])), duration=float(rng.choice([300.0, 3000.0])))
        for k in range(14)
    ]
    return jobs, topo


def test_served_placement_agent_equals_the_trained_policy_mean(tmp_path):
    args = _args(tmp_path, iterations=1, episodes_per_iter=1, minibatch=16, workload=racked_workload, rw_lambda=0.6, gp_noise=0.5)
    das.train(args)
    from rlsched.core.das_agent import DASAgentPlacement, rwgp_smoother
    from rlsched.core.nn import load_policy_file

    served = DASAgentPlacement(model(args))
    assert served.fallback_reason is None
    weights, meta = load_policy_file(model(args), policy="das")
    rwgp = das.PlacementRWGP(0.6, 0.5)
    core = SchedulingCore(racked_workload, EnvConfig(window=args.window))
    core.reset(3)
    np.testing.assert_allclose(rwgp_smoother(core.topology, 0.6, 0.5), rwgp.gp(core.topology)[0], atol=1e-10)
    checked = 0
    while not core.done:
        d = das.das_act(core, weights, meta["architecture"], None, rwgp.gp(core.topology))
        nodes = core.place_by_scores(d["job"], d["scores"])
        np.testing.assert_allclose(served.node_scores(d["job"], core.sim.state), d["scores"], rtol=1e-5, atol=1e-5)
        assert served.place(d["job"], core.sim.state) == nodes
        core.start(d["slot"], nodes)
        checked += 1
    assert checked == 14


def test_served_placement_falls_back_to_first_fit_without_weights(tmp_path):
    from rlsched.core import make_placement

    bad = tmp_path / "das.safetensors"
    bad.write_bytes(b"not a safetensors file")
    (tmp_path / "das.json").write_text("{}")
    p = make_placement("das-agent", model=bad)
    assert p.fallback_reason is not None
    core = SchedulingCore(racked_workload, EnvConfig(window=4))
    core.reset(0)
    job = core.window_jobs()[0]
    assert p.place(job, core.sim.state) == make_placement("firstfit").place(job, core.sim.state)
    assert DASOrdering(bad).fallback_reason is not None


def test_teacher_slot_is_the_heuristics_first_job_that_fits():
    core = SchedulingCore(sjf_workload, EnvConfig(window=8))
    core.reset(5)
    jobs, _, _ = core.ordering_obs()
    mask = core.mask()
    k = das.teacher_slot(core, make_ordering("sjf"), mask)
    window = core.window_jobs()
    assert mask[k] and window[k].est_runtime == min(j.est_runtime for j, m in zip(window, mask) if m)
    with pytest.raises(ValueError, match="fits"):
        das.teacher_slot(core, make_ordering("sjf"), np.zeros_like(mask))


def test_behaviour_cloning_copies_the_teacher_before_any_mappo(tmp_path):
    """Only BC iterations: the exported ordering must act like its teacher (SJF), while
    a fresh network is near FIFO on these shuffled jobs."""
    args = _args(tmp_path, iterations=0, bc_iterations=12, bc_teacher="sjf", episodes_per_iter=8, minibatch=32, lr=3e-3,
                 workload=sjf_workload, window=8, seed=2)
    assert das.train(args) == 0
    rows = (tmp_path / "das" / "train.csv").read_text().splitlines()
    assert rows[1].startswith("bc:sjf") and len(rows) == 13
    from rlsched.core import make_placement
    from rlsched.sim import Simulator, compute_metrics

    def jct(ordering, seed):
        jobs, topo = sjf_workload(np.random.default_rng(seed))
        return compute_metrics(Simulator(jobs, topo, ordering=ordering, placement=make_placement("firstfit")).run())["jct_mean"]

    seeds = range(200, 210)
    learned = np.mean([jct(DASOrdering(model(args)), s) for s in seeds])
    sjf = np.mean([jct(make_ordering("sjf"), s) for s in seeds])
    fifo = np.mean([jct(make_ordering("fifo"), s) for s in seeds])
    assert learned < sjf + 0.1 * (fifo - sjf)
    with pytest.raises(ValueError, match="bc-teacher"):
        das.train(_args(tmp_path, iterations=0, bc_iterations=1, workload=sjf_workload))
