"""Goodput per GPU type (core/type_goodput.py): a fit per (job, type) from that type's
reports alone, Sia's bootstrap on a type not run on (the fit elsewhere times the seed's
one-GPU throughput ratio), the seed rows alone, the prior, or nothing — and the
single-type path exactly as before."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rlsched.core.allocation import AllocJob, ProfileSample
from rlsched.core.batch import BatchBounds
from rlsched.core.goodput import ThroughputModel, ThroughputParams, ThroughputPrior
from rlsched.core.job_goodput import JobGoodput
from rlsched.core.type_goodput import (BOOTSTRAPPED, FITTED, PRIOR, SEEDED, TypeGoodput, scaled, seed_ratio)

#: two GPU types' true throughput parameters (B: compute 3x faster, its own sync costs)
TRUTH = {"A": ThroughputParams(0.06, 0.003, 0.02, 0.005, 0.2, 0.02, 1.5),
         "B": ThroughputParams(0.02, 0.001, 0.03, 0.004, 0.3, 0.03, 1.2)}
SHAPES = [(1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (8, 2), (8, 4)]
FLAT = ThroughputPrior(spread=100.0, gamma_spread=100.0)
BOUNDS = BatchBounds(128, 4096, 16, 64)


def _samples(gpu_type: str, shapes=SHAPES) -> tuple[ProfileSample, ...]:
    tm = ThroughputModel(TRUTH[gpu_type])
    return tuple(ProfileSample(N, K, m, float(tm.iteration_time(K, N, m, s)), 0.0, s, gpu_type)
                 for K, N in shapes for m in (16, 32, 64) for s in (0, 2))


def _seed(gpu_type: str, times: dict[int, float]) -> tuple[ProfileSample, ...]:
    return tuple(ProfileSample(1, 1, m, t, 0.0, 0, gpu_type) for m, t in times.items())


#: one-GPU seed rows: at m = 64, the job's largest micro-batch, A takes 0.4 s, B 0.1 s
SEED_A = _seed("A", {16: 0.2, 32: 0.25, 64: 0.4, 128: 0.7})
SEED_B = _seed("B", {16: 0.08, 32: 0.09, 64: 0.1, 128: 0.15})


def _job(profile=(), seed=(), jid: str = "j", grad=(1.0, 2.0)) -> AllocJob:
    return AllocJob(id=jid, submit_time=0.0, application="app", age=0.0, attained_service=0.0, num_restarts=0,
                    allocation=(), target_replicas=1, target_batch_size=128, min_replicas=1, max_replicas=8,
                    bounds=BOUNDS, grad_sqr=grad[0], grad_var=grad[1], profile=tuple(profile),
                    seed_profile=tuple(seed))


def test_each_type_is_fitted_to_its_own_reports_alone():
    """A job measured on both types, every shape noiseless: with a flat prior each
    type's fit gives back that type's own parameters (within 1e-3), and is exactly the
    fit of a job that reported that type alone; the pooled (type-blind) fit is neither."""
    both = _job(_samples("A") + _samples("B"))
    tg = TypeGoodput(JobGoodput(FLAT))
    for t in ("A", "B"):
        m = tg.model(both, t)
        assert (m.kind, m.source, m.ratio) == (FITTED, t, 1.0)
        rel = np.abs(np.array(m.throughput.params.astuple()) / np.array(TRUTH[t].astuple()) - 1)
        assert rel.max() < 1e-3, (t, rel)
        alone = JobGoodput(FLAT).model(_job(_samples(t)))
        assert m.throughput.params == alone.throughput.params
        assert m.goodput.efficiency == alone.efficiency and m.goodput.bounds == BOUNDS
    pooled = JobGoodput(FLAT).model(both).throughput.params
    assert pooled not in (tg.model(both, "A").throughput.params, tg.model(both, "B").throughput.params)


def test_a_job_of_one_type_gets_exactly_the_single_type_model():
    """Every report of one type: the model there is the very object JobGoodput gives
    the job (same fit, same cache), prior and fit rules included."""
    jobs = JobGoodput()
    tg = TypeGoodput(jobs)
    job = _job(_samples("A", SHAPES[:3]), SEED_A + SEED_B)
    m = tg.model(job, "A")
    assert m.kind == FITTED and m.goodput is jobs.model(job)
    tg.prepare([job], ["A", "B"])
    assert tg.model(job, "A").goodput is jobs.model(job)


def test_a_type_not_run_on_is_bootstrapped_from_the_fit_elsewhere_times_the_seed_ratio():
    """Reports on A only, seeds on both: the model on B is A's fit with every time
    divided by the one-GPU throughput ratio, read from the seed at the job's largest
    micro-batch (64: 0.4 s on A, 0.1 s on B, ratio 4): every step time a quarter of A's
    fit, every goodput four times, the same best batch."""
    job = _job(_samples("A"), SEED_A + SEED_B)
    tg = TypeGoodput()
    a, b = tg.model(job, "A"), tg.model(job, "B")
    assert (b.kind, b.source) == (BOOTSTRAPPED, "A")
    assert b.ratio == pytest.approx(4.0, rel=1e-12)
    assert b.throughput.params == scaled(a.throughput, 1 / b.ratio).params
    K, N, m, s = np.meshgrid([1, 2, 4, 8], [1, 2], [16, 33, 64], [0, 3])
    ok = N <= K
    ratio = b.throughput.throughput(K[ok], N[ok], m[ok], s[ok]) / a.throughput.throughput(K[ok], N[ok], m[ok], s[ok])
    assert np.allclose(ratio, 4.0, rtol=1e-12, atol=0)
    best_a, best_b = a.goodput.optimize_batch(np.array([1, 4, 8]), np.array([1, 1, 2])), \
        b.goodput.optimize_batch(np.array([1, 4, 8]), np.array([1, 1, 2]))
    assert np.array_equal(best_a.batch, best_b.batch)
    assert np.allclose(best_b.goodput / best_a.goodput, 4.0, rtol=1e-12, atol=0)
    assert b.goodput.efficiency == a.goodput.efficiency  # efficiency does not depend on the type
    assert tg.model(job, "B").goodput is b.goodput  # kept


def test_the_seed_ratio_is_read_at_the_largest_batch_both_measured():
    """Rows at 32 and 128 on A, up to 64 on B, no per-GPU limit below: m* = 64, A's
    step time there interpolated in log-log (the geometric mean of 32's and 128's)."""
    job = _job(seed=_seed("A", {32: 0.2, 128: 0.8}) + _seed("B", {16: 0.05, 64: 0.1}))
    job.bounds = BatchBounds(128, 4096, 16, None)
    assert seed_ratio(job, "B", "A") == pytest.approx(math.sqrt(0.2 * 0.8) / 0.1, rel=1e-12)
    assert seed_ratio(job, "A", "B") == pytest.approx(0.1 / math.sqrt(0.2 * 0.8), rel=1e-12)
    assert seed_ratio(job, "C", "A") is None
    apart = _job(seed=_seed("A", {256: 1.0}) + _seed("B", {16: 0.1, 64: 0.2}))
    assert seed_ratio(apart, "B", "A") is None


def test_what_the_model_on_a_type_rests_on_and_when_it_is_not_offered():
    """Only the job's reports and its seed rows count: without a seed row on B (or with
    no seed at all) a job that ran on A is offered nothing on B; with a seed row on B
    but no run to scale, the model is the fit to those rows; a job that reported and
    declared nothing gets the prior's model on every type; B's seed rows do not change
    A's fit, and rows on a third type change nothing on A or B."""
    tg = TypeGoodput()
    ran = _samples("A", SHAPES[:4])
    assert tg.model(_job(ran), "B") is None
    assert tg.model(_job(ran, SEED_A), "B") is None
    assert tg.model(_job(ran), "A").kind == FITTED
    seeded = tg.model(_job((), SEED_B), "B")
    assert seeded.kind == SEEDED
    assert seeded.throughput.params == JobGoodput().model(_job(SEED_B)).throughput.params
    assert tg.model(_job((), SEED_B), "A") is None
    # reports on A but no seed row on A: no ratio to scale by, so B's seed rows alone
    assert tg.model(_job(ran, SEED_B), "B").throughput.params == seeded.throughput.params
    blank = _job()
    for t in ("A", "B", "C"):
        m = tg.model(blank, t)
        assert m.kind == PRIOR and m.goodput is tg.jobs.model(blank)
    base = tg.model(_job(ran, SEED_A + SEED_B), "B")
    more = _job(ran, SEED_A + SEED_B + _seed("C", {16: 9.0, 64: 9.5}))
    assert tg.model(more, "B").throughput.params == base.throughput.params
    assert tg.model(more, "A").throughput.params == tg.model(_job(ran), "A").throughput.params
    assert set(tg.models(more, ["A", "B", "C", "D"])) == {"A", "B", "C"}


def test_the_bootstrap_source_is_the_type_with_most_reports_and_prepare_batches_fits():
    """Reports on A (one) and B (many), seeds on A, B and C: C is bootstrapped from B
    (ratio 0.1 s / 0.2 s at m = 64); prepare() runs the two fits model() needs, after
    which model() fits nothing."""
    seed_c = _seed("C", {16: 0.1, 64: 0.2})
    job = _job(_samples("A", SHAPES[:1])[:1] + _samples("B"), SEED_A + SEED_B + seed_c)
    jobs = JobGoodput()
    tg = TypeGoodput(jobs)
    tg.prepare([job], ["A", "B", "C"])
    assert len(jobs._fits) == 2
    c = tg.model(job, "C")
    assert (c.kind, c.source) == (BOOTSTRAPPED, "B") and c.ratio == pytest.approx(0.5, rel=1e-12)
    assert [tg.model(job, t).kind for t in ("A", "B")] == [FITTED, FITTED]
    assert len(jobs._fits) == 2


def test_a_later_decision_refits_only_the_job_that_reported_again():
    """Plans and fits are kept across decisions while a job's facts hold: copies of the
    jobs with the same reports are fitted by nothing and get the same models; a job
    that reported one more step time on A is fitted anew on A (and its model on B,
    bootstrapped from A, follows) while the other job keeps its models; new gradient
    statistics keep the fit and change the efficiency."""
    jobs = JobGoodput()
    fitted: list[int] = []
    fit = jobs._fitted
    jobs._fitted = lambda problems: (problems and fitted.append(len(problems)), fit(problems))[1]
    tg = TypeGoodput(jobs)
    a = _job(_samples("A", SHAPES[:3]), SEED_A + SEED_B, jid="a")
    b = _job(_samples("B", SHAPES[:2]), SEED_A + SEED_B, jid="b")

    def decide(*js):
        tg.prepare(js, ["A", "B"])
        return {(j.id, t): tg.model(j, t).goodput for j in js for t in ("A", "B")}

    first = decide(a, b)
    assert fitted == [2]
    again = decide(dataclasses.replace(a), dataclasses.replace(b))
    assert fitted == [2] and all(again[k] is first[k] for k in first)
    last = a.profile[-1]
    a3 = dataclasses.replace(a, profile=a.profile + (dataclasses.replace(last, step_time=last.step_time * 1.5),))
    moved = decide(a3, dataclasses.replace(b))
    assert fitted == [2, 1]
    assert moved["a", "A"].throughput.params != first["a", "A"].throughput.params
    assert moved["a", "B"].throughput.params != first["a", "B"].throughput.params
    assert moved["b", "A"] is first["b", "A"] and moved["b", "B"] is first["b", "B"]
    a4 = dataclasses.replace(a3, grad_sqr=3.0)
    grads = decide(a4, b)
    assert fitted == [2, 1]
    assert grads["a", "A"].throughput is moved["a", "A"].throughput
    assert grads["a", "A"].efficiency != moved["a", "A"].efficiency
