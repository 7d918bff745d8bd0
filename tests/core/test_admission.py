import numpy as np
import pytest

from rlsched.core import make_ordering
from rlsched.core.planning import (
    Admission,
    DynamicPriority,
    HIGHEST_BONUS,
    admit_in_order,
    gang_fits,
    take_gang,
    unfittable_reason,
)


@pytest.fixture
def qm():
    return Admission(make_ordering("fifo"))


def entry(make_spec, key, t, *, queue="normal", pr=0.0, **spec):
    """A waiting job's view: a gang of its spec's minimum workers, a ``highest`` one
    ranked before every other of its queue."""
    s = make_spec(**spec)
    bonus = HIGHEST_BONUS if s.priority_class == "highest" else 0.0
    return s.view(key, submit_time=t, workers=s.min_workers, priority=pr + bonus, queue=queue)


# ---------------------------------------------------------------- dynamic priority
def test_priority_grows_by_mu_per_request():
    dp = DynamicPriority(mu=0.1)
    pr, seen = dp.update(0.0, requests_total=3, requests_seen=0)
    assert pr == pytest.approx(0.3) and seen == 3
    pr, seen = dp.update(pr, requests_total=3, requests_seen=seen)  # no new request
    assert pr == pytest.approx(0.3) and seen == 3
    pr, seen = dp.update(pr, requests_total=1, requests_seen=seen)  # two withdrawn
    assert pr == pytest.approx(0.1) and seen == 1


def test_promotion_and_demotion_at_thresholds():
    dp = DynamicPriority(mu=0.1, promote_at=1.0, demote_at=-1.0)
    assert dp.queue("normal", 0.99) == "normal"
    assert dp.queue("normal", 1.0) == "urgent"
    assert dp.queue("urgent", -0.99) == "urgent"
    assert dp.queue("urgent", -1.0) == "normal"
    assert dp.queue("highest", -50) == "urgent"
    assert dp.queue("normal", 5, interrupted=True) == "interrupt"
    # ten requests promote a normal job at mu = 0.1
    pr, _ = dp.update(0.0, 10, 0)
    assert dp.queue("normal", pr) == "urgent"


def test_bad_thresholds_rejected():
    with pytest.raises(ValueError):
        DynamicPriority(promote_at=0.0, demote_at=0.0)
    with pytest.raises(ValueError):
        DynamicPriority(mu=-1)


# ---------------------------------------------------------------- ordering
def test_order_interrupt_then_urgent_then_normal_then_fifo(qm, make_cluster, make_spec):
    st = make_cluster(8)
    es = [
        entry(make_spec, "n-old", 1.0),
        entry(make_spec, "n-new", 2.0),
        entry(make_spec, "n-prio", 3.0, pr=0.5),
        entry(make_spec, "u", 4.0, queue="urgent"),
        entry(make_spec, "h", 5.0, queue="urgent", klass="highest"),
        entry(make_spec, "i", 6.0, queue="interrupt"),
    ]
    assert [v.id for v in qm.order(es, st)] == ["i", "h", "u", "n-prio", "n-old", "n-new"]


def test_nominated_preemptor_goes_first(qm, make_cluster, make_spec):
    st = make_cluster(8)
    es = [entry(make_spec, "i", 1.0, queue="interrupt"), entry(make_spec, "h", 2.0, queue="urgent", klass="highest")]
    assert [v.id for v in qm.order(es, st, nominated={"h"})] == ["h", "i"]
    assert [v.id for v in qm.order(es, st)] == ["i", "h"]


# ---------------------------------------------------------------- admission
def test_gang_fit_counts_per_node_slots():
    free = np.array([3, 3])
    assert gang_fits(free, 2, 2) and not gang_fits(free, 2, 3)
    f = free.copy()
    take_gang(f, 2, 2)
    assert f.tolist() == [1, 1]


def test_admits_in_order_and_blocks_head_of_line(qm, make_cluster, make_spec):
    st = make_cluster(4, 4)
    es = [
        entry(make_spec, "a", 1.0, mn=2, gpw=2),   # 4 GPUs
        entry(make_spec, "b", 2.0, mn=3, gpw=2),   # 6 GPUs: does not fit after a
        entry(make_spec, "c", 3.0, mn=1, gpw=1),   # would fit, but strict order
    ]
    plan = qm.plan(es, [], st)
    assert plan.admit == ["a"] and plan.blocked == "b" and plan.waiting_gpus == 6 and plan.preempt == []


def test_backfill_lets_small_jobs_pass(make_cluster, make_spec):
    qm = Admission(make_ordering("fifo"), backfill=True)
    st = make_cluster(4, 4)
    es = [entry(make_spec, "a", 1.0, mn=2, gpw=2), entry(make_spec, "b", 2.0, mn=3, gpw=2), entry(make_spec, "c", 3.0)]
    assert qm.plan(es, [], st).admit == ["a", "c"]


def test_urgent_job_passes_normal_ones(qm, make_cluster, make_spec):
    st = make_cluster(2)
    es = [entry(make_spec, "n1", 1.0, gpw=2), entry(make_spec, "n2", 2.0, gpw=2), entry(make_spec, "u", 9.0, gpw=2, queue="urgent")]
    assert qm.plan(es, [], st).admit == ["u"]


# ---------------------------------------------------------------- preemption
def running(make_spec, key, klass, pr, start, placement, gpw=1):
    """A running job's live view: its gang on ``placement``, its dynamic priority and
    the time it started."""
    s = make_spec(mn=len(placement), mx=len(placement), gpw=gpw, klass=klass)
    return s.view(key, submit_time=0.0, workers=len(placement), priority=pr, start_time=start,
                  placement=list(placement))


def full_cluster(make_cluster, holders):
    st = make_cluster(4, 4)
    for r in holders:
        for i in r.placement:
            st.allocate(i, r.gpus_per_worker)
    return st


def test_highest_preempts_lowest_priority_job(qm, make_cluster, make_spec):
    holders = [
        running(make_spec, "normal-high", "normal", 5.0, 1.0, [0, 0], gpw=2),
        running(make_spec, "normal-low", "normal", 0.0, 2.0, [1, 1], gpw=2),
    ]
    st = full_cluster(make_cluster, holders)
    h = entry(make_spec, "h", 10.0, mn=2, gpw=2, klass="highest", queue="urgent")
    plan = qm.plan([h], holders, st)
    assert plan.admit == [] and plan.blocked == "h" and plan.preempt == ["normal-low"]


def test_preemption_takes_normal_before_urgent_and_only_as_many_as_needed(qm, make_cluster, make_spec):
    holders = [
        running(make_spec, "urgent", "urgent", -5.0, 1.0, [0, 0, 0, 0]),
        running(make_spec, "normal-a", "normal", 1.0, 1.0, [1, 1]),
        running(make_spec, "normal-b", "normal", 2.0, 2.0, [1, 1]),
    ]
    st = full_cluster(make_cluster, holders)
    h = entry(make_spec, "h", 10.0, mn=4, klass="highest", queue="urgent")
    assert qm.plan([h], holders, st).preempt == ["normal-a", "normal-b"]
    h2 = entry(make_spec, "h", 10.0, mn=2, klass="highest", queue="urgent")
    assert qm.plan([h2], holders, st).preempt == ["normal-a"]


def test_highest_never_preempts_highest_nor_when_it_cannot_help(qm, make_cluster, make_spec):
    holders = [running(make_spec, "h-old", "highest", 0.0, 1.0, [0, 0, 0, 0, 1, 1, 1, 1])]
    st = full_cluster(make_cluster, holders)
    h = entry(make_spec, "h", 10.0, mn=1, klass="highest", queue="urgent")
    assert qm.plan([h], holders, st).preempt == []
    big = entry(make_spec, "big", 10.0, mn=20, klass="highest", queue="urgent")
    holders2 = [running(make_spec, "n", "normal", 0.0, 1.0, [0])]
    st2 = full_cluster(make_cluster, holders2)
    assert qm.plan([big], holders2, st2).preempt == []


def test_no_second_preemption_while_gpus_are_being_released(qm, make_cluster, make_spec):
    holders = [running(make_spec, "n", "normal", 0.0, 1.0, [0, 0, 0, 0, 1, 1, 1, 1])]
    st = full_cluster(make_cluster, holders)
    h = entry(make_spec, "h", 10.0, mn=2, klass="highest", queue="urgent")
    plan = qm.plan([h], holders, st, releasing=np.array([2, 0]))
    assert plan.preempt == [] and plan.blocked == "h"


def test_normal_and_urgent_jobs_never_preempt(qm, make_cluster, make_spec):
    holders = [running(make_spec, "n", "normal", 0.0, 1.0, [0, 0, 0, 0, 1, 1, 1, 1])]
    st = full_cluster(make_cluster, holders)
    u = entry(make_spec, "u", 10.0, mn=1, klass="urgent", queue="urgent", value=100)
    assert qm.plan([u], holders, st).preempt == []


# ---------------------------------------------------------------- the shared walk
def test_walk_blocks_head_of_line_or_backfills():
    fits = {"a": True, "b": False, "c": True}
    tried = []

    def try_start(k):
        tried.append(k)
        return fits[k]

    assert admit_in_order("abc", try_start, backfill=False) == (["a"], "b") and tried == ["a", "b"]
    tried.clear()
    assert admit_in_order("abc", try_start, backfill=True) == (["a", "c"], "b") and tried == ["a", "b", "c"]
    assert admit_in_order("ac", try_start, backfill=False) == (["a", "c"], None)


def test_simulator_admits_through_the_same_admission_object():
    from rlsched.core import NodeSpec, Topology, make_placement
    from rlsched.sim import SimConfig, Simulator
    from rlsched.sim.job import JobSpec

    topo = Topology([NodeSpec(name="n0", gpus=5, rack="r0", block="b0")])
    jobs = [JobSpec(id="big", submit_time=0.0, workers=1, gpus_per_worker=4, duration=10.0),
            JobSpec(id="wide", submit_time=1.0, workers=1, gpus_per_worker=4, duration=10.0),
            JobSpec(id="small", submit_time=2.0, workers=1, gpus_per_worker=1, duration=10.0)]
    for backfill in (False, True):
        sim = Simulator(jobs, topo, ordering=make_ordering("fifo"), placement=make_placement("firstfit"),
                        config=SimConfig(backfill=backfill, decision_gap=0))
        adm = sim.allocation.allocator.admission  # the gang allocator behind its one call
        assert isinstance(adm, Admission) and adm.backfill is backfill
        starts = {r.id: r.start for r in sim.run().records}
        # "wide" waits for "big"; "small" (1 GPU free) passes it only with backfill
        assert starts["wide"] == 10.0 and starts["small"] == (10.0 if not backfill else 2.0)


def test_gang_start_timeout(make_cluster):
    adm = Admission(make_ordering("fifo"), start_timeout_s=120.0)
    assert not adm.start_timed_out(admitted_at=1000.0, now=1120.0)
    assert adm.start_timed_out(admitted_at=1000.0, now=1120.5)
    with pytest.raises(ValueError, match="start_timeout_s"):
        Admission(make_ordering("fifo"), start_timeout_s=0)


# ---------------------------------------------------------------- priority from the spec
def test_expected_priority_is_what_update_reaches():
    dp = DynamicPriority(mu=0.1)
    pr, seen = 2.0, 0
    for total in (3, 7, 4, 10):
        pr, seen = dp.update(pr, total, seen)
        assert pr == pytest.approx(dp.expected(2.0, total))
    assert dp.expected(0.0, 10) == pytest.approx(1.0) and dp.queue("normal", dp.expected(0.0, 10)) == "urgent"


# ---------------------------------------------------------------- gangs that can never fit
@pytest.mark.parametrize("nodes, mn, gpw, needle", [
    ((8, 8, 8, 8), 1024, 64, "a worker needs 64 GPUs, the largest node has 8"),
    ((8, 8), 1, 9, "a worker needs 9 GPUs, the largest node has 8"),
    ((8, 8), 17, 1, "the gang needs 17 x 1 = 17 GPUs, the cluster has 16"),
    # 12 GPUs in all, but only one 6-GPU worker per node
    ((6, 3, 3), 2, 6, "the gang needs 2 workers of 6 GPUs, the cluster's nodes can host 1"),
    ((), 1, 1, "the largest node has 0"),
])
def test_unfittable_reason_names_the_numbers(nodes, mn, gpw, needle):
    why = unfittable_reason(np.array(nodes, dtype=np.int64), gpw, mn)
    assert why is not None and needle in why


def test_unfittable_reason_is_none_for_gangs_that_fit_the_empty_cluster():
    total = np.array([8, 8, 4])
    assert unfittable_reason(total, 8, 2) is None and unfittable_reason(total, 4, 5) is None
    assert unfittable_reason(total, 1, 20) is None


def test_unfittable_gang_does_not_block_the_queue(qm, make_cluster, make_spec):
    """Issue 12 item 6: a 1024 x 64 GPU gang at the head of the queue is reported and
    skipped; the 1-GPU job behind it is admitted (strict head-of-line otherwise)."""
    st = make_cluster(8, 8, 8, 8)
    es = [entry(make_spec, "huge", 1.0, mn=1024, gpw=64), entry(make_spec, "tiny", 2.0),
          entry(make_spec, "wide", 3.0, mn=1, gpw=16)]
    plan = qm.plan(es, [], st)
    assert plan.admit == ["tiny"] and plan.blocked is None and plan.waiting_gpus == 0
    assert plan.unfittable == {"huge": "a worker needs 64 GPUs, the largest node has 8",
                               "wide": "a worker needs 16 GPUs, the largest node has 8"}
    assert plan.order == ["huge", "tiny", "wide"]


def test_unfittable_is_judged_on_capacity_not_on_free_gpus(qm, make_cluster, make_spec):
    st = make_cluster(8, 8)
    st.allocate(0, 8)
    st.allocate(1, 8)
    es = [entry(make_spec, "full-cluster", 1.0, mn=2, gpw=8), entry(make_spec, "tiny", 2.0)]
    plan = qm.plan(es, [], st)
    # it fits the empty cluster: it is the blocked head, not unfittable
    assert plan.unfittable == {} and plan.blocked == "full-cluster" and plan.admit == []


def test_unfittable_highest_job_preempts_nobody(qm, make_cluster, make_spec):
    holders = [running(make_spec, "n", "normal", 0.0, 1.0, [0, 0, 0, 0, 1, 1, 1, 1])]
    st = full_cluster(make_cluster, holders)
    boss = entry(make_spec, "boss", 5.0, mn=3, gpw=4, klass="highest", queue="urgent")
    plan = qm.plan([boss], holders, st)
    assert plan.preempt == [] and plan.unfittable == {"boss": "the gang needs 3 x 4 = 12 GPUs, the cluster has 8"}


# ---------------------------------------------------------------- policy-driven preemption
def _live(job, *, remaining=0.0, attained=0.0, submit=0.0):
    """A job's live view with the live values the orderings compare."""
    job.remaining, job.attained_service, job.submit_time = remaining, attained, submit
    return job


def test_srtf_head_evicts_the_longest_remaining_job_only(make_cluster, make_spec):
    adm = Admission(make_ordering("srtf"))
    holders = [
        _live(running(make_spec, "short", "normal", 0.0, 1.0, [0, 0, 0, 0]), remaining=50.0),
        _live(running(make_spec, "long", "normal", 0.0, 2.0, [1, 1, 1, 1]), remaining=500.0),
    ]
    st = full_cluster(make_cluster, holders)
    w = _live(entry(make_spec, "w", 5.0, mn=4), remaining=100.0)
    plan = adm.plan([w], holders, st)
    # 100 < 500 but not < 50: only "long" may go, and it is enough
    assert plan.blocked == "w" and plan.preempt == ["long"]
    # a tie never preempts; neither does a job whose remaining time is longer
    assert adm.plan([_live(entry(make_spec, "w", 5.0, mn=4), remaining=500.0)], holders, st).preempt == []
    # preemption off: nobody
    assert Admission(make_ordering("srtf"), preemption=False).plan([w], holders, st).preempt == []
    # FIFO is not preemptive: a normal job never evicts
    assert Admission(make_ordering("fifo")).plan([w], holders, st).preempt == []


def test_policy_preemption_respects_classes(make_cluster, make_spec):
    adm = Admission(make_ordering("srtf"))
    urgent = _live(running(make_spec, "u", "urgent", 0.0, 1.0, [0, 0, 0, 0, 1, 1, 1, 1]), remaining=900.0)
    st = full_cluster(make_cluster, [urgent])
    w = _live(entry(make_spec, "w", 5.0, mn=4), remaining=1.0)
    assert adm.plan([w], [urgent], st).preempt == []  # a normal job never evicts an urgent one
    normal = _live(running(make_spec, "n", "normal", 0.0, 1.0, [0, 0, 0, 0, 1, 1, 1, 1]), remaining=900.0)
    assert adm.plan([w], [normal], full_cluster(make_cluster, [normal])).preempt == ["n"]


def test_tiresias_evicts_only_jobs_of_a_higher_las_queue(make_cluster, make_spec):
    adm = Admission(make_ordering("tiresias", thresholds=(800.0,)))
    holders = [
        _live(running(make_spec, "young", "normal", 0.0, 3.0, [0, 0, 0, 0]), attained=799.0),
        _live(running(make_spec, "old", "normal", 0.0, 1.0, [1, 1, 1, 1]), attained=800.0),
    ]
    st = full_cluster(make_cluster, holders)
    w = _live(entry(make_spec, "w", 5.0, mn=4))
    assert adm.plan([w], holders, st).preempt == ["old"]
    w8 = _live(entry(make_spec, "w8", 5.0, mn=8))
    assert adm.plan([w8], holders, st).preempt == []  # evicting "old" alone cannot make room


def test_tiresias_demotion_time():
    from rlsched.core import JobView

    t = make_ordering("tiresias", thresholds=(800.0, 8000.0))
    v = JobView(id="a", submit_time=0.0, gpus_per_worker=8, attained_service=400.0)
    assert t.demotes_at(v, 10.0) == pytest.approx(10.0 + 400.0 / 8)
    v.attained_service = 800.0  # at the threshold: the next one
    assert t.demotes_at(v, 0.0) == pytest.approx(7200.0 / 8)
    v.attained_service = 9000.0
    assert t.demotes_at(v, 0.0) is None
    assert t.preemptive and make_ordering("srtf").preemptive and not make_ordering("sjf").preemptive


def test_outranked_agrees_with_pairwise_preempts(make_cluster):
    from rlsched.core import JobView

    st = make_cluster(8)
    for name in ("srtf", "tiresias"):
        o = make_ordering(name)
        views = [JobView(id=f"r{k}", submit_time=float(k), remaining=float(r), attained_service=float(a))
                 for k, (r, a) in enumerate([(10, 0), (100, 4000), (50, 40000), (50, 3599)])]
        head = JobView(id="h", submit_time=9.0, remaining=50.0, attained_service=3600.0)
        assert [v.id for v in o.outranked(head, views, st)] == [v.id for v in views if o.preempts(head, v, st)]


# ---------------------------------------------------------------- room checked by the placement
def test_admission_checks_room_with_the_placement_that_follows(qm, make_cluster, make_spec):
    """Nodes with 4, 4 and 8 free GPUs; waiting: x (2 workers x 4 GPUs), then y (1 x 8).
    Counting room fullest-first puts x on the two half-full nodes and admits y too; a
    placement that keeps x's gang on one node (as DAS did in the twin check) gives x the
    empty node, so y does not fit and waits: admission must follow the placement."""
    st = make_cluster(8, 8, 8)
    st.allocate(0, 4)
    st.allocate(1, 4)
    x = entry(make_spec, "x", 0.0, mn=2, gpw=4)
    y = entry(make_spec, "y", 1.0, mn=1, gpw=8)
    assert qm.plan([x, y], [], st).admit == ["x", "y"]

    calls = []

    def one_node(job, state):  # the gang on the emptiest node that holds it whole
        calls.append((job.id, state.free.tolist()))
        ok = [i for i in range(len(state.free)) if state.free[i] >= job.gpus]
        return [max(ok, key=lambda i: (state.free[i], -i))] * job.workers if ok else None

    plan = qm.plan([x, y], [], st, place=one_node)
    assert plan.admit == ["x"] and plan.blocked == "y" and plan.waiting_gpus == 8
    # with x's gang on node 2 the slot count already rules y out (the placement is
    # asked only for gangs that fit by count); nothing is left allocated
    assert calls == [("x", [4, 4, 8])]
    assert st.free.tolist() == [4, 4, 8]


def test_admission_with_a_core_placement_policy(qm, make_cluster, make_spec):
    """The same with core's topology packing (the hook is ``Placement.place``)."""
    from rlsched.core import make_placement

    st = make_cluster(8, 8, 8)
    st.allocate(0, 4)
    st.allocate(1, 4)
    x = entry(make_spec, "x", 0.0, mn=2, gpw=4)
    y = entry(make_spec, "y", 1.0, mn=1, gpw=8)
    packing = make_placement("topology")
    nodes = packing.place(x, st)
    plan = qm.plan([x, y], [], st, place=packing.place)
    # whatever packing picks for x decides whether y still fits the rest
    rest = st.free.copy()
    for i in nodes:
        rest[i] -= 4
    assert plan.admit == (["x", "y"] if (rest >= 8).any() else ["x"])
    assert st.free.tolist() == [4, 4, 8]
