"""Our ordering + placement as an allocation policy (core/gang_allocator.py)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rlsched.core import make_ordering, make_placement
from rlsched.core.allocation import AllocJob, AllocNode, check_allocations
from rlsched.core.batch import BatchBounds
from rlsched.core.cluster import Progress
from rlsched.core.gang_allocator import GangAllocator
from rlsched.core.live_allocation import LiveTarget

from .views import view

LIM = BatchBounds(128, 4096, 32, 1024)
NODES = [AllocNode(i, 4) for i in range(2)]


def job(jid, t, replicas, allocation=()):
    return AllocJob(id=jid, submit_time=t, application="cifar10", age=0.0, attained_service=0.0, num_restarts=0,
                    allocation=tuple(allocation), target_replicas=replicas, target_batch_size=128 * replicas,
                    min_replicas=1, max_replicas=16, bounds=LIM)


def gang(order="fifo", place="bestfit", backfill=True):
    rng = np.random.default_rng(0)
    return GangAllocator(make_ordering(order, rng=rng), make_placement(place, rng=rng), backfill=backfill)


def test_running_jobs_keep_their_nodes_and_the_queue_starts_in_order():
    jobs = [job("run", 0, 3, (1, 1, 1)), job("a", 1, 4), job("b", 2, 1)]
    out = gang(place="firstfit").allocate(jobs, NODES, 60.0)
    check_allocations(jobs, NODES, out)
    assert out["run"].nodes == (1, 1, 1)
    assert sorted(out["a"].nodes) == [0, 0, 0, 0]
    assert out["b"].nodes == (1,)  # the last free GPU


def test_backfill_or_head_of_line_blocking():
    jobs = [job("run", 0, 6, (0, 0, 0, 0, 1, 1)), job("big", 1, 4), job("small", 2, 1)]
    assert set(gang(backfill=True).allocate(jobs, NODES, 0.0)) == {"run", "small"}
    assert set(gang(backfill=False).allocate(jobs, NODES, 0.0)) == {"run"}


def test_learning_score_is_relative_improvement_in_the_metric_direction():
    from rlsched.core.gang_allocator import learning_score

    assert learning_score([0.5, 0.6, 0.75], True) == [0.0, 0.19999999999999996, 0.5]
    assert learning_score([100.0, 50.0, 40.0], False) == [0.0, 0.5, 0.6]  # WER falls: the score rises
    assert learning_score([], True) == []


def test_a_converging_job_gives_a_worker_back_and_a_gaining_one_grows():
    from rlsched.core import make_scaling

    alloc = GangAllocator(make_ordering("fifo"), make_placement("firstfit"), make_scaling("beta"))
    flat = job("flat", 0, 2, (0, 0))
    flat.metrics, flat.epoch = (0.5,) * 8, 8  # no gain for 8 evaluations
    rising = job("rising", 1, 2, (1, 1))
    rising.metrics, rising.epoch = tuple(0.1 * k for k in range(1, 9)), 8
    out = alloc.allocate([flat, rising], NODES, 600.0)
    check_allocations([flat, rising], NODES, out)
    assert len(out["flat"].nodes) == 1
    assert len(out["rising"].nodes) == 3


def test_a_preemptive_ordering_evicts_through_cores_admission():
    """Tiresias (core's ordering, threshold 3600 GPU-s): a fresh job outranks one that
    has run past the threshold; the blocked newcomer evicts it, as the operator does."""
    old = job("old", 0, 8, (0, 0, 0, 0, 1, 1, 1, 1))
    old.attained_service = 10_000.0
    new = job("new", 5, 4)
    out = gang(order="tiresias", place="firstfit").allocate([old, new], NODES, 600.0)
    check_allocations([old, new], NODES, out)
    assert "old" not in out and len(out["new"].nodes) == 4
    # without preemption the running job keeps its GPUs and the newcomer waits
    keep = GangAllocator(make_ordering("tiresias"), make_placement("firstfit"), preemption=False)
    assert set(keep.allocate([old, new], NODES, 600.0)) == {"old"}


def test_only_a_highest_heads_victims_wait_in_the_interrupt_queue():
    """A victim of a preemptive ordering goes back to its own queue, where Tiresias ranks
    it after its preemptor's peers; a ``highest`` head's normal victim waits in the
    interrupt queue and resumes first (core's one rule, as the engine's passes apply it).
    The live plan says which, so the operator and the engine requeue them alike."""
    from rlsched.core.live_allocation import LiveAllocation

    live = LiveAllocation.named("tiresias/firstfit+nobackfill")
    old = view("ns/old", 0.0, 8, 8, placement=(0,) * 4 + (1,) * 4, attained_service=10_000.0)
    plan = live.plan([old, view("ns/new", 5.0, 4, 4)], {0: 4, 1: 4}, now=600.0)
    assert plan.stop == ["ns/old"] and plan.interrupt == [] and not live.allocator.interrupted()
    boss = view("ns/boss", 5.0, 4, 4, priority_class="highest", queue="urgent")
    plan = live.plan([replace(old, attained_service=0.0), boss], {0: 4, 1: 4}, now=600.0)
    assert plan.stop == ["ns/old"] and plan.interrupt == ["ns/old"]
    assert live.allocator.interrupted() == {"ns/old"}


def test_a_job_preempted_this_cycle_is_not_resized():
    from rlsched.core import make_scaling

    old = job("old", 0, 8, (0, 0, 0, 0, 1, 1, 1, 1))
    old.attained_service, old.metrics, old.epoch = 10_000.0, (0.1, 0.2, 0.3), 3
    new = job("new", 5, 4)
    alloc = GangAllocator(make_ordering("tiresias"), make_placement("firstfit"), make_scaling("fs"))
    out = alloc.allocate([old, new], NODES, 600.0)
    check_allocations([old, new], NODES, out)
    assert "old" not in out and len(out["new"].nodes) >= 4


def test_a_protected_job_is_no_victim():
    """A job inside its minimum run time keeps its GPUs: the newcomer that would have
    evicted it waits."""
    old = job("old", 0, 8, (0, 0, 0, 0, 1, 1, 1, 1))
    old.attained_service, old.protected = 10_000.0, True
    new = job("new", 5, 4)
    assert set(gang(order="tiresias", place="firstfit").allocate([old, new], NODES, 600.0)) == {"old"}


def test_multi_gpu_workers_stay_whole_on_a_node_and_uneven_nodes_are_used():
    """Workers of 2 GPUs (``replica_group``) are placed whole: each worker's 2 replicas
    on one node; nodes of different sizes (what the live operator offers) are fine."""
    nodes = [AllocNode(0, 3, "a"), AllocNode(1, 4, "b"), AllocNode(2, 1, "c")]
    pair = replace(job("pair", 0, 4), replica_group=2)
    out = gang(place="firstfit").allocate([pair], nodes, 0.0)
    check_allocations([pair], nodes, out)
    where = out["pair"].nodes
    assert len(where) == 4 and [where[0], where[2]] == [where[1], where[3]]  # whole workers
    assert sorted(where) != [0, 0, 0, 1]  # no worker split between a and b


def test_heuristic_names_build_live_allocators_and_team_queues_are_only_reported():
    from rlsched.core.live_allocation import LiveAllocation
    from rlsched.core.queues import QueueBook, QueueSpec

    live = LiveAllocation.named("tiresias/firstfit+nobackfill")
    assert isinstance(live.allocator, GangAllocator) and not live.allocator.backfill
    assert live.allocator.name == "tiresias/firstfit+nobackfill"
    plan = live.plan([view("ns/a", 0.0, 2, 4, gpus_per_worker=2), view("ns/b", 1.0, 1, 1, gpus_per_worker=4)],
                     {0: 4, 1: 4}, now=10.0)
    assert plan.error is None and plan.start == {"ns/a": LiveTarget(2, None), "ns/b": LiveTarget(1, None)}
    # a heuristic does not enforce team queues: a job over its queue's cap, or naming no
    # such queue, starts all the same; the queues' use is reported
    book = QueueBook([QueueSpec("team", nominal_gpus=1, borrowing_limit=0)])
    plan = live.plan([view("ns/a", 0.0, 2, 2, team="team"), view("ns/b", 1.0, 1, 1, team="gone")],
                     {0: 4}, now=10.0, queues=book)
    assert plan.error is None and set(plan.start) == {"ns/a", "ns/b"} and not plan.waiting
    assert plan.queues["team"]["gpusInUse"] == 2 and not live.enforces_queues
    with pytest.raises(ValueError, match="ordering/placement"):
        LiveAllocation.named("nosuch")


def test_a_demoting_ordering_asks_to_decide_again_when_a_queue_changes():
    """Tiresias: the job just given 2 GPUs, 600 GPU-s short of the first threshold, is
    demoted 300 s later; who may preempt whom changes then. FIFO, or Tiresias without
    preemption, never asks."""
    from rlsched.core.live_allocation import LiveAllocation

    th = make_ordering("tiresias").thresholds[0]
    run = job("run", 0, 2, (0, 0))
    run.attained_service = th - 600.0
    alloc = gang(order="tiresias")
    out = alloc.allocate([run, job("wait", 1, 1)], NODES, 100.0)
    assert alloc.next_decision([run, job("wait", 1, 1)], out, 100.0) == pytest.approx(400.0)
    assert alloc.next_decision([run], {}, 100.0) is None  # nothing runs: no queue moves
    assert gang(order="fifo").next_decision([run], out, 100.0) is None
    keep = GangAllocator(make_ordering("tiresias"), make_placement("bestfit"), preemption=False)
    assert keep.next_decision([run], out, 100.0) is None
    plan = LiveAllocation(gang(order="tiresias")).plan(
        [view("ns/run", 0.0, 2, 2, placement=(0, 0), attained_service=th - 600.0)], {0: 4}, now=100.0)
    assert plan.wake_at == pytest.approx(400.0)


def test_the_service_queues_and_dynamic_priority_order_the_gangs():
    """RLPTO's queues: a preempted job (interrupt) before urgent before normal; inside a
    queue the higher dynamic priority first, a ``highest`` job before every other."""
    from rlsched.core.live_allocation import LiveAllocation

    live = LiveAllocation.named("fifo/bestfit+nobackfill")

    def first(*jobs):
        return list(live.plan(list(jobs), {0: 8}, now=10.0).start)

    n1 = view("ns/n1", 0.0, 1, 1, gpus_per_worker=8)
    promoted = view("ns/n2", 1.0, 1, 1, gpus_per_worker=8, queue="urgent", priority=1.0)
    urgent = view("ns/u", 2.0, 1, 1, gpus_per_worker=8, priority_class="urgent", queue="urgent")
    resumed = view("ns/r", 3.0, 1, 1, gpus_per_worker=8, queue="interrupt")
    highest = view("ns/h", 4.0, 1, 1, gpus_per_worker=8, priority_class="highest", queue="urgent")
    assert first(n1, promoted, urgent) == ["ns/n2"]
    assert first(n1, urgent) == ["ns/u"]
    assert first(n1, urgent, resumed) == ["ns/r"]
    assert first(n1, promoted, urgent, highest) == ["ns/h"]


def test_a_highest_job_behind_a_blocked_head_preempts_a_normal_one():
    from rlsched.core.live_allocation import LiveAllocation

    live = LiveAllocation.named("fifo/bestfit+nobackfill")
    low = view("ns/low", 0.0, 1, 1, gpus_per_worker=8, placement=(0,))
    waiter = view("ns/waiter", 1.0, 1, 1, gpus_per_worker=8)
    boss = view("ns/boss", 2.0, 1, 1, gpus_per_worker=8, priority_class="highest", queue="urgent")
    plan = live.plan([low, waiter, boss], {0: 8}, now=10.0)
    assert plan.stop == ["ns/low"] and list(plan.start) == ["ns/boss"]
    assert plan.interrupt == ["ns/low"]  # RLPTO's class rule: it resumes first
    # of two running jobs the one of lower dynamic priority is the victim
    high = view("ns/high", 1.0, 1, 1, gpus_per_worker=8, placement=(1,), priority=0.5)
    plan = live.plan([low, high, replace(boss, gpus_per_worker=8)], {0: 8, 1: 8}, now=10.0)
    assert plan.stop == ["ns/low"] and list(plan.start) == ["ns/boss"]


def test_a_gang_allocator_says_why_each_job_waits_from_its_admission_plan():
    """As the operator's admission said it: the head of line does not fit the free GPUs
    (NoRoom), a job behind it waits without backfill (BehindHead), a gang the cluster
    can never hold has no place in the order (Unfittable)."""
    from rlsched.core.live_allocation import LiveAllocation

    live = LiveAllocation.named("fifo/bestfit+nobackfill")
    jobs = [view("ns/holder", 0.0, 1, 1, gpus_per_worker=8, placement=(0,)),
            view("ns/next", 1.0, 1, 1, gpus_per_worker=8), view("ns/small", 2.0, 1, 1),
            view("ns/huge", 3.0, 2, 2, gpus_per_worker=8)]
    why = live.plan(jobs, {0: 8}, now=10.0).waiting
    assert {k: (w.position, w.reason) for k, w in why.items()} == {
        "ns/next": (1, "NoRoom"), "ns/small": (2, "BehindHead"), "ns/huge": (0, "Unfittable")}
    assert "1 x 8 GPUs" in why["ns/next"].message and "0 free GPUs" in why["ns/next"].message
    assert "behind ns/next" in why["ns/small"].message


def test_a_running_job_whose_pin_moved_goes_one_worker_per_decision_towards_it():
    """``kubectl scale`` of a running job: one worker per decision, each a new size (the
    none mode's pin rule), up only where a worker has room; never stopped for it."""
    from rlsched.core.live_allocation import LiveAllocation

    live = LiveAllocation.named("fifo/bestfit+nobackfill")
    up = view("ns/up", 0.0, 1, 4, placement=(0,), pinned_workers=3)
    assert live.plan([up], {0: 2, 1: 4}, now=10.0).resize == {"ns/up": LiveTarget(2, None)}
    assert live.plan([replace(up, placement=(0, 0))], {0: 2, 1: 4}, now=10.0).resize == {"ns/up": LiveTarget(3, None)}
    full = live.plan([up, view("ns/other", 0.0, 1, 1, placement=(0,))], {0: 2}, now=10.0)
    assert not full.resize and not full.stop  # no room: it keeps its worker
    down = view("ns/down", 0.0, 1, 4, placement=(0, 0, 1), pinned_workers=1)
    assert live.plan([down], {0: 2, 1: 4}, now=10.0).resize == {"ns/down": LiveTarget(2, None)}
    assert live.plan([replace(down, placement=(0, 0))], {0: 2}, now=10.0).resize == {"ns/down": LiveTarget(1, None)}


def test_a_gang_whose_workers_no_node_can_host_by_cpu_does_not_block_the_line():
    from rlsched.core.live_allocation import LiveAllocation

    live = LiveAllocation.named("fifo/bestfit+nobackfill")
    five = view("ns/five", 0.0, 5, 5, cpu_milli=60_000)  # one worker per node by CPU: 4 nodes hold 4
    four = view("ns/four", 1.0, 4, 4, cpu_milli=60_000)
    offers = {i: (96_000, 1 << 20) for i in range(4)}
    plan = live.plan([five, four], {i: 8 for i in range(4)}, now=10.0, offers=offers)
    assert list(plan.start) == ["ns/four"] and plan.waiting["ns/five"].reason == "Unfittable"


def _callers(history, *, rec):
    """What the caller's live view of a running job carries for the scaling planner
    (the operator's ``live_job``): its reported progress and its ``status.rlpto``
    record."""
    from rlsched.core.cluster import Progress

    prog = Progress(epoch=len(history), accuracy=history[-1], history=list(history), loss=0.5, max_loss=2.0)
    return dict(progress=prog, record=rec, start_time=5.0)


def test_a_callers_elastic_record_scales_on_the_jobs_own_beta_and_range():
    """The operator's record (``status.rlpto``) and ``spec.beta``: a job still gaining
    its β grows by one whole worker, the evaluation is marked decided on the record (no
    second step on it), and a converging one gives a worker back, never below its
    minimum."""
    from rlsched.core.live_allocation import LiveAllocation
    from rlsched.core.planning import ElasticState

    live = LiveAllocation.named("fifo/bestfit/beta+nobackfill")
    rec = ElasticState(epoch=3, streak=0, decided_epoch=2)
    rising = view("ns/r", 0.0, 1, 4, gpus_per_worker=8, placement=(0,), **_callers((0.1, 0.3, 0.5), rec=rec),
                  beta=0.02)
    plan = live.plan([rising], {0: 8, 1: 8}, now=10.0)
    assert plan.resize == {"ns/r": LiveTarget(2, None)} and rec.decided_epoch == 3
    assert not live.plan([rising], {0: 8, 1: 8}, now=20.0).resize  # the same evaluation: no second step
    hist = (0.1, 0.3, 0.5, 0.505)
    flat = replace(rising, placement=(0, 1), **_callers(hist, rec=ElasticState(epoch=4, streak=1, decided_epoch=3)))
    assert live.plan([flat], {0: 8, 1: 8}, now=30.0).resize == {"ns/r": LiveTarget(1, None)}
    alone = replace(flat, placement=(0,), min_workers=1,
                    **_callers(hist, rec=ElasticState(epoch=4, streak=1, decided_epoch=3)))
    assert not live.plan([alone], {0: 8, 1: 8}, now=40.0).resize  # at its minimum


def test_a_scaling_policy_sees_the_callers_measured_view():
    """RLPTO's network is shown a job with the caller's record as core's planner shows
    it the caller's view (:func:`~rlsched.core.planning.measured_view`): its reported
    loss, its remaining time, β, its workers and the speed-up its own reports give; and
    the jobs still waiting after the decision's admissions as pending. Alone on the
    cluster, its RLPTO features are the ones the planner computes on a cluster state of
    the same nodes."""
    from rlsched.core.cluster import ClusterState, JobView
    from rlsched.core.estimate import estimate_remaining
    from rlsched.core.learned import job_observation
    from rlsched.core.live_allocation import LiveAllocation
    from rlsched.core.planning import ElasticState, measured_view
    from rlsched.core.topology import NodeSpec, Topology

    hist = (0.1, 0.3, 0.5)
    rec = ElasticState(epoch=3, decided_epoch=2, trained_s=120.0)
    live = LiveAllocation.named("fifo/das/rlpto+nobackfill")
    policy = live.allocator.planner.policy
    seen = []
    decide = policy.decide

    def spy(running, state):
        seen.extend((v, job_observation(v, state), len(state.pending)) for v in running)
        return decide(running, state)

    policy.decide = spy
    left = estimate_remaining(3600.0, 120.0, 3, 30)
    run = view("ns/r", 0.0, 1, 4, gpus_per_worker=8, placement=(0, 1), **_callers(hist, rec=rec), beta=0.004,
               est_runtime=3600.0, remaining=left, max_epochs=30)
    start = view("ns/s", 1.0, 1, 1, gpus_per_worker=8)  # admitted by the same decision
    wait = view("ns/w", 2.0, 3, 3, gpus_per_worker=8)  # does not fit: still pending
    live.plan([run, start, wait], {i: 8 for i in range(4)}, now=10.0)
    (v, feats, pending), = seen
    state = ClusterState(Topology([NodeSpec(f"node-{i}", 8) for i in range(4)]), time=10.0)
    want = measured_view(replace(run, workers=2), state)
    assert (v.progress.loss, v.progress.max_loss, v.progress.history) == (0.5, 2.0, list(hist))
    assert v.remaining == want.remaining == left > 0 and v.est_runtime == 3600.0
    assert (v.beta, v.workers, v.speedup, v.stat_efficiency) == (want.beta, want.workers, want.speedup,
                                                                 want.stat_efficiency)
    assert pending == 1  # ns/s was admitted, ns/w waits
    for i in (0, 1, 2):  # ns/r on nodes 0 and 1, ns/s admitted to node 2
        state.allocate(i, 8)
    state.pending = [JobView("ns/w", 2.0, gpus_per_worker=8, workers=3, min_workers=3, max_workers=3)]
    assert feats.tolist() == job_observation(want, state).tolist()


def test_the_last_started_job_is_the_victim_and_a_restart_is_no_resize():
    """Of two running jobs of one class and priority the one started last is preempted
    for a ``highest`` job; one the same decision starts again elsewhere (the preemptor
    needs its whole node) is stopped and started in the plan after its preemptor (a
    preemption and a resumption), where a plan of the same size alone would leave it on
    the node."""
    from rlsched.core.live_allocation import LiveAllocation

    # the same submit second; second started last, so of the two it is the victim
    first = view("ns/first", 0.0, 1, 2, gpus_per_worker=8, placement=(0, 1), start_time=1.0)
    second = view("ns/second", 0.0, 1, 2, gpus_per_worker=8, placement=(2, 3), start_time=2.0)
    boss = view("ns/boss", 3.0, 1, 1, gpus_per_worker=8, priority_class="highest", queue="urgent")
    plan = LiveAllocation.named("fifo/bestfit+nobackfill").plan([first, second, boss], {i: 8 for i in range(4)},
                                                                now=10.0)
    assert plan.stop == ["ns/second"] and list(plan.start) == ["ns/boss"]
    a = view("ns/a", 0.0, 1, 1, gpus_per_worker=4, placement=(0,), start_time=2.0)
    c = view("ns/c", 0.0, 1, 1, gpus_per_worker=4, placement=(1,), start_time=1.0)
    live = LiveAllocation.named("fifo/bestfit+nobackfill")
    plan = live.plan([a, c, boss], {0: 8, 1: 8}, now=10.0)
    assert plan.stop == ["ns/a"] and list(plan.start) == ["ns/boss", "ns/a"] and not plan.resize  # boss first
    assert plan.allocations["ns/a"].nodes == (1,) * 4 and plan.allocations["ns/boss"].nodes == (0,) * 8


def test_a_preempting_head_starts_before_the_jobs_behind_it_backfill(monkeypatch):
    """One node of 8 GPUs under Tiresias with backfill: v (2 GPUs, running) and w (2
    GPUs, waiting) have run past the first threshold, the boss (8 GPUs) has not. The
    boss preempts v and starts on the node in the next round, before w may backfill, as
    the event engine starts a preempting head; w waits. Backfilled in the round that
    preempted, w took GPUs the boss needed, and the boss evicted w, then v, in turn
    until the round limit."""
    from rlsched.core.live_allocation import LiveAllocation

    live = LiveAllocation.named("tiresias/firstfit+backfill")
    served = 10 * 3600.0
    jobs = [view("ns/v", 0.0, 1, 1, gpus_per_worker=2, placement=(0,), attained_service=served),
            view("ns/boss", 1.0, 1, 1, gpus_per_worker=8),
            view("ns/w", 2.0, 1, 1, gpus_per_worker=2, attained_service=served)]
    cycle, seen = live.allocator.cycle, []
    settle = cycle.plan
    monkeypatch.setattr(cycle, "plan", lambda *a, **k: seen.append(settle(*a, **k)) or seen[-1])
    plan = live.plan(jobs, {0: 8}, now=10.0, why=True)
    (one,) = seen
    assert [(list(r.placed), r.released) for r in one.rounds] == [([], ["ns/v"]), (["ns/boss"], [])]
    assert plan.stop == ["ns/v"] and list(plan.start) == ["ns/boss"] and "ns/w" in plan.waiting


def test_srtf_as_one_allocator_preempts_on_the_users_estimates():
    """SRTF as the operator's one allocator: A (8 GPUs, 70 s of its estimate left) runs,
    B (8 GPUs, estimate 20 s) waits: B preempts A. With no estimates nothing is known,
    SRTF has nothing to compare and nobody is preempted."""
    from rlsched.core.live_allocation import LiveAllocation

    live = LiveAllocation.named("srtf/firstfit")
    a = view("ns/a", 0.0, 1, 1, gpus_per_worker=8, placement=(0,), est_runtime=100.0, remaining=70.0,
                attained_service=240.0, start_time=0.0)
    b = view("ns/b", 30.0, 1, 1, gpus_per_worker=8, est_runtime=20.0, remaining=20.0)
    plan = live.plan([a, b], {0: 8}, now=30.0)
    assert plan.stop == ["ns/a"] and list(plan.start) == ["ns/b"]
    plan = live.plan([replace(a, est_runtime=0.0, remaining=0.0), replace(b, est_runtime=0.0, remaining=0.0)],
                     {0: 8}, now=30.0)
    assert plan.stop == [] and plan.start == {}


def test_a_scaling_step_every_interval_and_a_wake_for_the_next():
    """With ``scale_every``, the scaling step runs one interval after the first decision
    and then at most once an interval, as the event engine's scaling ticks; between two
    steps the allocator only admits, and asks to decide again when the next step is due."""
    from rlsched.core.live_allocation import LiveAllocation
    from rlsched.core.planning import ElasticState

    live = LiveAllocation.named("fifo/bestfit/beta+nobackfill@scale_every=300")

    def rising(now):
        rec = ElasticState(epoch=3, streak=0, decided_epoch=2)
        return view("ns/r", 0.0, 1, 4, gpus_per_worker=8, placement=(0,), **_callers((0.1, 0.3, 0.5), rec=rec),
                    beta=0.02)

    first = live.plan([rising(0.0)], {0: 8, 1: 8}, now=0.0)
    assert not first.resize and first.wake_at == 300.0
    between = live.plan([rising(100.0)], {0: 8, 1: 8}, now=100.0)
    assert not between.resize and between.wake_at == 300.0
    due = live.plan([rising(300.0)], {0: 8, 1: 8}, now=300.0)
    assert due.resize == {"ns/r": LiveTarget(2, None)} and due.wake_at == 600.0
    every = LiveAllocation.named("fifo/bestfit/beta+nobackfill")  # no interval: every decision
    assert every.plan([rising(0.0)], {0: 8, 1: 8}, now=0.0).resize == {"ns/r": LiveTarget(2, None)}
    with pytest.raises(ValueError, match="scale_every"):
        LiveAllocation.named("fifo/bestfit/beta@scale_every=0")


def test_grows_come_in_the_order_the_planner_placed_them():
    """The plan lists scale-ups in the order the scaling planner gave them room (the
    job still gaining most first), so a caller placing the new workers one after the
    other puts each where the planner found room for it."""
    from rlsched.core.live_allocation import LiveAllocation
    from rlsched.core.planning import ElasticState

    live = LiveAllocation.named("fifo/bestfit/beta+nobackfill")
    jobs = []
    for k, (key, hist) in enumerate((("ns/slow", (0.1, 0.2, 0.25)), ("ns/fast", (0.1, 0.3, 0.6)))):
        rec = ElasticState(epoch=3, streak=0, decided_epoch=2)
        jobs.append(view(key, float(k), 1, 4, gpus_per_worker=8, placement=(k,), **_callers(hist, rec=rec),
                         beta=0.01))
    plan = live.plan(jobs, {i: 8 for i in range(4)}, now=10.0)
    assert list(plan.resize) == ["ns/fast", "ns/slow"]
    assert plan.resize["ns/fast"] == LiveTarget(2, None)
