"""rlsched's goodput allocator (core/goodput_allocator.py): each rule of its decision on
a case small enough to reason out by hand, feasibility on random cases, and that it
reads only what jobs report."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.core.allocation import AllocJob, Allocator, AllocNode, ProfileSample, check_allocations
from rlsched.core.batch import BatchBounds
from rlsched.core.goodput_allocator import GoodputAllocator
from rlsched.sim.allocators import make_allocator

# an application whose per-GPU batch is fixed (min = max local batch = init batch):
# every allocation trains at 64 samples per GPU, so goodput is throughput alone
FIXED = BatchBounds(64, 64 * 64, 64, 64)
# and one whose batch may grow 16x, with up to 256 per GPU
ELASTIC = BatchBounds(128, 2048, 16, 256)


def linear_step(k, n, m):
    """Perfect scaling: the step time does not depend on the GPUs."""
    return 0.010 + 0.001 * m


def poor_step(k, n, m):
    """Synchronisation as costly as the compute once there are 2+ GPUs: 2 GPUs are
    worth about one."""
    return (0.010 + 0.001 * m) * (1.0 if k == 1 else 2.0 + 0.2 * (k - 2))


def measured(step, *shapes):
    return tuple(ProfileSample(num_nodes=n, num_replicas=k, atomic_bsz=m, step_time=step(k, n, m),
                               sync_time=step(k, n, m) - step(1, 1, m)) for k, n, m in shapes)


SHAPES = ((1, 1, 64), (2, 1, 64), (4, 1, 64), (8, 2, 64))


def make_job(jid, *, step=linear_step, bounds=FIXED, alloc=(), age=1e5, restarts=0, attained=0.0, submit=0.0,
             max_replicas=16, min_replicas=1, grad=(1.0, 1.0), oracle=None):
    return AllocJob(id=jid, submit_time=submit, application="app", age=age, attained_service=attained,
                    num_restarts=restarts, allocation=tuple(alloc), target_replicas=1,
                    target_batch_size=bounds.init_batch, min_replicas=min_replicas, max_replicas=max_replicas,
                    bounds=bounds, grad_sqr=grad[0], grad_var=grad[1], profile=measured(step, *SHAPES), oracle=oracle)


def nodes_of(*gpus):
    return [AllocNode(i, g, f"n{i}") for i, g in enumerate(gpus)]


def decide(jobs, nodes, allocator=None, now=0.0):
    allocator = allocator or GoodputAllocator()
    out = allocator.allocate(jobs, nodes, now)
    check_allocations(jobs, nodes, out)
    assert set(out) == {j.id for j in jobs}
    return out


def counts(out):
    return {k: a.replicas for k, a in out.items()}


def test_registered_and_non_clairvoyant():
    a = make_allocator("goodput")
    assert isinstance(a, GoodputAllocator) and isinstance(a, Allocator)
    assert a.name == "goodput" and a.clairvoyant is False


def test_the_least_served_jobs_run_first_when_gpus_are_short():
    """6 one-GPU jobs on 4 GPUs: the four in the fairness order run — queue 0 (below
    the threshold of attained service) first, first come first served within it."""
    big = GoodputAllocator().threshold
    jobs = [make_job("old-heavy", submit=0.0, attained=2 * big, alloc=(0,)),
            make_job("a", submit=1.0), make_job("b", submit=2.0), make_job("c", submit=3.0),
            make_job("d", submit=4.0), make_job("e", submit=5.0)]
    out = counts(decide(jobs, nodes_of(2, 2)))
    assert out == {"old-heavy": 0, "a": 1, "b": 1, "c": 1, "d": 1, "e": 0}


def test_a_lone_job_gets_every_gpu_it_can_use_in_one_decision():
    """One perfectly scaling job and 8 free GPUs: all 8 at once (many workers added in
    one decision), at the batch its goodput model picks for 8 GPUs."""
    jobs = [make_job("a", max_replicas=8)]
    out = decide(jobs, nodes_of(4, 4))
    assert out["a"].replicas == 8 and sorted(out["a"].nodes) == [0] * 4 + [1] * 4
    assert (out["a"].atomic_bsz, out["a"].accum_steps) == (64, 0)


def test_gpus_go_where_they_are_worth_most():
    """A perfectly scaling job and one that gains nothing from a second GPU share 8
    GPUs: the poorly scaling one keeps one GPU, the other takes the rest."""
    jobs = [make_job("good", max_replicas=8), make_job("poor", step=poor_step, submit=1.0, max_replicas=8)]
    assert counts(decide(jobs, nodes_of(4, 4))) == {"good": 7, "poor": 1}


def test_a_running_job_shrinks_to_let_a_waiting_one_start():
    """A perfectly scaling job holding all 4 GPUs and a newcomer: the newcomer starts
    on GPUs the running job gives up; with log utility (proportional fairness) they
    split evenly, since log 2 + log 2 > log 3 + log 1."""
    jobs = [make_job("running", alloc=(0, 0, 0, 0), attained=10.0), make_job("new", submit=1.0)]
    out = counts(decide(jobs, nodes_of(4)))
    assert out["new"] >= 1 and out["running"] >= 1 and out["new"] + out["running"] == 4
    assert counts(decide(jobs, nodes_of(4), GoodputAllocator(p=0.0))) == {"running": 2, "new": 2}


@pytest.mark.parametrize("age, grows", [(10.0, False), (1e5, True)])
def test_a_change_must_pay_for_its_restart(age, grows):
    """A running job on 2 of 4 GPUs that would scale perfectly to 4: a young job (10 s
    old, factor 10/70) would train slower over its horizon after a 60 s restart and
    stays on its 2 GPUs; an old one grows."""
    jobs = [make_job("a", alloc=(0, 0), age=age, max_replicas=4)]
    out = decide(jobs, nodes_of(4))
    assert out["a"].replicas == (4 if grows else 2)
    if not grows:
        assert out["a"].nodes == (0, 0)  # kept where it was: no restart


@pytest.mark.parametrize("horizon", [0.0, 600.0])
def test_idle_gpus_nobody_waits_for_go_to_a_young_job_that_can_use_them(horizon):
    """The young job of the test above on 2 of 4 GPUs: with ``idle_horizon`` (600 s) the
    2 GPUs nobody waits for are weighed over a horizon of at least 600 s (factor
    600/660 instead of 10/70), so it grows to 4; off (0, the default) it stays on 2."""
    a = GoodputAllocator(idle_horizon=horizon)
    young = make_job("a", alloc=(0, 0), age=10.0, max_replicas=4)
    assert a.factor(young, idle=True) == pytest.approx((600 / 660) if horizon else 10 / 70)
    assert a.factor(young) == pytest.approx(10 / 70)  # someone waits: Pollux's factor as it is
    assert decide([young], nodes_of(4), a)["a"].replicas == (4 if horizon else 2)


def test_idle_horizon_changes_nothing_while_a_job_waits():
    """A job that waits (its gang of 4 does not fit beside the young one) keeps the rule
    as it is: the young job stays on its 2 GPUs with or without ``idle_horizon``."""
    jobs = [make_job("a", alloc=(0, 0), age=10.0, max_replicas=4),
            make_job("b", submit=1.0, min_replicas=4, max_replicas=4)]
    base = decide(jobs, nodes_of(4))
    idle = decide(jobs, nodes_of(4), GoodputAllocator(idle_horizon=600.0))
    assert counts(base) == counts(idle) == {"a": 2, "b": 0}
    with pytest.raises(ValueError):
        GoodputAllocator(idle_horizon=-1.0)


def test_a_job_that_restarted_often_pays_more_for_a_change():
    """The factor max(T − R·δ, 0)/(T + δ) (δ = 60 s by default): with 50 restarts in
    1,000 s, nothing pays."""
    a = GoodputAllocator()
    assert a.factor(make_job("x", age=1000.0, restarts=0)) == pytest.approx(1000 / 1060)
    assert GoodputAllocator(restart_delay=30.0).factor(make_job("x", age=1000.0, restarts=2)) == pytest.approx(940 / 1030)
    assert a.factor(make_job("x", age=1000.0, restarts=50)) == 0.0
    jobs = [make_job("a", alloc=(0,), age=1000.0, restarts=50, max_replicas=4)]
    assert decide(jobs, nodes_of(4))["a"].nodes == (0,)


def test_the_batch_size_is_chosen_with_the_allocation():
    """An elastic-batch job with a large gradient noise scale (big batches lose little
    efficiency) trains at the goodput-optimal batch of its allocation; with a tiny noise
    scale it stays near its initial batch."""
    alloc = GoodputAllocator()
    noisy = make_job("a", bounds=ELASTIC, max_replicas=4, grad=(1.0, 1e4))
    out = decide([noisy], nodes_of(4), alloc)["a"]
    gm = alloc.jobs.model(noisy)
    best = gm.optimize_batch(out.replicas, 1)
    assert out.batch_size == pytest.approx(best.batch, rel=0.05) and out.batch_size > ELASTIC.init_batch
    quiet = make_job("a", bounds=ELASTIC, max_replicas=4, grad=(1.0, 1e-4))
    out = decide([quiet], nodes_of(4), GoodputAllocator())["a"]
    assert out.batch_size <= 2 * ELASTIC.init_batch


def test_gpus_follow_statistical_efficiency():
    """Two elastic-batch jobs share 8 GPUs of a poorly scaling application, where more
    GPUs pay only through a larger batch: the job whose gradient noise scale is large
    (large batches lose little progress per sample) gets more GPUs than the one whose
    small noise scale makes every sample beyond its initial batch nearly wasted."""
    wide = make_job("wide", step=poor_step, bounds=ELASTIC, max_replicas=8, grad=(1.0, 1e3))
    narrow = make_job("narrow", step=poor_step, bounds=ELASTIC, max_replicas=8, submit=1.0, grad=(1.0, 1e-3))
    out = counts(decide([wide, narrow], nodes_of(4, 4)))
    assert out["wide"] > out["narrow"] >= 1


def test_it_reads_no_oracle():
    class Forbidden:
        def __getattribute__(self, name):
            raise AssertionError(f"goodput read the oracle's {name}")

    nodes = nodes_of(4, 4)
    plain = [make_job("a"), make_job("b", submit=1.0, step=poor_step)]
    spied = [replace(j, oracle=Forbidden()) for j in plain]
    assert decide(plain, nodes) == decide(spied, nodes)


def test_rejects_calls_out_of_time_order_and_bad_settings():
    a = GoodputAllocator()
    decide([make_job("a")], nodes_of(4), a, now=60.0)
    with pytest.raises(ValueError):
        a.allocate([make_job("a")], nodes_of(4), 0.0)
    for bad in ({"p": float("nan")}, {"restart_delay": -1.0}, {"threshold": 0.0}, {"room_rounds": 0},
                {"room_rounds": 2.5}):
        with pytest.raises(ValueError):
            GoodputAllocator(**bad)


def test_gpus_no_whole_worker_fits_on_go_to_the_others_round_after_round():
    """Two nodes of 4 GPUs; a holds 2 on each and keeps them (protected). Four waiting
    jobs of one 4-GPU worker each cannot be placed: no node has 4 GPUs free. Each round
    of the decision admits the next of them, finds it cannot be placed and decides the
    GPUs again without it: after 3 rounds the 4 free GPUs are still offered to a whole
    worker and stay idle; with 5, every such job has been tried and a takes them."""
    a = replace(make_job("a", alloc=(0, 0, 1, 1), max_replicas=8), protected=True)
    whole = [replace(make_job(f"w{k}", submit=float(k + 1), min_replicas=4, max_replicas=4), replica_group=4)
             for k in range(4)]
    few = counts(decide([a, *whole], nodes_of(4, 4), GoodputAllocator(room_rounds=3)))
    many = counts(decide([a, *whole], nodes_of(4, 4), GoodputAllocator(room_rounds=5)))
    assert few == {"a": 4, "w0": 0, "w1": 0, "w2": 0, "w3": 0}
    assert many == {"a": 8, "w0": 0, "w1": 0, "w2": 0, "w3": 0}


@pytest.mark.parametrize("p", [1.0, 0.0, -1.0])
def test_utility_is_increasing_and_zero_at_speedup_one(p):
    u = GoodputAllocator(p=p).utility(np.array([0.0, 0.5, 1.0, 2.0, 8.0]))
    assert u[0] == -np.inf and u[2] == pytest.approx(0.0) and np.all(np.diff(u[1:]) > 0)


@settings(max_examples=15, deadline=None)
@given(
    gpus=st.lists(st.integers(0, 8), min_size=1, max_size=5),
    specs=st.lists(st.tuples(st.booleans(), st.integers(1, 12), st.integers(1, 3), st.floats(0, 1e5),
                             st.integers(0, 5), st.booleans()), min_size=1, max_size=10),
    p=st.sampled_from([1.0, 0.0, -1.0]),
)
def test_always_a_valid_allocation_that_uses_the_gpus(gpus, specs, p):
    nodes = nodes_of(*gpus)
    free = {n.index: n.gpus for n in nodes}
    jobs = []
    for i, (good, mx, mn, age, restarts, running) in enumerate(specs):
        mn = min(mn, mx)
        alloc = ()
        if running:  # a valid current allocation: mn GPUs wherever they are still free
            take = [n for n, f in free.items() for _ in range(f)][:mn]
            if len(take) == mn:
                alloc = tuple(take)
                for n in take:
                    free[n] -= 1
        jobs.append(make_job(f"j{i}", step=linear_step if good else poor_step, max_replicas=mx, min_replicas=mn,
                             age=age, restarts=restarts, submit=float(i), alloc=alloc,
                             bounds=ELASTIC if i % 2 else FIXED))
    allocator = GoodputAllocator(p=p)
    out = decide(jobs, nodes, allocator)
    # with no restart to weigh (nobody holds GPUs yet), a GPU is left idle only when no
    # job that runs would gain, by its own fitted goodput, from any of the idle GPUs
    if not any(j.allocation for j in jobs):
        idle = sum(gpus) - sum(a.replicas for a in out.values())
        width = min(max(j.max_replicas for j in jobs), sum(gpus)) + 1
        for j in jobs:
            k = out[j.id].replicas
            if idle and 0 < k < j.max_replicas:
                v = allocator.values(j, width, max(gpus))
                assert np.all(v[k + 1:min(k + idle, j.max_replicas, width - 1) + 1] <= v[k]), (counts(out), gpus, j.id)


def test_refit_tolerance_keeps_a_fit_that_still_predicts_and_refits_a_surprised_one():
    """With refit_tolerance, a job's throughput model is kept while it predicts each new
    measured step time within the tolerance and refitted once one is off by more."""
    a = GoodputAllocator(refit_tolerance=0.05)
    j = make_job("a", max_replicas=8)
    first = a.jobs.model(j).throughput
    # a new measurement the fit already predicts (within 5%): same model, no refit
    k, n, m = 3, 1, 64
    good = ProfileSample(n, k, m, float(first.iteration_time(k, n, m)) * 1.01, 0.0)
    assert a.jobs.model(replace(j, profile=j.profile + (good,))).throughput is first
    # one it mispredicts by 50%: refitted
    bad = ProfileSample(n, k, m, float(first.iteration_time(k, n, m)) * 1.5, 0.0)
    assert a.jobs.model(replace(j, profile=j.profile + (bad,))).throughput is not first
    # without the tolerance every change of the measurements refits
    b = GoodputAllocator()
    f0 = b.jobs.model(j).throughput
    assert b.jobs.model(replace(j, profile=j.profile + (good,))).throughput is not f0


def test_a_higher_service_class_runs_first():
    """Two one-GPU jobs on one GPU: the later `highest`-class job (priority 2) runs, the
    earlier `normal` one stops for it, whatever their attained service."""
    jobs = [make_job("normal", submit=0.0, alloc=(0,), max_replicas=1),
            replace(make_job("boss", submit=5.0, attained=1e9, max_replicas=1), priority=2)]
    assert counts(decide(jobs, nodes_of(1))) == {"normal": 0, "boss": 1}


# ------------------------------------------------------------------ GPU models
def mixed_nodes():
    """Two nodes of 4 A100s, two of 4 V100s."""
    return [AllocNode(0, 4, "a0", "A100"), AllocNode(1, 4, "a1", "A100"),
            AllocNode(2, 4, "v0", "V100"), AllocNode(3, 4, "v1", "V100")]


def test_a_job_limited_to_a_gpu_model_gets_gpus_only_on_nodes_of_that_model():
    """A perfectly scaling job that allows only A100s, alone on 8 A100 + 8 V100 GPUs:
    all 8 A100 GPUs and none of the V100s (before, it was counted the whole 16)."""
    nodes = mixed_nodes()
    job = replace(make_job("a100-only"), gpu_models=frozenset({"A100"}))
    out = decide([job], nodes)
    assert sorted(out["a100-only"].nodes) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_the_gpus_a_limited_job_cannot_use_go_to_the_others():
    """Two A100-only jobs and one that runs anywhere: the limited ones share the 8
    A100 GPUs, the other gets the V100s; every replica on a model its job allows."""
    nodes = mixed_nodes()
    a = replace(make_job("a", submit=0.0), gpu_models=frozenset({"A100"}))
    b = replace(make_job("b", submit=1.0), gpu_models=frozenset({"A100"}))
    c = make_job("c", submit=2.0)
    out = decide([a, b, c], nodes)
    assert out["a"].replicas + out["b"].replicas == 8 and out["a"].replicas >= 1 and out["b"].replicas >= 1
    assert set(out["a"].nodes) | set(out["b"].nodes) <= {0, 1}
    assert sorted(out["c"].nodes) == [2, 2, 2, 2, 3, 3, 3, 3]


def test_a_job_of_a_model_the_cluster_lacks_gets_nothing_and_the_rest_is_unchanged():
    nodes = mixed_nodes()
    lost = replace(make_job("h100", submit=0.0), gpu_models=frozenset())
    other = make_job("any", submit=1.0)
    with_lost = decide([lost, other], nodes)
    assert with_lost["h100"].replicas == 0
    assert with_lost["any"] == decide([other], nodes)["any"]


def test_without_model_limits_the_decision_is_the_same_as_on_unlabelled_nodes():
    jobs = [make_job("x", submit=0.0, step=poor_step), make_job("y", submit=1.0), make_job("z", submit=2.0,
                                                                                           bounds=ELASTIC)]
    assert decide(jobs, mixed_nodes()) == decide(jobs, nodes_of(4, 4, 4, 4))


def test_check_allocations_refuses_a_replica_on_a_model_its_job_does_not_allow():
    from rlsched.core.allocation import Allocation, AllocationError

    job = replace(make_job("a"), gpu_models=frozenset({"A100"}))
    with pytest.raises(AllocationError, match="GPU model 'V100'"):
        check_allocations([job], mixed_nodes(), {"a": Allocation((2,))})


def test_explore_caps_growth_at_a_multiple_of_the_most_gpus_measured():
    alone = make_job("a")  # measured up to 8 GPUs (SHAPES)
    fresh = replace(make_job("f"), profile=measured(linear_step, (1, 1, 64)))
    held = replace(fresh, id="h", allocation=(0,) * 4)  # holds 4, measured on 1: keeps its 4
    x = GoodputAllocator(explore=2.0)
    assert [j.max_replicas for j in x.explored([alone, fresh, held])] == [16, 2, 4]
    assert GoodputAllocator().explored([fresh])[0] is fresh  # off by default
    out = decide([fresh], nodes_of(8, 8), x)
    assert out["f"].replicas == 2  # perfect scaling would take all 16 without the cap
    with pytest.raises(ValueError, match="explore"):
        GoodputAllocator(explore=-1.0)


def test_service_weight_grows_the_less_served_of_two_like_jobs_first():
    """Two identical perfectly scaling jobs (a large gradient noise scale: little
    efficiency lost to a larger batch) on one 8-GPU node, one with much more attained
    service: without the weight they split evenly (equal gains, p = 0); with
    ``service_exponent`` (1, the default) the less served one takes more (weights 1
    and 1/4: 6 and 2), and the weight falls with service continuously, 1 at none."""
    big = GoodputAllocator().threshold
    jobs = [make_job("served", attained=3 * big, max_replicas=8, grad=(1.0, 1000.0)),
            make_job("fresh", attained=0.0, submit=1.0, max_replicas=8, grad=(1.0, 1000.0))]
    off = GoodputAllocator(p=0.0, service_exponent=0.0)
    assert counts(decide(jobs, nodes_of(8), off)) == {"served": 4, "fresh": 4}
    assert counts(decide(jobs, nodes_of(8), GoodputAllocator(p=0.0))) == {"served": 2, "fresh": 6}
    w = GoodputAllocator(service_exponent=1.0)
    assert w.weight(jobs[1]) == 1.0 and w.weight(jobs[0]) == pytest.approx(0.25)
    assert GoodputAllocator(service_exponent=1.0, service_scale=big / 3).weight(jobs[0]) == pytest.approx(0.1)
    assert off.weight(jobs[0]) == 1.0
    for bad in ({"service_exponent": -1.0}, {"service_scale": 0.0}):
        with pytest.raises(ValueError, match="service_"):
            GoodputAllocator(**bad)
