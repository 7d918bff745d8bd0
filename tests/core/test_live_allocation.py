"""core/live_allocation.py: the live operator's allocator cycle — translation of what
the operator knows into the allocator's terms and of its answer into actions, exactly,
and the safe plan when the policy fails."""

import math

import pytest

from rlsched.core.allocation import Allocation
from rlsched.core.batch import BatchBounds
from rlsched.core.cluster import Progress
from rlsched.core.goodput import JobObservations
from rlsched.core.goodput_allocator import GoodputAllocator
from rlsched.core.live_allocation import (
    LiveAllocation,
    LiveTarget,
    attained_service,
    observations_from_status,
    observations_to_status,
)
from rlsched.core.planning import TrainingSpec

from .views import view


class Fixed:
    """An allocator whose answer the test writes down."""

    name = "fixed"
    clairvoyant = False
    type_aware = False

    def __init__(self, answer):
        self.answer = answer
        self.seen = None

    def allocate(self, jobs, nodes, now, queues=None):
        self.seen = (list(jobs), list(nodes), now)
        return self.answer

    def order(self, jobs):
        return sorted(jobs, key=lambda j: (j.submit_time, j.id))


class Broken(Fixed):
    def allocate(self, jobs, nodes, now, queues=None):
        raise RuntimeError("policy bug")


def test_attained_service_adds_the_gpus_held_since_the_record():
    assert attained_service(100.0, 10.0, 4, 40.0) == 220.0
    assert attained_service(None, 10.0, 2, 20.0) == 20.0
    assert attained_service(-5, 10.0, 2, 20.0) == 20.0  # a negative record is not trusted
    assert attained_service("x", None, 2, 20.0) == 0.0
    assert attained_service(7.0, 30.0, 2, 20.0) == 7.0  # a clock behind the record adds nothing


def test_observations_round_trip_through_the_status_and_refuse_garbage():
    b = BatchBounds(128, 1024, 16, 256)
    obs = JobObservations(b).record(2, 1, 256, 0.2).record(2, 1, 256, 0.3).record(4, 2, 512, 0.25)
    obs = JobObservations(b, obs.shapes, 2.0, 900.0, fitted=obs.fitted)
    st = observations_to_status(obs, "2026-01-01T00:00:00Z")
    back, last = observations_from_status(st, b)
    assert last == "2026-01-01T00:00:00Z"
    assert back.shapes == obs.shapes and (back.grad_sqr, back.grad_var) == (2.0, 900.0)
    assert back.observations() == obs.observations() and back.fitted == back.observations()
    # the next report folds in where the record left off (the running mean of 3 reports)
    assert back.record(2, 1, 256, 0.4).shapes[0].step_time == pytest.approx((0.2 + 0.3 + 0.4) / 3)
    hostile = {"shapes": [[2, 3, 256, 0, 0.2, 1], [2, 1, 0, 0, 0.2, 1], ["a"], [2, 1, 256, 0, math.nan, 1], 7],
               "gradSqr": "big", "gradVar": 1.0}
    bad, last = observations_from_status(hostile, b)
    assert bad.shapes == () and bad.grad_sqr is None and last is None
    assert observations_from_status(["not", "a", "map"], b)[0] == JobObservations(b)


def test_batch_bounds_from_the_spec():
    assert TrainingSpec(1, 2).bounds is None
    assert TrainingSpec(1, 2, batch_size=128).bounds == BatchBounds(128)
    assert TrainingSpec(1, 2, batch_size=128, max_batch_size=1024, local_batch_size=(16, 256)).bounds == \
        BatchBounds(128, 1024, 16, 256)
    assert TrainingSpec(1, 2, batch_size=128, local_batch_size=(None, 64)).bounds == BatchBounds(128, None, 1, 64)


def test_a_job_in_the_allocators_terms_replicas_are_gpus():
    b = BatchBounds(128, 1024, 16, 256)
    obs = JobObservations(b, (), 2.0, 900.0).record(2, 1, 256, 0.2)
    j = view("ns/a", submit_time=100.0, min_workers=1, max_workers=4, gpus_per_worker=2, placement=(0, 3),
                batch_size=256, bounds=b, observations=obs, attained_service=50.0, restarts=2)
    a = LiveAllocation.alloc_job(j, now=160.0)
    assert (a.id, a.age, a.attained_service, a.num_restarts) == ("ns/a", 60.0, 50.0, 2)
    assert a.allocation == (0, 0, 3, 3) and (a.min_replicas, a.max_replicas) == (2, 8)
    assert (a.bounds.init_batch, a.bounds.largest, a.bounds.min_local_batch, a.bounds.largest_local) == \
        (128, 1024, 16, 256)
    # the trainer's per-sample tr(Σ) in AdaptDL's units at the initial batch
    assert (a.grad_sqr, a.grad_var) == (2.0, 900.0 / 128)
    (p,) = a.profile
    assert (p.num_nodes, p.num_replicas, p.atomic_bsz, p.step_time, p.accum_steps) == (1, 4, 64, 0.2, 0)
    pinned = LiveAllocation.alloc_job(view("ns/p", 0.0, 1, 8, pinned_workers=3), now=0.0)
    assert (pinned.min_replicas, pinned.max_replicas) == (3, 3)
    # no batch size: one sample per GPU per step, never accumulated — goodput is throughput
    free = LiveAllocation.alloc_job(view("ns/f", 0.0, 2, 6), now=0.0)
    assert (free.bounds.min_local_batch, free.bounds.largest_local) == (1, 1)
    assert (free.grad_sqr, free.grad_var) == (0.0, 1.0)  # efficiency 1: goodput is throughput


def test_the_answer_becomes_starts_resizes_and_stops_in_whole_workers():
    jobs = [
        view("ns/wait", 0.0, 1, 4, bounds=BatchBounds(64, 512)),
        view("ns/grow", 1.0, 1, 4, placement=(0,), batch_size=64, bounds=BatchBounds(64, 512)),
        view("ns/stop", 2.0, 1, 4, placement=(1,)),
        view("ns/same", 3.0, 1, 4, placement=(1,), bounds=BatchBounds(64, 512)),
        view("ns/pair", 4.0, 2, 2, gpus_per_worker=2),  # 3 GPUs are one worker: below its gang
        view("ns/left", 5.0, 1, 1),
    ]
    answer = {
        "ns/wait": Allocation((2, 2), 64, 1),
        "ns/grow": Allocation((0, 0, 0), 32, 0),
        "ns/stop": Allocation(),
        "ns/same": Allocation((1,), 128, 0),  # a batch-only change: not worth a restart
        "ns/pair": Allocation((3, 3, 3), None, None),
    }
    live = LiveAllocation(Fixed(answer))
    plan = live.plan(jobs, {0: 4, 1: 4, 2: 4, 3: 4}, now=10.0)
    assert plan.error is None
    assert plan.start == {"ns/wait": LiveTarget(2, 256)}
    assert plan.resize == {"ns/grow": LiveTarget(3, 96)}
    assert plan.stop == ["ns/stop"] and plan.interrupt == ["ns/stop"]  # it resumes first
    # who waits, and why: ns/stop (given nothing), ns/pair (3 GPUs are no gang of 2 x 2), ns/left
    assert {k: (w.position, w.reason) for k, w in plan.waiting.items()} == \
        {"ns/stop": (1, "Ranked"), "ns/pair": (2, "Ranked"), "ns/left": (3, "Ranked")}
    assert "2 job(s) ranked before it" in plan.waiting["ns/stop"].message  # wait (starts) and grow run before it
    seen_jobs, seen_nodes, now = live.allocator.seen
    assert [n.gpus for n in seen_nodes] == [4, 4, 4, 4] and now == 10.0
    assert [j.id for j in seen_jobs] == [j.id for j in jobs]


def test_a_policy_that_raises_keeps_everyone_and_starts_nobody():
    live = LiveAllocation(Broken({}))
    plan = live.plan([view("ns/a", 0.0, 1, 2), view("ns/b", 0.0, 1, 2, placement=(0,))], {0: 2}, now=0.0)
    assert isinstance(plan.error, RuntimeError)
    assert (plan.start, plan.resize, plan.stop) == ({}, {}, [])


def test_a_job_that_ended_by_itself_is_completed_in_the_plan_and_its_gpus_wait_a_decision():
    """The β stop and ``maxEpochs`` are the plan's: a running job whose own end came is
    in ``complete``, is not given to the allocator, and its GPUs are not offered until
    the next decision (its workers are still stopping); a job whose generation still
    starts (not movable) is judged too, but never allocated."""
    from rlsched.core.planning import ElasticState

    jobs = [
        view("ns/epochs", 0.0, 1, 2, placement=(0, 0), progress=Progress(scale_invariant_epochs=10.0), max_epochs=10),
        view("ns/beta", 1.0, 1, 2, placement=(1,), record=ElasticState(streak=3), patience=3),
        view("ns/learning", 2.0, 1, 2, placement=(1,), record=ElasticState(streak=2), patience=3,
             progress=Progress(scale_invariant_epochs=9.5), max_epochs=10),
        view("ns/settling", 3.0, 1, 2, placement=(2,), record=ElasticState(streak=5), patience=None,
             movable=False),
        view("ns/starting", 4.0, 1, 2, placement=(3,), progress=Progress(scale_invariant_epochs=10.0),
             max_epochs=10, movable=False),
        view("ns/wait", 5.0, 1, 2),
    ]
    fixed = Fixed({"ns/learning": Allocation((1,), None, None), "ns/wait": Allocation((1,), None, None)})
    plan = LiveAllocation(fixed).plan(jobs, {0: 2, 1: 3}, now=20.0)  # node 2, 3: the starting jobs'
    assert plan.complete == {"ns/epochs": "MaxEpochs", "ns/beta": "Converged", "ns/starting": "MaxEpochs"}
    seen_jobs, seen_nodes, _ = fixed.seen
    assert [j.id for j in seen_jobs] == ["ns/learning", "ns/wait"]
    assert {n.index: n.gpus for n in seen_nodes} == {0: 0, 1: 2}  # ns/epochs' 2 and ns/beta's 1 are not offered
    assert plan.start == {"ns/wait": LiveTarget(1, None)} and plan.stop == [] and plan.resize == {}
    broken = LiveAllocation(Broken({})).plan(jobs, {0: 2, 1: 3}, now=20.0)
    assert isinstance(broken.error, RuntimeError) and broken.complete == plan.complete  # a job's end is its own


def test_capacity_must_hold_the_running_jobs():
    with pytest.raises(ValueError, match="more GPUs than the capacity"):
        LiveAllocation(Fixed({})).plan([view("ns/a", 0.0, 1, 2, gpus_per_worker=2, placement=(0,))], {0: 1}, now=0.0)


def test_clairvoyant_allocators_are_refused():
    class Oracle(Fixed):
        clairvoyant = True

    with pytest.raises(ValueError, match="clairvoyant"):
        LiveAllocation(Oracle({}))

    class Unordered:
        name, clairvoyant = "x", False

        def allocate(self, jobs, nodes, now, queues=None):
            return {}

    with pytest.raises(TypeError, match="order"):
        LiveAllocation(Unordered())


def test_goodput_live_shrinks_a_running_job_to_start_a_queued_one():
    """The real goodput allocator through the live translation: one job holds all 4
    GPUs, a second is queued — the running one shrinks (a resize) and the queued one
    starts, together using every GPU, each at a batch within its bounds."""
    b = BatchBounds(128, 2048, 16, 256)
    run = view("ns/run", 0.0, 1, 4, placement=(0, 0, 0, 0), batch_size=512, bounds=b, attained_service=10.0)
    new = view("ns/new", 50.0, 1, 4, bounds=b)
    plan = LiveAllocation(GoodputAllocator()).plan([run, new], {0: 4}, now=1e5)
    assert set(plan.start) == {"ns/new"} and set(plan.resize) == {"ns/run"} and plan.stop == []
    assert plan.start["ns/new"].workers + plan.resize["ns/run"].workers == 4
    for t in (plan.start["ns/new"], plan.resize["ns/run"]):
        assert 128 <= t.batch_size <= 2048


def test_allocator_names_and_options():
    from rlsched.core.live_allocation import make_live_allocator, parse_allocator_options

    assert parse_allocator_options("goodput@restart_delay=2,refit_tolerance=none") == \
        ("goodput", {"restart_delay": 2.0, "refit_tolerance": None})
    a = make_live_allocator("goodput@restart_delay=2")
    assert isinstance(a, GoodputAllocator) and a.restart_delay == 2.0
    learned = make_live_allocator("goodput-learned@p=0.5")  # the promoted growth weight, read
    assert isinstance(learned, GoodputAllocator) and learned.growth is not None
    assert learned.growth.fallback_reason is None and learned.growth.metadata["policy"] == "growth"
    assert a.growth is None
    rlpto = make_live_allocator("goodput-rlpto@restart_delay=2")  # the promoted RLPTO network, read
    assert rlpto.restart_delay == 2.0 and rlpto.growth.fallback_reason is None
    assert rlpto.growth.metadata["policy"] == "rlpto-goodput"
    for bad, match in (("fifo", "unknown live allocator"), ("goodput@p", "not key=number"),
                       ("goodput@p=x", "not key=number"), ("goodput@nope=1", "nope")):
        with pytest.raises(ValueError, match=match):
            make_live_allocator(bad)


def test_service_classes_reach_the_allocator():
    ranks = [LiveAllocation.alloc_job(view("ns/a", 0.0, 1, 2, priority_class=c), now=0.0).priority
             for c in ("highest", "urgent", "normal")]
    assert ranks == [2, 1, 0]


def test_gpu_models_reach_the_allocator_and_an_unplaceable_gang_waits_unfittable():
    """Nodes 0-1 are A100, 2-3 V100 (4 GPUs each). A 1-16 worker job that allows only
    A100s starts on at most the 8 A100 GPUs; a job whose template allows a model the
    cluster lacks waits ``Unfittable``, its message naming the GPU model rule."""
    live = LiveAllocation(GoodputAllocator())
    a100 = view("ns/a100", 0.0, 1, 16, gpu_models=frozenset({"A100"}))
    lost = view("ns/lost", 1.0, 1, 2, gpu_models=frozenset())
    models = {0: "A100", 1: "A100", 2: "V100", 3: "V100"}
    plan = live.plan([a100, lost], {i: 4 for i in range(4)}, 100.0, models=models)
    assert set(plan.allocations["ns/a100"].nodes) <= {0, 1} and 1 <= plan.start["ns/a100"].workers <= 8
    assert "ns/lost" not in plan.start
    w = plan.waiting["ns/lost"]
    assert w.reason == "Unfittable" and "GPU model" in w.message and "0 are the allocator's" in w.message
    # without the models (every node unlabelled) the same jobs are not told apart
    blind = LiveAllocation(GoodputAllocator()).plan([view("ns/a100", 0.0, 1, 16)], {i: 4 for i in range(4)}, 100.0)
    assert blind.start["ns/a100"].workers == 16 and max(blind.allocations["ns/a100"].nodes) >= 2


def test_the_learning_curve_reaches_the_allocator_as_in_the_interval_engine():
    """``status.progress``' epoch and history (the accuracy after each epoch) are the
    AllocJob's ``epoch`` and ``metrics``, so a growth weight reading the curve
    (core/growth_weight.py) sees live what it saw in training."""
    from rlsched.core.growth_weight import curve_pace

    curve = Progress(epoch=5, history=[0.2, 0.5, 0.6, 0.6, 0.62])
    a = LiveAllocation.alloc_job(view("ns/a", 0.0, 1, 2, progress=curve), now=10.0)
    assert (a.epoch, a.metrics, a.higher_is_better) == (5, (0.2, 0.5, 0.6, 0.6, 0.62), True)
    assert curve_pace(a.metrics, a.higher_is_better) == pytest.approx((0.12 / 3) / (0.42 / 4))
    fresh = LiveAllocation.alloc_job(view("ns/b", 0.0, 1, 2), now=0.0)
    assert (fresh.epoch, fresh.metrics) == (0, ())


def test_the_end_of_a_protection_wakes_the_decision_while_a_job_waits():
    """A job inside its 600 s minimum run time keeps its GPUs; while another waits the
    plan asks to decide again when the protection ends, and not when nobody waits."""
    from rlsched.core.queues import QueueBook

    book = QueueBook(min_run_s=600.0)
    run = view("ns/run", 0.0, 1, 1, placement=(0,), start_time=100.0)
    wait = view("ns/wait", 50.0, 1, 1)
    plan = LiveAllocation(Fixed({"ns/run": Allocation((0,), None, None)})).plan([run, wait], {0: 1}, now=300.0,
                                                                               queues=book)
    assert "ns/wait" in plan.waiting and plan.wake_at == 700.0
    alone = LiveAllocation(Fixed({"ns/run": Allocation((0,), None, None)})).plan([run], {0: 1}, now=300.0, queues=book)
    assert alone.wake_at is None


def test_a_plan_without_reasons_decides_the_same():
    """``why=False`` leaves ``waiting`` empty and changes nothing else: the end of a
    protection still wakes the decision while a job waits."""
    from rlsched.core.queues import QueueBook

    book = QueueBook(min_run_s=600.0)
    run = view("ns/run", 0.0, 1, 1, placement=(0,), start_time=100.0)
    jobs = [run, view("ns/wait", 50.0, 1, 1), view("ns/new", 60.0, 1, 1)]
    answer = {"ns/run": Allocation((0,), None, None), "ns/new": Allocation((1,), None, None)}
    full = LiveAllocation(Fixed(answer)).plan(jobs, {0: 1, 1: 1}, now=300.0, queues=book)
    bare = LiveAllocation(Fixed(answer)).plan(jobs, {0: 1, 1: 1}, now=300.0, queues=book, why=False)
    assert list(full.waiting) == ["ns/wait"] and bare.waiting == {}
    assert (bare.start, bare.resize, bare.stop, bare.complete, bare.wake_at) == \
        (full.start, full.resize, full.stop, full.complete, full.wake_at) == ({"ns/new": LiveTarget(1, None)}, {}, [],
                                                                             {}, 700.0)
    alone = LiveAllocation(Fixed(answer)).plan([run], {0: 1}, now=300.0, queues=book, why=False)
    assert alone.wake_at is None


def test_a_kept_profile_follows_new_observations():
    """The profile kept between decisions is the one of the job's observations now."""
    b = BatchBounds(128, 1024)
    first = JobObservations(b).record(2, 1, 256, 0.2)
    later = first.record(4, 2, 512, 0.25)
    live = LiveAllocation(Fixed({}))
    seen = []
    for obs in (first, first, later):
        live.plan([view("ns/a", 0.0, 1, 4, bounds=b, observations=obs)], {0: 4}, now=10.0)
        seen.append(live.allocator.seen[0][0].profile)
    assert seen[0] is seen[1] and len(seen[0]) == 1
    assert [(p.num_replicas, p.num_nodes) for p in seen[2]] == [(2, 1), (4, 2)]
    assert seen[2] == LiveAllocation.alloc_job(view("ns/a", 0.0, 1, 4, bounds=b, observations=later), 10.0).profile
