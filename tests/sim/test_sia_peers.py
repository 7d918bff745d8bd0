"""The heterogeneity-aware peers (sim/peers/sia.py, sim/peers/gavel.py): exact answers on
tiny clusters of two GPU types, capacity and one type per job, and that each reads
per-type speed only from what the job reported or declared."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rlsched.core.allocation import AllocJob, AllocNode, ProfileSample, check_allocations
from rlsched.core.batch import BatchBounds
from rlsched.sim.allocators import make_allocator
from rlsched.sim.interval import IntervalSimulator
from rlsched.sim.peers.gavel import GavelAllocator, seed_step_time
from rlsched.sim.peers.sia import Config, SiaAllocator, configurations, one_gpu_throughput
from rlsched.sim.traces import load_trace

DATA = Path(os.environ.get("RLSCHED_DATA_DIR") or Path(__file__).resolve().parents[2].parent / "shared" / "data")
BOUNDS = BatchBounds(64, 1024, 8, 128)


def _nodes(spec: list[tuple[str, int]]) -> list[AllocNode]:
    return [AllocNode(i, g, f"n{i}", gpu_model=t, gpu_type=t) for i, (t, g) in enumerate(spec)]


def _seed(t: str, step: float) -> tuple[ProfileSample, ...]:
    """One-GPU seed rows on ``t``: ``step`` s at 64 per GPU, 2·step at 128."""
    return (ProfileSample(1, 1, 64, step, 0.0, gpu_type=t), ProfileSample(1, 1, 128, 2 * step, 0.0, gpu_type=t))


def _job(jid: str, *, seeds=(), profile=(), allocation=(), age=0.0, restarts=0, target=1, app="cifar10") -> AllocJob:
    return AllocJob(id=jid, submit_time=0.0, application=app, age=age, attained_service=0.0, num_restarts=restarts,
                    allocation=tuple(allocation), target_replicas=target, target_batch_size=64, min_replicas=1,
                    max_replicas=16, bounds=BOUNDS, profile=tuple(profile), seed_profile=tuple(seeds))


def _check(jobs, nodes, out):
    """A valid allocation, each job on one type, no type over its GPUs."""
    check_allocations(jobs, nodes, out)
    kind = {n.index: n.gpu_type for n in nodes}
    for a in out.values():
        assert len({kind[i] for i in a.nodes}) <= 1
    used = Counter(kind[i] for a in out.values() for i in a.nodes)
    for t, k in used.items():
        assert k <= sum(n.gpus for n in nodes if n.gpu_type == t)


# ------------------------------------------------------------------ Sia
def test_the_configuration_set_is_powers_of_two_in_a_node_then_whole_nodes():
    cfg = configurations(_nodes([("a", 4), ("a", 4), ("a", 4), ("b", 8)]))
    assert [(c.gpu_type, c.nodes, c.gpus) for c in cfg] == [
        ("a", 1, 1), ("a", 1, 2), ("a", 1, 4), ("a", 2, 8), ("a", 3, 12),
        ("b", 1, 1), ("b", 1, 2), ("b", 1, 4), ("b", 1, 8)]


def test_sia_gives_the_one_fast_gpu_to_the_job_it_speeds_up_most():
    """One GPU of each type; x runs 4x faster on b, y 2x: normalised goodputs x (1, 4),
    y (1, 2); with p = -0.5 the sum 4^-0.5 + 1 = 1.5 beats 1 + 2^-0.5 = 1.71."""
    nodes = _nodes([("a", 1), ("b", 1)])
    jobs = [_job("x", seeds=_seed("a", 0.4) + _seed("b", 0.1)), _job("y", seeds=_seed("a", 0.2) + _seed("b", 0.1))]
    out = SiaAllocator().allocate(jobs, nodes, 0.0)
    _check(jobs, nodes, out)
    assert out["x"].nodes == (1,) and out["y"].nodes == (0,)


def test_sia_scales_a_job_that_scales_and_keeps_capacity_per_type():
    """A job that ran on 2 GPUs of a (perfectly: twice the one-GPU rate) may take 4 of b,
    where it is bootstrapped twice as fast; a new job waits rather than cross types."""
    nodes = _nodes([("a", 2), ("b", 4)])
    ran = (ProfileSample(1, 1, 64, 0.2, 0.0, gpu_type="a"), ProfileSample(1, 2, 32, 0.1, 0.0, gpu_type="a"))
    x = _job("x", seeds=_seed("a", 0.2) + _seed("b", 0.1), profile=ran, allocation=(0, 0), age=600.0)
    y = _job("y", seeds=_seed("a", 0.2))
    out = SiaAllocator().allocate([x, y], nodes, 600.0)
    _check([x, y], nodes, out)
    assert out["x"].nodes == (1, 1, 1, 1)
    assert out["y"].nodes == (0,)


def test_sia_bootstraps_a_type_from_another_by_the_seed_ratio():
    """On a type it never ran on, a job's goodput is its fitted model where it ran
    (several GPUs) times thr1(b)/thr1(a) from its seeds; with no seed on b, no estimate."""
    ran = (ProfileSample(1, 2, 32, 0.15, 0.05, gpu_type="a"), ProfileSample(1, 1, 64, 0.2, 0.0, gpu_type="a"))
    sia = SiaAllocator()
    job = _job("x", seeds=_seed("a", 0.2) + _seed("b", 0.05), profile=ran)
    est = sia.estimators(job, ["a", "b"])
    assert est["a"][1:] == ("a", 1.0) and est["b"][1] == "a"
    assert est["b"][0] is est["a"][0]
    assert est["b"][2] == pytest.approx(one_gpu_throughput(_seed("b", 0.05)) / one_gpu_throughput(_seed("a", 0.2)))
    assert est["b"][2] == pytest.approx(4.0)
    assert set(sia.estimators(dataclasses.replace(job, seed_profile=_seed("a", 0.2)), ["a", "b"])) == {"a"}


def test_sia_places_no_job_where_it_has_no_report_and_no_seed():
    """Free GPUs on b, but the jobs declared and reported nothing there: they stay on a
    (or wait), whatever b would do for them."""
    nodes = _nodes([("a", 1), ("b", 8)])
    ran = (ProfileSample(1, 1, 64, 0.2, 0.0, gpu_type="a"),)
    jobs = [_job("new", seeds=_seed("a", 0.3)), _job("old", profile=ran, allocation=(0,), age=120.0)]
    sia = SiaAllocator()
    for now in (120.0, 180.0, 240.0):
        out = sia.allocate(jobs, nodes, now)
        _check(jobs, nodes, out)
        assert all(i == 0 for a in out.values() for i in a.nodes)


def test_sia_restart_factor_and_whole_nodes_for_several_nodes():
    sia = SiaAllocator()
    assert sia._realloc_factor(_job("x", age=1000.0, restarts=2)) == pytest.approx((1000 - 2 * 30) / (1000 + 30))
    assert sia._realloc_factor(_job("x", age=10.0, restarts=2)) == 1.0
    nodes = _nodes([("a", 4), ("a", 4), ("a", 4)])
    # node 1 has one GPU busy: a two-node configuration takes nodes 0 and 2 whole
    busy = _job("busy", allocation=(1,), seeds=_seed("a", 0.2))
    items = [(0, Config("a", 2, 8)), (1, Config("a", 1, 1))]
    where = sia._place_type([_job("x"), busy], nodes, items, keep=True)
    assert sorted(where[0]) == [0] * 4 + [2] * 4 and where[1] == (1,)


def test_sia_on_random_small_problems_respects_capacity_and_types():
    rng = np.random.default_rng(5)
    nodes = _nodes([("a", 4), ("a", 4), ("b", 8)])
    sia = SiaAllocator()
    jobs: list[AllocJob] = []
    for r in range(8):
        jobs = []
        for i in range(int(rng.integers(3, 9))):
            t = str(rng.choice(["a", "b"]))
            k = int(rng.choice([1, 2, 4]))
            prof = (ProfileSample(1, k, 32, float(rng.uniform(0.05, 0.3)), 0.01, gpu_type=t),)
            jobs.append(_job(f"j{i}", seeds=_seed("a", float(rng.uniform(0.1, 0.4))) + _seed("b", 0.1),
                             profile=prof, age=300.0 * r))
        out = sia.allocate(jobs, nodes, 60.0 * r)
        _check(jobs, nodes, out)
        assert out


# ------------------------------------------------------------------ Gavel
def test_gavel_lp_puts_the_job_with_most_throughput_to_gain_on_the_fast_type():
    """x: 2.5 vs 10 steps/s (a, b), y: 5 vs 10: the sum is largest with x on b, y on a."""
    nodes = _nodes([("a", 1), ("b", 1)])
    jobs = [_job("x", seeds=_seed("a", 0.4) + _seed("b", 0.1)), _job("y", seeds=_seed("a", 0.2) + _seed("b", 0.1))]
    g = GavelAllocator()
    assert g.throughputs(jobs[0], ["a", "b"], {"a": 1, "b": 1}) == pytest.approx({"a": 2.5, "b": 10.0})
    out = g.allocate(jobs, nodes, 0.0)
    _check(jobs, nodes, out)
    assert out["x"].nodes == (1,) and out["y"].nodes == (0,)


def test_gavel_is_rigid_keeps_rounds_and_reads_only_reports_and_seeds():
    """A 4-GPU job never lands on a 2-GPU type; allocations stand within a round; a job
    with reports on a but no seeds is not placed on b; measured speed beats the seed."""
    nodes = _nodes([("a", 2), ("b", 4)])
    big = _job("big", target=4, seeds=_seed("a", 0.1) + _seed("b", 0.4))
    g = GavelAllocator(round_s=360.0)
    out = g.allocate([big], nodes, 0.0)
    assert sorted(out["big"].nodes) == [1] * 4
    ran = (ProfileSample(1, 1, 64, 0.5, 0.0, gpu_type="a"),)
    old = _job("old", profile=ran, allocation=(0,))
    assert g.throughputs(old, ["a", "b"], {"a": 2, "b": 4}) == {"a": 2.0}
    new = _job("new", seeds=_seed("a", 0.1))
    mid = g.allocate([dataclasses.replace(big, allocation=out["big"].nodes), new], nodes, 60.0)
    assert set(mid) == {"big"}  # the new job waits for the next round
    assert seed_step_time(_seed("a", 0.1), 96) == pytest.approx(0.15)
    assert seed_step_time(_seed("a", 0.1), 256) == pytest.approx(0.4)


# ------------------------------------------------------------------ in the engine
@pytest.mark.parametrize("policy", ["sia", "gavel"])
def test_the_peers_run_on_the_sia_mix_one_type_per_job(policy):
    """The first 20 minutes of Philly workload 1 on the 64-GPU mix."""
    trace = load_trace("sia:workloads/philly/workload-1", data_dir=DATA)
    trace.jobs = trace.jobs[:16]
    sim = IntervalSimulator(trace.jobs, trace.apps, make_allocator(policy), cluster=trace.cluster,
                            config=trace.interval_config(max_time=1200.0), seeds=trace.seeds)
    ran = 0
    while not sim.done:
        sim.step()
        for j in sim._active:
            assert len({sim._type_of[i] for i in j.nodes}) <= 1
        ran = max(ran, sum(1 for j in sim._active if j.nodes))
    assert ran >= 4
