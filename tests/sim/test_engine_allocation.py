"""The event engine run by an allocation policy (``Simulator(allocation=...)``): the
same core object the operator's ``--allocator`` mode calls (core/live_allocation.py),
deciding every job's workers each ``scaling_interval`` from the step times the jobs
report — several workers at once, shrink-to-admit, restart cost on every change."""

from __future__ import annotations

import pytest

from rlsched.core import Topology, make_ordering, make_placement
from rlsched.core.goodput_allocator import GoodputAllocator
from rlsched.core.live_allocation import LiveAllocation
from rlsched.sim import JobSpec, SimConfig, Simulator


def topo():
    return Topology.uniform(4, gpus_per_node=8, racks=2, blocks=1, prefix="n")


def sim(jobs, **cfg):
    config = SimConfig(scaling_interval=60.0, restart_cost=30.0, record_decisions=True, **cfg)
    return Simulator(jobs, topo(), placement=make_placement("bestfit"),
                     allocation=LiveAllocation(GoodputAllocator(restart_delay=30.0)), config=config)


def job(jid, t, lo=1, hi=16, **kw):
    kw = {"samples_per_epoch": 4_000_000, "max_epochs": 20, **kw}
    return JobSpec(jid, t, workers=lo, min_workers=lo, max_workers=hi, compute_time=0.2, grad_gb=0.02,
                   batch_per_worker=32, **kw)


def test_the_policy_decides_alone_with_a_placement():
    with pytest.raises(ValueError, match="decides alone"):
        Simulator([job("a", 0.0)], topo(), ordering=make_ordering("fifo"), placement=make_placement("bestfit"),
                  allocation=LiveAllocation(GoodputAllocator()))
    with pytest.raises(ValueError, match="decides alone"):
        Simulator([job("a", 0.0)], topo(), allocation=LiveAllocation(GoodputAllocator()))


def test_a_lone_job_starts_wide_and_every_job_finishes():
    s = sim([job("a", 0.0), job("b", 3000.0, lo=2)])
    res = s.run()
    assert {r.id for r in res.records} == {"a", "b"} and not res.unfinished
    admits = [d for d in res.decisions if d["kind"] == "admit"]
    first = next(d for d in admits if d["job"] == "a")
    assert first["workers"] >= 2 and first["t"] == 0.0  # decided on its arrival, several workers at once
    # it learned from its reports: a's record holds the shapes it ran
    assert s._by_id["a"].obs.shapes and all(r.step_time > 0 for r in s._by_id["a"].obs.shapes)


def test_a_running_job_shrinks_to_admit_one_that_does_not_fit_beside_it():
    # a alone takes what its goodput says; b's gang needs all but one of the 32 GPUs
    s = sim([job("a", 0.0, hi=32), job("b", 3000.0, lo=31, hi=31)])
    s.advance_until(2950.0)
    held = s.job("a").workers
    assert held >= 2
    s.advance_until(3100.0)
    assert s.job("b").start_time is not None and s.job("a").workers == 1
    steps = [d for d in s.result().decisions if d["job"] == "a" and d["kind"] == "scale"]
    assert steps and steps[-1]["delta"] == 1 - held  # one decision, many workers


def test_teams_queues_decide_in_the_event_engine_too():
    """Two teams guaranteed 16 GPUs each of the 32: team x's elastic job alone first
    borrows beyond its 16, then team y's job takes y's guarantee back at the next
    decision after it arrives (no minimum run time) — the same QueueBook the operator
    passes."""
    from rlsched.core.queues import QueueBook, QueueSpec

    book = QueueBook([QueueSpec("x", 16), QueueSpec("y", 16)])
    jobs = [job("a", 0.0, hi=32, tenant="x"), job("b", 3000.0, lo=16, hi=16, tenant="y")]
    s = Simulator(jobs, topo(), placement=make_placement("bestfit"), queues=book,
                  allocation=LiveAllocation(GoodputAllocator(restart_delay=30.0)),
                  config=SimConfig(scaling_interval=60.0, restart_cost=30.0))
    s.advance_until(2950.0)
    assert s.job("a").workers > 16  # borrowing y's idle GPUs
    s.advance_until(3100.0)
    assert s.job("b").start_time is not None and s.job("b").workers == 16
    assert s.job("a").workers <= 16  # back within x's guarantee
    with pytest.raises(ValueError, match="allocation policy"):
        Simulator(jobs, topo(), ordering=make_ordering("fifo"), placement=make_placement("bestfit"), queues=book)


def test_the_engine_gives_the_allocator_each_nodes_cpu_and_memory():
    """As the operator does (issue 25 item 1): a job whose workers ask for 40 of a
    node's 96 cores is planned at most two workers per node (the GPUs alone would
    allow 32); one asking for as much memory as a node has, one per node."""
    s = sim([job("cpu", 0.0, hi=32, cpu_milli=40_000), job("mem", 0.0, hi=32, memory_mib=786_432)])
    s.advance_until(0.0)  # the decision on their arrival, carried out by the engine's placement
    assert 2 <= s.job("cpu").workers <= 8 and 1 <= s.job("mem").workers <= 4
    plan = s.allocation_cycle()  # and the next decision keeps them there
    assert set(plan.start) == set(plan.stop) == set() and all(
        t.workers <= (8 if k == "cpu" else 4) for k, t in plan.resize.items())
    s.advance_until(600.0)
    assert 2 <= s.job("cpu").workers <= 8 and 1 <= s.job("mem").workers <= 4


def test_with_allocate_on_events_a_job_starts_when_it_arrives():
    """The operator decides every 5 s; with ``allocate_on_events`` the engine decides at
    each arrival and finish too, not only every ``scaling_interval`` (60 s here)."""
    short = dict(samples_per_epoch=200_000, max_epochs=2)
    jobs = [job("a", 0.0, lo=16, hi=16, **short), job("b", 10.0, lo=1, hi=1, **short)]
    eager = {r.id: r.start for r in sim(list(jobs), decision_gap=5.0).run().records}
    late = {r.id: r.start for r in sim(list(jobs), allocate_on_events=False).run().records}
    assert (eager["a"], eager["b"]) == (0.0, 10.0)
    assert (late["a"], late["b"]) == (60.0, 60.0)


@pytest.mark.parametrize("gap", [0.0, 5.0, 20.0])
def test_a_burst_of_events_makes_one_decision_at_the_end_of_the_gap(gap):
    """Decisions on events are at least ``decision_gap`` apart: an arrival within the
    gap after a decision waits for its end, not for the next interval."""
    short = dict(samples_per_epoch=200_000, max_epochs=2)
    jobs = [job("a", 0.0, lo=8, hi=8, **short), job("b", 1.0, lo=1, hi=1, **short), job("c", 2.0, lo=1, hi=1, **short)]
    s = sim(list(jobs), allocate_on_events=True, decision_gap=gap)
    start = {r.id: r.start for r in s.run().records}
    assert start["a"] == 0.0
    assert start["b"] == max(1.0, gap) and start["c"] == max(2.0, gap)


@pytest.mark.parametrize("ordering, placement, backfill, spec, seed", [
    ("fifo", "bestfit", False, "synthetic:small,jobs=120", 7),
    ("fifo", "bestfit", True, "synthetic:small,jobs=120", 7),
    ("tiresias", "topology", True, "synthetic:small", 10001),
])
def test_a_heuristic_given_as_policies_is_the_named_gang_allocator(ordering, placement, backfill, spec, seed):
    """The engine has one path: an ordering and a placement given to it are core's gang
    allocator behind its one decision call, the run the same as naming the heuristic
    (``ordering/placement`` through LiveAllocation, as the operator's ``--allocator``).
    Under Tiresias jobs are preempted."""
    from rlsched.sim.traces import default_topology, load_trace

    trace = load_trace(spec, seed=seed)
    topo = trace.topology or default_topology(trace.jobs)
    cfg = SimConfig(backfill=backfill, decision_gap=0.0)
    suffix = "+backfill" if backfill else "+nobackfill"
    given = Simulator(trace.jobs, topo, ordering=make_ordering(ordering), placement=make_placement(placement),
                      config=cfg, seed=seed).run()
    one = Simulator(trace.jobs, topo, placement=make_placement(placement), config=cfg, seed=seed,
                    allocation=LiveAllocation.named(f"{ordering}/{placement}{suffix}")).run()
    times = [{r.id: (r.start, r.end) for r in res.records} for res in (given, one)]
    assert len(times[0]) == len(trace.jobs) and times[0] == times[1]
    assert (sum(r.preemptions for r in one.records) > 0) == (ordering == "tiresias")


def test_on_nodes_of_two_gpu_types_a_job_runs_reports_and_moves_by_its_type():
    """``SimConfig.gpu_types``: each node's type its product (``NodeSpec.gpu_model``); a
    job runs at its ``gpu_speed`` there, its reports carry the type, the allocator sees
    the types and the seed profile the job declares on them. A job that lands on the
    slow type while the fast one is taken moves there (a new generation at its size,
    every worker placed on the fast type) once it has room; without types, nothing of it."""
    from rlsched.core.topology import NodeSpec
    from rlsched_dev.twin import mixed_scenario

    fast = Topology.uniform(4, gpus_per_node=8, racks=2, blocks=1, prefix="kwok-gpu")
    nodes = list(fast.nodes) + [NodeSpec(f"t4-{i}", 4, gpu_model="Tesla-T4", rack="rack-t4") for i in range(2)]
    mixed = Topology(nodes, fast.bandwidth)
    conf = dict(scaling_interval=2.5, restart_cost=30.0, record_decisions=True, allocate_on_events=False)

    def run(gpu_types):
        from rlsched.core.served import SERVED

        s = Simulator(mixed_scenario(), mixed, placement=make_placement("bestfit"),
                      allocation=LiveAllocation.named(SERVED.allocator), config=SimConfig(gpu_types=gpu_types, **conf))
        return s, s.run()

    s, res = run({})
    names = [n.name for n in mixed.nodes]
    log = {(d["kind"], d["job"]): d for d in res.decisions}
    assert {names[i][:3] for i in log["admit", "mx-a"]["nodes"]} == {"kwo"}
    assert {names[i][:3] for i in log["admit", "mx-b"]["nodes"]} == {"t4-"}
    assert log["scale", "mx-b"]["delta"] == 0 and log["scale", "mx-b"]["gpu_type"] == "A100"
    b = s._by_id["mx-b"]
    assert {r.gpu_type for r in b.obs.shapes} == {"Tesla-T4", "A100"} and not res.unfinished
    # the move's stall, as the operator's status.restartStall: the restart it paid
    assert b.stall(s.now) == conf["restart_cost"] and s._by_id["mx-a"].stall(s.now) is None  # a first start: none
    _, plain = run(None)  # no types: the allocator sees one kind of GPU
    assert not [d for d in plain.decisions if d["kind"] == "scale"]
