"""The Pollux-paper reference allocator (sim/peers/pollux_paper.py): exact small cases
against hand reasoning and brute force, feasibility, determinism, non-clairvoyance."""

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.core.allocation import (
    AllocJob,
    Allocator,
    AllocNode,
    ProfileSample,
    check_allocations,
)
from rlsched.core.batch import BatchBounds
from rlsched.sim.peers import PEERS, PolluxPaperAllocator

LIMITS = BatchBounds(128, 2048, 16, 256)


def step_time(k, n, m):
    """A job's true step time on ``k`` GPUs over ``n`` nodes at ``m`` per GPU: 20 ms +
    0.5 ms per sample of compute, 10 ms all-reduce within a node, 80 ms across nodes
    (no overlap) — a job that scales well on one node and poorly across nodes."""
    sync = 0.0 if k == 1 else (0.010 if n == 1 else 0.080)
    return 0.020 + 0.0005 * m + sync


def samples(*shapes):
    """ProfileSamples measured on ``(k, n, m)`` shapes."""
    return tuple(ProfileSample(num_nodes=n, num_replicas=k, atomic_bsz=m, step_time=step_time(k, n, m),
                               sync_time=step_time(k, n, m) - step_time(1, 1, m)) for k, n, m in shapes)


PROFILE = samples((1, 1, 128), (1, 1, 256), (2, 1, 64), (4, 1, 32), (4, 1, 128), (4, 2, 64))


def job(jid, *, profile=PROFILE, alloc=(), age=3600.0, restarts=0, attained=0.0, submit=0.0, max_replicas=16,
        grad=(1.0, 4.0), oracle=None):
    return AllocJob(
        id=jid, submit_time=submit, application="app", age=age, attained_service=attained, num_restarts=restarts,
        allocation=tuple(alloc), target_replicas=1, target_batch_size=128, min_replicas=1, max_replicas=max_replicas,
        bounds=LIMITS, grad_sqr=grad[0], grad_var=grad[1], profile=profile, oracle=oracle,
    )


def cluster(*gpus):
    return [AllocNode(i, g, f"n{i}") for i, g in enumerate(gpus)]


def decide(alloc, jobs, nodes, now=0.0):
    out = alloc.allocate(jobs, nodes, now)
    check_allocations(jobs, nodes, out)
    assert set(out) == {j.id for j in jobs}
    return out


def test_registered_as_a_non_clairvoyant_allocator():
    assert PEERS["pollux-paper"] is PolluxPaperAllocator
    a = PolluxPaperAllocator()
    assert isinstance(a, Allocator)
    assert a.name == "pollux-paper" and a.clairvoyant is False


def test_efficiency_is_the_engines_normalisation():
    """AllocJob's grad_var is at the initial batch (AdaptDL's, the engine's): GOODPUT's
    efficiency × M/M0 is the engine's progress per update (var + sqr)/(var·M0/M + sqr)."""
    sqr, var = 0.3, 2.0
    gm = PolluxPaperAllocator().model(job("a", grad=(sqr, var)))
    m0 = LIMITS.init_batch
    for M in (128, 200, 512, 2048):
        assert gm.efficiency.efficiency(M) * M / m0 == pytest.approx((var + sqr) / (var * m0 / M + sqr), rel=1e-12)


def test_the_throughput_fit_recovers_the_measured_step_times():
    gm = PolluxPaperAllocator().model(job("a"))
    for s in PROFILE:
        got = gm.throughput.iteration_time(s.num_replicas, s.num_nodes, s.atomic_bsz)
        assert got == pytest.approx(s.step_time, rel=0.1)


def test_a_single_job_gets_the_allocation_that_maximises_its_goodput():
    """Brute force over every GPU count and node spread the job may have (its cap is
    twice the 4 GPUs it measured): the allocator's choice has the best goodput, and its
    batch is the goodput-optimal one at that allocation."""
    nodes = cluster(4, 4, 4)
    a = PolluxPaperAllocator(seed=1)
    j = job("a")
    out = decide(a, [j], nodes)["a"]
    gm = a.model(j)
    best = max(gm.optimize_batch(k, n).goodput for k in range(1, 9) for n in range(1, 4)
               if n <= k and k <= 4 * n)
    got = gm.optimize_batch(out.replicas, len(set(out.nodes)))
    assert got.goodput == pytest.approx(best, rel=1e-9)
    # the optimal batch in whole per-GPU batches: at most one sample per micro-batch below it
    assert got.batch - out.replicas * (out.accum_steps + 1) < out.batch_size <= got.batch
    assert out.replicas == 4 and len(set(out.nodes)) == 1  # across nodes costs 80 ms: one node wins


def test_a_new_job_explores_one_doubling_at_a_time():
    a = PolluxPaperAllocator()
    out = decide(a, [job("a", profile=())], cluster(4, 4))
    assert out["a"].replicas == 1
    out = decide(PolluxPaperAllocator(), [job("a", profile=samples((1, 1, 128)))], cluster(4, 4))
    assert out["a"].replicas == 2


def test_two_identical_jobs_share_evenly():
    nodes = cluster(4, 4)
    out = decide(PolluxPaperAllocator(seed=3), [job("a"), job("b", submit=1.0)], nodes)
    assert out["a"].replicas == out["b"].replicas == 4
    assert len(set(out["a"].nodes)) == len(set(out["b"].nodes)) == 1


def test_the_restart_penalty_keeps_an_allocation_when_the_gain_is_below_it():
    """On 2 GPUs of node 0; 4 GPUs there would be faster. Young with two restarts the
    factor (100 − 2·30)/(100 + 30) = 0.31 is below 2(4 GPUs)/2(2 GPUs) ≈ 1.7: it
    stays. Old with no restarts the factor is ~1: it grows."""
    nodes = cluster(4)
    gm = PolluxPaperAllocator().model(job("a"))
    gain = gm.optimize_batch(4, 1).goodput / gm.optimize_batch(2, 1).goodput
    assert 1.2 < gain < (100 + 30) / (100 - 60)
    young = decide(PolluxPaperAllocator(), [job("a", alloc=(0, 0), age=100.0, restarts=2)], nodes)
    assert young["a"].nodes == (0, 0)
    old = decide(PolluxPaperAllocator(), [job("a", alloc=(0, 0), age=1e6, restarts=0)], nodes)
    assert old["a"].replicas == 4


def _every_allocation(caps, node_gpus):
    """Every feasible allocation matrix: node capacity, at most one distributed job per
    node, each job within its cap."""
    rows = [[r for r in itertools.product(*(range(g + 1) for g in node_gpus)) if sum(r) <= c] for c in caps]
    m = np.array(list(itertools.product(*rows)))  # (count, jobs, nodes)
    ok = (m.sum(axis=1) <= np.array(node_gpus)).all(axis=1)
    distributed = (m > 0).sum(axis=2) > 1
    ok &= ((m > 0) & distributed[:, :, None]).sum(axis=1).max(axis=1) <= 1
    return m[ok]


@pytest.mark.parametrize("seed", range(5))
def test_the_search_reaches_the_brute_force_optimum_on_tiny_clusters(seed):
    """Every feasible allocation matrix of four jobs on 2 × 3 GPUs, each scored with
    the allocator's own fitness: the genetic search returns one with the best score.
    The optimum here takes a GPU from a running job (a restart) to start the others."""
    nodes = cluster(3, 3)
    jobs = [job("a", age=500.0, alloc=(0, 0), restarts=1),
            job("b", profile=samples((1, 1, 128)), attained=100.0, submit=1.0),
            job("c", profile=samples((1, 1, 128), (2, 1, 64)), attained=50.0, submit=2.0, grad=(1.0, 100.0)),
            job("d", profile=samples((1, 1, 128), (2, 2, 64)), attained=10.0, submit=3.0, grad=(1.0, 1000.0))]
    a = PolluxPaperAllocator(seed=seed)
    out = decide(a, jobs, nodes)
    every = _every_allocation([a.cap(j) for j in jobs], (3, 3))
    best = a.fitness_of_matrices(jobs, nodes, every).max()
    assert a.fitness_of(jobs, nodes, out) == pytest.approx(best, rel=1e-12)


def test_deterministic_under_a_seed():
    nodes = cluster(4, 4, 4, 4)
    jobs = [job(f"j{i}", submit=float(i), attained=30.0 * i, profile=PROFILE[: 1 + i % 6]) for i in range(9)]

    def run(seed):
        a, log = PolluxPaperAllocator(seed=seed), []
        cur = list(jobs)
        for t in range(3):
            out = decide(a, cur, nodes, 60.0 * t)
            log.append({k: (v.nodes, v.atomic_bsz, v.accum_steps) for k, v in out.items()})
            cur = [replace(j, allocation=out[j.id].nodes, age=j.age + 60.0) for j in cur]
        return log

    assert run(7) == run(7)


class _Forbidden:
    """An oracle a non-clairvoyant allocator must never touch."""

    def __getattribute__(self, name):
        raise AssertionError(f"pollux-paper read the oracle's {name}")


def test_it_reads_no_oracle():
    nodes = cluster(4, 4)
    plain = [job("a"), job("b", submit=1.0)]
    spied = [job("a", oracle=_Forbidden()), job("b", submit=1.0, oracle=_Forbidden())]
    assert decide(PolluxPaperAllocator(), plain, nodes) == decide(PolluxPaperAllocator(), spied, nodes)


@settings(max_examples=15, deadline=None)
@given(
    gpus=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    specs=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 8), st.floats(0, 1e4), st.integers(0, 3)),
                   min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_always_a_valid_allocation(gpus, specs, seed):
    nodes = cluster(*gpus)
    jobs = []
    for i, (shapes, mx, age, restarts) in enumerate(specs):
        jobs.append(job(f"j{i}", profile=PROFILE[:shapes], max_replicas=mx, age=age, restarts=restarts,
                        submit=float(i), attained=float(10 * i), alloc=(0,) if i == 0 else ()))
    out = decide(PolluxPaperAllocator(seed=seed, generations=10, population=16), jobs, nodes)
    for a in out.values():
        if a.nodes and a.atomic_bsz is not None:
            assert LIMITS.min_local_batch <= a.atomic_bsz <= LIMITS.largest_local


def test_rejects_calls_out_of_time_order():
    a = PolluxPaperAllocator()
    decide(a, [job("a")], cluster(4), 60.0)
    with pytest.raises(ValueError):
        a.allocate([job("a")], cluster(4), 0.0)
