"""Issue 15: simulations with the linear DAS agents give the schedules of the slow path.

Every run here is made twice, once with the DAS ordering and placement agents as served
and once with the code they replaced (``tests/oracles/das_reference.py``), and the two
decision logs (admissions with their nodes, preemptions, resizes, finishes) and job
records must be equal — on multi-worker synthetic traces, on an Alibaba-like cluster of
mixed GPU models with CPU and memory requests, with and without backfill, with
``highest`` jobs that preempt, and with elastic scaling.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.core import NodeSpec, Topology, make_placement, make_scaling
from das_reference import ReferenceDASAgentPlacement, ReferenceDASOrdering
from rlsched.core.das_agent import DASAgentPlacement, DASOrdering
from rlsched.sim import JobSpec, SimConfig, Simulator
from rlsched.sim.traces import load_trace


def _alibaba_like(seed: int, n_jobs: int = 220):
    """Nodes of 1-8 GPUs of three models with CPU and memory, racked; one-worker pods
    (a few gangs) asking CPU and memory, some for one GPU model, some ``highest``."""
    rng = np.random.default_rng(seed)
    nodes = [
        NodeSpec(name=f"n{i:03d}", gpus=int(rng.choice([1, 2, 4, 8], p=[0.1, 0.4, 0.1, 0.4])),
                 gpu_model=str(rng.choice(["G2", "T4", "V100"])), rack=f"r{i // 8}", block="b0",
                 cpu_milli=int(rng.choice([64_000, 96_000])), memory_mib=int(rng.choice([262_144, 393_216])))
        for i in range(40)
    ]
    jobs = []
    t = 0.0
    for k in range(n_jobs):
        t += float(rng.exponential(40.0))
        workers = int(rng.choice([1, 1, 1, 1, 2, 3]))
        jobs.append(JobSpec(
            id=f"p{k:04d}", submit_time=round(t), workers=workers, gpus_per_worker=int(rng.choice([1, 1, 1, 2, 4, 8])),
            gpu_models=frozenset({str(rng.choice(["G2", "T4"]))}) if rng.random() < 0.2 else None,
            cpu_milli=int(rng.choice([3_000, 8_000, 12_000, 30_000])), memory_mib=int(rng.choice([8_192, 49_152, 98_304])),
            priority_class="highest" if rng.random() < 0.03 else None,
            duration=float(rng.lognormal(np.log(3000.0), 1.0)),
        ))
    return jobs, Topology(nodes)


def _bursty(seed: int, n_batches: int = 30):
    """Batches of big jobs arriving at one instant on 12 nodes of 8 GPUs: at each batch
    several jobs of one class fit and not all can start, so the transformer's logits
    decide which do."""
    rng = np.random.default_rng(seed)
    jobs = []
    for b in range(n_batches):
        for k in range(int(rng.integers(3, 8))):
            jobs.append(JobSpec(
                id=f"b{b:02d}-{k}", submit_time=1500.0 * b, workers=int(rng.choice([1, 1, 2])),
                gpus_per_worker=int(rng.choice([2, 4, 8])), duration=float(rng.lognormal(np.log(4000.0), 0.8)),
                priority=float(rng.choice([0.0, 0.0, 1.0])),
            ))
    return jobs, Topology.uniform(12, 8, racks=3)


def _run(jobs, topo, ordering, placement, scaling=None, **cfg):
    sim = Simulator(jobs, topo, ordering=ordering, placement=placement, scaling=scaling,
                    config=SimConfig(record_decisions=True, **cfg))
    res = sim.run()
    return res.decisions, [(r.id, r.start, r.end, r.level, r.rescales, r.preemptions) for r in res.records]


def _scrambled(order, seed):
    """``order`` with seeded noise on its transformer's weights: the trained agent ranks
    jobs that fit mostly by age, so its logits rarely decide between two of them;
    scrambled ones do, and the tests see the runs where the transformer decides."""
    if seed is not None:
        rng = np.random.default_rng(seed)
        order.weights = {k: (v + rng.normal(scale=0.5, size=v.shape)).astype(v.dtype) if not k.startswith("placement.") else v
                         for k, v in sorted(order.weights.items())}
    return order


def _same(jobs, topo, new_placement, ref_placement, scaling=None, scramble=None, **cfg):
    new = _run(jobs, topo, _scrambled(DASOrdering(), scramble), new_placement, scaling() if scaling else None, **cfg)
    ref = _run(jobs, topo, _scrambled(ReferenceDASOrdering(), scramble), ref_placement, scaling() if scaling else None, **cfg)
    assert new[1] == ref[1]
    assert new[0] == ref[0]
    return new


@pytest.mark.parametrize("scramble", [None, 11])
@pytest.mark.parametrize("seed", [0, 2])
@pytest.mark.parametrize("backfill", [False, True])
def test_alibaba_like_cluster_schedules_as_the_reference(seed, backfill, scramble):
    jobs, topo = _alibaba_like(seed)
    decisions, records = _same(jobs, topo, DASAgentPlacement(), ReferenceDASAgentPlacement(), backfill=backfill,
                               scramble=scramble)
    # the run is loaded: jobs waited or (under the served model's attained-service
    # queues, which preempt) were suspended, and highest jobs preempted (the tests see the paths)
    submit = {j.id: j.submit_time for j in jobs}
    assert sum(1 for r in records if r[1] > submit[r[0]] or r[5] > 0) > len(jobs) // 4
    if seed == 0:
        assert any(d["kind"] == "preempt" for d in decisions)


@pytest.mark.parametrize("scramble", [None, 13])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("backfill", [False, True])
def test_bursts_of_jobs_that_fit_at_once_schedule_as_the_reference(seed, backfill, scramble):
    jobs, topo = _bursty(seed)
    _same(jobs, topo, DASAgentPlacement(), ReferenceDASAgentPlacement(), backfill=backfill, scramble=scramble)


@pytest.mark.parametrize("scramble", [None, 12])
@pytest.mark.parametrize("seed", [0, 5])
@pytest.mark.parametrize("backfill", [False, True])
def test_multi_worker_synthetic_trace_schedules_as_the_reference(seed, backfill, scramble):
    tr = load_trace("synthetic:small,load=1.6", seed=seed)
    _same(tr.jobs, tr.topology, DASAgentPlacement(), ReferenceDASAgentPlacement(), backfill=backfill, scramble=scramble)


def test_elastic_scaling_with_the_das_agents_schedules_as_the_reference():
    tr = load_trace("synthetic:small,load=1.2,max_workers=4", seed=3)
    decisions, _ = _same(tr.jobs, tr.topology, DASAgentPlacement(), ReferenceDASAgentPlacement(),
                         scaling=lambda: make_scaling("beta"), scaling_interval=600.0)
    assert any(d["kind"] == "scale" for d in decisions)


@pytest.mark.parametrize("placement", ["das", "firstfit"])
def test_das_ordering_with_other_placements_schedules_as_the_reference(placement):
    jobs, topo = _alibaba_like(4, 160)
    _same(jobs, topo, make_placement(placement), make_placement(placement))

