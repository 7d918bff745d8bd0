"""Elastic scaling in the simulator runs core's ScalingPlanner, as the operator does.

The engine computes each job's end ahead from its curve (``stop_epoch`` with the job's
β and patience); these tests hold that end to what the planner's own rule
(``ElasticState`` fed the reported accuracies, ``ScalingPlanner.finished``) says, and
hold the planner's invariants on the engine's scaling ticks.
"""

from __future__ import annotations

import pytest

from rlsched.core import Progress, Topology, make_ordering, make_placement, make_scaling
from rlsched.core.planning import ElasticState, ScalingPlanner, TrainingSpec
from rlsched.sim import JobSpec, SimConfig, Simulator
from rlsched.sim.traces import synthetic


class Recording:
    """A scaling policy that records what it is asked about, then answers as ``inner``."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name = inner.name
        self.asked: list[tuple[str, int, float]] = []

    def decide(self, running, state):
        self.asked.extend((v.id, v.progress.epoch, state.time) for v in running)
        return self.inner.decide(running, state)


def _planner_end(history: list[float], spec: JobSpec, reports: int = 1) -> tuple[int, str | None]:
    """The first epoch at which ``ScalingPlanner.finished`` fires when the job reports
    its accuracies ``reports`` epochs at a time, and why (None: never)."""
    planner = ScalingPlanner(make_scaling("none"))
    ts = TrainingSpec(min_workers=spec.min_workers, max_workers=spec.max_workers, beta=spec.beta,
                      max_epochs=spec.max_epochs)
    st = ElasticState()
    epochs = list(range(reports, len(history) + 1, reports))
    if not epochs or epochs[-1] != len(history):
        epochs.append(len(history))
    for e in epochs:
        prog = Progress(epoch=e, accuracy=history[e - 1], history=list(history[:e]))
        st.observe(prog, workers=spec.workers, trained_s=0.0, beta=spec.beta, data_size=spec.samples_per_epoch)
        why = planner.finished(ts.view(spec.id, submit_time=0.0, workers=spec.workers, priority=0.0, progress=prog,
                                       record=st, patience=spec.patience))
        if why:
            return e, why
    return len(history), None


@pytest.mark.parametrize("ordering,scaling", [("fifo", "beta"), ("fifo", "fs"), ("tiresias", "beta"), ("fifo", None)])
def test_engine_ends_each_job_where_the_planners_beta_stop_would(ordering, scaling):
    """Every training job ends at the epoch the planner's rule finishes it — with
    resizes (the end is recomputed from the history) and preemptions (Tiresias) in
    between — whether the planner sees every evaluation or several at once."""
    tr = synthetic("small,jobs=40,nodes=4,racks=2", seed=7)
    o = make_ordering("tiresias", thresholds=(600.0, 6000.0)) if ordering == "tiresias" else make_ordering(ordering)
    sim = Simulator(tr.jobs, tr.topology, ordering=o, placement=make_placement("firstfit"),
                    scaling=make_scaling(scaling) if scaling else None, seed=7,
                    config=SimConfig(scaling_interval=120, restart_cost=20))
    res = sim.run()
    assert len(res.records) == 40 and not res.unfinished
    if scaling:
        assert sum(r.rescales for r in res.records) > 0
    if ordering == "tiresias":
        assert sum(r.preemptions for r in res.records) > 0
    converged = 0
    for r in res.records:
        spec = sim.spec(r.id)
        hist = sim.job(r.id).progress.history
        assert len(hist) == r.epochs
        end, why = _planner_end(hist, spec)
        assert end == r.epochs, f"{r.id}: engine ended at epoch {r.epochs}, the planner at {end}"
        assert why is not None  # the planner finishes it too: converged or max epochs
        converged += why == "Converged"
        # reports every 3 epochs (a slow cycle): the streak is the same, so the planner
        # finishes it at its first report at or after that epoch (here: the last one)
        assert _planner_end(hist, spec, reports=3) == (end, why)
    assert converged > 0


def test_a_job_is_decided_on_once_per_evaluation():
    """The policy is asked about a job only when it reported an evaluation newer than
    the planner's last decision on it — once per (job, epoch) at most, never before
    its first evaluation, never about a job without evaluations."""
    tr = synthetic("small,jobs=30,nodes=4,racks=2", seed=3)
    rec = Recording(make_scaling("beta"))
    sim = Simulator(tr.jobs, tr.topology, ordering=make_ordering("fifo"), placement=make_placement("firstfit"),
                    scaling=rec, seed=3, config=SimConfig(scaling_interval=60))
    res = sim.run()
    assert rec.asked and sum(r.rescales for r in res.records) > 0
    pairs = [(jid, e) for jid, e, _ in rec.asked]
    assert len(pairs) == len(set(pairs))
    assert all(e >= 1 for _, e in pairs)
    last: dict[str, int] = {}
    for jid, e, _ in rec.asked:
        assert e > last.get(jid, 0)
        last[jid] = e
    # a fixed-duration job never reports an evaluation: never asked, never resized
    fixed = [JobSpec(id="f", submit_time=0.0, workers=1, min_workers=1, max_workers=4, duration=3600.0)]
    rec2 = Recording(make_scaling("fcfs"))
    res2 = Simulator(fixed, Topology.uniform(1, 4), ordering=make_ordering("fifo"), placement=make_placement("firstfit"),
                     scaling=rec2, config=SimConfig(scaling_interval=60)).run()
    assert rec2.asked == [] and res2.records[0].rescales == 0


def test_added_workers_go_where_the_placement_policy_put_them():
    """The gang allocator's planner grows the job and the engine places the worker where
    its placement policy puts it: load-balance picks the emptiest node (best fit would
    pick the fullest that fits). The first scaling step is one interval after the first
    decision."""
    topo = Topology.uniform(3, 4)
    curve = {"acc_max": 0.9, "acc0": 0.1, "tau": 20.0, "gamma": 0.0, "noise": 0.0}
    jobs = [
        JobSpec(id="big", submit_time=0.0, workers=3, gpus_per_worker=1, compute_time=0.2, grad_gb=0.0,
                samples_per_epoch=3200, max_epochs=50, beta=1e-6, convergence=curve),
        JobSpec(id="e", submit_time=0.0, workers=1, min_workers=1, max_workers=4, compute_time=0.2, grad_gb=0.0,
                samples_per_epoch=3200, max_epochs=50, beta=1e-6, convergence=curve),
    ]
    sim = Simulator(jobs, topo, ordering=make_ordering("fifo"), placement=make_placement("loadbalance"),
                    scaling=make_scaling("fcfs"), config=SimConfig(scaling_interval=200.0, decision_gap=0))
    sim.step()
    before = {v.id: list(v.placement) for v in sim.running}
    sim.advance_until(199.0)  # e reports its first evaluations; no scaling step yet
    assert sim.job("e").workers == 1
    free = sim.state.free.copy()
    want = make_placement("loadbalance").place(sim.job("e"), sim.state, workers=1)[0]
    sim.advance_until(200.0)  # the scaling step
    assert want == int(free.argmax())
    assert sim.job("e").placement[:len(before["e"]) + 1] == before["e"] + [want]
    assert sim.job("e").workers >= 2 and sim.state.free[want] <= free[want] - 1
