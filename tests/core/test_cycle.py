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

