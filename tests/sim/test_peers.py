"""The peers as allocators (sim/peers): Tiresias 2-queue LAS and Optimus+Oracle, on
hand-computed scenarios, and properties on random job sets."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.core.allocation import (
    AllocJob,
    Allocation,
    AllocationError,
    Allocator,
    AllocNode,
    Oracle,
    check_allocations,
)
from rlsched.core.batch import BatchBounds
from rlsched.core.ordering import POLLUX_THRESHOLD
from rlsched.sim.peers import PEERS, MissingOracleError, OptimusOracle, TiresiasAllocator

LIMITS = BatchBounds(128, 4096, 16, 512)
INTERVAL = 60.0


def job(jid, submit, replicas=1, *, alloc=(), attained=0.0, max_replicas=None, oracle=None, min_replicas=1):
    return AllocJob(
        id=jid,
        submit_time=submit,
        application="cifar10",
        age=0.0,
        attained_service=attained,
        num_restarts=0,
        allocation=tuple(alloc),
        target_replicas=replicas,
        target_batch_size=128,
        min_replicas=min_replicas,
        max_replicas=max_replicas if max_replicas is not None else max(replicas, 8),
        bounds=LIMITS,
        oracle=oracle,
    )


def cluster(*gpus):
    return [AllocNode(i, g, f"n{i}") for i, g in enumerate(gpus)]


def decide(alloc, jobs, nodes, now):
    """One allocator call, checked as the engine checks it; job id -> node tuple."""
    out = alloc.allocate(jobs, nodes, now)
    check_allocations(jobs, nodes, out)
    assert set(out) == {j.id for j in jobs}
    assert all(a.atomic_bsz is None for a in out.values())  # fixed batch: the engine derives it
    return {jid: a.nodes for jid, a in out.items()}


def advance(jobs, where, dt=INTERVAL):
    """What the engine does between calls: each job runs on the nodes it was given
    for ``dt`` seconds (its attained service grows by GPUs × dt)."""
    return [replace(j, allocation=where[j.id], attained_service=j.attained_service + len(where[j.id]) * dt) for j in jobs]


class Run:
    """A minimal interval driver: jobs arrive at their submit time (seen by the next
    call), calls every INTERVAL seconds; records every decision."""

    def __init__(self, alloc, nodes, arrivals):
        self.alloc, self.nodes, self.pending = alloc, nodes, sorted(arrivals, key=lambda j: j.submit_time)
        self.jobs, self.now, self.log = [], 0.0, {}

    def step(self):
        self.jobs += [j for j in self.pending if j.submit_time <= self.now]
        self.pending = [j for j in self.pending if j.submit_time > self.now]
        where = decide(self.alloc, self.jobs, self.nodes, self.now)
        self.log[self.now] = where
        self.jobs = advance(self.jobs, where)
        self.now += INTERVAL
        return where

    def until(self, t):
        while self.now <= t:
            self.step()
        return self.log[t]

    def get(self, jid):
        return next(j for j in self.jobs if j.id == jid)


def test_both_are_allocators_named_as_the_benchmark_names_them():
    t, o = TiresiasAllocator(), OptimusOracle()
    assert isinstance(t, Allocator) and isinstance(o, Allocator)
    assert (t.name, t.clairvoyant, o.name, o.clairvoyant) == ("tiresias-2q", False, "optimus-oracle", True)
    from rlsched.sim.peers import PolluxPaperAllocator

    assert PEERS == {"tiresias-2q": TiresiasAllocator, "optimus-oracle": OptimusOracle,
                     "pollux-paper": PolluxPaperAllocator}
    assert PolluxPaperAllocator.clairvoyant is False
    # the Pollux paper's threshold: 16 GPU-hours
    assert POLLUX_THRESHOLD == 57_600.0 and t.threshold == 57_600.0 and t.starvation_factor == 0.0


# ---------------------------------------------------------------- Tiresias


def test_tiresias_demotion_at_the_threshold_and_a_newcomer_preempts_the_demoted_job():
    """2 nodes × 4 GPUs. A (4 GPUs) starts at 0 and gains 240 GPU-s per interval: it
    has 57,360 at t=14,340 (queue 0) and 57,600 at t=14,400 (queue 1). B (2 GPUs)
    arrives at 30. C (4 GPUs) arrives at 14,410: at t=14,460 the order is B, C (queue
    0, by arrival), A (queue 1): B keeps its nodes, C takes A's node, A is preempted."""
    t = TiresiasAllocator()
    run = Run(t, cluster(4, 4), [job("A", 0.0, 4), job("B", 30.0, 2), job("C", 14_410.0, 4)])
    assert run.until(0.0) == {"A": (0, 0, 0, 0)}
    assert run.until(60.0) == {"A": (0, 0, 0, 0), "B": (1, 1)}

    run.until(14_280.0)
    assert run.get("A").attained_service == 57_360.0  # what the call at 14,340 sees
    assert run.until(14_340.0) == {"A": (0, 0, 0, 0), "B": (1, 1)}
    assert t._demoted_at == {}  # still queue 0 at 14,340
    assert run.get("A").attained_service == 57_600.0  # what the call at 14,400 sees

    # the call at 14,400 sees 57,600: demoted; nobody waits, nothing moves
    assert run.until(14_400.0) == {"A": (0, 0, 0, 0), "B": (1, 1)}
    assert t._demoted_at == {"A": 14_400.0}
    assert t.queue_of(run.get("A")) == 1 and t.queue_of(run.get("B")) == 0

    # C arrives: queue 0 before queue 1, A does not fit in the 2 GPUs left
    assert run.until(14_460.0) == {"B": (1, 1), "C": (0, 0, 0, 0), "A": ()}
    assert run.until(14_520.0) == {"B": (1, 1), "C": (0, 0, 0, 0), "A": ()}


def test_tiresias_demotion_boundary_is_57600_gpu_seconds():
    t = TiresiasAllocator()
    below, at = job("x", 0.0, 4, attained=57_599.0), job("y", 0.0, 4, attained=57_600.0)
    assert (t.queue_of(below), t.queue_of(at)) == (0, 1)


def test_tiresias_queue_one_is_served_in_demotion_order():
    """Threshold 480 GPU-s, 2 × 4 GPUs. Q (4 GPUs) and P (2 GPUs) start at 0; Q is
    demoted at 120 (240 per interval), P at 240 (120 per interval). R (4 GPUs, queue
    0) arrives at 250: at 300 R comes first, then Q (demoted first, though P comes
    first by arrival: same submit time, id P < Q) takes the 4 GPUs left; P waits.
    FIFO by arrival would have run P."""
    t = TiresiasAllocator(threshold=480.0)
    run = Run(t, cluster(4, 4), [job("P", 0.0, 2), job("Q", 0.0, 4), job("R", 250.0, 4)])
    assert run.until(0.0) == {"P": (1, 1), "Q": (0, 0, 0, 0)}  # largest placed first
    run.until(240.0)
    assert t._demoted_at == {"Q": 120.0, "P": 240.0}
    assert run.until(300.0) == {"P": (), "Q": (0, 0, 0, 0), "R": (1, 1, 1, 1)}
    assert [j.id for j in t.order(run.jobs, 300.0)] == ["R", "Q", "P"]


def test_tiresias_skips_a_job_that_does_not_fit_and_admits_a_later_smaller_one():
    nodes = cluster(4, 4)
    jobs = [
        job("E", 0.0, 4, alloc=(0, 0, 0, 0), attained=600.0),
        job("F", 10.0, 6),  # 6 > the 4 left: waits
        job("G", 20.0, 2),  # fits: admitted past F
        job("H", 30.0, 3),  # 3 > the 2 left: waits
        job("I", 40.0, 2),  # fits exactly
    ]
    assert decide(TiresiasAllocator(), jobs, nodes, 60.0) == {
        "E": (0, 0, 0, 0), "F": (), "G": (1, 1), "H": (), "I": (1, 1)
    }


def test_tiresias_consolidates_new_jobs_largest_first_and_keeps_running_ones():
    """3 × 4 GPUs; K runs on (0, 0, 1) — kept as is, not repacked. Free: 2, 3, 4.
    New N (2), M (3), L (4) in arrival order; placed largest first, each lands on one
    node. Placed in arrival order instead, N would take node 2 and L would be split."""
    nodes = cluster(4, 4, 4)
    jobs = [job("K", 0.0, 3, alloc=(0, 0, 1), attained=10.0), job("N", 1.0, 2), job("M", 2.0, 3), job("L", 3.0, 4)]
    assert decide(TiresiasAllocator(), jobs, nodes, 60.0) == {
        "K": (0, 0, 1), "L": (2, 2, 2, 2), "M": (1, 1, 1), "N": (0, 0)
    }


def test_tiresias_replaces_a_running_job_whose_nodes_are_gone():
    nodes = cluster(4, 4)
    jobs = [job("A", 0.0, 2, alloc=(0, 7)), job("B", 1.0, 4, alloc=(1, 1, 1, 1))]
    assert decide(TiresiasAllocator(), jobs, nodes, 60.0) == {"A": (0, 0), "B": (1, 1, 1, 1)}


@pytest.mark.parametrize("factor, runs_at_420", [(0.0, False), (2.0, True)])
def test_tiresias_starvation_knob_promotes_after_factor_times_last_run(factor, runs_at_420):
    """Threshold 480, 1 node × 4 GPUs. A (4) runs 0..120 and is demoted at 120, when
    B (1 GPU, queue 0) arrives and preempts it: A's last run is 120 s. B gains 60 GPU-s
    per interval and stays in queue 0 past 420. With factor 2, A is promoted once its
    wait exceeds 240 s: not at 360 (waited 240), at 420 (waited 300); back in queue 0
    it precedes B (earlier arrival), and B no longer fits. Off (0), A keeps waiting."""
    t = TiresiasAllocator(threshold=480.0, starvation_factor=factor)
    run = Run(t, cluster(4), [job("A", 0.0, 4), job("B", 100.0, 1)])
    assert run.until(60.0) == {"A": (0, 0, 0, 0)}
    assert run.until(120.0) == {"A": (), "B": (0,)}
    assert run.until(360.0) == {"A": (), "B": (0,)}
    assert run.until(420.0) == ({"A": (0, 0, 0, 0), "B": ()} if runs_at_420 else {"A": (), "B": (0,)})
    if runs_at_420:
        # service counts from the promotion: demoted again after 480 more GPU-s (2 intervals)
        a = run.get("A")
        assert t.queue_of(a) == 0 and a.attained_service == 720.0
        run.until(480.0)
        assert t.queue_of(run.get("A")) == 1


def test_tiresias_rejects_jobs_without_a_fixed_size_and_bad_settings():
    t = TiresiasAllocator()
    with pytest.raises(AllocationError, match="fixed-size"):
        t.allocate([replace(job("a", 0.0, 2), target_replicas=None)], cluster(4), 0.0)
    with pytest.raises(AllocationError, match="fixed-size"):
        t.allocate([job("a", 0.0, 2, max_replicas=1)], cluster(4), 0.0)
    for bad in (dict(threshold=0.0), dict(threshold=float("nan")), dict(starvation_factor=-1.0)):
        with pytest.raises(ValueError):
            TiresiasAllocator(**bad)
    t.allocate([], cluster(4), 120.0)
    with pytest.raises(ValueError, match="time order"):
        t.allocate([], cluster(4), 60.0)


def test_tiresias_forgets_finished_jobs():
    t = TiresiasAllocator(threshold=100.0)
    decide(t, [job("a", 0.0, 1, attained=200.0)], cluster(4), 0.0)
    assert "a" in t._demoted_at
    decide(t, [], cluster(4), 60.0)
    assert t._demoted_at == {} and t._run_start == {}


# ---------------------------------------------------------------- Optimus + Oracle


def oracle_from_times(remaining, times):
    """An oracle whose remaining time on k GPUs is times[k-1]."""
    return Oracle(remaining, {k: remaining / tk for k, tk in enumerate(times, start=1)})


#: remaining time (s) on 1..k GPUs: J1 doubles its speed with 2 GPUs, J2 barely gains
J1 = oracle_from_times(1200.0, [1200, 600, 450, 400, 380, 375, 374, 374])  # gains 600, 150, 50, 20, 5, 1, 0
J2 = oracle_from_times(600.0, [600, 580, 570, 565, 562, 560, 559, 559])  # gains 20, 10, 5, ...
J3 = oracle_from_times(300.0, [300, 200, 160, 150])  # gains 100, 40, 10; max 4


def optimus_jobs(**alloc):
    return [
        job("J1", 0.0, 1, oracle=J1, max_replicas=8, alloc=alloc.get("J1", ())),
        job("J2", 10.0, 1, oracle=J2, max_replicas=8, alloc=alloc.get("J2", ())),
        job("J3", 20.0, 1, oracle=J3, max_replicas=4, alloc=alloc.get("J3", ())),
    ]


def test_optimus_greedy_by_marginal_gain():
    """8 GPUs: 1 each (5 left), then by largest T(k) − T(k+1): J1 (600) → 2, J1 (150)
    → 3, J3 (100) → 2, J1 (50 > J3's 40) → 4, J3 (40 > J1's 20 = J2's 20) → 3. Placed
    largest first: J1 on node 0, J3 then J2 on node 1."""
    o = OptimusOracle()
    assert o.counts(optimus_jobs(), 8) == {"J1": 4, "J2": 1, "J3": 3}
    assert decide(o, optimus_jobs(), cluster(4, 4), 0.0) == {"J1": (0, 0, 0, 0), "J2": (1,), "J3": (1, 1, 1)}
    assert o.remaining_time(optimus_jobs()[0], 2) == pytest.approx(600.0)


def test_optimus_stops_when_no_job_gains_and_caps_at_max_replicas():
    o = OptimusOracle()
    # 40 GPUs: J1 and J2 stop at 7 (T(7) = T(8): no gain), J3 at its max 4
    counts = o.counts(optimus_jobs(), 40)
    assert counts == {"J1": 7, "J2": 7, "J3": 4}
    assert sum(counts.values()) < 40  # the rest stay idle


def test_optimus_unchanged_jobs_keep_their_nodes_and_changed_ones_are_packed():
    """Same counts as above. J1 holds 4 GPUs on node 1 and J2 1 GPU on node 0 (not
    where packing would put them): both keep them. J3 holds 2 and gets 3: packed on
    the 3 GPUs left on node 0."""
    jobs = optimus_jobs(J1=(1, 1, 1, 1), J2=(0,), J3=(0, 1))
    assert decide(OptimusOracle(), jobs, cluster(4, 4), 60.0) == {"J1": (1, 1, 1, 1), "J2": (0,), "J3": (0, 0, 0)}


def test_optimus_one_gpu_each_in_arrival_order_while_gpus_last():
    """3 GPUs, four jobs: the three earliest get one each, the last waits; with no GPU
    left, nobody grows."""
    jobs = [*optimus_jobs(), job("J0", 30.0, 1, oracle=J1, max_replicas=8)]
    assert decide(OptimusOracle(), jobs, cluster(3), 0.0) == {"J1": (0,), "J2": (0,), "J3": (0,), "J0": ()}


def test_optimus_honours_min_replicas_and_a_job_that_cannot_run():
    # J4 needs 2 GPUs at least; a job whose rate is 0 on 1 GPU and 10/s on 2 gains ∞
    j4 = job("J4", 0.0, 2, min_replicas=2, max_replicas=4, oracle=oracle_from_times(100.0, [100, 50, 40, 35]))
    slow = job("S", 5.0, 1, max_replicas=2, oracle=Oracle(100.0, {1: 0.0, 2: 10.0}))
    assert OptimusOracle().counts([j4, slow], 4) == {"J4": 2, "S": 2}
    assert OptimusOracle().counts([j4, slow], 2) == {"J4": 2}


def test_optimus_without_an_oracle_is_a_clear_error():
    jobs = [*optimus_jobs(), job("blind", 5.0, 1)]
    with pytest.raises(MissingOracleError, match="clairvoyant"):
        OptimusOracle().allocate(jobs, cluster(4, 4), 0.0)
    assert issubclass(MissingOracleError, AllocationError)
    with pytest.raises(AllocationError, match="progress_rate"):
        OptimusOracle().counts([job("neg", 0.0, 1, oracle=Oracle(10.0, {1: -1.0}))], 4)


# ---------------------------------------------------------------- properties

jobsets = st.lists(
    st.tuples(
        st.floats(0, 1000, allow_nan=False),  # submit
        st.integers(1, 10),  # replicas (some never fit)
        st.floats(0, 100_000, allow_nan=False),  # attained
        st.lists(st.integers(0, 4), max_size=6),  # a current allocation, maybe bad
        st.lists(st.floats(0.01, 50, allow_nan=False), min_size=1, max_size=10),  # rates
        st.floats(0, 10_000, allow_nan=False),  # remaining
    ),
    max_size=12,
)


def build(specs):
    return [
        job(f"j{k}", s, r, alloc=a, attained=att, max_replicas=max(r, len(rates)),
            oracle=Oracle(rem, {i + 1: x for i, x in enumerate(rates)}))
        for k, (s, r, att, a, rates, rem) in enumerate(specs)
    ]


@settings(max_examples=150, deadline=None)
@given(specs=jobsets, gpus=st.lists(st.integers(0, 8), min_size=1, max_size=4),
       name=st.sampled_from(sorted(PEERS)), factor=st.sampled_from([0.0, 1.5]))
def test_random_job_sets_never_over_commit(specs, gpus, name, factor):
    nodes = cluster(*gpus)
    alloc = TiresiasAllocator(threshold=3000.0, starvation_factor=factor) if name == "tiresias-2q" else OptimusOracle()
    jobs = build(specs)
    for step in range(4):
        now = step * INTERVAL
        where = decide(alloc, jobs, nodes, now)  # check_allocations: no node over its GPUs
        used = sum(len(w) for w in where.values())
        assert used <= sum(gpus)
        left = sum(gpus) - used
        for j in jobs:
            if name == "tiresias-2q":
                assert len(where[j.id]) in (0, j.target_replicas)
                if not where[j.id]:
                    assert j.target_replicas > left  # skipped only when it did not fit
            else:
                if not where[j.id]:
                    assert left == 0
            if step > 0 and j.allocation and len(where[j.id]) == len(j.allocation):
                assert where[j.id] == j.allocation  # a job that keeps running keeps its nodes
        jobs = advance(jobs, where)


@settings(max_examples=60, deadline=None)
@given(free=st.lists(st.integers(0, 8), min_size=1, max_size=40),
       counts=st.lists(st.integers(1, 12), min_size=1, max_size=30))
def test_keep_or_pack_places_exactly_as_packed_one_job_after_another(free, counts):
    """keep_or_pack's bucketed free list picks what packing by its definition picks (the
    nodes with the most free GPUs first, ties by index; allocation.packed), job after
    job (largest first), on any cluster."""
    from collections import Counter

    from rlsched.core.allocation import packed as packed_impl
    from rlsched.core.packing import keep_or_pack

    def packed(c, left):  # the definition, by a full sort
        out = []
        for i, n in sorted(left.items(), key=lambda kv: (-kv[1], kv[0])):
            out.extend([i] * min(max(n, 0), c - len(out)))
        return tuple(out)

    nodes = [AllocNode(i, g, f"n{i}") for i, g in enumerate(free)]
    jobs, total = [], sum(free)
    for k, c in enumerate(counts):
        if c > total:
            break
        jobs.append((job(f"j{k}", float(k)), c))
        total -= c
    got = keep_or_pack(jobs, nodes)
    left = {n.index: n.gpus for n in nodes}
    for k, (j, c) in sorted(enumerate(jobs), key=lambda e: (-e[1][1], e[0])):
        want = packed(c, left)
        assert packed_impl(c, left) == want
        assert got[j.id] == want
        for i, n in Counter(want).items():
            left[i] -= n
