"""RLPTO's layout-2 observation (issue 16): the measured marginal speed-up and statistical
efficiency, the rank in estimated remaining work and the queue, on hand-built snapshots;
model files of the old layout are refused with a clear reason and serving falls back to
FS+β; the least-remaining-work scaler's targets."""

import numpy as np
import pytest
import torch

from rlsched.core import ClusterState, JobView, Topology, make_scaling
from rlsched.core.cluster import Progress
from rlsched.core.learned import (RLPTO_FEATURES, RLPTO_LAYOUT, RLPTOActor, RLPTOScaling, job_observation,
                                  remaining_rank)
from rlsched.core.nn import PolicyFileError
from rlsched.models import rlpto as R
from rlsched.models.export import export_policy


def _state():
    """8 one-GPU nodes; a (2 workers, 600 s left), b (1 worker, 1000 s left), c (1 worker,
    remaining unknown) run on nodes 0-3; p (2 workers) and q (1 worker) wait."""
    st = ClusterState(Topology.uniform(8, gpus_per_node=1))
    prog = Progress(epoch=5, loss=0.4, max_loss=2.0, accuracy=0.7, history=[0.69, 0.7])
    a = JobView(id="a", submit_time=0.0, workers=2, min_workers=1, max_workers=4, remaining=600.0, progress=prog,
                beta=0.001, speedup=1.5, stat_efficiency=0.95)
    b = JobView(id="b", submit_time=5.0, workers=1, min_workers=1, max_workers=4, remaining=1000.0)
    c = JobView(id="c", submit_time=6.0, workers=1, min_workers=1, max_workers=4)
    for v, nodes in ((a, [0, 1]), (b, [2]), (c, [3])):
        v.placement = nodes
        st.allocate_job(v, nodes)
        st.running[v.id] = v
    st.pending = [JobView(id="p", submit_time=7.0, workers=2, min_workers=2, max_workers=2),
                  JobView(id="q", submit_time=8.0, workers=1)]
    return st, a, b, c


def test_layout_2_features_on_a_hand_built_state():
    st, a, b, c = _state()
    assert len(RLPTO_FEATURES) == 11 and RLPTO_LAYOUT == 2
    # remaining work: a 600 s x 2 GPUs = 1200, b 1000 x 1 = 1000, c unknown (last)
    assert remaining_rank(b, st) == 0.0 and remaining_rank(a, st) == 0.5 and remaining_rank(c, st) == 1.0
    o = job_observation(a, st)
    expected = [4 / 8, 0.05, 0.2, 2 / 8, 0.7, 1.0,  # m, e, l, n, a, c: gain 0.01 / β 0.001 = 10 -> clipped 1
                2 / 16, 0.5, 0.95, 0.5, (3 / 8) / 2]  # w, s = 1.5 - 1, x, r, q = 3 queued GPUs of 8
    np.testing.assert_allclose(o, expected, atol=1e-7)
    # a job nobody measured: speed-up unknown -> 0, efficiency unknown -> 1
    ob = job_observation(b, st)
    assert ob[7] == 0.0 and ob[8] == 1.0 and ob[9] == 0.0
    # alone in the cluster a job ranks 0
    solo = ClusterState(Topology.uniform(2, gpus_per_node=1))
    solo.running["b"] = b
    assert remaining_rank(b, solo) == 0.0


def _export(path, n_in, observation):
    torch.manual_seed(0)
    actor = torch.nn.Sequential(torch.nn.Linear(n_in, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 3))
    state = {f"actor.{k}": v.detach().numpy().astype(np.float32) for k, v in actor.state_dict().items()}
    export_policy(path, state, policy="rlpto", version="1", observation=observation,
                  architecture={"actor_layers": 3, "hidden": 8, "activation": "tanh"}, training={}, trained_on={})


def test_a_layout_1_model_is_refused_clearly_and_serving_falls_back_to_fs_beta(tmp_path):
    old = tmp_path / "old.safetensors"
    _export(old, 7, {"features": list(RLPTO_FEATURES[:7]), "encoding": "rlsched.core.learned.rlpto_observation",
                     "actions": ["-i", "0", "+i"], "action_step": 1})  # as issue-6 models were written: no layout
    pol = RLPTOScaling(path=old)
    assert pol.fallback_reason is not None
    assert "layout 1" in pol.fallback_reason and "layout 2" in pol.fallback_reason and "retrain" in pol.fallback_reason
    assert "'fs'" in pol.fallback_reason
    st, *_ = _state()
    assert pol.decide(list(st.running.values()), st) == make_scaling("fs").decide(list(st.running.values()), st)
    # a file claiming layout 2 with a 7-input actor is refused too
    lying = tmp_path / "lying.safetensors"
    _export(lying, 7, {"features": list(RLPTO_FEATURES), "layout": 2, "action_step": 1})
    assert "11 features" in RLPTOScaling(path=lying).fallback_reason
    # a layout-2 file loads and decides
    new = tmp_path / "new.safetensors"
    _export(new, 11, {"features": list(RLPTO_FEATURES), "layout": 2, "action_step": 1})
    ok = RLPTOScaling(path=new)
    assert ok.fallback_reason is None
    assert ok.probabilities(list(st.running.values()), st).shape == (3, 3)
    with pytest.raises(PolicyFileError, match="layout 1"):
        from rlsched.core.nn import load_policy_file

        RLPTOActor(*load_policy_file(old, policy="rlpto"))


def test_least_remaining_work_targets_on_the_hand_state():
    st, a, b, c = _state()
    # elastic GPUs: 4 free + 4 held, minus 3 minimum workers = 5 to hand out: b (least work)
    # gets 3 more (max 4), a 2 more; c (unknown) stays at its minimum
    d = R.LeastRemainingWork().decide([a, b, c], st)
    assert d == {"a": 1, "b": 1}
    # only jobs asked about are answered
    assert R.LeastRemainingWork().decide([c], st) == {}


def test_cluster_reward_training_and_the_protocol_on_test_seeds(tmp_path):
    import json

    from rlsched.models.cli import run
    from rlsched.sim.protocol import seeds

    argv = ["--iterations", "2", "--episodes", "2", "--workers", "0", "--nodes", "4", "--n-jobs", "3", "--betas", "0.001",
            "--val-every", "2", "--val-seeds", "1", "--minibatch", "256", "--interarrivals", "300", "--reward", "cluster",
            "--runs-dir", str(tmp_path), "--run", "c"]
    assert run("train", "rlpto", argv) == 0
    meta = RLPTOScaling(path=tmp_path / "c" / "model.safetensors").metadata
    assert meta["observation"]["layout"] == 2 and meta["observation"]["features"] == list(RLPTO_FEATURES)
    assert meta["trained_on"]["reward"].startswith("cluster") and meta["training"]["reward"] == "cluster"
    assert "validation" in meta["trained_on"]["selection"]
    res = tmp_path / "res"
    argv = ["--run", "c", "--runs-dir", str(tmp_path), "--protocol", "--test-seeds", "3", "--workers", "0",
            "--nodes", "4", "--n-jobs", "3", "--interarrivals", "300", "--protocol-budgets", "oracle",
            "--protocol-betas", "0.001", "--results", str(res)]
    assert run("eval", "rlpto", argv) == 0
    s = json.loads((res / "rlpto_protocol.json").read_text())
    assert s["test_seeds"] == [seeds("test", 3)[0], seeds("test", 3)[-1]] and s["n_seeds"] == 3
    assert set(s["clairvoyant"]) == set(R.ORACLES) and set(s["policies"]) == set(R.PROTOCOL_POLICIES)
    cell = s["cells"]["oracle|4|300|0.001"]
    v = cell["rlpto_vs"]["FS+beta"]["sum_jct_h"]
    assert v["n"] == 3 and v["diff"] == pytest.approx(cell["means"]["RLPTO"]["sum_jct_h"] - cell["means"]["FS+beta"]["sum_jct_h"])
    assert v["diff_lo"] <= v["diff"] <= v["diff_hi"]
    assert cell["oracle_bound"]["policy"] in R.ORACLES and isinstance(cell["must_show"], bool)
    md = (res / "rlpto_protocol.md").read_text()
    assert "Oracle-LRW (clairvoyant reference)" in md and "must-show" in md
    rows = (res / "rlpto_protocol_episodes.csv").read_text().splitlines()
    assert len(rows) == 1 + 3 * len(R.PROTOCOL_POLICIES)


def test_queue_aware_grow_is_a_function_of_the_observation():
    """The imitation teacher's actions read off the layout-2 observation are the
    heuristic's decisions on the same snapshot (+1 at max_workers is a no-op the
    heuristic leaves out), over an episode with a queue."""
    from rlsched.sim.scaling_env import ScalingEnv, ScalingEnvConfig

    env = ScalingEnv(ScalingEnvConfig(nodes=12, beta=0.0003, mean_interarrival=150.0))
    obs, infos = env.reset(seed=3)
    pol = R.QueueAwareGrow()
    shrinks = 0
    while env.agents:
        views = {v.id: v for v in env.asked}  # as the planner shows them to its policy
        ids = [j for j in env.agents if infos[j]["decides"]]
        assert set(ids) == set(views)
        if ids:
            t = R.teacher_actions(np.stack([obs[j] for j in ids]))
            d = pol.decide([views[j] for j in ids], env.cluster)
            for j, a in zip(ids, t):
                want = (-1, 0, 1)[int(a)]
                if want == 1 and views[j].workers >= views[j].max_workers:
                    assert j not in d
                else:
                    assert d.get(j) == want
            shrinks += int((t == 0).sum())
        obs, _, _, _, infos = env.step({j: int(a) for j, a in zip(ids, R.teacher_actions(np.stack([obs[j] for j in ids])))}
                                       if ids else {})
    assert shrinks > 0
