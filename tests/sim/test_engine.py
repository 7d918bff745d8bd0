"""Simulator engine: hand-computed scenarios, model checks and invariants."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hand_policies import ByHand, Pinned
from rlsched.core import Bandwidth, Level, NodeSpec, Topology, make_ordering, make_placement
from rlsched.core.live_allocation import LiveAllocation
from rlsched.core.planning import convergence_gain
from rlsched.sim import JobSpec, SimConfig, Simulator, compute_metrics
from rlsched.sim.job import step_time
from rlsched.sim.metrics import dumps


def _sim(jobs, topo, ordering="fifo", placement="firstfit", config=None, **kw):
    """A decision at every event time (``decision_gap=0``): the hand-computed schedules."""
    config = replace(config or SimConfig(), decision_gap=0.0)
    return Simulator(jobs, topo, ordering=make_ordering(ordering), placement=make_placement(placement), config=config,
                     **kw)


def _jct(res):
    return {r.id: r.end - r.submit for r in res.records}


# ---------------------------------------------------------------- hand-computed
# One node of 4 GPUs in one NVLink domain; fixed-duration jobs run at exactly their
# duration there (ideal placement). Jobs:
#   A: submit 0, 4 GPUs, 10 s     B: submit 1, 4 GPUs, 6 s     C: submit 2, 4 GPUs, 2 s
HAND = [
    JobSpec(id="A", submit_time=0, gpus_per_worker=4, duration=10),
    JobSpec(id="B", submit_time=1, gpus_per_worker=4, duration=6),
    JobSpec(id="C", submit_time=2, gpus_per_worker=4, duration=2),
]
ONE_NODE = Topology.uniform(1, 4)


def test_fifo_hand_computed():
    # FIFO: A runs 0-10, B 10-16, C 16-18.
    # JCT: A = 10 - 0 = 10, B = 16 - 1 = 15, C = 18 - 2 = 16; mean = 41 / 3.
    res = _sim(HAND, ONE_NODE, "fifo").run()
    assert _jct(res) == pytest.approx({"A": 10.0, "B": 15.0, "C": 16.0})
    m = compute_metrics(res)
    assert m["jct_mean"] == pytest.approx(41 / 3)
    # waits: A 0, B 10 - 1 = 9, C 16 - 2 = 14 -> mean 23 / 3; makespan 18
    assert m["wait_mean"] == pytest.approx(23 / 3)
    assert m["makespan"] == pytest.approx(18.0)


def test_sjf_hand_computed():
    # SJF on the users' estimates (here exact): only A is there at 0, so A runs 0-10;
    # at 10 both wait and C (2 s) goes before B (6 s): C 10-12, B 12-18.
    # JCT: A = 10, C = 12 - 2 = 10, B = 18 - 1 = 17; mean = 37 / 3.
    told = [j.with_(estimated_runtime=j.duration) for j in HAND]
    res = _sim(told, ONE_NODE, "sjf").run()
    assert _jct(res) == pytest.approx({"A": 10.0, "B": 17.0, "C": 10.0})
    assert compute_metrics(res)["jct_mean"] == pytest.approx(37 / 3)
    # the same with the true run times shown (a clairvoyant reference run)
    res = _sim(HAND, ONE_NODE, "sjf", config=SimConfig(clairvoyant=True)).run()
    assert _jct(res) == pytest.approx({"A": 10.0, "B": 17.0, "C": 10.0})
    # nobody tells a run time: SJF has nothing to sort on and keeps FIFO's order
    res = _sim(HAND, ONE_NODE, "sjf").run()
    assert _jct(res) == pytest.approx({"A": 10.0, "B": 15.0, "C": 16.0})
    # a user who overestimates C 4x (8 s > B's 6 s) makes SJF run B first
    wrong = [told[0], told[1], told[2].with_(estimated_runtime=8.0)]
    assert _jct(_sim(wrong, ONE_NODE, "sjf").run()) == pytest.approx({"A": 10.0, "B": 15.0, "C": 16.0})


def test_head_of_line_blocking_and_backfill():
    # 4 GPUs. A (3 GPUs, 0-10). B (2 GPUs, submit 1) blocks the queue; C (1 GPU,
    # submit 2, 4 s) fits beside A.
    jobs = [
        JobSpec(id="A", submit_time=0, gpus_per_worker=3, duration=10),
        JobSpec(id="B", submit_time=1, gpus_per_worker=2, duration=5),
        JobSpec(id="C", submit_time=2, gpus_per_worker=1, duration=4),
    ]
    # no backfill: C waits behind B. B runs 10-15 and C starts at 10 too (2+1 <= 4):
    # JCT C = 14 - 2 = 12
    res = _sim(jobs, ONE_NODE, "fifo").run()
    assert _jct(res)["C"] == pytest.approx(12.0)
    # backfill: C starts at 2 beside A: JCT C = 4
    res = _sim(jobs, ONE_NODE, "fifo", config=SimConfig(backfill=True)).run()
    assert _jct(res)["C"] == pytest.approx(4.0)
    assert _jct(res)["B"] == pytest.approx(14.0)  # 10-15


# ---------------------------------------------------------------- job model
def _two_racks():
    # 4 nodes x 4 GPUs (one NVLink domain each), racks r0 = {n0, n1}, r1 = {n2, n3},
    # one block.
    nodes = [NodeSpec(f"n{i}", 4, rack=f"r{i // 2}", nvlink_domain_size=4) for i in range(4)]
    return Topology(nodes, Bandwidth())


def test_placement_changes_step_time():
    # 2 workers x 4 GPUs, compute 0.2 s, 1 GB of gradients, ring over n = 8 GPUs:
    #   comm = 2 * 7/8 * 1 GB / bw = 1.75 / bw
    #   same rack  (RACK, 25 GB/s):   step = 0.2 + 0.07 = 0.27 s
    #   two racks  (BLOCK, 12.5 GB/s): step = 0.2 + 0.14 = 0.34 s
    # The ideal placement of 8 GPUs on 4-GPU nodes is one rack, so a 270 s job takes
    # 270 s there and 270 * 0.34 / 0.27 = 340 s across racks.
    spec = JobSpec(id="j", submit_time=0, workers=2, gpus_per_worker=4, compute_time=0.2, grad_gb=1.0, duration=270)
    bw = Bandwidth()
    assert step_time(spec, 2, Level.RACK, bw) == pytest.approx(0.27)
    assert step_time(spec, 2, Level.BLOCK, bw) == pytest.approx(0.34)
    for nodes, expect in (([0, 1], 270.0), ([0, 2], 340.0)):
        sim = Simulator([spec], _two_racks(), ordering=make_ordering("fifo"), placement=Pinned({"j": nodes}))
        (rec,) = sim.run().records
        assert rec.end - rec.start == pytest.approx(expect)
        assert rec.level == (Level.RACK if nodes == [0, 1] else Level.BLOCK)


def test_training_job_runs_to_convergence_and_reports_progress():
    # one training job alone: it stops at the epoch the convergence rule gives, and
    # its run time is samples / throughput at its placement.
    spec = JobSpec(id="t", submit_time=0, workers=1, gpus_per_worker=1, compute_time=0.1, grad_gb=0.0,
                   batch_per_worker=10, samples_per_epoch=1000, max_epochs=40, beta=0.002, patience=2)
    sim = _sim([spec], ONE_NODE)
    res = sim.run()
    (rec,) = res.records
    view = sim.job("t")
    hist = view.progress.history
    assert rec.epochs == len(hist) == view.progress.epoch
    if rec.epochs < 40:  # stopped by the rule: the last two (windowed) gains were below beta
        assert all(convergence_gain(hist[:e]) < 0.002 for e in (len(hist) - 1, len(hist)))
        assert convergence_gain(hist[:-2]) >= 0.002
    # throughput = 10 samples / 0.1 s = 100 samples/s; each epoch is 1000 samples
    assert rec.end - rec.start == pytest.approx(rec.epochs * 1000 / 100)
    assert rec.accuracy == hist[-1]


def test_unfittable_job_is_reported_not_waited_on(caplog):
    jobs = [
        JobSpec(id="ok", submit_time=0, gpus_per_worker=2, duration=5),
        JobSpec(id="huge", submit_time=1, workers=3, gpus_per_worker=4, duration=5),  # 12 GPUs > 4
        JobSpec(id="wrongmodel", submit_time=1, gpus_per_worker=1, gpu_models=frozenset({"H100"}), duration=5),
        JobSpec(id="after", submit_time=2, gpus_per_worker=4, duration=1),
    ]
    with caplog.at_level("WARNING", logger="rlsched.sim"):
        res = _sim(jobs, ONE_NODE).run()
    assert sorted(res.unfittable) == ["huge", "wrongmodel"]
    assert sorted(r.id for r in res.records) == ["after", "ok"]
    m = compute_metrics(res)
    assert m["jobs_unfittable"] == 2 and m["jobs_completed"] == 2
    assert "huge" in caplog.text and "can never fit" in caplog.text


def test_elastic_scale_pays_restart_cost():
    # fixed job of 1 worker x 1 GPU, 100 s. At t=10 scale to 2 workers (restart 30 s):
    # work done by then = 10 s; no progress 10-40; then 2 workers on one NVLink
    # domain run at 2x (grad_gb = 0: no communication) -> remaining 90 s takes 45 s.
    spec = JobSpec(id="e", submit_time=0, workers=1, max_workers=2, gpus_per_worker=1, grad_gb=0.0, duration=100)
    grow = ByHand(lambda now: {"e": [0] if now < 10 else [0, 0]})  # decides at 0 and every 10 s
    sim = Simulator([spec], ONE_NODE, placement=Pinned({"e": [0]}, more={"e": [0]}), allocation=LiveAllocation(grow),
                    config=SimConfig(restart_cost=30, scaling_interval=10))
    (rec,) = sim.run().records
    assert rec.end == pytest.approx(10 + 30 + 45)
    assert rec.rescales == 1


# ---------------------------------------------------------------- properties
def _topologies():
    return st.builds(
        lambda n, g, r: Topology.uniform(n, g, racks=min(r, n)),
        st.integers(1, 6), st.sampled_from([1, 2, 4, 8]), st.integers(1, 3),
    )


@st.composite
def _jobs(draw):
    n = draw(st.integers(1, 25))
    jobs = []
    for k in range(n):
        fixed = draw(st.booleans())
        jobs.append(
            JobSpec(
                id=f"j{k}",
                submit_time=draw(st.integers(0, 50)) * 1.0,
                workers=draw(st.integers(1, 3)),
                gpus_per_worker=draw(st.sampled_from([1, 2, 4])),
                grad_gb=draw(st.sampled_from([0.0, 0.5, 2.0])),
                duration=draw(st.integers(1, 40)) * 1.0 if fixed else None,
                samples_per_epoch=draw(st.integers(100, 2000)),
                max_epochs=draw(st.integers(1, 8)),
            )
        )
    return jobs


POLICIES = st.tuples(
    st.sampled_from(["fifo", "sjf", "srtf", "tiresias", "drf", "tetris", "random"]),
    st.sampled_from(["firstfit", "bestfit", "loadbalance", "random"]),
    st.booleans(),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_jobs(), _topologies(), POLICIES, st.integers(0, 2**31))
def test_invariants(jobs, topo, policy, seed):
    import numpy as np

    o, p, backfill = policy
    sim = Simulator(
        jobs, topo,
        ordering=make_ordering(o, rng=np.random.default_rng(seed)),
        placement=make_placement(p, rng=np.random.default_rng(seed + 1)),
        seed=seed, config=SimConfig(backfill=backfill),
    )
    total = np.array([n.gpus for n in topo.nodes])
    while sim.step():
        # a GPU is never allocated twice: recount usage from the running jobs
        used = np.zeros(len(topo), dtype=int)
        for v in sim.running:
            for i in v.placement:
                used[i] += v.gpus_per_worker
        assert (used <= total).all()
        assert (used == total - sim.state.free).all()
    res = sim.result()
    ids = [r.id for r in res.records]
    # every job starts and ends exactly once (or is reported unfittable)
    assert len(ids) == len(set(ids))
    assert sorted(ids + res.unfittable) == sorted(j.id for j in jobs)
    assert not res.unfinished
    for r in res.records:
        assert r.submit <= r.start <= r.end
        # JCT is never below the run time at ideal placement
        assert r.jct >= r.ideal_runtime * (1 - 1e-9)
        assert r.end - r.start >= r.ideal_runtime * (1 - 1e-9)


def test_same_seed_same_metrics_different_seed_different():
    from rlsched.sim.traces import synthetic

    def run(seed):
        tr = synthetic("small,jobs=60,nodes=4", seed=seed)
        return dumps(compute_metrics(_sim(tr.jobs, tr.topology, "fifo", "firstfit", seed=seed).run()))

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_bad_arguments():
    with pytest.raises(ValueError):
        Simulator(HAND, ONE_NODE, ordering=make_ordering("fifo"))  # placement missing
    with pytest.raises(ValueError, match="allocation policy, or an ordering"):
        Simulator(HAND, ONE_NODE)  # nothing decides
    with pytest.raises(ValueError):
        _sim(HAND + [HAND[0]], ONE_NODE)  # duplicate id
    with pytest.raises(ValueError):
        JobSpec(id="x", submit_time=0, workers=2, max_workers=1)
    assert math.isinf(SimConfig().max_time)


@pytest.mark.parametrize("scaling", ["fs", "fcfs", "optimus", "beta"])
def test_scaling_policies_keep_invariants(scaling):
    import numpy as np

    from rlsched.core import make_scaling
    from rlsched.sim.traces import synthetic

    tr = synthetic("small,jobs=40,nodes=4,racks=2", seed=5)
    sim = Simulator(
        tr.jobs, tr.topology, ordering=make_ordering("fifo"), placement=make_placement("firstfit"),
        scaling=make_scaling(scaling), seed=5, config=SimConfig(scaling_interval=120, restart_cost=20),
    )
    total = np.array([n.gpus for n in tr.topology.nodes])
    while sim.step():
        used = np.zeros(len(total), dtype=int)
        for v in sim.running:
            assert v.min_workers <= v.workers == len(v.placement) <= v.max_workers
            for i in v.placement:
                used[i] += v.gpus_per_worker
        assert (used == total - sim.state.free).all()
    res = sim.result()
    assert len(res.records) == 40 and not res.unfinished
    assert sum(r.rescales for r in res.records) > 0
    for r in res.records:
        assert r.submit <= r.start <= r.end


def test_max_time_reports_unfinished():
    # stop at t = 12: A (0-10) done, B (10-16) still running, C waiting
    res = _sim(HAND, ONE_NODE, "fifo", config=SimConfig(max_time=12)).run()
    assert [r.id for r in res.records] == ["A"]
    assert sorted(res.unfinished) == ["B", "C"]
    assert compute_metrics(res)["jobs_unfinished"] == 2


@pytest.mark.parametrize("workers,gpw,nodes", [
    (1, 8, [0]), (2, 2, [0, 0]), (1, 4, [0]), (2, 4, [0, 0]), (2, 4, [0, 1]), (2, 2, [1, 2]),
])
def test_span_level_matches_topology(workers, gpw, nodes):
    # nodes of 8 GPUs in two NVLink islands of 4; n0, n1 in rack r0, n2 in rack r1
    topo = Topology([NodeSpec(f"n{i}", 8, rack=f"r{i // 2}", nvlink_domain_size=4) for i in range(3)])
    spec = JobSpec(id="j", submit_time=0, workers=workers, gpus_per_worker=gpw, duration=10)
    sim = Simulator([spec], topo, ordering=make_ordering("fifo"), placement=Pinned({"j": nodes}))
    sim.run()
    counts: dict[int, int] = {}
    for i in nodes:
        counts[i] = counts.get(i, 0) + gpw
    assert sim.result().records[0].level == topo.span_level(counts)
