import math

import pytest

from rlsched.core import Progress
from rlsched.core import make_scaling
from rlsched.core.planning import ElasticState, ScalingPlanner, scaling_steps
from rlsched.core.planning.elastic import CONVERGENCE_WINDOW, convergence_gain


def prog(*accs, epoch=None, loss=1.0, max_loss=2.0):
    return Progress(epoch=len(accs) if epoch is None else epoch, loss=loss, max_loss=max_loss,
                    accuracy=accs[-1] if accs else 0.0, history=list(accs))


def job(make_spec, key, workers, progress, *, mn=1, mx=4, beta=0.01, decided=0, pinned=None, max_epochs=100, streak=0):
    s = make_spec(mn=mn, mx=mx, beta=beta, pinned_workers=pinned, max_epochs=max_epochs)
    st = ElasticState(decided_epoch=decided, streak=streak)
    return s.view(key, submit_time=0.0, workers=workers, priority=0.0, start_time=0.0, progress=progress, record=st)


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
    # the convergence gain is the mean over the evaluations so far: (0.6 - 0.5) / 2
    assert st.streak == 0 and st.gain == pytest.approx(0.05)
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
    assert conv.record.decided_epoch == 2 and gain.record.decided_epoch == 2


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
        j.record.decided_epoch = 0
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
    the same streak as one report per epoch: the gains come from the history
    (one-evaluation gains here, ``window=1``, so the streaks are easy to check)."""
    accs = [0.5, 0.6, 0.6001, 0.6002, 0.7, 0.7001, 0.7002, 0.7003]
    one_by_one = ElasticState()
    streaks = []
    for e in range(1, len(accs) + 1):
        one_by_one.observe(prog(*accs[:e]), workers=1, trained_s=0.0, beta=0.01, data_size=0, window=1)
        streaks.append(one_by_one.streak)
    assert streaks == [0, 0, 1, 2, 0, 1, 2, 3]
    for stride in (2, 3, 8):
        st = ElasticState()
        for e in list(range(stride, len(accs) + 1, stride)) + [len(accs)]:
            st.observe(prog(*accs[:e]), workers=1, trained_s=0.0, beta=0.01, data_size=0, window=1)
        assert st.streak == 3 and st.epoch == 8
    # a history truncated to the newest 2 evaluations: the 3 not held break the streak
    st = ElasticState(epoch=3, streak=1)
    st.observe(prog(0.7002, 0.7003, epoch=8), workers=1, trained_s=0.0, beta=0.01, data_size=0, window=1)
    assert st.streak == 1
    # no history at all: the latest gain (none: infinite) decides, as before
    st = ElasticState(epoch=3, streak=2)
    st.observe(Progress(epoch=5, accuracy=0.7), workers=1, trained_s=0.0, beta=0.01, data_size=0, window=1)
    assert st.streak == 0


def test_reserved_gpus_is_the_blocked_heads_gang(make_spec):
    from rlsched.core.planning import reserved_gpus

    assert reserved_gpus(None) == 0
    assert reserved_gpus(make_spec(3, 5, gpw=2).view("head", submit_time=0.0, workers=3, priority=0.0)) == 6


def test_place_hook_decides_room_and_the_node(planner, make_cluster, make_spec):
    """The adapter's placement is the room check: a hook that refuses node 0 leaves the
    job that would only fit there without its worker, and the node each granted
    scale-up got is reported; the snapshot is left as it was."""
    st = make_cluster(1, 1)
    a = job(make_spec, "a", 1, prog(0.1, 0.5))
    b = job(make_spec, "b", 1, prog(0.1, 0.2))
    seen = []

    def place(j, state):
        seen.append((j.id, state.free.tolist()))
        ok = [i for i in (1,) if state.free[i] >= j.gpus_per_worker]
        return ok[0] if ok else None

    plan = planner.plan([a, b], st, place=place)
    assert plan.deltas == {"a": 1} and plan.nodes == {"a": 1} and plan.decided == ["a", "b"]
    assert seen == [("a", [1, 1]), ("b", [1, 0])]  # b saw a's worker on node 1
    assert st.free.tolist() == [1, 1]
    # default: best fit by free GPUs
    for j in (a, b):
        j.record.decided_epoch = 0
    st2 = make_cluster(4, 2)
    assert planner.plan([a, b], st2).nodes == {"a": 1, "b": 1}


def test_per_job_patience_overrides_the_planners(planner, make_spec):
    j = job(make_spec, "p", 1, prog(0.8, 0.8), streak=3)
    assert planner.finished(j) == "Converged"
    j.patience = 4
    assert planner.finished(j) is None and planner.decides(j)


# ---------------------------------------------------------------- RLPTO's β rule (issue 13 item 5)
def test_convergence_gain_is_the_mean_gain_over_the_last_evaluations():
    h = [0.5, 0.6, 0.65, 0.66, 0.665, 0.667, 0.668]
    assert CONVERGENCE_WINDOW == 5
    assert convergence_gain(h) == pytest.approx((0.668 - 0.6) / 5)
    assert convergence_gain(h, 1) == pytest.approx(0.001) == pytest.approx(prog(*h).gain)
    assert convergence_gain(h, 2) == pytest.approx((0.668 - 0.665) / 2)
    assert convergence_gain([0.3, 0.5]) == pytest.approx(0.2)  # fewer evaluations than the window
    assert math.isinf(convergence_gain([0.3])) and math.isinf(convergence_gain([]))
    with pytest.raises(ValueError):
        convergence_gain(h, 0)


#: a job that rises, then stays flat at 0.902 +- 0.002 (evaluation noise): the last
#: gains alternate +0.004 / -0.004, so the one-evaluation gain is >= beta = 0.001 every
#: other time and a streak of one-evaluation gains never passes 1
ZIGZAG = [0.70, 0.80, 0.86, 0.90, 0.904, 0.900, 0.904, 0.900, 0.904, 0.900, 0.904]
#: mean gain over the last (up to) 5 evaluations after each of them, by hand:
#: e2 0.1/1, e3 0.16/2, e4 0.2/3, e5 0.204/4, e6 0.2/5, e7 0.104/5, e8 0.04/5,
#: e9 0.004/5 = 0.0008, e10 -0.004/5, e11 0.004/5
ZIGZAG_GAINS = [0.1, 0.08, 0.2 / 3, 0.051, 0.04, 0.0208, 0.008, 0.0008, -0.0008, 0.0008]


def test_noisy_flat_curve_converges_on_the_windowed_gain_not_on_the_last_difference():
    st = ElasticState()
    streaks, gains = [], []
    for e in range(1, len(ZIGZAG) + 1):
        st.observe(prog(*ZIGZAG[:e]), workers=2, trained_s=e, beta=0.001, data_size=0)
        streaks.append(st.streak)
        gains.append(st.gain)
    assert gains[1:] == pytest.approx(ZIGZAG_GAINS)
    assert streaks == [0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3]
    # the one-evaluation gain (window 1) never gives two small gains in a row
    raw = ElasticState()
    raw_streaks = []
    for e in range(1, len(ZIGZAG) + 1):
        raw.observe(prog(*ZIGZAG[:e]), workers=2, trained_s=e, beta=0.001, data_size=0, window=1)
        raw_streaks.append(raw.streak)
    assert max(raw_streaks) == 1


def test_streak_counts_every_evaluation_between_two_reports():
    """The demo's trainer evaluates every second, the operator looks every two: the
    streak still counts evaluations, so the β stop comes after ``patience``
    evaluations, not ``patience`` cycles."""
    every, pairs = ElasticState(), ElasticState()
    for e in range(1, len(ZIGZAG) + 1):
        every.observe(prog(*ZIGZAG[:e]), workers=2, trained_s=e, beta=0.001, data_size=0)
        if e % 2 == 1:  # reports seen at epochs 1, 3, 5, ...: two new evaluations each
            pairs.observe(prog(*ZIGZAG[:e]), workers=2, trained_s=e, beta=0.001, data_size=0)
            assert (pairs.streak, pairs.gain, pairs.epoch) == (every.streak, every.gain, every.epoch)
    assert pairs.streak == 3
    # a report without a history: no gain known, the streak resets
    pairs.observe(Progress(epoch=12, accuracy=0.9), workers=2, trained_s=12, beta=0.001, data_size=0)
    assert pairs.streak == 0 and math.isinf(pairs.gain)


@pytest.mark.parametrize("policy", ["rlpto", "fcfs"])
def test_converging_job_gives_workers_back_whatever_the_policy_and_then_stops(policy, make_cluster, make_spec):
    """The default policy (the learned RLPTO actor) and an always-grow one (FCFS) ask
    +1 for a converging job; the planner gives a worker back at each new evaluation
    from the first one whose windowed gain is below β (epoch 9 of ZIGZAG), then the β
    stop finishes the job after ``patience`` (3) such evaluations (epoch 11)."""
    planner = ScalingPlanner(make_scaling(policy), patience=3)
    st = make_cluster(8)
    spec = make_spec(mn=1, mx=4, beta=0.001, max_epochs=100)
    j = spec.view("z", submit_time=0.0, workers=4, priority=0.0, start_time=0.0, progress=prog(ZIGZAG[0]),
                  record=ElasticState())
    for i in range(4):
        st.allocate(0, 1)
        j.placement.append(0)
    deltas, finished = {}, {}
    for e in range(1, len(ZIGZAG) + 1):
        j.progress = prog(*ZIGZAG[:e])
        j.record.observe(j.progress, j.workers, float(e), spec.beta, 0)
        plan = planner.plan([j], st)
        if plan.finished:
            finished[e] = plan.finished["z"]
            break
        d = plan.deltas.get("z", 0)
        deltas[e] = d
        if d < 0:
            st.release(j.placement.pop(), 1)
        elif d > 0:
            st.allocate(0, 1)
            j.placement.append(0)
        j.workers += d
    assert {e: d for e, d in deltas.items() if d} == {9: -1, 10: -1}
    assert finished == {11: "Converged"} and j.workers == 2


def test_converging_job_at_min_workers_or_pinned_is_not_shrunk(planner, make_cluster, make_spec):
    st = make_cluster(8)
    at_min = job(make_spec, "min", 1, prog(0.8, 0.8), mn=1, streak=1)
    pinned = job(make_spec, "pin", 2, prog(0.8, 0.8), pinned=3, streak=1)
    assert planner.plan([at_min, pinned], st).deltas == {"pin": 1}


def test_workers_a_converging_job_gives_back_go_to_the_waiting_head_not_to_scale_ups(make_cluster, make_spec):
    """One full node: the converging job gives one back, the gaining job asks +1, but
    the blocked head of the queue needs that GPU (reserved): no scale-up."""
    planner = ScalingPlanner(make_scaling("fcfs"), patience=5)
    st = make_cluster(4)
    conv = job(make_spec, "conv", 2, prog(0.8, 0.8), mx=2, streak=1)
    grow = job(make_spec, "grow", 2, prog(0.1, 0.5), mx=4)
    for j in (conv, grow):
        for _ in range(j.workers):
            st.allocate(0, 1)
            j.placement.append(0)
    plan = planner.plan([conv, grow], st, reserved_gpus=1)
    assert plan.deltas == {"conv": -1}
