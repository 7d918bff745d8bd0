"""Teams' queues (core/queues.py) deciding through the served goodput allocator, with
answers computed by hand: borrowing idle GPUs, reclaiming them by preemption once the
minimum run time is over, weighted fair share, caps, barred classes and queues."""

import pytest

from rlsched.core.goodput_allocator import GoodputAllocator
from rlsched.core.live_allocation import LiveAllocation
from rlsched.core.queues import QueueBook, QueueError, QueueSpec

from .views import view


def rigid(key, submit, gpus, queue, *, nodes=(), since=None, cls="normal", served=0.0):
    """A job of one worker of ``gpus`` GPUs (min = max = 1 worker: no elastic growth)."""
    return view(key, submit, 1, 1, gpus_per_worker=gpus, placement=nodes, team=queue, start_time=since,
                   priority_class=cls, attained_service=served)


def decide(jobs, nodes, now, book):
    """One decision of the served allocator; ``nodes``: each node's GPUs (all of them
    the allocator's: free, or held by the running ``jobs``)."""
    return LiveAllocation(GoodputAllocator()).plan(jobs, dict(enumerate(nodes)), now, queues=book)


def test_the_busy_team_borrows_and_the_owner_reclaims_after_the_minimum_run_time():
    # 16 GPUs (4 nodes x 4); team-a and team-b are guaranteed 8 each; minimum run 600 s
    book = QueueBook([QueueSpec("team-a", 8), QueueSpec("team-b", 8)], min_run_s=600.0)
    a = [rigid(f"a/{i}", float(i), 4, "team-a") for i in range(4)]
    plan = decide(a, [4, 4, 4, 4], 10.0, book)
    # team-b is idle: team-a's four 4-GPU jobs all start, 8 of its 16 GPUs borrowed
    assert sorted(plan.start) == ["a/0", "a/1", "a/2", "a/3"]
    assert plan.queues["team-a"] == {"gpusInUse": 16, "borrowedGpus": 8, "pendingJobs": 0, "runningJobs": 4}
    assert plan.queues["team-b"] == {"gpusInUse": 0, "borrowedGpus": 0, "pendingJobs": 0, "runningJobs": 0}

    running = [rigid(f"a/{i}", float(i), 4, "team-a", nodes=(i,), since=10.0, served=4 * 90.0) for i in range(4)]
    b = view("b/0", 100.0, 2, 2, gpus_per_worker=4, team="team-b")  # a gang of two 4-GPU workers
    # at t = 100 team-a's jobs have run 90 s < 600 s: they keep their GPUs, b waits
    plan = decide(running + [b], [4, 4, 4, 4], 100.0, book)
    assert (plan.start, plan.stop, plan.resize) == ({}, [], {})
    assert plan.waiting["b/0"].reason == "MinRunTime"
    assert plan.queues["team-b"]["pendingJobs"] == 1
    # at t = 610 they have run 600 s: b's guarantee is taken back from the borrower —
    # team-a keeps its two first jobs (its nominal 8 GPUs), its two last are preempted
    running = [rigid(f"a/{i}", float(i), 4, "team-a", nodes=(i,), since=10.0, served=4 * 600.0) for i in range(4)]
    plan = decide(running + [b], [4, 4, 4, 4], 610.0, book)
    assert sorted(plan.stop) == ["a/2", "a/3"]
    assert list(plan.start) == ["b/0"] and plan.start["b/0"].workers == 2
    assert plan.queues["team-a"] == {"gpusInUse": 8, "borrowedGpus": 0, "pendingJobs": 2, "runningJobs": 2}
    assert plan.queues["team-b"] == {"gpusInUse": 8, "borrowedGpus": 0, "pendingJobs": 0, "runningJobs": 1}


def test_without_a_minimum_run_time_the_owner_reclaims_at_once():
    book = QueueBook([QueueSpec("team-a", 8), QueueSpec("team-b", 8)])
    running = [rigid(f"a/{i}", float(i), 4, "team-a", nodes=(i,), since=10.0) for i in range(4)]
    b = view("b/0", 100.0, 2, 2, gpus_per_worker=4, team="team-b")
    plan = decide(running + [b], [4, 4, 4, 4], 11.0, book)
    assert sorted(plan.stop) == ["a/2", "a/3"] and list(plan.start) == ["b/0"]


def test_a_queue_minimum_run_time_overrides_the_default():
    book = QueueBook([QueueSpec("team-a", 8, min_run_s=0.0), QueueSpec("team-b", 8)], min_run_s=600.0)
    running = [rigid(f"a/{i}", float(i), 4, "team-a", nodes=(i,), since=10.0) for i in range(4)]
    b = view("b/0", 100.0, 2, 2, gpus_per_worker=4, team="team-b")
    assert sorted(decide(running + [b], [4, 4, 4, 4], 100.0, book).stop) == ["a/2", "a/3"]


def test_weights_two_to_one_share_the_contended_gpus_two_to_one():
    # 12 GPUs, no guarantees, both queues with more 1-GPU jobs than GPUs: the queue using
    # the fewest GPUs per unit of weight goes next (ties: the job ranked first, x's)
    # x 0/2 vs y 0/1 -> x; 1/2 vs 0 -> y; 1/2 vs 1 -> x; 1 vs 1 -> x (x/2 submitted
    # first); 3/2 vs 1 -> y; ... ends 8 : 4
    book = QueueBook([QueueSpec("x", weight=2.0), QueueSpec("y", weight=1.0)])
    jobs = [rigid(f"x/{i}", float(2 * i), 1, "x") for i in range(12)]
    jobs += [rigid(f"y/{i}", float(2 * i + 1), 1, "y") for i in range(12)]
    plan = decide(jobs, [4, 4, 4], 50.0, book)
    got = {q: sum(t.workers for k, t in plan.start.items() if k.startswith(q)) for q in "xy"}
    assert got == {"x": 8, "y": 4}
    assert sorted(plan.start) == sorted([f"x/{i}" for i in range(8)] + [f"y/{i}" for i in range(4)])
    assert plan.waiting["y/4"].reason == "Ranked" and "fair share" in plan.waiting["y/4"].message
    # the same weights, one team alone: it takes all 12 (idle GPUs are shared)
    plan = decide([j for j in jobs if j.team == "x"], [4, 4, 4], 50.0, book)
    assert len(plan.start) == 12


def test_a_borrowing_limit_caps_the_queue_even_with_idle_gpus():
    book = QueueBook([QueueSpec("c", nominal_gpus=4, borrowing_limit=2), QueueSpec("d", 12)])
    jobs = [rigid(f"c/{i}", float(i), 2, "c") for i in range(4)]
    plan = decide(jobs, [4, 4, 4, 4], 10.0, book)
    assert sorted(plan.start) == ["c/0", "c/1", "c/2"]  # 4 nominal + 2 borrowed
    assert plan.waiting["c/3"].reason == "Quota"
    assert "uses 6 of its 4 nominal + 2 borrowable" in plan.waiting["c/3"].message


def test_elastic_growth_stays_within_the_queue_cap():
    book = QueueBook([QueueSpec("e", nominal_gpus=4, borrowing_limit=2)])
    job = view("e/0", 0.0, 1, 16, team="e")
    plan = decide([job], [4, 4, 4, 4], 10.0, book)
    assert plan.start["e/0"].workers <= 6


def test_barred_jobs_wait_with_the_reason_and_others_run():
    book = QueueBook([QueueSpec("team-a", 8)])
    jobs = [rigid("a/hi", 0.0, 1, "team-a", cls="highest"), rigid("a/ok", 1.0, 1, "team-a"),
            rigid("z/0", 2.0, 1, "nope")]
    plan = decide(jobs, [4, 4], 10.0, book)
    assert list(plan.start) == ["a/ok"]
    assert plan.waiting["a/hi"].reason == "PriorityNotAllowed"
    assert plan.waiting["z/0"].reason == "NoSuchQueue"
    allowed = QueueBook([QueueSpec("team-a", 8, priority_classes=frozenset({"normal", "highest"}))])
    assert sorted(decide(jobs[:2], [4, 4], 10.0, allowed).start) == ["a/hi", "a/ok"]


def test_without_queues_the_allocator_decides_as_before():
    jobs = [rigid(f"j/{i}", float(i), 4, None) for i in range(5)]
    with_book = decide(jobs, [4, 4, 4, 4], 10.0, QueueBook())
    without = LiveAllocation(GoodputAllocator()).plan(jobs, {i: 4 for i in range(4)}, 10.0)
    assert with_book.start == without.start and sorted(without.start) == ["j/0", "j/1", "j/2", "j/3"]
    assert with_book.queues == {}


def test_the_minimum_run_time_holds_without_queues_too():
    running = [rigid(f"j/{i}", 10.0 + i, 4, None, nodes=(i,), since=20.0) for i in range(4)]
    urgent = rigid("u/0", 30.0, 4, None, cls="urgent")  # served first by class
    book = QueueBook(min_run_s=300.0)
    assert decide(running + [urgent], [4, 4, 4, 4], 100.0, book).stop == []
    assert decide(running + [urgent], [4, 4, 4, 4], 400.0, book).stop == ["j/3"]


def test_namespaces_default_to_their_queue_and_manifests_parse():
    book = QueueBook([QueueSpec.from_manifest({"metadata": {"name": "b"}, "spec": {"namespaces": ["ml"]}}),
                      QueueSpec.from_manifest({"metadata": {"name": "a"},
                                               "spec": {"nominalGpus": 8, "borrowingLimitGpus": 0, "weight": 2,
                                                        "priorityClasses": ["highest"], "minRunSeconds": 60,
                                                        "namespaces": ["ml", "cv"]}})])
    assert book.resolve("ml", None) == "a"  # two queues list it: the first by name
    assert book.resolve("cv", "b") == "b" and book.resolve("other", None) == ""
    a = book.get("a")
    assert (a.nominal_gpus, a.cap, a.weight, a.allows("highest"), a.allows("normal"), book.min_run("a")) == \
        (8, 8, 2.0, True, False, 60.0)
    for bad in ({"metadata": {"name": "q"}, "spec": {"nominalGpus": -1}},
                {"metadata": {"name": "q"}, "spec": {"weight": 0}},
                {"metadata": {"name": "q"}, "spec": {"nominalGpus": "8"}},
                {"metadata": {"name": "q"}, "spec": {"priorityClasses": ["vip"]}},
                {"metadata": {}, "spec": {}}):
        with pytest.raises(QueueError):
            QueueSpec.from_manifest(bad)
    with pytest.raises(QueueError, match="two queues"):
        QueueBook([QueueSpec("a"), QueueSpec("a")])


def test_growth_reaches_a_guarantee_before_anyone_borrows():
    # one node of 8 GPUs; a is guaranteed 6, b nothing; one elastic job each (1..8 GPUs)
    book = QueueBook([QueueSpec("a", 6), QueueSpec("b")])
    jobs = [view("a/0", 0.0, 1, 8, team="a"), view("b/0", 1.0, 1, 8, team="b")]
    plan = decide(jobs, [8], 10.0, book)
    assert (plan.start["a/0"].workers, plan.start["b/0"].workers) == (6, 2)
    assert plan.queues["a"]["gpusInUse"] == 6 and plan.queues["b"]["borrowedGpus"] == 2


def test_weights_split_the_growth_too():
    # no guarantees, weights 3 : 1, one elastic job each on 8 GPUs: each queue grows in
    # turn by GPUs per unit of weight (x 1/3 < y 1/1 -> x; ...; ties by name), 6 : 2
    book = QueueBook([QueueSpec("x", weight=3.0), QueueSpec("y", weight=1.0)])
    jobs = [view("x/0", 0.0, 1, 8, team="x"), view("y/0", 1.0, 1, 8, team="y")]
    plan = decide(jobs, [8], 10.0, book)
    assert (plan.start["x/0"].workers, plan.start["y/0"].workers) == (6, 2)
    # equal weights: 4 : 4
    even = QueueBook([QueueSpec("x"), QueueSpec("y")])
    plan = decide(jobs, [8], 10.0, even)
    assert (plan.start["x/0"].workers, plan.start["y/0"].workers) == (4, 4)


def test_fair_share_by_attained_service_serves_the_queue_that_got_least():
    # 4 GPUs, two queues of equal weight, 1-GPU rigid jobs. By GPUs held the two share
    # 2 : 2; by attained service queue x's jobs already had 10,000 GPU-seconds and y's
    # none, so y goes first until its service (60 s per GPU held) passes x's: all 4 to y
    x = [rigid(f"x/{i}", float(i), 1, "x", served=10_000.0 / 3) for i in range(3)]
    y = [rigid(f"y/{i}", 10.0 + i, 1, "y") for i in range(4)]
    by_gpus = decide(x + y, [4], 20.0, QueueBook([QueueSpec("x"), QueueSpec("y")]))
    assert sorted(by_gpus.start) == ["x/0", "x/1", "y/0", "y/1"]
    by_service = decide(x + y, [4], 20.0, QueueBook([QueueSpec("x"), QueueSpec("y")], fair_share="service"))
    assert sorted(by_service.start) == ["y/0", "y/1", "y/2", "y/3"]
    with pytest.raises(QueueError, match="fair_share"):
        QueueBook(fair_share="dominant")
