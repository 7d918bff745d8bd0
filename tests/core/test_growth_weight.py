"""The learned growth weight of the goodput allocator (core/growth_weight.py) and its
trainer's pieces (models/growth.py): exact answers on cases worked by hand."""

from dataclasses import replace

import numpy as np
import pytest

from rlsched.core.goodput_allocator import GoodputAllocator
from rlsched.core.growth_weight import (
    DEFAULT_COEF,
    GROWTH_FEATURES,
    LearnedGrowthWeight,
    curve_pace,
    growth_features,
)
from rlsched.core.rlpto_weight import RLPTOGrowthWeight
from rlsched.sim.allocators import make_allocator

from .test_goodput_allocator import counts, decide, make_job, nodes_of


def test_curve_pace_by_hand():
    assert curve_pace([], True) == 1.0 and curve_pace([0.1, 0.2], True) == 1.0  # too short: no evidence
    assert curve_pace([0.1, 0.2, 0.3, 0.4, 0.5], True) == pytest.approx(1.0)  # steady pace
    # 0.1 -> 0.7 in 3 epochs, then flat for 3: recent 0, overall 0.6/6
    assert curve_pace([0.1, 0.3, 0.5, 0.7, 0.7, 0.7, 0.7], True) == 0.0
    # a loss (lower is better) falling 1 an epoch lately, 3/8 an epoch overall: 8/3, clipped at 2
    assert curve_pace([10, 10, 10, 10, 10, 10, 9, 8, 7], False) == 2.0
    assert curve_pace([10, 9.9, 9.8, 9.7, 9.0, 8.0, 7.0], False) == pytest.approx(0.9 / 0.5)
    # accuracy that fell back: recent pace -0.03/3 per epoch against 0.27/6 overall
    assert curve_pace([0.5, 0.6, 0.7, 0.8, 0.8, 0.8, 0.77], True) == pytest.approx((-0.03 / 3) / (0.27 / 6))
    assert curve_pace([0.3, 0.3, 0.3], True) == 1.0  # it never moved


def test_default_coefficients_are_the_goodput_service_weight():
    """w = (−1, 0, 0, 0, 0) is (1 + A/θ)^−1 exactly, so a model at its start decides as
    the goodput allocator's service weight does."""
    served = GoodputAllocator()
    learned = LearnedGrowthWeight(DEFAULT_COEF)
    big = served.threshold
    for attained, age, restarts in ((0.0, 10.0, 0), (big, 3600.0, 2), (7.3 * big, 9e4, 11)):
        job = replace(make_job("j", attained=attained, age=age, restarts=restarts), epoch=5,
                      metrics=(0.1, 0.5, 0.6, 0.61, 0.615, 0.616))
        assert learned.weight(job) == pytest.approx(served.weight(job), rel=1e-12)
    jobs = [make_job("served", attained=3 * big, max_replicas=8, grad=(1.0, 1000.0)),
            make_job("fresh", attained=0.0, submit=1.0, max_replicas=8, grad=(1.0, 1000.0))]
    with_model = GoodputAllocator(p=0.0, growth=learned)
    assert counts(decide(jobs, nodes_of(8), with_model)) == counts(decide(jobs, nodes_of(8), GoodputAllocator(p=0.0)))
    assert counts(decide(jobs, nodes_of(8), with_model)) == {"served": 2, "fresh": 6}


def test_a_weight_on_the_learning_curve_gives_a_converged_jobs_gpus_to_the_other():
    """Two like jobs on one 8-GPU node, same service: with a coefficient on the curve's
    pace, the one whose metric has flattened (pace 0: weight 1) grows less than the one
    still learning at its pace (pace 1: weight e^1.1 = 3.0), the split the service
    weight gives for weights 1/4 and 1, mirrored."""
    flat = (0.1, 0.4, 0.7, 0.8, 0.8, 0.8, 0.8)
    steady = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)
    jobs = [replace(make_job("flat", max_replicas=8, grad=(1.0, 1000.0)), metrics=flat, epoch=7),
            replace(make_job("learning", submit=1.0, max_replicas=8, grad=(1.0, 1000.0)), metrics=steady, epoch=7)]
    coef = np.array([0.0, 0.0, 0.0, 0.0, np.log(4.0)])
    w = LearnedGrowthWeight(coef)
    assert w.weight(jobs[0]) == pytest.approx(1.0) and w.weight(jobs[1]) == pytest.approx(4.0)
    assert counts(decide(jobs, nodes_of(8), GoodputAllocator(p=0.0, growth=w))) == {"flat": 2, "learning": 6}


def test_features_read_only_what_the_job_reported():
    class Forbidden:
        def __getattr__(self, name):
            raise AssertionError(f"the growth weight read the oracle's {name!r}")

    job = replace(make_job("j", attained=3600.0, age=7200.0, restarts=3, oracle=Forbidden()), epoch=4,
                  metrics=(0.2, 0.4, 0.5, 0.55))
    phi = growth_features(job, service_scale=3600.0)
    assert phi.tolist() == pytest.approx([np.log(2.0), np.log(3.0), np.log(4.0), np.log(5.0),
                                          curve_pace(job.metrics, True)])
    assert len(phi) == len(GROWTH_FEATURES)
    LearnedGrowthWeight(np.ones(len(GROWTH_FEATURES))).weight(job)


def test_a_missing_or_corrupt_model_falls_back_to_the_served_weight(tmp_path):
    missing = LearnedGrowthWeight(path=tmp_path / "none.safetensors")
    assert missing.fallback_reason and "not found" in missing.fallback_reason
    assert missing.coef.tolist() == DEFAULT_COEF.tolist()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a model")
    bad.with_suffix(".json").write_text("{")
    assert "not valid JSON" in LearnedGrowthWeight(path=bad).fallback_reason
    alloc = make_allocator("goodput-learned", growth_model=str(tmp_path / "none.safetensors"))
    assert alloc.growth.fallback_reason
    with pytest.raises(ValueError, match="finite"):
        LearnedGrowthWeight([1.0, np.nan, 0, 0, 0])
    with pytest.raises(ValueError, match="5 finite numbers"):
        LearnedGrowthWeight([1.0, 2.0])


def test_an_exported_model_round_trips(tmp_path):
    from types import SimpleNamespace

    from rlsched.models.growth import _export

    coef = np.array([-0.8, 0.1, -0.2, 0.05, 0.4])
    path = tmp_path / "model.safetensors"
    args = SimpleNamespace(loads="0.5,1.5", generations=1, pairs=1, form="linear")
    _export(path, coef, args, "test", [{"seed": 1, "pop_relative_jct": 1.0}])
    w = LearnedGrowthWeight(path=path)
    assert w.fallback_reason is None and w.coef == pytest.approx(coef, rel=1e-6)
    assert make_allocator("goodput-learned", growth_model=str(path)).growth.coef == pytest.approx(coef, rel=1e-6)


def test_es_gradient_and_adam_by_hand():
    """JCT(w) = base · (1 − a·w) near w = 0: each antithetic pair along a unit vector e_i
    gives F(+σe_i) − F(−σe_i) = 2σ a_i, so the estimate with the d unit vectors is a/d;
    Adam's first step is lr · sign(g)."""
    from rlsched.models.growth import Adam, es_gradient

    a, base, sigma = np.array([0.3, -0.1, 0.0, 0.2, -0.5]), 2000.0, 0.25
    eps = np.eye(5)
    plus = base * (1 - sigma * eps @ a)
    minus = base * (1 + sigma * eps @ a)
    g = es_gradient(eps, plus, minus, base, sigma)
    assert g == pytest.approx(a / 5)
    step = Adam(0.1).step(g)
    assert step == pytest.approx(0.1 * np.sign(g), abs=1e-6)


def test_the_trainer_refuses_a_seed_outside_the_train_split():
    from rlsched.models.growth import run_workload
    from rlsched.sim.protocol import SPLITS

    with pytest.raises(ValueError, match="not a train seed"):
        run_workload(DEFAULT_COEF, SPLITS["validation"][0], 1.0, None)


def test_no_weight_acts_where_no_job_can_grow():
    """Rigid jobs (min = max = 1 replica, as on the Alibaba suite): the weight only
    decides who grows, so every weight decides as the service weight does — with
    unequal weights on every job, and more jobs than GPUs."""
    big = GoodputAllocator().threshold
    jobs = [replace(make_job(f"j{i}", attained=i * big / 3, age=600.0 * (i + 1), restarts=i % 3, submit=float(i),
                             max_replicas=1, alloc=(i % 2,) if i < 3 else ()), epoch=i, metrics=(0.1, 0.2 + i / 50, 0.3))
            for i in range(7)]
    w = LearnedGrowthWeight(np.array([-1.3, 0.7, -0.5, 0.9, 0.4]))
    assert len({round(w.weight(j), 9) for j in jobs}) == len(jobs)
    want = counts(decide(jobs, nodes_of(2, 2)))
    assert sum(want.values()) == 4
    assert counts(decide(jobs, nodes_of(2, 2), GoodputAllocator(growth=w))) == want
    net = RLPTOGrowthWeight.from_vector(np.random.default_rng(3).normal(size=RLPTOGrowthWeight.size(4)), w.coef, 4)
    assert counts(decide(jobs, nodes_of(2, 2), GoodputAllocator(growth=net))) == want  # RLPTO's network too
