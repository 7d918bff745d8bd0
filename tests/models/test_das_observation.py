"""DAS on the non-clairvoyant observation (issue 16): the features never read a job's
true run time, the layout-2 model loads (and layout-1 files fail clearly, falling back),
the attained-service queues preempt, and training draws only train seeds."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from rlsched.core import ClusterState, JobView, Topology, make_placement
from rlsched.core.cluster import Progress
from rlsched.core.das_agent import (
    JOB_FEATURES,
    DASAgentPlacement,
    DASOrdering,
    ObservationMismatch,
    check_observation,
    job_features,
)
from rlsched.models import das
from rlsched.models.scheduling import parse_loads
from rlsched.sim import SimConfig, Simulator, compute_metrics
from rlsched.sim.envs import EnvConfig, SchedulingCore, trace_workload
from rlsched.sim.job import JobSpec
from rlsched.sim.protocol import SPLITS

from .test_das import _args, model


@pytest.fixture(scope="module")
def las_model(tmp_path_factory):
    """A layout-2 model (2 training iterations on a toy cluster) with attained-service
    queues at 100 and 1,000 GPU-seconds."""
    tmp = tmp_path_factory.mktemp("das2")
    args = _args(tmp, iterations=1, episodes_per_iter=1, minibatch=16, workload=_workload(), las_thresholds="100,1000")
    torch.manual_seed(0)
    assert das.train(args) == 0
    return model(args)


def _workload(long_duration: float = 20_000.0):
    """8 fixed-duration jobs on 2 nodes x 4 GPUs; j0 is long (``long_duration``)."""

    def draw(rng: np.random.Generator):
        topo = Topology.uniform(2, gpus_per_node=4)
        jobs = [JobSpec(id="j0", submit_time=0.0, workers=1, gpus_per_worker=4, duration=long_duration)]
        for k in range(1, 8):
            jobs.append(JobSpec(id=f"j{k}", submit_time=50.0 * k, workers=1, gpus_per_worker=int(1 + k % 3), duration=300.0 * k))
        return jobs, topo

    return draw


# ------------------------------------------------------------------ non-clairvoyance
def test_job_features_read_attained_service_age_and_progress_not_more():
    st = ClusterState(Topology.uniform(1, 8), time=1000.0)
    fresh = JobView("a", 100.0, gpus_per_worker=2)
    served = JobView("b", 100.0, gpus_per_worker=2, attained_service=600.0, progress=Progress(epoch=3))
    f, g = job_features(fresh, st), job_features(served, st)
    col = {n: k for k, n in enumerate(JOB_FEATURES)}
    assert f[col["log_attained"]] == 0.0 and f[col["log_epochs"]] == 0.0 and f[col["has_estimate"]] == 0.0
    assert g[col["log_attained"]] == pytest.approx(math.log1p(600.0) / 14.0)
    assert g[col["log_executed"]] == pytest.approx(math.log1p(300.0) / 12.0)  # 600 GPU-s on 2 GPUs
    assert g[col["log_epochs"]] == pytest.approx(math.log1p(3) / 5.0)
    assert f[col["log_wait"]] == pytest.approx(math.log1p(900.0) / 10.0)
    # a progress-based remaining estimate is known, and marked so
    served.remaining = 500.0
    assert job_features(served, st)[col["has_estimate"]] == 1.0


def _env_observations(long_duration: float) -> list[tuple]:
    core = SchedulingCore(_workload(long_duration), EnvConfig(window=4))
    core.reset(3)
    seen = []
    while not core.done and core.sim.now < 5_000.0:  # before j0 (run time >= 10,000 s) ends
        jobs, clus, valid = core.ordering_obs()
        st = core.state_vector(0, obs=(jobs, clus, valid), mask=core.mask())
        seen.append((core.sim.now, jobs.copy(), clus.copy(), st.copy()))
        core.start(int(np.flatnonzero(core.mask())[0]), core.place_by_policy(core.window_jobs()[int(np.flatnonzero(core.mask())[0])], "firstfit"))
    return seen


def test_changing_a_jobs_true_run_time_does_not_change_what_the_agents_see():
    a, b = _env_observations(20_000.0), _env_observations(10_000.0)
    assert len(a) == len(b) >= 3
    for (ta, ja, ca, sa), (tb, jb, cb, sb) in zip(a, b):
        assert ta == tb
        assert np.array_equal(ja, jb) and np.array_equal(ca, cb) and np.array_equal(sa, sb)


def test_served_ordering_inputs_do_not_depend_on_true_run_times(las_model):
    """The served (preemptive) ordering in the engine, with a job's true run time changed:
    every input the transformer gets before that job could end is the same."""

    def inputs(long_duration: float) -> list[bytes]:
        order = DASOrdering(las_model)
        seen: list[bytes] = []
        real = order._inputs

        def spy(head, fits, state, n):
            out = real(head, fits, state, n)
            seen.append(out[0].tobytes() + out[1].tobytes())
            return out

        order._inputs = spy
        jobs, topo = _workload(long_duration)(np.random.default_rng(0))
        Simulator(jobs, topo, ordering=order, placement=make_placement("firstfit"), seed=0,
                  config=SimConfig(max_time=5_000.0, record_series=False)).run()
        return seen

    a, b = inputs(20_000.0), inputs(10_000.0)
    assert a and a == b


# ------------------------------------------------------------------ model file
def test_layout_2_model_loads_and_records_its_observation(las_model):
    order, place = DASOrdering(las_model), DASAgentPlacement(las_model)
    assert order.fallback_reason is None and place.fallback_reason is None
    meta = json.loads(las_model.with_suffix(".json").read_text())
    assert meta["version"] == das.VERSION == "2"
    assert meta["observation"]["job_features"] == list(JOB_FEATURES)
    assert meta["observation"]["non_clairvoyant"] is True
    assert meta["architecture"]["las_thresholds"] == [100.0, 1000.0]
    assert order.thresholds == (100.0, 1000.0) and order.preemptive


def _copy_with_meta(src, dst_dir, edit):
    dst = dst_dir / "m.safetensors"
    shutil.copy(src, dst)
    meta = json.loads(src.with_suffix(".json").read_text())
    edit(meta)
    dst.with_suffix(".json").write_text(json.dumps(meta))
    return dst


def test_layout_1_model_fails_clearly_and_serving_falls_back(las_model, tmp_path, caplog):
    old = _copy_with_meta(las_model, tmp_path, lambda m: m["observation"].update(job_features=list(JOB_FEATURES[:10])))
    order, place = DASOrdering(old), DASAgentPlacement(old)
    assert "ObservationMismatch" in order.fallback_reason and "layout" in order.fallback_reason
    assert place.fallback_reason is not None
    assert any("falling back to FIFO" in r.getMessage() for r in caplog.records)
    jobs = [JobView(f"j{k}", float(10 - k)) for k in range(5)]
    st = ClusterState(Topology.uniform(1, 8))
    assert [j.id for j in order.rank(jobs, st)] == [f"j{k}" for k in range(4, -1, -1)]  # FIFO
    assert not order.preemptive


def test_weights_of_another_width_fail_even_when_the_metadata_claims_layout_2(las_model, tmp_path):
    from safetensors.numpy import load_file, save_file

    dst = tmp_path / "w.safetensors"
    w = load_file(str(las_model))
    w["embed.weight"] = w["embed.weight"][:, :10].copy()
    save_file(w, str(dst))
    meta = json.loads(las_model.with_suffix(".json").read_text())
    meta["sha256"] = hashlib.sha256(dst.read_bytes()).hexdigest()  # a consistent file, of the wrong width
    dst.with_suffix(".json").write_text(json.dumps(meta))
    assert "embed.weight" in DASOrdering(dst).fallback_reason


def test_corrupt_model_falls_back(tmp_path):
    bad = tmp_path / "das.safetensors"
    bad.write_bytes(b"garbage")
    bad.with_suffix(".json").write_text("{not json")
    assert DASOrdering(bad).fallback_reason is not None
    assert DASAgentPlacement(bad).fallback_reason is not None


def test_check_observation_needs_the_record():
    with pytest.raises(ObservationMismatch):
        check_observation({})
    with pytest.raises(ObservationMismatch):
        check_observation({"observation": {"node_features": []}})


@pytest.mark.parametrize("bad", [[-1.0], [100.0, 100.0], [1000.0, 10.0], "100"])
def test_bad_thresholds_fall_back(las_model, bad):
    assert DASOrdering(las_model, las_thresholds=bad).fallback_reason is not None


# ------------------------------------------------------------------ attained-service queues
def test_attained_service_queues_rank_preempt_and_demote(las_model):
    order = DASOrdering(las_model)
    st = ClusterState(Topology.uniform(1, 8), time=500.0)
    young = JobView("young", 400.0, attained_service=50.0)
    old = JobView("old", 0.0, attained_service=5000.0, workers=2)
    mid = JobView("mid", 100.0, attained_service=500.0)
    assert [j.id for j in order.rank([old, mid, young], st)] == ["young", "mid", "old"]
    assert order.preempts(young, old, st) and not order.preempts(old, young, st)
    assert not order.preempts(young, JobView("peer", 0.0, attained_service=10.0), st)  # a tie never preempts
    assert [j.id for j in order.outranked(young, [old, mid], st)] == ["old", "mid"]
    # 'mid' runs on 1 GPU: it reaches 1,000 GPU-s 500 s from now; 'old' is past the last
    assert order.demotes_at(mid, 500.0) == pytest.approx(1000.0)
    assert order.demotes_at(old, 500.0) is None
    plain = DASOrdering(las_model, las_thresholds=())
    assert not plain.preemptive and not plain.preempts(young, old, st) and plain.demotes_at(mid, 0.0) is None


def test_served_das_with_queues_preempts_in_the_engine_and_finishes_every_job(las_model):
    jobs, topo = _workload()(np.random.default_rng(0))
    res = Simulator(jobs, topo, ordering=DASOrdering(las_model), placement=DASAgentPlacement(las_model), seed=0).run()
    assert len(res.records) == len(jobs)
    assert sum(r.preemptions for r in res.records) > 0  # j0 holds 4 GPUs long past 1,000 GPU-s
    m = compute_metrics(res)
    assert math.isfinite(m["jct_mean"])


# ------------------------------------------------------------------ training workloads
def test_training_workload_draws_train_seeds_and_loads_in_range(monkeypatch):
    import rlsched.sim.traces as traces

    seen = []
    real = traces.load_trace

    def spy(spec, **kw):
        seen.append((spec, kw["seed"]))
        return real(spec, **kw)

    monkeypatch.setattr(traces, "load_trace", spy)
    draw = trace_workload("synthetic:small,runtime_sigma=1.5;synthetic:small", 20, loads=(0.5, 2.0))
    rng = np.random.default_rng(0)
    for _ in range(30):
        draw(rng)
    lo, hi = SPLITS["train"]
    assert all(lo <= s < hi for _, s in seen)
    loads = [float(spec.rsplit("load=", 1)[1]) for spec, _ in seen]
    assert all(0.5 <= x <= 2.0 for x in loads) and max(loads) - min(loads) > 0.5
    assert {spec.split(",")[1] for spec, _ in seen} == {"runtime_sigma=1.5", "jobs=20"}


def test_loads_option_parses_and_rejects():
    assert parse_loads(None) is None and parse_loads("") is None
    assert parse_loads("0.5,2.0") == (0.5, 2.0) and parse_loads([0.5, 2]) == (0.5, 2.0)
    for bad in ("2.0,0.5", "0,1", "a,b", "1"):
        with pytest.raises(ValueError):
            parse_loads(bad)


# ------------------------------------------------------------------ placement cloning, protocol helpers
def _spread_workload(rng: np.random.Generator):
    """Small jobs on 6 nodes in 2 racks: many nodes can take each job, so the teacher's
    choice says something."""
    topo = Topology.uniform(6, gpus_per_node=4, racks=2)
    jobs = [JobSpec(id=f"s{k}", submit_time=30.0 * k, workers=int(1 + k % 2), gpus_per_worker=int(1 + k % 3), duration=600.0 + 50 * k)
            for k in range(16)]
    return jobs, topo


def test_placement_cloning_moves_only_the_placement_agent(tmp_path):
    from rlsched.core.nn import load_policy_file

    first = _args(tmp_path, iterations=1, episodes_per_iter=1, minibatch=16, workload=_spread_workload, run="a")
    torch.manual_seed(0)
    assert das.train(first) == 0
    w0, _ = load_policy_file(model(first), policy="das")
    clone = _args(tmp_path, iterations=0, bc_iterations=2, bc_teacher="", bc_placement="topology", placement_lr=0.05,
                  episodes_per_iter=2, minibatch=16, workload=_spread_workload, run="b", init=model(first))
    assert das.train(clone) == 0
    w1, _ = load_policy_file(model(clone), policy="das")
    assert not np.allclose(w0["placement.score.weight"], w1["placement.score.weight"])
    assert all(np.array_equal(w0[k], w1[k]) for k in w0 if not k.startswith("placement."))
    rows = (tmp_path / "b" / "train.csv").read_text().splitlines()
    assert rows[1].startswith("bc:-/topology") and len(rows) == 3


def test_protocol_candidates_and_summary():
    from rlsched.models import das as dp

    assert dp.parse_candidate("a=m.safetensors") == ("a", Path("m.safetensors"), None, "das-agent")
    assert dp.parse_candidate("a=m.safetensors@-#topology") == ("a", Path("m.safetensors"), (), "topology")
    assert dp.parse_candidate("a=m.safetensors@10:100") == ("a", Path("m.safetensors"), (10.0, 100.0), "das-agent")
    with pytest.raises(ValueError):
        dp.parse_candidate("no-model")
    rows = []
    for seed, base in ((1, 100.0), (2, 200.0), (3, 300.0)):
        for k, h in enumerate(dp.PROTOCOL_POOL):
            rows.append({"cell": "c", "load": 1.0, "seed": seed, "system": h, "jct_mean": base + 10 * k, "jcts": []})
        rows.append({"cell": "c", "load": 1.0, "seed": seed, "system": "das", "jct_mean": base * 0.8, "jcts": []})
        rows.append({"cell": "c", "load": 1.0, "seed": seed, "system": dp.IDEAL, "jct_mean": base * 0.5, "jcts": []})
    (line,) = dp.protocol_summary(rows, ["das"])
    assert line["best_heuristic"] == dp.PROTOCOL_POOL[0] and line["unit"] == "seed" and line["n"] == 3
    d = line["vs_best"]["das"]
    assert d["rel"] == pytest.approx(-0.2) and d["diff_hi"] < 0
    md = dp.protocol_table([line], "das")
    assert "| met |" in md and "40%" in md  # 20 of the 50 points to the bound
