"""core/cycle.py: admission, preemption and elastic scaling as one pure call — the
operator's cycle, the gang allocator's interval and the event engine's steps (head of
line, preemption rounds, scaling), with hand-computed answers."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.core import ClusterState, JobView, Progress, Topology, make_ordering, make_scaling
from rlsched.core.cycle import CyclePlan, SchedulingCycle, after_admission, best_fit_gang
from rlsched.core.planning import (
    Admission,
    ElasticState,
    HIGHEST_BONUS,
    ScalingPlanner,
    TrainingSpec,
)


def cluster(nodes: int, gpus: int, used: dict[int, int]) -> ClusterState:
    st = ClusterState(Topology.uniform(nodes, gpus_per_node=gpus, racks=1), time=100.0)
    for i, g in used.items():
        st.allocate(i, g)
    return st


def spec(workers, gpw, klass="normal", mx=None, beta=0.01):
    return TrainingSpec(min_workers=workers, max_workers=workers if mx is None else mx, gpus_per_worker=gpw,
                        priority_class=klass, beta=beta)


def elastic(key, workers, gpw, history, placement, mx=4):
    s = TrainingSpec(min_workers=1, max_workers=mx, gpus_per_worker=gpw, beta=0.01)
    prog = Progress(epoch=len(history), accuracy=history[-1], history=list(history))
    st = ElasticState()
    st.observe(prog, workers, 50.0, s.beta, 0)
    return s.view(key, submit_time=0.0, workers=workers, priority=0.0, placement=list(placement), progress=prog,
                  record=st)


def holder(rj_or_key, s=None, placement=(), priority=0.0, start=0.0):
    """A job holding GPUs as admission holds it: its live view on its nodes, with its
    dynamic priority and the time it started (a running job's, or a spec's)."""
    if isinstance(rj_or_key, JobView):  # a running job's own view
        rj_or_key.priority, rj_or_key.start_time = priority, start
        return rj_or_key
    return s.view(rj_or_key, submit_time=0.0, workers=len(placement), priority=priority, start_time=start,
                  placement=list(placement))


def queued(key, s, t, priority=0.0):
    """A waiting job's view: a gang of its spec's minimum workers in the normal queue."""
    bonus = HIGHEST_BONUS if s.priority_class == "highest" else 0.0
    return s.view(key, submit_time=t, workers=s.min_workers, priority=priority + bonus)


def cycle(backfill=True, scaling="beta", preemption=True):
    planner = ScalingPlanner(make_scaling(scaling), patience=5) if scaling else None
    return SchedulingCycle(Admission(make_ordering("fifo"), backfill=backfill, preemption=preemption), planner)


# ---------------------------------------------------------------- the operator's cycle
def test_admission_preemption_and_scaling_in_one_plan():
    """3 nodes x 16 GPUs. ``low`` (16 GPUs, node 0) is the cheapest victim of ``vip``
    (highest, 1 x 16, fits no node); ``small`` (1 x 2) is backfilled onto node 1, best
    fit; ``conv`` (flat curve) gives a worker back; ``rise`` (gaining) gets one more on
    the best-fit node — the 24 free GPUs minus the 16 reserved for ``vip`` leave room."""
    st = cluster(3, 16, {0: 16, 1: 4, 2: 2})
    conv = elastic("conv", 2, 2, [0.5, 0.5, 0.5], [1, 1])
    rise = elastic("rise", 1, 2, [0.1, 0.3, 0.5], [2])
    holders = [holder("low", spec(1, 16), [0], priority=-5.0), holder(conv), holder(rise)]
    waiting = [queued("vip", spec(1, 16, "highest"), 1.0),
               queued("small", spec(1, 2), 2.0)]
    plan = cycle().plan(waiting, holders, st, running=[conv, rise])
    assert isinstance(plan, CyclePlan) and plan.scaling_error is None
    a = plan.admission
    assert (a.admit, a.preempt, a.blocked, a.waiting_gpus, a.order) == (["small"], ["low"], "vip", 16, ["vip", "small"])
    assert plan.blocked is waiting[0] and plan.preempted == ["low"] and plan.rounds == []
    # the state after admission: small holds 2 GPUs of node 1; the victim's pods still exist
    assert plan.state is st and st.free.tolist() == [0, 10, 14]
    assert [v.id for v in st.pending] == ["vip"]
    s = plan.scaling
    assert s.deltas == {"conv": -1, "rise": 1} and s.nodes == {"rise": 1} and s.finished == {}
    assert [r.id for r in plan.running] == ["conv", "rise"]


def test_a_victim_is_never_scaled():
    st = cluster(2, 8, {0: 8, 1: 8})
    vic = elastic("vic", 4, 2, [0.1, 0.3, 0.5], [0, 0, 0, 0], mx=8)
    other = elastic("other", 4, 2, [0.1, 0.3, 0.5], [1, 1, 1, 1])
    holders = [holder(vic, priority=-1.0), holder(other, priority=1.0)]
    waiting = [queued("vip", spec(1, 8, "highest"), 1.0)]
    plan = cycle().plan(waiting, holders, st, running=[vic, other])
    assert plan.admission.preempt == ["vic"] and [r.id for r in plan.running] == ["other"]
    assert vic.record.decided_epoch == 0 and other.record.decided_epoch == 3  # only other was decided on
    assert plan.scaling.deltas == {}  # no free GPUs (the victim's are still held)


def test_scaling_reserves_the_blocked_heads_gang():
    """Two gaining jobs of 2 GPUs per worker; 10 GPUs free. A blocked head needing 8
    leaves 2: one scale-up (the best-fit node), not two; with nobody waiting both grow."""
    def run(waiting):
        st = cluster(2, 8, {0: 4, 1: 2})
        a = elastic("a", 2, 2, [0.1, 0.3, 0.6], [0, 0])  # gains most: served first
        b = elastic("b", 1, 2, [0.1, 0.2, 0.3], [1])
        holders = [holder(a), holder(b)]
        return cycle(preemption=False).plan(waiting, holders, st, running=[a, b])

    head = queued("head", spec(1, 8), 1.0)
    blocked = run([head])
    assert blocked.admission.blocked == "head" and blocked.admission.preempt == []
    assert blocked.scaling.asked == {"a": 1, "b": 1}
    assert blocked.scaling.deltas == {"a": 1} and blocked.scaling.nodes == {"a": 0}
    free = run([])
    assert free.scaling.deltas == {"a": 1, "b": 1} and free.scaling.nodes == {"a": 0, "b": 0}


def test_no_planner_no_scaling_step():
    st = cluster(1, 8, {})
    called = []
    plan = cycle(scaling=None).plan([queued("j", spec(2, 2), 0.0)], [], st,
                                    running=lambda gone: called.append(gone) or [])
    assert plan.admission.admit == ["j"] and plan.scaling.deltas == {} and called == []
    assert st.free.tolist() == [4]


class _Broken:
    name = "broken"
    fallback_reason = None

    def decide(self, running, state):
        raise RuntimeError("policy bug")


def test_a_failing_scaling_policy_leaves_admission_standing():
    st = cluster(1, 8, {0: 2})
    rj = elastic("r", 1, 2, [0.1, 0.3], [0])
    cyc = SchedulingCycle(Admission(make_ordering("fifo")), ScalingPlanner(_Broken()))
    plan = cyc.plan([queued("j", spec(1, 4), 0.0)], [holder(rj)], st, running=[rj])
    assert plan.admission.admit == ["j"]
    assert isinstance(plan.scaling_error, RuntimeError) and plan.scaling.deltas == {}
    assert st.free.tolist() == [2]  # the gang's 4 GPUs held; nothing of the failed step left allocated


def test_after_admission_charges_best_fit_and_sets_pending():
    st = cluster(3, 8, {0: 6, 1: 2})
    waiting = [queued("a", spec(2, 2), 0.0),
               queued("b", spec(1, 8), 1.0)]
    plan = Admission(make_ordering("fifo"), backfill=True).plan(waiting, [], st)
    assert plan.admit == ["a", "b"]
    after_admission(st, waiting, plan)
    # a: fullest-fitting first — node 0 (2 free) takes one worker, node 1 (6) the other; b: node 2
    assert st.free.tolist() == [0, 4, 0] and st.pending == []


# ---------------------------------------------------------------- settling in the call
def _settle_setup():
    """2 nodes x 8 GPUs: ``low`` (2 x 4, one worker per node) and ``a`` (1 x 4, node 0),
    ``b`` (1 x 4, node 1); ``vip`` (highest, 1 x 8) needs a whole node."""
    st = cluster(2, 8, {0: 8, 1: 8})
    holders = [holder("low", spec(2, 4), [0, 1], priority=-1.0, start=1.0),
               holder("a", spec(1, 4), [0], start=2.0),
               holder("b", spec(1, 4), [1], priority=0.5, start=3.0)]
    waiting = [queued("vip", spec(1, 8, "highest"), 5.0)]
    return st, holders, waiting


def test_settle_releases_victims_and_plans_again():
    """Round 1: vip preempts low and a (node 0 whole; low alone frees 4 + 4). Round 2:
    vip starts on node 0; low (2 x 4) no longer fits, a (1 x 4) is backfilled onto
    node 1's freed half: started again, so it is not preempted after all."""
    st, holders, waiting = _settle_setup()
    seen = []

    def running(gone):
        seen.append(set(gone))
        return []

    plan = cycle().plan(waiting, holders, st, running=running, settle=True)
    assert [r.admission.admit for r in plan.rounds] == [[], ["vip", "a"]]
    assert [r.admission.preempt for r in plan.rounds] == [["low", "a"], []]
    assert [r.placed for r in plan.rounds] == [{}, {"vip": [0], "a": [1]}]
    assert [r.released for r in plan.rounds] == [["low", "a"], []]
    assert plan.admission.admit == ["vip", "a"] and plan.admission.preempt == ["low", "a"]
    assert plan.preempted == ["low"] and seen == [{"low"}]
    assert plan.admission.blocked == "low" and plan.blocked is holders[0]  # its own view waits again
    assert plan.rounds[0].interrupt == ["low", "a"]  # a highest head's victims: the interrupt queue
    assert st.free.tolist() == [0, 0]
    assert sorted(st.running) == ["a", "vip"] and st.running["vip"].placement == [0]
    assert [v.id for v in st.pending] == ["low"]  # the jobs still waiting, as after_admission leaves them


def test_settle_rounds_are_bounded():
    st, holders, waiting = _settle_setup()
    plan = cycle().plan(waiting, holders, st, settle=True, rounds=1)
    assert len(plan.rounds) == 1 and plan.admission.admit == [] and plan.admission.preempt == ["low", "a"]
    assert plan.admission.blocked == "vip" and plan.blocked is waiting[0]
    assert st.free.tolist() == [8, 4]  # the victims are released even in the last round


def test_settle_without_preemption_is_one_round_and_a_refused_gang_waits():
    st = cluster(2, 8, {0: 4})
    waiting = [queued("a", spec(1, 4), 0.0),
               queued("b", spec(1, 4), 1.0)]
    asked: list[str] = []

    def place(job, state):  # refuses b the second time it is asked
        asked.append(job.id)
        return None if asked.count("b") == 2 and job.id == "b" else best_fit_gang(job, state)

    plan = cycle(scaling=None).plan(waiting, [], st, place=place, settle=True)
    assert len(plan.rounds) == 1 and plan.rounds[0].admission.admit == ["a", "b"]
    # the room check let b in next to a; the placement, asked again after a is placed, refuses it
    assert asked == ["a", "b", "a", "b"]
    assert plan.rounds[0].placed == {"a": [0]} and plan.admission.admit == ["a"]
    assert st.free.tolist() == [0, 8] and sorted(st.running) == ["a"]


def test_best_fit_gang():
    st = cluster(3, 8, {0: 6, 1: 4})
    from rlsched.core import JobView

    assert best_fit_gang(JobView(id="j", submit_time=0.0, gpus_per_worker=2, workers=3, max_workers=3), st) == [0, 1, 1]
    assert best_fit_gang(JobView(id="k", submit_time=0.0, gpus_per_worker=8, workers=2, max_workers=2), st) is None


@pytest.mark.parametrize("settle", [False, True])
def test_the_same_call_in_both_modes_without_preemption(settle):
    """Nobody preempted: both modes admit the same gangs and scale the same; settling
    places the gangs (here where best fit counts them) instead of charging them."""
    st = cluster(2, 8, {0: 2})
    rj = elastic("r", 1, 2, [0.1, 0.3], [0])
    waiting = [queued("j", spec(2, 4), 0.0)]
    plan = cycle().plan(waiting, [holder(rj)], st, running=[rj], settle=settle)
    assert plan.admission.admit == ["j"] and plan.admission.preempt == []
    assert st.free.tolist() == [2, 4]
    assert plan.scaling.deltas == {"r": 1} and plan.scaling.nodes == {"r": 0}
    assert np.array_equal(st.free, [2, 4])  # the scaling step's trial allocations are released


# ---------------------------------------------------------------- the event engine's steps
def _live(key, gpw, node, *, start, priority=0.0, remaining=0.0, workers=1, models=None):
    """A running job's live view, as the event engine keeps it."""
    return JobView(id=key, submit_time=0.0, gpus_per_worker=gpw, workers=workers, max_workers=workers,
                   priority=priority, remaining=remaining, start_time=start, placement=[node] * workers,
                   gpu_models=models)


def _waiting(v, klass="normal"):
    """A waiting job's live view, of service class ``klass``."""
    v.priority_class = klass
    return v


def _running_state(topology, views):
    st = ClusterState(topology, time=100.0)
    for v in views:
        st.allocate_job(v, v.placement)
        st.running[v.id] = v
    return st


def test_head_of_line_and_whether_anyone_may_preempt():
    st = cluster(1, 8, {})
    a = JobView(id="a", submit_time=2.0, remaining=50.0)
    b = JobView(id="b", submit_time=1.0, remaining=500.0)
    srtf = SchedulingCycle(Admission(make_ordering("srtf")))
    assert srtf.head([b, a], st) is a and srtf.head([], st) is None
    assert SchedulingCycle(None).head([a, b], st) is b  # no ordering: first submitted
    fifo = SchedulingCycle(Admission(make_ordering("fifo")))
    assert fifo.head([a, b], st) is b
    assert (fifo.preemption_possible(False), fifo.preemption_possible(True)) == (False, True)
    assert srtf.preemption_possible(False) is True
    assert SchedulingCycle(Admission(make_ordering("srtf"), preemption=False)).preemption_possible(True) is False
    assert SchedulingCycle(None).preemption_possible(True) is False


def test_preempt_a_highest_head_on_the_nodes_of_its_gpu_model():
    """Nodes 0, 1: A100; node 2: H100; 8 GPUs each, all held. ``vip`` (highest, 1 x 8,
    A100 only) evicts ``a``: ``h`` has the lowest priority but its H100 GPUs do not
    help, ``b`` started at this instant (no victim). ``a`` resumes first (interrupt)."""
    topo = Topology.from_dict({"nodes": [dict(name="n0", gpus=8, gpu_model="A100"),
                                         dict(name="n1", gpus=8, gpu_model="A100"),
                                         dict(name="n2", gpus=8, gpu_model="H100")]})
    views = [_live("a", 8, 0, start=10.0), _live("b", 8, 1, start=100.0), _live("h", 8, 2, start=5.0, priority=-5.0)]
    st = _running_state(topo, views)
    vip = _waiting(JobView(id="vip", submit_time=50.0, gpus_per_worker=8, gpu_models=frozenset({"A100"})), "highest")
    d = cycle().preempt(vip, st.running.values(), st, 100.0)
    assert (d.head, d.victims, d.interrupt) == (vip, ["a"], ["a"])
    assert st.free.tolist() == [0, 0, 0]  # a decision only
    # a normal head under FIFO never preempts
    assert cycle().preempt(_waiting(vip), st.running.values(), st, 100.0) is None


def test_preempt_under_srtf_evicts_only_what_the_ordering_ranks_after_the_head():
    """``h`` (100 s left) outranks ``long`` (1000 s) but not ``short`` (50 s): ``long``
    goes, back to its own queue (the ordering's rule, not the class rule)."""
    views = [_live("long", 8, 0, start=10.0, remaining=1000.0), _live("short", 8, 1, start=10.0, remaining=50.0)]
    st = _running_state(Topology.uniform(2, gpus_per_node=8, racks=1), views)
    cyc = SchedulingCycle(Admission(make_ordering("srtf")))
    h = _waiting(JobView(id="h", submit_time=50.0, gpus_per_worker=8, remaining=100.0))
    d = cyc.preempt(h, st.running.values(), st, 100.0)
    assert (d.victims, d.interrupt) == (["long"], [])
    slow = _waiting(JobView(id="slow", submit_time=50.0, gpus_per_worker=8, remaining=2000.0))
    assert cyc.preempt(slow, st.running.values(), st, 100.0) is None


def _rounds_setup():
    """2 nodes x 8 GPUs under SRTF: ``long`` (1000 s left, node 0), ``mid`` (500 s,
    node 1) run; ``p1`` (100 s) and ``p2`` (200 s), 1 x 8 each, wait."""
    views = [_live("long", 8, 0, start=10.0, remaining=1000.0), _live("mid", 8, 1, start=10.0, remaining=500.0)]
    st = _running_state(Topology.uniform(2, gpus_per_node=8, racks=1), views)
    st.pending = [JobView(id="p1", submit_time=20.0, gpus_per_worker=8, remaining=100.0),
                  JobView(id="p2", submit_time=30.0, gpus_per_worker=8, remaining=200.0)]
    return st, SchedulingCycle(Admission(make_ordering("srtf")))


def _apply(st, log, ok=True):
    """The engine's part: suspend the victims (they wait again), start the head on their node."""
    def apply(d):
        log.append(("apply", d.head.id, list(d.victims)))
        for key in d.victims:
            v = st.running.pop(key)
            st.release_job(v, v.placement)
            v.start_time, v.placement = None, []
            st.pending.append(v)
        if not ok:
            return False
        head = d.head
        nodes = best_fit_gang(head, st)
        st.allocate_job(head, nodes)
        head.placement, head.start_time = nodes, st.time
        st.running[head.id] = head
        st.pending = [p for p in st.pending if p is not head]
        return True
    return apply


def test_preemption_rounds_until_nobody_preempts():
    """Round 1: p1 evicts long (the one SRTF ranks last); round 2: p2 evicts mid (p1
    started now: no victim); round 3: long, then mid, outrank nobody running before now."""
    st, cyc = _rounds_setup()
    log = []
    done = cyc.preemption_rounds(st, 100.0, apply=_apply(st, log),
                                 admit=lambda: log.append("admit"))
    assert [(d.head.id, d.victims, d.interrupt) for d in done] == [("p1", ["long"], []), ("p2", ["mid"], [])]
    assert log == [("apply", "p1", ["long"]), "admit", ("apply", "p2", ["mid"]), "admit"]
    assert sorted(st.running) == ["p1", "p2"] and [v.id for v in st.pending] == ["long", "mid"]


def test_preemption_rounds_are_bounded_and_end_when_the_head_cannot_start(caplog):
    st, cyc = _rounds_setup()
    log = []
    with caplog.at_level("WARNING", logger="rlsched.core.cycle"):
        done = cyc.preemption_rounds(st, 100.0, apply=_apply(st, log),
                                     admit=lambda: log.append("admit"), rounds=1)
    assert [d.head.id for d in done] == ["p1"] and log == [("apply", "p1", ["long"]), "admit"]
    assert "preemption did not settle" in caplog.text
    st, cyc = _rounds_setup()
    log = []
    done = cyc.preemption_rounds(st, 100.0, apply=_apply(st, log, ok=False),
                                 admit=lambda: log.append("admit"))
    assert [d.victims for d in done] == [["long"]] and log == [("apply", "p1", ["long"])]  # no pass after a failed start


def test_scale_is_the_cycles_scaling_step():
    """The step :meth:`SchedulingCycle.plan` runs after admission, alone: the blocked
    head's 8 GPUs reserved leave room for one scale-up of the two asked."""
    def run(blocked):
        st = cluster(2, 8, {0: 4, 1: 2})
        a = elastic("a", 2, 2, [0.1, 0.3, 0.6], [0, 0])
        b = elastic("b", 1, 2, [0.1, 0.2, 0.3], [1])
        return cycle().scale([a, b], st, blocked), st

    plan, st = run(queued("head", spec(1, 8), 1.0))
    assert plan.asked == {"a": 1, "b": 1} and plan.deltas == {"a": 1} and plan.nodes == {"a": 0}
    assert st.free.tolist() == [4, 6]  # trial allocations released
    assert run(None)[0].deltas == {"a": 1, "b": 1}
    with pytest.raises(ValueError):
        cycle(scaling=None).scale([], cluster(1, 8, {}))
