"""Clusters of several GPU types in the interval engine (sim/interval.py) on the Sia
SOSP'23 profiles: the all-aws cluster gives the Pollux benchmark's figures exactly, a job
runs at the speed its type's profile says and reports it under that type, one type per
job at a time, and policies see only what jobs reported."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rlsched.core.allocation import Allocation, AllocationError, AllocJob, AllocNode, ProfileSample
from rlsched.core.type_goodput import BOOTSTRAPPED, FITTED, TypeGoodput, scaled
from rlsched.sim.cli import run_allocator
from rlsched.sim.interval import IntervalConfig, IntervalSimulator
from rlsched.sim.measured import (
    CLUSTERS,
    SIA_CALIBRATION,
    SIA_RESTART_COST,
    Application,
    MeasuredCluster,
    MeasuredJobSpec,
    NodeGroup,
    StepProfile,
    load_applications,
    load_seed_profile,
    parse_cluster,
)
from rlsched.sim.traces import TraceError, load_trace

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("RLSCHED_DATA_DIR") or REPO.parent / "shared" / "data")
SIA = DATA / "sia-sosp23" / "traces"
pytestmark = pytest.mark.skipif(not SIA.is_dir(), reason=f"Sia profiles not found at {SIA} (../shared/data)")

#: one aws node of 4 T4 and one dgx-ext node of 8 A100 (node 0: aws, node 1: dgx-ext)
SMALL = MeasuredCluster("small", (NodeGroup("aws", 1, 4), NodeGroup("dgx-ext", 1, 8)))


@pytest.fixture(scope="module")
def cifar10() -> dict[str, Application]:
    return load_applications(SIA, ("cifar10",), gpu_types=("aws", "dgx-ext"))


def _row(gpu_type: str, placement: str, bsz: int) -> tuple[float, float]:
    """(step, sync) of the data's own row, read by header name."""
    with open(SIA / "cifar10" / f"placements-{gpu_type}.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["placement"] == placement and float(r["local_bsz"]) == bsz:
                return float(r["step_time"]), float(r["sync_time"])
    raise LookupError((gpu_type, placement, bsz))


class Pin:
    """A type-aware test policy: each job on the nodes ``plan[call][job]``; records what
    it was given."""

    name = "pin"
    clairvoyant = False
    type_aware = True

    def __init__(self, plan):
        self.plan, self.calls, self.seen = plan, 0, []

    def allocate(self, jobs, nodes, now):
        self.seen.append((list(jobs), list(nodes)))
        plan = self.plan[min(self.calls, len(self.plan) - 1)]
        self.calls += 1
        return {j.id: Allocation(tuple(plan[j.id])) for j in jobs if j.id in plan}


def _job(i: int, t: float = 0.0) -> MeasuredJobSpec:
    return MeasuredJobSpec(f"c{i}", t, "cifar10", 4, 516)  # 129 per GPU on 4: a measured row


# ------------------------------------------------------------------ all-aws: today's figures
def test_all_aws_cluster_gives_the_pollux_benchmark_figures_exactly():
    """workload-1 under tiresias-2q: the default (Pollux's data, 16 x 4) and the all-aws
    cluster read from the Sia data (placements-aws.csv) give the same metrics to the last
    digit, and the figures recorded before clusters had types."""
    trace = load_trace("pollux:workloads/workload-1", data_dir=DATA)
    _, default = run_allocator(trace, (16, 4), "tiresias-2q", trace.interval_config())
    sia = load_trace("pollux:workloads/workload-1", data_dir=DATA)
    sia.apps = load_applications(SIA, tuple(sorted(sia.apps)), gpu_types=("aws",))
    _, typed = run_allocator(sia, MeasuredCluster("aws16", (NodeGroup("aws", 16, 4),)), "tiresias-2q",
                             sia.interval_config())
    assert typed == default
    assert default["jobs_completed"] == 160
    assert default["jct_mean"] == 2460.6742336144234  # recorded on main before this engine had types
    assert default["makespan"] == 83907.43263222813


def test_pollux_gen_draws_are_the_same_on_any_64_gpu_cluster_and_scale_with_gpus():
    base = load_trace("pollux-gen:seed=3", data_dir=DATA)
    mix = load_trace("pollux-gen:seed=3,cluster=sia-64", data_dir=DATA)
    big = load_trace("pollux-gen:seed=3,cluster=aws:32x4", data_dir=DATA)
    assert base.name == "pollux-gen:seed=3,jobs=160,hours=8,load=1,start=2"
    assert [j.to_dict() for j in mix.jobs] == [j.to_dict() for j in base.jobs]
    assert mix.cluster is CLUSTERS["sia-64"] and set(mix.apps["cifar10"].gpu_types) == {"aws", "dgx-ext", "rtx"}
    key = lambda t: Counter((j.submit_time, j.application, j.num_replicas, j.batch_size, j.tenant) for j in t.jobs)  # noqa: E731
    assert len(big.jobs) == 320 and not key(base) - key(big)  # the same seed: a superset


def test_pollux_gen_runs_in_the_sia_setting_when_asked_and_in_pollux_otherwise():
    """``calibration=``/``restart=`` put a draw in the Sia artifact's setting, as
    ``sia:`` workloads are; the jobs are the same draw; bad values are refused."""
    base = load_trace("pollux-gen:seed=3,cluster=sia-64", data_dir=DATA)
    sia = load_trace("pollux-gen:seed=3,cluster=sia-64,calibration=sia,restart=sia", data_dir=DATA)
    assert [j.to_dict() for j in sia.jobs] == [j.to_dict() for j in base.jobs]
    assert base.calibration is None and base.restart_costs is None and base.restart_cost == 30.0
    cfg = sia.interval_config()
    assert cfg.restart_costs == {a: SIA_RESTART_COST[a] for a in sia.apps}
    assert cfg.calibration == {a: SIA_CALIBRATION[a] for a in sia.apps}
    assert sia.name.endswith(",cluster=sia-64,calibration=sia,restart=sia")
    one = load_trace("pollux-gen:seed=3,cluster=sia-64,restart=45", data_dir=DATA)
    assert one.restart_cost == 45.0 and one.restart_costs is None and one.calibration is None
    for bad, match in (("calibration=x", "calibration='x'"), ("restart=-1", "must be >= 0"), ("restart=fast", "expected sia")):
        with pytest.raises(TraceError, match=match):
            load_trace(f"pollux-gen:seed=3,cluster=sia-64,{bad}", data_dir=DATA)


# ------------------------------------------------------------------ speed by type
def test_a_job_trains_at_the_speed_its_type_measured_and_reports_it_under_that_type(cifar10):
    """The same job on 4 T4 (aws) and on 4 A100 (dgx-ext): each step time is the data's
    own row of its type, and progress after one interval follows it."""
    jobs = [_job(0), _job(1)]
    sim = IntervalSimulator(jobs, cifar10, Pin([{"c0": (0,) * 4, "c1": (1,) * 4}]), cluster=SMALL,
                            config=IntervalConfig(interval=1.0, restart_cost=0.0))
    sim.step()  # one second: within the first epoch on both
    c0, c1 = (sim._by_id[i] for i in ("c0", "c1"))
    assert c0.epoch == c1.epoch == 0 and c0.progress > 0
    assert c0.atomic == c1.atomic == 129
    aws, dgx = _row("aws", "4", 129), _row("dgx-ext", "4", 129)
    assert aws[0] > 1.5 * dgx[0]  # the data: an A100 is several times a T4 on cifar10
    (s0,), (s1,) = c0.profile.values(), c1.profile.values()
    assert (s0.gpu_type, s0.step_time, s0.sync_time) == ("aws", *aws)
    assert (s1.gpu_type, s1.step_time, s1.sync_time) == ("dgx-ext", *dgx)
    # the same gain per update (same batch, same epoch): progress goes as 1 / step
    assert c1.progress / c0.progress == pytest.approx(aws[0] / dgx[0], rel=1e-9)


def test_calibration_multiplies_the_step_times_the_job_reports(cifar10):
    cfg = IntervalConfig(restart_cost=0.0, calibration={"cifar10": SIA_CALIBRATION["cifar10"]})
    sim = IntervalSimulator([_job(0)], cifar10, Pin([{"c0": (1,) * 4}]), cluster=SMALL, config=cfg)
    sim.step()
    (s,) = sim._by_id["c0"].profile.values()
    assert s.step_time == pytest.approx(1.8 * _row("dgx-ext", "4", 129)[0], rel=1e-12)


def test_moving_between_types_is_a_restart_and_keeps_both_types_reports(cifar10):
    pin = Pin([{"c0": (0,) * 4}, {"c0": (1,) * 4}])
    sim = IntervalSimulator([_job(0)], cifar10, pin, cluster=SMALL, config=IntervalConfig(restart_cost=30.0))
    sim.step()
    sim.step()
    j = sim._by_id["c0"]
    assert j.restarts == 1 and j.delay == 0.0 and j.gpu_type == "dgx-ext"
    assert sorted(s.gpu_type for s in j.profile.values()) == ["aws", "dgx-ext"]
    assert sim.views()[0].num_restarts == 1


def test_a_job_shows_the_restart_stall_it_lived_through_not_the_engine_table(cifar10):
    """The engine's table says 90 s per restart; a job shows ``restart_s`` only once it
    has stepped after a new allocation (from the allocation to that step), keeps it
    while a later stall is under way, and a job stopped mid-stall shows none."""
    pin = Pin([{"c0": (0,) * 4, "c1": (1,) * 4}, {"c0": (0,) * 4}, {"c0": (1,) * 4}, {"c0": (1,) * 4}])
    sim = IntervalSimulator([_job(0), _job(1)], cifar10, pin, cluster=SMALL, config=IntervalConfig(restart_cost=90.0))
    sim.step()
    sim.step()
    sim.config = IntervalConfig(restart_cost=150.0)  # the move at 120 s stalls 150 s
    for _ in range(3):
        sim.step()
    seen = [{j.id: j.restart_s for j in jobs} for jobs, _ in pin.seen]
    assert seen[0] == {"c0": None, "c1": None}
    assert seen[1] == {"c0": None, "c1": None}  # 60 s into a 90 s stall: nothing measured yet
    assert seen[2] == {"c0": 90.0, "c1": None}  # c0 stepped at 90 s; c1 was stopped mid-stall
    assert seen[3] == {"c0": 90.0, "c1": None}  # the move's stall is under way: the last one
    assert seen[4] == {"c0": 90.0, "c1": None}
    assert sim.views()[0].restart_s == 150.0  # it stepped at 270 s: the move's 150 s


# ------------------------------------------------------------------ one type per job
def test_an_allocation_across_types_is_refused(cifar10):
    sim = IntervalSimulator([_job(0)], cifar10, Pin([{"c0": (0, 0, 1, 1)}]), cluster=SMALL)
    with pytest.raises(AllocationError, match=r"job c0: allocation spans GPU types \['aws', 'dgx-ext'\]"):
        sim.step()


def test_a_type_unaware_allocator_is_kept_to_one_type_per_job(cifar10):
    """An allocator that knows nothing of types spreads a 6-GPU job over both nodes:
    the engine re-places it on the one type with room for all six (the 8 A100s)."""

    class Spread:
        name, clairvoyant, type_aware = "spread", False, False

        def allocate(self, jobs, nodes, now):
            return {j.id: Allocation((0, 0, 0, 1, 1, 1)) for j in jobs}

    sim = IntervalSimulator([MeasuredJobSpec("c0", 0.0, "cifar10", 6, 768)], cifar10, Spread(), cluster=SMALL)
    sim.step()
    assert sim._by_id["c0"].nodes == (1,) * 6


@pytest.mark.parametrize("policy", ["tiresias-2q", "goodput", "pollux-paper"])
def test_existing_allocators_run_on_the_sia_mix(policy):
    """The first 10–20 minutes of Philly workload 1 on the 64-GPU mix: no job ever on two
    types, every job's samples only from the types it ran on."""
    trace = load_trace("sia:workloads/philly/workload-1", data_dir=DATA)
    trace.jobs = trace.jobs[:16]
    from rlsched.sim.allocators import make_allocator

    sim = IntervalSimulator(trace.jobs, trace.apps, make_allocator(policy), cluster=trace.cluster,
                            config=trace.interval_config(max_time=600.0 if policy == "pollux-paper" else 1200.0))
    ran: dict[str, set[str]] = {}
    while not sim.done:
        sim.step()
        for j in sim._active:
            types = {sim._type_of[i] for i in j.nodes}
            assert len(types) <= 1
            ran.setdefault(j.spec.id, set()).update(types)
    assert sum(1 for t in ran.values() if t) >= 4
    for j in sim._active:
        assert {s.gpu_type for s in j.profile.values()} <= ran[j.spec.id]


# ------------------------------------------------------------------ what a policy sees
def _reachable(x, seen=None):
    """Every object reachable from ``x`` through dataclass fields, mappings and sequences."""
    seen = set() if seen is None else seen
    if id(x) in seen:
        return
    seen.add(id(x))
    yield x
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            yield from _reachable(getattr(x, f.name), seen)
    elif isinstance(x, dict):
        for k, v in x.items():
            yield from _reachable(k, seen)
            yield from _reachable(v, seen)
    elif isinstance(x, (list, tuple, set, frozenset)):
        for v in x:
            yield from _reachable(v, seen)


def test_a_policy_sees_per_type_speed_only_from_what_the_job_reported(cifar10):
    """Through its views and nodes a policy reaches no profile table (no Application,
    StepProfile or array); before a job runs it has no sample but the one-GPU seed rows
    it declared (of the cluster's types); after, only samples of the type it ran on,
    equal to what it measured there."""
    seed = load_seed_profile(SIA.parent / "seed" / "cifar10.csv")
    pin = Pin([{}, {"c0": (0,) * 4}, {"c0": (0,) * 4}])
    sim = IntervalSimulator([_job(0)], cifar10, pin, cluster=SMALL, seeds={"cifar10": seed})
    for _ in range(3):
        sim.step()
    for jobs, nodes in pin.seen:
        for x in _reachable((jobs, nodes)):
            assert not isinstance(x, (Application, StepProfile, np.ndarray)), type(x)
            assert isinstance(x, (AllocJob, AllocNode, ProfileSample, list, tuple, frozenset, str, int, float,
                                  bool, type(None))) or dataclasses.is_dataclass(x), type(x)
    assert [n.gpu_type for n in pin.seen[0][1]] == ["aws", "dgx-ext"]
    assert pin.seen[0][0][0].profile == () and pin.seen[1][0][0].profile == ()
    declared = pin.seen[0][0][0].seed_profile
    assert {x.gpu_type for x in declared} == {"aws", "dgx-ext"} and {x.num_replicas for x in declared} == {1}
    assert all((x.step_time, x.sync_time) == _row(x.gpu_type, "1", x.atomic_bsz) for x in declared)
    (s,) = pin.seen[2][0][0].profile
    assert s.gpu_type == "aws" and (s.step_time, s.sync_time) == _row("aws", "4", 129)


def test_a_type_aware_model_rests_on_reports_and_seeds_never_on_the_engine_tables(cifar10):
    """A job run on aws only: its model on dgx-ext is bootstrapped from its aws fit and
    the seed ratio. With the engine's dgx-ext table replaced by the rtx one (a job there
    would run at another speed) the views, and the model, are the same; without seeds
    the model is not offered on dgx-ext."""
    seed = load_seed_profile(SIA.parent / "seed" / "cifar10.csv")

    def last_view(apps, seeds):
        sim = IntervalSimulator([_job(0)], apps, Pin([{"c0": (0,) * 4}]), cluster=SMALL, seeds=seeds)
        for _ in range(3):
            sim.step()
        return sim.views()[0]

    swapped = load_applications(SIA, ("cifar10",), gpu_types=("aws", "dgx-ext", "rtx"))
    true_dgx = swapped["cifar10"].step_time((4,), 129, "dgx-ext")
    swapped["cifar10"].profiles["dgx-ext"] = swapped["cifar10"].profiles["rtx"]
    assert swapped["cifar10"].step_time((4,), 129, "dgx-ext") != true_dgx
    view, view2 = last_view(cifar10, {"cifar10": seed}), last_view(swapped, {"cifar10": seed})
    assert view == view2 and {s.gpu_type for s in view.profile} == {"aws"}
    tg = TypeGoodput()
    m, m2 = tg.model(view, "dgx-ext"), TypeGoodput().model(view2, "dgx-ext")
    assert (m.kind, m.source) == (BOOTSTRAPPED, "aws") and m.ratio > 1.5
    assert m2.throughput.params == m.throughput.params and m2.ratio == m.ratio
    assert m.throughput.params == scaled(tg.model(view, "aws").throughput, 1 / m.ratio).params
    bare = last_view(cifar10, None)
    assert TypeGoodput().model(bare, "dgx-ext") is None and TypeGoodput().model(bare, "aws").kind == FITTED


def test_cluster_forms_and_a_type_without_profiles():
    assert parse_cluster("sia-64").total_gpus == 64 and parse_cluster("16x4") == CLUSTERS["pollux-64"].__class__.uniform(16, 4)
    assert parse_cluster("aws:6x4+rtx:3x8").gpu_types == ("aws", "rtx")
    aws_only = load_applications(SIA, ("cifar10",), gpu_types=("aws",))
    with pytest.raises(ValueError, match=r"no step times on GPU types \['rtx'\]"):
        IntervalSimulator([_job(0)], aws_only, Pin([{}]), cluster=parse_cluster("aws:1x4+rtx:1x8"))


def test_cli_runs_the_sia_setting_and_a_named_cluster(tmp_path):
    from rlsched.cli import main

    rc = main(["sim", "run", "--trace", "sia:workloads/philly/workload-1", "--data-dir", str(DATA), "--policy",
               "tiresias-2q", "--max-time", "900", "--out", str(tmp_path / "sia"), "--quiet"])
    assert rc == 0
    cfg = json.loads((tmp_path / "sia" / "metrics.json").read_text())["config"]
    assert cfg["cluster"] == {"name": "sia-64", "groups": [["aws", 6, 4], ["dgx-ext", 2, 8], ["rtx", 3, 8]]}
    assert cfg["calibration"]["cifar10"] == 1.8 and cfg["restart_costs"]["imagenet"] == 250.0
    rc = main(["sim", "run", "--trace", "pollux:workloads/workload-1", "--data-dir", str(DATA), "--cluster", "sia-64",
               "--policy", "tiresias-2q", "--max-time", "900", "--out", str(tmp_path / "p"), "--quiet"])
    cfg = json.loads((tmp_path / "p" / "metrics.json").read_text())["config"]
    assert rc == 0 and cfg["cluster"]["name"] == "sia-64" and "calibration" not in cfg and cfg["restart_cost"] == 30.0
    assert main(["sim", "run", "--trace", "pollux:workloads/workload-1", "--data-dir", str(DATA), "--cluster",
                 "aws:1x4+nope:1x8", "--policy", "tiresias-2q", "--out", str(tmp_path / "x"), "--quiet"]) == 2
