"""The measured job model (sim/measured.py) and the interval engine (sim/interval.py)
on the Pollux OSDI'21 profiles: step times and progress checked by hand against the
data's own rows, placement effects as the data says, restarts, preemption, completion."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import pytest

from rlsched.core.allocation import Allocation, AllocationError, fixed_batch
from rlsched.sim.interval import IntervalConfig, IntervalSimulator
from rlsched.sim.measured import Application, MeasuredJobSpec, ProfileError, load_applications, placement_of

REPO = Path(__file__).resolve().parents[2]


def _traces() -> Path:
    d = os.environ.get("RLSCHED_DATA_DIR") or str(REPO.parent / "shared" / "data")
    return Path(d) / "pollux-osdi21" / "traces"


TRACES = _traces()
pytestmark = pytest.mark.skipif(not TRACES.is_dir(), reason=f"measured profiles not found at {TRACES} (../shared/data)")


@pytest.fixture(scope="module")
def apps() -> dict[str, Application]:
    return load_applications(TRACES)


def _row(app: str, placement: str, bsz: int) -> tuple[float, float]:
    with open(TRACES / app / "placements.csv") as f:
        for r in csv.DictReader(f):
            if r["placement"] == placement and int(r["local_bsz"]) == bsz:
                return float(r["step_time"]), float(r["sync_time"])
    raise LookupError((app, placement, bsz))


class Pin:
    """A test policy: pins each job to the nodes given per decision index."""

    name = "pin"
    clairvoyant = False
    type_aware = False

    def __init__(self, plan, atomic=None):
        self.plan, self.atomic, self.calls = plan, atomic, 0

    def allocate(self, jobs, nodes, now):
        plan = self.plan[min(self.calls, len(self.plan) - 1)]
        self.calls += 1
        return {j.id: Allocation(tuple(plan[j.id]), *(self.atomic or (None, None))) for j in jobs if j.id in plan}


# ------------------------------------------------------------------ the model
def test_step_time_is_the_measured_row_for_two_placements(apps):
    c = apps["cifar10"]
    assert c.step_time((4,), 32)[0] == pytest.approx(0.05821514129638672, rel=1e-12)  # placements.csv "4,32"
    assert c.step_time((2, 2), 64)[0] == pytest.approx(0.1699998140335083, rel=1e-12)  # "22,64"
    # between two measured per-GPU batches: linear ("4,32" and "4,45")
    assert c.step_time((4,), 38.5)[0] == pytest.approx((0.05821514129638672 + 0.06267681121826171) / 2, rel=1e-12)
    # any order or rotation of a measured placement is that placement
    assert c.step_time((1, 2), 32) == c.step_time((2, 1), 32) == _row("cifar10", "12", 32)


def test_progress_by_hand_for_two_placements(apps):
    """30 s of training after the 30 s restart, in one 60 s interval."""
    c = apps["cifar10"]
    # batch 128 = the initial batch: gain 1, progress = seconds / step time ("4,32")
    a = MeasuredJobSpec("a", 0.0, "cifar10", 4, 128)
    sim = IntervalSimulator([a], apps, Pin([{"a": (0, 0, 0, 0)}]), nodes=2, gpus_per_node=4)
    sim.step()
    assert sim.views()[0].progress == pytest.approx(30 / 0.05821514129638672, rel=1e-9)
    # batch 256 on 2+2 GPUs (64 per GPU, "22,64"); gain from validation-256.csv row 1
    sqr, var = 17.379458169870425, 13.937760473946334
    gain = (var + sqr) / (var / 2 + sqr)
    b = MeasuredJobSpec("b", 0.0, "cifar10", 4, 256)
    sim = IntervalSimulator([b], apps, Pin([{"b": (0, 0, 1, 1)}]), nodes=2, gpus_per_node=4)
    sim.step()
    v = sim.views()[0]
    assert v.progress == pytest.approx(30 / 0.1699998140335083 * gain, rel=1e-9)
    assert (v.grad_sqr, v.grad_var) == pytest.approx((sqr, var))
    assert v.profile[0].num_nodes == 2 and v.profile[0].atomic_bsz == 64


def test_one_node_is_faster_than_four_wherever_the_data_says_so(apps):
    checked = 0
    for name, app in apps.items():
        with open(TRACES / name / "placements.csv") as f:
            rows = {(r["placement"], int(r["local_bsz"])): float(r["step_time"]) for r in csv.DictReader(f)}
        for (p, b), t in rows.items():
            if p == "4" and ("1111", b) in rows:
                data_says = t < rows[("1111", b)]
                assert (app.step_time((4,), b)[0] < app.step_time((1, 1, 1, 1), b)[0]) == data_says, (name, b)
                checked += 1
    assert checked >= 40


def test_a_job_packed_on_one_node_finishes_before_the_same_job_spread_over_four(apps):
    # bert: one node is faster at every measured batch (placements.csv "4" vs "1111")
    job = MeasuredJobSpec("j", 0.0, "bert", 4, 48)
    ends = {}
    for label, nodes in (("one", (0, 0, 0, 0)), ("four", (0, 1, 2, 3))):
        sim = IntervalSimulator([job], apps, Pin([{"j": nodes}]), nodes=4, gpus_per_node=4)
        ends[label] = sim.run().records[0].end
    assert ends["one"] < ends["four"]


def test_unmeasured_placements_interpolate_between_node_counts(apps):
    c = apps["cifar10"]
    five = c.step_time((4, 4, 4, 4, 4), 32)[0]  # 5 nodes: between the 4-node and 6-node measurements
    four = c.step_time((4, 4, 4, 4), 32)[0]
    six = c.step_time((4,) * 6, 32)[0]
    assert min(four, six) <= five <= max(four, six)
    assert all(math.isfinite(x) and x > 0 for x in c.step_time((4,) * 16, 1024))


def test_completion_time_by_hand(apps):
    """bert at its initial batch (12) on one GPU: gain 1 throughout, so it completes
    30 s (restart) + target progress × step time after its first decision."""
    step = _row("bert", "1", 12)[0]
    bert = apps["bert"]
    job = MeasuredJobSpec("j", 0.0, "bert", 1, 12)
    res = IntervalSimulator([job], apps, Pin([{"j": (0,)}]), nodes=1, gpus_per_node=4).run()
    assert res.records[0].end == pytest.approx(30 + bert.target_progress * step, rel=1e-9)
    assert res.records[0].epochs == bert.max_epochs == 2
    assert bert.metric(12, 2) == pytest.approx(88.613, abs=1e-3)  # validation-12.csv's best F1


def test_the_job_reports_its_real_learning_curve(apps):
    job = MeasuredJobSpec("j", 0.0, "cifar10", 1, 128)
    sim = IntervalSimulator([job], apps, Pin([{"j": (0,)}]), nodes=1, gpus_per_node=4)
    for _ in range(4):
        sim.step()
    v = sim.views()[0]
    with open(TRACES / "cifar10" / "validation-128.csv") as f:
        rows = [float(r["metric"]) for r in csv.DictReader(f)]
    assert v.epoch >= 2 and list(v.metrics) == pytest.approx(rows[: v.epoch])
    assert v.higher_is_better and not apps["deepspeech2"].higher_is_better


def test_fixed_batch_splits_into_accumulation(apps):
    lim = apps["yolov3"].bounds  # at most 8 per GPU
    assert fixed_batch(64, 4, lim) == (8, 1)  # 16 per GPU = 2 x 8
    assert fixed_batch(8, 1, lim) == (8, 0)
    assert fixed_batch(16, 1, lim) == (8, 1)


def test_placement_of():
    assert placement_of((3, 3, 1, 3)) == (3, 1)
    assert placement_of(()) == ()


def test_missing_and_corrupt_profiles_raise(tmp_path, apps):
    with pytest.raises(ProfileError, match="no such folder"):
        load_applications(tmp_path / "nope")
    bad = tmp_path / "app"
    bad.mkdir()
    (bad / "placements.csv").write_text("placement,local_bsz,step_time,sync_time\n4,32,oops,0.1\n")
    with pytest.raises(ProfileError, match="placements.csv: column step_time"):
        Application(bad)


# ------------------------------------------------------------------ the engine
def test_restart_cost_only_when_the_allocation_changes(apps):
    job = MeasuredJobSpec("j", 0.0, "cifar10", 2, 128)
    same = IntervalSimulator([job], apps, Pin([{"j": (0, 0)}]), nodes=2, gpus_per_node=4)
    moved = IntervalSimulator([job], apps, Pin([{"j": (0, 0)}, {"j": (1, 1)}]), nodes=2, gpus_per_node=4)
    for s in (same, moved):
        s.step(), s.step()
    a, b = same.views()[0], moved.views()[0]
    assert a.num_restarts == 0 and b.num_restarts == 1
    step = apps["cifar10"].step_time((2,), 64)[0]
    assert a.progress == pytest.approx(90 / step, rel=1e-9)  # 30 s restart, then 30 + 60 s
    assert b.progress == pytest.approx(60 / step, rel=1e-9)  # two restarts of 30 s


def test_ncf_trains_at_its_own_batch_whatever_an_adaptive_policy_asks(apps):
    """The paper's setting (the artifact's simulator) keeps ncf at its 32,768 under
    every policy: an allocator's batch for it is not applied, and its view shows the
    bounds of a fixed batch; another application takes the allocator's batch."""
    jobs = [MeasuredJobSpec("n", 0.0, "ncf", 1, 32768), MeasuredJobSpec("c", 0.0, "cifar10", 1, 128)]
    sim = IntervalSimulator(jobs, apps, Pin([{"n": (0,), "c": (1,)}], atomic=(256, 0)), nodes=2, gpus_per_node=4)
    sim.step()
    n, c = sorted(sim.views(), key=lambda v: v.id)[::-1]
    assert (n.id, c.id) == ("n", "c")
    assert (n.atomic_bsz, n.accum_steps) == fixed_batch(32768, 1, apps["ncf"].bounds)
    assert n.batch_size == 32768 != 256
    assert (n.bounds.init_batch, n.bounds.largest) == (32768, 32768)
    assert (c.atomic_bsz, c.accum_steps, c.batch_size) == (256, 0, 256)
    assert c.bounds == apps["cifar10"].bounds


def test_a_job_left_out_keeps_its_progress(apps):
    job = MeasuredJobSpec("j", 0.0, "cifar10", 1, 128)
    sim = IntervalSimulator([job], apps, Pin([{"j": (0,)}, {}, {}]), nodes=1, gpus_per_node=4)
    sim.step()
    p = sim.views()[0].progress
    sim.step(), sim.step()
    v = sim.views()[0]
    assert v.progress == p > 0 and v.allocation == ()
    assert v.attained_service == pytest.approx(60.0)
    assert sim._by_id["j"].queued == pytest.approx(120.0)


def test_an_overcommitting_allocator_is_refused(apps):
    jobs = [MeasuredJobSpec("a", 0.0, "cifar10", 4, 128), MeasuredJobSpec("b", 0.0, "cifar10", 4, 128)]
    sim = IntervalSimulator(jobs, apps, Pin([{"a": (0, 0, 0, 0), "b": (0, 0, 0, 0)}]), nodes=2, gpus_per_node=4)
    with pytest.raises(AllocationError, match="node 0: 8 GPUs"):
        sim.step()


def test_jobs_wait_for_the_next_decision_and_idle_time_is_skipped(apps):
    job = MeasuredJobSpec("j", 1000.0, "bert", 1, 12)
    res = IntervalSimulator([job], apps, Pin([{"j": (0,)}]), nodes=1, gpus_per_node=4,
                            config=IntervalConfig(interval=60)).run()
    assert res.records[0].start == 1020.0  # the first decision at or after t=1000
    assert res.records[0].queued == 20.0


def test_only_clairvoyant_allocators_see_the_oracle(apps):
    seen = {}

    class Spy(Pin):
        def allocate(self, jobs, nodes, now):
            seen.setdefault(self.clairvoyant, jobs[0].oracle)
            return super().allocate(jobs, nodes, now)

    job = MeasuredJobSpec("j", 0.0, "cifar10", 2, 256)
    for clair in (False, True):
        spy = Spy([{"j": (0, 0)}])
        spy.clairvoyant = clair
        res = IntervalSimulator([job], apps, spy, nodes=1, gpus_per_node=4, config=IntervalConfig(max_time=120)).run()
        assert res.clairvoyant is clair
    assert seen[False] is None
    o = seen[True]
    assert o.remaining_progress == pytest.approx(apps["cifar10"].target_progress)
    assert o.progress_rate[2] > o.progress_rate[1] > 0


@pytest.mark.parametrize("policy,published", [("tiresias-2q", 3470.0), ("optimus-oracle", 5302.0)])
def test_peers_reproduce_the_published_workload_6(policy, published):
    """The fidelity check in miniature: workload 6 at 1.0x, the paper's setting, within
    15 % of the paper's figure (Qiao et al. OSDI'21; the full table: make bench-peers)."""
    from rlsched.sim.allocators import make_allocator
    from rlsched.sim.traces import load_trace

    trace = load_trace("pollux:workloads/workload-6", data_dir=TRACES.parent.parent)
    res = IntervalSimulator(trace.jobs, trace.apps, make_allocator(policy)).run()
    assert len(res.records) == 160
    jct = sum(r.jct for r in res.records) / 160
    assert abs(jct / published - 1) <= 0.15, jct
    assert res.clairvoyant is (policy == "optimus-oracle")
