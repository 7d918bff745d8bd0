"""RLPTO's network on the goodput mechanism (core/rlpto_weight.py) and its trainer's
export: exact answers on cases worked by hand."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from rlsched.core.goodput_allocator import GoodputAllocator
from rlsched.core.growth_weight import LearnedGrowthWeight, curve_pace
from rlsched.core.rlpto_weight import RLPTO_GOODPUT_FEATURES, RLPTOGrowthWeight, rlpto_views
from rlsched.sim.allocators import make_allocator

from .test_goodput_allocator import counts, decide, make_job, nodes_of

K = len(RLPTO_GOODPUT_FEATURES)


def net(base, w1, b1, w2):
    return RLPTOGrowthWeight({"base_coef": np.asarray(base, float), "w1": np.asarray(w1, float),
                              "b1": np.asarray(b1, float), "w2": np.asarray(w2, float)})


def test_views_by_hand():
    """8 GPUs: "a" holds 2 with 100 GPU-s of service, "b" holds 4 with 50, "c" waits for
    a gang of 2. Free 2/8; ranks in service b 0, a 1, c (holds none) 1; one job and 2
    GPUs waiting."""
    curve = (0.1, 0.3, 0.5, 0.7, 0.7, 0.7, 0.7)
    jobs = [replace(make_job("a", alloc=(0, 0), attained=100.0), epoch=7, metrics=curve),
            replace(make_job("b", alloc=(1, 1, 1, 1), attained=50.0), epoch=150),
            make_job("c", min_replicas=2)]
    v = rlpto_views(jobs, nodes_of(4, 4))
    assert v["a"].tolist() == pytest.approx([0.25, 0.07, curve_pace(curve, True) / 2, 2 / 16, 1.0, 1 / 8, 0.125])
    assert v["b"].tolist() == pytest.approx([0.25, 1.0, 0.5, 4 / 16, 0.0, 1 / 8, 0.125])
    assert v["c"].tolist() == pytest.approx([0.25, 0.0, 0.5, 0.0, 1.0, 1 / 8, 0.125])
    assert all(len(x) == K for x in v.values())


def test_with_v_zero_it_is_the_growth_weight_exactly():
    base = np.array([-0.9, 0.1, -0.2, 0.05, 0.3])
    rng = np.random.default_rng(3)
    w = net(base, rng.standard_normal((4, K)), rng.standard_normal(4), np.zeros(4))
    lin = LearnedGrowthWeight(base)
    big = GoodputAllocator().threshold
    jobs = [replace(make_job("served", attained=3 * big, max_replicas=8, grad=(1.0, 1000.0), alloc=(0,)), epoch=9,
                    metrics=(0.1, 0.5, 0.6, 0.61)),
            make_job("fresh", attained=0.0, submit=1.0, max_replicas=8, grad=(1.0, 1000.0))]
    w.prepare(jobs, nodes_of(8))
    for j in jobs:
        assert w.weight(j) == pytest.approx(lin.weight(j), rel=1e-12)
    assert (counts(decide(jobs, nodes_of(8), GoodputAllocator(p=0.0, growth=w)))
            == counts(decide(jobs, nodes_of(8), GoodputAllocator(p=0.0, growth=lin))))


def test_the_network_moves_gpus_to_the_job_it_weighs_up():
    """Two like jobs on one 8-GPU node, same service, no base weight: a unit reading the
    epoch feature with v = log 4 / tanh 1 weighs the job at 100 epochs 4 and the fresh
    one 1, the 6 : 2 split of weights 4 and 1 (test_growth_weight's worked case)."""
    w1 = np.zeros((1, K))
    w1[0, RLPTO_GOODPUT_FEATURES.index("e")] = 1.0
    w = net(np.zeros(5), w1, [0.0], [np.log(4.0) / np.tanh(1.0)])
    jobs = [make_job("fresh", max_replicas=8, grad=(1.0, 1000.0)),
            replace(make_job("old", submit=1.0, max_replicas=8, grad=(1.0, 1000.0)), epoch=100)]
    w.prepare(jobs, nodes_of(8))
    assert w.weight(jobs[0]) == pytest.approx(1.0) and w.weight(jobs[1]) == pytest.approx(4.0)
    assert counts(decide(jobs, nodes_of(8), GoodputAllocator(p=0.0, growth=w))) == {"fresh": 2, "old": 6}


def test_it_reads_only_what_the_job_reported():
    class Forbidden:
        def __getattr__(self, name):
            raise AssertionError(f"the RLPTO weight read the oracle's {name!r}")

    jobs = [replace(make_job("j", attained=3600.0, alloc=(0,), oracle=Forbidden()), epoch=4, metrics=(0.2, 0.4, 0.5)),
            make_job("k", oracle=Forbidden())]
    w = net(np.ones(5), np.ones((2, K)), np.ones(2), np.ones(2))
    decide(jobs, nodes_of(4), GoodputAllocator(growth=w))


def test_bad_input_gives_a_clear_error_and_a_missing_model_the_growth_weight(tmp_path):
    w = net(np.zeros(5), np.zeros((2, K)), np.zeros(2), np.zeros(2))
    with pytest.raises(KeyError, match="prepare"):
        w.weight(make_job("x"))
    with pytest.raises(ValueError, match="w1 must be"):
        net(np.zeros(5), np.zeros((2, K + 1)), np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="finite"):
        net(np.zeros(5), np.full((2, K), np.nan), np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="expected 18 numbers"):
        RLPTOGrowthWeight.from_vector(np.zeros(5), np.zeros(5), 2)
    missing = RLPTOGrowthWeight(path=tmp_path / "none.safetensors")
    assert missing.fallback_reason and "not found" in missing.fallback_reason
    assert missing.base.coef.tolist() == LearnedGrowthWeight().coef.tolist()  # the promoted growth weight
    alloc = make_allocator("goodput-rlpto", rlpto_model=str(tmp_path / "none.safetensors"))
    assert alloc.growth.fallback_reason
    job = make_job("j", attained=5000.0)
    alloc.growth.prepare([job], nodes_of(4))
    assert alloc.growth.weight(job) == pytest.approx(LearnedGrowthWeight().weight(job))


def test_an_exported_network_round_trips(tmp_path):
    from rlsched.models.growth import _export, make_weight

    hidden = 3
    theta = np.random.default_rng(0).standard_normal(RLPTOGrowthWeight.size(hidden))
    base = np.array([-0.8, 0.1, -0.2, 0.05, 0.4])
    path = tmp_path / "model.safetensors"
    args = SimpleNamespace(loads="0.5,1.5", generations=1, pairs=1, form="rlpto", hidden=hidden)
    _export(path, theta, args, "test", [{"seed": 1, "pop_relative_jct": 1.0}], base)
    loaded = RLPTOGrowthWeight(path=path)
    direct = make_weight("rlpto", theta, base, hidden)
    assert loaded.fallback_reason is None
    jobs = [replace(make_job("j", attained=3600.0, alloc=(0, 0)), epoch=3, metrics=(0.1, 0.2, 0.4)), make_job("k")]
    for w in (loaded, direct):
        w.prepare(jobs, nodes_of(4))
    for j in jobs:
        assert loaded.weight(j) == pytest.approx(direct.weight(j), rel=1e-5)  # float32 on disk
    assert make_allocator("goodput-rlpto", rlpto_model=str(path)).growth.w2 == pytest.approx(direct.w2, rel=1e-6)
