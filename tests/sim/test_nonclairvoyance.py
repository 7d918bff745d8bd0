"""The simulator keeps true run times from the policies (issue 13 item 3).

Spy ordering, placement and scaling policies record every JobView they are given.
Two traces identical except the jobs' true lengths (durations; the patience of the
convergence stop, which no view carries) must give the spies identical views until
the first job finishes, and no view may carry a job's true run time or true
remaining time — unless the run is clairvoyant (``SimConfig.clairvoyant``), when they
do.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from rlsched.core import JobView, Topology, make_ordering, make_placement, make_scaling
from rlsched.core.estimate import estimate_remaining
from rlsched.sim import JobSpec, SimConfig, Simulator
from rlsched.sim.traces import synthetic

#: every field of a view but the β stop's patience: the scheduler's own setting (the
#: operator's ``--patience``; each trace job's own here), which the training pair below
#: varies to make the true run times differ
_FIELDS = [f.name for f in dataclasses.fields(JobView) if f.name != "patience"]


def _snap(v: JobView) -> tuple:
    """Everything a policy can read of a view (progress and placement copied)."""
    out = []
    for name in _FIELDS:
        x = getattr(v, name)
        if name == "progress":
            x = (x.epoch, repr(x.loss), repr(x.max_loss), x.accuracy, tuple(x.history))
        elif name == "record" and x is not None:  # the scaling record as it stands now
            x = repr(x)
        elif isinstance(x, list):
            x = tuple(x)
        out.append((name, x))
    return tuple(out)


class _Log:
    """What the spies saw: (time, who, views), and every view with the engine's truth
    about its job at that moment (read from the engine's private state: test only)."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str, tuple]] = []
        self.seen: list[tuple[dict, float, float | None]] = []
        self.sim: Simulator | None = None

    def record(self, who: str, views, state) -> None:
        # a policy reads the views it is given and the running jobs of the snapshot
        views = list(views)
        views += [v for v in state.running.values() if all(v is not w for w in views)]
        self.calls.append((state.time, who, tuple(_snap(v) for v in views)))
        for v in views:
            j = self.sim._by_id[v.id]
            true_rem = (j.work_total - j.work_done) / j.rate if j.rate > 0 else None
            self.seen.append((dict(_snap(v)), j.ideal, true_rem))


class SpyOrdering:
    def __init__(self, inner, log: _Log) -> None:
        self.inner, self.log = inner, log
        self.name, self.preemptive, self.thresholds = inner.name, inner.preemptive, inner.thresholds

    def rank(self, pending, state):
        self.log.record("rank", pending, state)
        return self.inner.rank(pending, state)

    def preempts(self, job, victim, state):
        self.log.record("preempts", [job, victim], state)
        return self.inner.preempts(job, victim, state)

    def outranked(self, job, others, state):
        self.log.record("outranked", [job, *others], state)
        return self.inner.outranked(job, others, state)

    def demotes_at(self, job, now):  # the job's attained service and GPUs, no more
        return self.inner.demotes_at(job, now)


class SpyPlacement:
    fallback_reason = None

    def __init__(self, inner, log: _Log) -> None:
        self.inner, self.log, self.name = inner, log, inner.name

    def place(self, job, state, workers=None):
        self.log.record("place", [job], state)
        return self.inner.place(job, state, workers)

    def score(self, job, candidates, state):
        self.log.record("score", [job], state)
        return self.inner.score(job, candidates, state)


class SpyScaling:
    fallback_reason = None

    def __init__(self, inner, log: _Log) -> None:
        self.inner, self.log, self.name = inner, log, inner.name

    def decide(self, running, state):
        self.log.record("decide", running, state)
        return self.inner.decide(running, state)


def _run(jobs, topo, ordering="srtf", scaling="beta", **cfg) -> tuple[_Log, Simulator]:
    log = _Log()
    sim = Simulator(jobs, topo, ordering=SpyOrdering(make_ordering(ordering), log),
                    placement=SpyPlacement(make_placement("firstfit"), log),
                    scaling=SpyScaling(make_scaling(scaling), log), seed=7,
                    config=SimConfig(scaling_interval=60.0, **cfg))
    log.sim = sim
    sim.run()
    return log, sim


def _before(log: _Log, t: float) -> list:
    return [c for c in log.calls if c[0] < t]


def _first_end(*sims: Simulator) -> float:
    return min(r.end for s in sims for r in s.result().records)


# One node of 8 GPUs; 4-GPU jobs arrive every 10 s, so they queue; their run times
# (the engine's secret) differ between the two traces.
ONE_NODE = Topology.uniform(1, 8)
SHORT = [JobSpec(id=f"f{k}", submit_time=10.3 * k, gpus_per_worker=4, duration=1013.7 + 311.9 * k) for k in range(6)]
LONG = [j.with_(duration=j.duration * (2 + k % 3)) for k, j in enumerate(SHORT)]


def _training_pair():
    """Training jobs twice: patience 1 and 6 (the convergence stop, a trainer's
    setting no view carries): the same accuracy curves, other true run times."""
    tr = synthetic("small,jobs=12,nodes=2,racks=1,arrival_rate=0.02", seed=3)
    early = [j.with_(patience=1) for j in tr.jobs]
    late = [j.with_(patience=6) for j in tr.jobs]
    return early, late, tr.topology


@pytest.mark.parametrize("ordering", ["srtf", "sjf", "tetris", "fifo", "tiresias"])
def test_fixed_jobs_same_views_until_the_first_finish(ordering):
    a, sa = _run(SHORT, ONE_NODE, ordering)
    b, sb = _run(LONG, ONE_NODE, ordering)
    assert [sa.ideal_runtime(j.id) for j in SHORT] != [sb.ideal_runtime(j.id) for j in LONG]
    t = _first_end(sa, sb)
    seen_a, seen_b = _before(a, t), _before(b, t)
    # fixed-duration jobs report no evaluations, so the scaling planner never asks the
    # scaling policy about them (as in the operator); the training pair covers "decide"
    assert len(seen_a) >= 10 and {c[1] for c in seen_a} >= {"rank", "place"}
    assert seen_a == seen_b
    # clairvoyant, the views differ from the first arrival on
    ca, sca = _run(SHORT, ONE_NODE, ordering, clairvoyant=True)
    cb, scb = _run(LONG, ONE_NODE, ordering, clairvoyant=True)
    assert ca.calls[0] != cb.calls[0]


def test_training_jobs_same_views_until_the_first_finish():
    early, late, topo = _training_pair()
    a, sa = _run(early, topo)
    b, sb = _run(late, topo)
    ideal_a = [sa.ideal_runtime(j.id) for j in early]
    ideal_b = [sb.ideal_runtime(j.id) for j in late]
    assert sum(x != y for x, y in zip(ideal_a, ideal_b)) >= 6  # the secret differs
    t = _first_end(sa, sb)
    seen = _before(a, t)
    # by then the jobs report epochs, so the progress-based estimate is at work
    assert any(dict(v)["progress"][0] >= 1 and dict(v)["remaining"] > 0 for _, _, vs in seen for v in vs)
    assert seen == _before(b, t)
    ca, _ = _run(early, topo, clairvoyant=True)
    cb, _ = _run(late, topo, clairvoyant=True)
    assert _before(ca, t) != _before(cb, t)


@pytest.mark.parametrize("clairvoyant", [False, True])
def test_no_view_carries_the_true_run_time_unless_clairvoyant(clairvoyant):
    early, _, topo = _training_pair()
    for jobs, tp in ((SHORT, ONE_NODE), (early, topo)):
        log, _ = _run(jobs, tp, clairvoyant=clairvoyant)
        hits_ideal = hits_rem = 0
        for v, ideal, true_rem in log.seen:
            fields = [x for x in v.values() if isinstance(x, float)]
            hits_ideal += any(math.isclose(x, ideal, rel_tol=1e-9) for x in fields)
            if true_rem is not None and true_rem > 0:
                hits_rem += any(math.isclose(x, true_rem, rel_tol=1e-9) for x in fields)
        assert len(log.seen) > 50
        if clairvoyant:
            assert hits_ideal > 0 and hits_rem > 0
        else:
            assert hits_ideal == 0 and hits_rem == 0


def test_a_view_carries_only_the_users_estimate():
    """With estimates: the view's est_runtime is the user's (factor x the secret, or
    the seconds given), and remaining follows core's rule from it; without: 0."""
    jobs = [SHORT[0].with_(estimated_runtime=500.0), SHORT[1].with_(estimate_factor=2.0), *SHORT[2:]]
    log, sim = _run(jobs, ONE_NODE, "fifo")
    arrived: dict[str, tuple] = {}
    for _, who, views in log.calls:
        for snap in views:
            d = dict(snap)
            arrived.setdefault(d["id"], d)
    assert arrived["f0"]["est_runtime"] == 500.0 and arrived["f0"]["remaining"] == 500.0
    assert arrived["f1"]["est_runtime"] == pytest.approx(2.0 * sim.ideal_runtime("f1"))
    for k in range(2, 6):
        assert (arrived[f"f{k}"]["est_runtime"], arrived[f"f{k}"]["remaining"]) == (0.0, 0.0)
    # a running job's remaining time: its estimate less the time it ran
    for v, _, _ in log.seen:
        if v["id"] == "f0" and v["start_time"] is not None and v["attained_service"] > 0:
            ran = v["attained_service"] / (v["workers"] * v["gpus_per_worker"])
            assert v["remaining"] == pytest.approx(estimate_remaining(500.0, ran, 0, 0))
            break
    else:
        pytest.fail("f0 never seen running")
