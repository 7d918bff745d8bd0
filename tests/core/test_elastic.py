import math

import pytest

from rlsched.core import Progress
from rlsched.core import make_scaling
from rlsched.core.planning import ElasticState, RunningJob, ScalingPlanner, scaling_steps


def prog(*accs, epoch=None, loss=1.0, max_loss=2.0):
    return Progress(epoch=len(accs) if epoch is None else epoch, loss=loss, max_loss=max_loss,
                    accuracy=accs[-1] if accs else 0.0, history=list(accs))


def job(make_spec, key, workers, progress, *, mn=1, mx=4, beta=0.01, decided=0, pinned=None, max_epochs=100, streak=0):
    s = make_spec(mn=mn, mx=mx, beta=beta, pinned_workers=pinned, max_epochs=max_epochs)
    st = ElasticState(decided_epoch=decided, streak=streak)
    return RunningJob(key=key, spec=s, workers=workers, progress=progress, state=st)


@pytest.fixture
def planner():
    return ScalingPlanner(make_scaling("beta"), patience=3)


def test_rlpto_state_observes_once_per_evaluation():
    st = ElasticState()
    st.observe(prog(0.5, 0.505, loss=0.5, max_loss=2.0), workers=3, trained_s=10.0, beta=0.01, data_size=1000)
    assert (st.data_size, st.epoch, st.workers, st.trained_s) == (1000, 2, 3, 10.0)
    assert st.accuracy == 0.505 and st.gain == pytest.approx(0.005) and st.loss_norm == pytest.approx(0.25) and st.streak == 1
    st.observe(prog(0.5, 0.505, loss=0.5, max_loss=2.0), workers=3, trained_s=11.0, beta=0.01, data_size=1000)
    assert st.streak == 1 and st.trained_s == 11.0  # same epoch: not counted twice
    st.observe(prog(0.5, 0.505, 0.6), workers=3, trained_s=12.0, beta=0.01, data_size=1000)
    assert st.streak == 0 and st.gain == pytest.approx(0.095)
    back = ElasticState.from_status(st.to_status())
    assert back == st


def test_rlpto_state_roundtrips_infinite_gain():
    st = ElasticState()
    assert st.to_status()["gain"] is None and math.isinf(ElasticState.from_status(st.to_status()).gain)


def test_converging_job_shrinks_one_and_gaining_job_grows(planner, make_cluster, make_spec):
    st = make_cluster(4, 4)
    st.allocate(0, 4)
    conv = job(make_spec, "conv", 3, prog(0.80, 0.801))
    gain = job(make_spec, "gain", 1, prog(0.3, 0.5))
    plan = planner.plan([conv, gain], st)
    assert plan.deltas == {"conv": -1, "gain": 1}
    assert conv.state.decided_epoch == 2 and gain.state.decided_epoch == 2


def test_no_decision_without_new_evaluation(planner, make_cluster, make_spec):
    st = make_cluster(8)
    j = job(make_spec, "a", 3, prog(0.80, 0.801), decided=2)
    assert planner.plan([j], st).deltas == {}


def test_bounds_are_never_crossed(planner, make_cluster, make_spec):
    st = make_cluster(8)
    at_min = job(make_spec, "min", 1, prog(0.8, 0.8), mn=1)
    at_max = job(make_spec, "max", 4, prog(0.1, 0.5), mx=4)
    assert planner.plan([at_min, at_max], st).deltas == {}


def test_scale_up_respects_reservation_and_capacity(planner, make_cluster, make_spec):
    st = make_cluster(2)
    a = job(make_spec, "a", 1, prog(0.1, 0.5))
    b = job(make_spec, "b", 1, prog(0.1, 0.2))
    # two free GPUs, a waiting gang needs 1: only one scale-up, to the job gaining most
    assert planner.plan([a, b], st, reserved_gpus=1).deltas == {"a": 1}
    for j in (a, b):
        j.state.decided_epoch = 0
    assert planner.plan([a, b], st, reserved_gpus=2).deltas == {}


def test_pinned_job_moves_one_step_towards_the_pin(planner, make_cluster, make_spec):
    st = make_cluster(8)
    j = job(make_spec, "p", 1, prog(0.8, 0.8), pinned=3)
    assert planner.plan([j], st).deltas == {"p": 1}
    j2 = job(make_spec, "q", 4, prog(0.1, 0.5), pinned=2)
    assert planner.plan([j2], st).deltas == {"q": -1}


def test_completion_converged_or_max_epochs(planner, make_cluster, make_spec):
    st = make_cluster(8)
    conv = job(make_spec, "conv", 1, prog(0.8, 0.8), streak=3)
    maxed = job(make_spec, "maxed", 2, prog(0.1, 0.5), max_epochs=2)
    going = job(make_spec, "going", 1, prog(0.8, 0.8), streak=2)
    plan = planner.plan([conv, maxed, going], st)
    assert plan.finished == {"conv": "Converged", "maxed": "MaxEpochs"}
    assert "conv" not in plan.deltas and "maxed" not in plan.deltas


def test_scaling_steps_are_single_steps_removals_first():
    assert scaling_steps({"b": 3, "a": 1, "z": -2, "c": 0, "y": -1}) == [("y", -1), ("z", -1), ("a", 1), ("b", 1)]


def test_worker_counts_are_clamped_to_the_spec(make_spec):
    """Issue 12 item 4: whatever a status says (40 on a maxWorkers-2 job), the worker
    count acted on lies in [minWorkers, maxWorkers]."""
    s = make_spec(mn=1, mx=2)
    assert [s.clamp_workers(n) for n in (40, 2, 1, 0, -5)] == [2, 2, 1, 1, 1]
    assert [s.clamp_workers(n) for n in (None, "40", True, float("nan"), float("inf"), 1.9)] == [1, 1, 1, 1, 1, 1]


def test_streak_counts_every_evaluation_since_the_last_report():
    """Reports that skip epochs (a slow cycle, or the simulator's scaling tick) give
    the same streak as one report per epoch: the gains come from the history."""
    accs = [0.5, 0.6, 0.6001, 0.6002, 0.7, 0.7001, 0.7002, 0.7003]
    one_by_one = ElasticState()
    streaks = []
    for e in range(1, len(accs) + 1):
        one_by_one.observe(prog(*accs[:e]), workers=1, trained_s=0.0, beta=0.01, data_size=0)
        streaks.append(one_by_one.streak)
    assert streaks == [0, 0, 1, 2, 0, 1, 2, 3]
    for stride in (2, 3, 8):
        st = ElasticState()
        for e in list(range(stride, len(accs) + 1, stride)) + [len(accs)]:
            st.observe(prog(*accs[:e]), workers=1, trained_s=0.0, beta=0.01, data_size=0)
        assert st.streak == 3 and st.epoch == 8
    # a history truncated to the newest 2 evaluations: the 3 not held break the streak
    st = ElasticState(epoch=3, streak=1)
    st.observe(prog(0.7002, 0.7003, epoch=8), workers=1, trained_s=0.0, beta=0.01, data_size=0)
    assert st.streak == 1
    # no history at all: the latest gain (none: infinite) decides, as before
    st = ElasticState(epoch=3, streak=2)
    st.observe(Progress(epoch=5, accuracy=0.7), workers=1, trained_s=0.0, beta=0.01, data_size=0)
    assert st.streak == 0


def test_reserved_gpus_is_the_blocked_heads_gang(make_spec):
    from rlsched.core.planning import reserved_gpus

    assert reserved_gpus(None) == 0
    assert reserved_gpus(make_spec(3, 5, gpw=2)) == 6


def test_place_hook_decides_room_and_the_node(planner, make_cluster, make_spec):
    """The adapter's placement is the room check: a hook that refuses node 0 leaves the
    job that would only fit there without its worker, and the node each granted
    scale-up got is reported; the snapshot is left as it was."""
    st = make_cluster(1, 1)
    a = job(make_spec, "a", 1, prog(0.1, 0.5))
    b = job(make_spec, "b", 1, prog(0.1, 0.2))
    seen = []

    def place(j, state):
        seen.append((j.key, state.free.tolist()))
        ok = [i for i in (1,) if state.free[i] >= j.spec.gpus_per_worker]
        return ok[0] if ok else None

    plan = planner.plan([a, b], st, place=place)
    assert plan.deltas == {"a": 1} and plan.nodes == {"a": 1} and plan.decided == ["a", "b"]
    assert seen == [("a", [1, 1]), ("b", [1, 0])]  # b saw a's worker on node 1
    assert st.free.tolist() == [1, 1]
    # default: best fit by free GPUs
    for j in (a, b):
        j.state.decided_epoch = 0
    st2 = make_cluster(4, 2)
    assert planner.plan([a, b], st2).nodes == {"a": 1, "b": 1}


def test_per_job_patience_overrides_the_planners(planner, make_spec):
    j = job(make_spec, "p", 1, prog(0.8, 0.8), streak=3)
    assert planner.finished(j) == "Converged"
    j.patience = 4
    assert planner.finished(j) is None and planner.decides(j)
