"""The twin check's pure parts: the job set, the simulated log, the replay trainer's
job model and the comparison (which must flag a perturbed log)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from rlsched.core import Level, Topology
from rlsched.core.served import SERVED
from rlsched.sim.job import throughput
from rlsched_dev.twin import (
    ReplayTrainer,
    Tolerances,
    TwinConfig,
    compare,
    decided_epoch,
    live_log,
    render_markdown,
    sim_side,
    simulate,
    twin_jobs,
    twin_workload,
    windowed_gain_bounds,
)

TOPO = Topology.uniform(4, gpus_per_node=8, racks=2, blocks=1, prefix="kwok-gpu")
#: the k8s check's job set (tests/dev/test_twin_k8s.py): seed 9 of 7 jobs has scale-ups,
#: give-backs, early β stops and a preemption, under the default allocator
#: (fifo/das/fcfs+nobackfill) on both sides
CFG = TwinConfig(jobs=7, seed=9)


@pytest.fixture(scope="module")
def jobs():
    return twin_workload(CFG, TOPO)


@pytest.fixture(scope="module")
def sim(jobs):
    return sim_side(jobs, TOPO, CFG)


def test_job_set_has_what_the_check_needs():
    jobs = twin_jobs(20, 3)
    classes = [j.priority_class for j in jobs]
    assert classes.count("highest") == 1 and "urgent" in classes and "normal" in classes
    assert any(j.min_workers < j.max_workers for j in jobs)
    h = classes.index("highest")
    assert sum(j.min_workers * j.gpus_per_worker for j in jobs[:h]) >= 32  # it arrives on a full cluster
    t = [j.submit_time for j in jobs]
    assert all(b - a >= 40.0 for a, b in zip(t, t[1:]))  # one-second creation timestamps never tie
    assert twin_jobs(20, 3) == jobs and twin_jobs(20, 4) != jobs


def test_simulated_run_preempts_converges_early_scales_and_gives_back(jobs, sim):
    kinds = [d["kind"] for d in sim["decisions"]]
    assert kinds.count("preempt") == 1
    (p,) = [d for d in sim["decisions"] if d["kind"] == "preempt"]
    # by the allocator, in the decision that started the highest-class job
    started = {d["job"] for d in sim["decisions"] if d["kind"] == "admit" and d["t"] == p["t"]}
    assert {dict((j.id, j.priority_class) for j in jobs)[k] for k in started} == {"highest"}
    assert p["by"] == CFG.allocator.rsplit("/", 1)[-1]
    resume = [d for d in sim["decisions"] if d["kind"] == "admit" and d["resume"]]
    assert [d["job"] for d in resume] == [p["job"]]
    assert "scale" in kinds and not sim["unfinished"]
    epochs = {d["job"]: d["epoch"] for d in sim["decisions"] if d["kind"] == "finish"}
    early = {j.id for j in jobs if epochs[j.id] < j.max_epochs}
    assert early  # the β stop ended someone early
    ups = {d["job"] for d in sim["decisions"] if d["kind"] == "scale" and d["delta"] > 0}
    downs = [d for d in sim["decisions"] if d["kind"] == "scale" and d["delta"] < 0]
    assert ups and downs
    # every scale-down is a give-back: a job converging (windowed gain below β) on its
    # way to the β stop, at most patience - 1 evaluations before it
    spec = {j.id: j for j in jobs}
    for d in downs:
        assert d["job"] in early and epochs[d["job"]] - spec[d["job"]].patience < d["epoch"] < epochs[d["job"]]


def test_a_preempted_job_resumes_with_its_gang(jobs, sim):
    """Found by the twin check: the engine resumed a victim at the worker count it had
    scaled to; the operator restarts it at minWorkers (its gang)."""
    spec = {j.id: j for j in jobs}
    for d in sim["decisions"]:
        if d["kind"] == "admit":
            assert d["workers"] == spec[d["job"]].min_workers == len(d["nodes"])
    scaled_before = {d["job"] for d in sim["decisions"] if d["kind"] == "scale"}
    victim = next(d["job"] for d in sim["decisions"] if d["kind"] == "preempt")
    assert victim in scaled_before  # so the check above is not vacuous


def test_arrivals_stay_clear_of_other_decisions(jobs):
    w = 1.5 * CFG.latency_sim
    decisions = simulate(jobs, TOPO, CFG).decisions
    for j in jobs[1:]:
        started = {d["t"] for d in decisions if d["kind"] == "admit" and d["job"] == j.id}
        assert all(abs(d["t"] - j.submit_time) >= w for d in decisions
                   if d["job"] != j.id and not (d["kind"] == "preempt" and d["t"] in started))


def test_comparison_passes_on_identical_logs(sim):
    rep = compare(sim, copy.deepcopy(sim), latency=CFG.latency_sim)
    assert rep["ok"], render_markdown(rep)
    assert rep["jct"]["max_abs_diff_sim"] == 0


def _perturbed(sim, fn):
    live = copy.deepcopy(sim)
    fn(live)
    return compare(sim, live, latency=CFG.latency_sim)


def test_comparison_flags_another_victim(sim):
    def other_victim(live):
        p = next(d for d in live["decisions"] if d["kind"] == "preempt")
        started = {d["job"] for d in live["decisions"] if d["kind"] == "admit" and d["t"] == p["t"]}
        p["job"] = next(d["job"] for d in live["decisions"] if d["kind"] == "admit" and d["job"] != p["job"]
                        and d["job"] not in started)

    rep = _perturbed(sim, other_victim)
    assert not rep["ok"] and not rep["preemptions"]["ok"] and rep["admissions"]["ok"]


def test_comparison_flags_a_late_job_and_a_swap_and_a_missing_admission(sim):
    job = next(iter(sim["jct"]))

    def late(live):
        live["jct"][job] += 10 * CFG.latency_sim + 0.2 * sim["jct"][job]

    rep = _perturbed(sim, late)
    assert not rep["ok"] and rep["jct"]["beyond_tolerance"] == [job]

    admits = sorted((d for d in sim["decisions"] if d["kind"] == "admit"), key=lambda d: d["t"])
    a, b = admits[1], admits[-1]
    assert b["t"] - a["t"] > 4 * CFG.latency_sim

    def swap(live):
        for d in live["decisions"]:
            if d["kind"] == "admit" and (d["job"], d["resume"]) == (a["job"], a["resume"]):
                d["t"] = b["t"] + 3 * CFG.latency_sim

    rep = _perturbed(sim, swap)
    assert not rep["admissions"]["ok"] and rep["admissions"]["swaps_beyond_window"]

    rep = _perturbed(sim, lambda live: live["decisions"].remove(
        next(d for d in live["decisions"] if d["kind"] == "admit" and d["job"] == a["job"])))
    assert not rep["admissions"]["ok"] and rep["admissions"]["missing_live"]


def test_comparison_flags_scaling_beyond_one_edit_and_at_another_epoch(sim):
    job = next(d["job"] for d in sim["decisions"] if d["kind"] == "scale")

    def two_more_downs(live):
        t = max(d["t"] for d in live["decisions"])
        live["decisions"] += [{"kind": "scale", "job": job, "t": t, "delta": -1, "epoch": 9},
                              {"kind": "scale", "job": job, "t": t + 1, "delta": -1, "epoch": 10}]

    rep = _perturbed(sim, two_more_downs)
    assert rep["scaling"]["beyond_tolerance"] == [job] and not rep["ok"]

    def earlier(live):  # what the engine did before it planned through core: act before an evaluation
        for d in live["decisions"]:
            if d["kind"] == "scale":
                d["epoch"] = 0

    rep = _perturbed(sim, earlier)
    assert rep["scaling"]["identical_jobs"] < len(rep["scaling"]["jobs"])
    assert compare(sim, copy.deepcopy(sim), latency=CFG.latency_sim, tol=Tolerances(scale_edits=0))["ok"]


def test_scaling_steps_match_within_one_evaluation():
    """A job's steps shifted by one evaluation (a race with another job's finish that
    cascades) match; two evaluations, or the other direction, do not."""
    from rlsched_dev.twin import _edits

    sim = [(1, 4), (1, 5)]
    assert _edits(sim, [(1, 3), (1, 4)], 1) == 0 and _edits(sim, [(1, 3), (1, 4)]) == 2
    assert _edits(sim, [(1, 2), (1, 3)], 1) == 2
    assert _edits(sim, [(1, 4), (-1, 5)], 1) == 1
    assert _edits([(1, None)], [(1, None)], 1) == 0 and _edits([(1, None)], [(1, 0)], 1) == 1


def test_live_log_from_events():
    t0, k = 1000.0, 10.0
    events = [
        {"job": "a", "reason": "Admitted", "message": "starting gang of 2 workers x 4 GPUs from queue normal", "time": 1000.5},
        {"job": "a", "reason": "ScaledUp", "message": "workers 2 -> 3 (accuracy gain 0.01, beta 0.001)", "time": 1010.0},
        {"job": "a", "reason": "Preempted", "message": "preempted by highest-priority job ns/h; workers get 0s", "time": 1020.0},
        {"job": "a", "reason": "Admitted", "message": "starting gang of 2 workers x 4 GPUs from queue interrupt", "time": 1030.0},
        {"job": "a", "reason": "Completed", "message": "Converged at epoch 9", "time": 1050.0},
        {"job": "a", "reason": "GangTimeout", "message": "only 1/2 workers running", "time": 1040.0},
    ]
    reports = {"a": [(1005.0, 1, 0.5), (1008.0, 2, 0.51), (1011.0, 3, 0.52)]}
    runs = {"a": [(1000.6, ["n0", "n0"]), (1030.2, ["n1", "n1"])]}
    dec, jct, anomalies = live_log(events, {"a": 999.0}, runs, t0, k, reports)
    assert [d["kind"] for d in dec] == ["admit", "scale", "preempt", "admit", "finish"]
    assert dec[0]["t"] == pytest.approx(5.0) and dec[0]["nodes"] == ["n0", "n0"] and not dec[0]["resume"]
    assert dec[1]["epoch"] == 2 and dec[1]["workers"] == 3  # the report before the event whose gain is 0.01
    assert dec[2]["by"] == "h" and dec[3]["resume"] and dec[3]["nodes"] == ["n1", "n1"]
    assert jct == {"a": pytest.approx(510.0)}
    assert len(anomalies) == 1 and "GangTimeout" in anomalies[0]


def test_decided_epoch_reads_the_windowed_gain():
    """The operator's event names the convergence gain (the mean over the last five
    evaluations), not the last evaluation's gain."""
    reports = [(1.0, 1, 0.30), (2.0, 2, 0.40), (3.0, 3, 0.45)]
    assert decided_epoch(reports, 2.5, "inf") == 1
    assert decided_epoch(reports, 3.5, "0.1") == 2
    assert decided_epoch(reports, 3.5, "0.075") == 3  # (0.45 - 0.30) / 2
    assert decided_epoch(reports, 0.5, "inf") is None
    accs = [0.1, 0.3, 0.4, 0.45, 0.48, 0.50, 0.51, 0.515]
    reports = [(float(e), e, a) for e, a in enumerate(accs, 1)]
    # after epoch 7: (0.51 - 0.30) / 5 = 0.042, not the last evaluation's 0.01
    assert decided_epoch(reports, 7.5, "0.042") == 7
    assert decided_epoch(reports, 8.5, "0.042") == 7
    assert decided_epoch(reports, 8.5, f"{(0.515 - 0.4) / 5:.4g}") == 8


@pytest.mark.parametrize("lo,hi", [(1, 1), (1, 2), (2, 4), (3, 4)])
def test_windowed_gain_bounds_hold_any_worker_mix(lo, hi):
    """Every windowed gain of a noise-free curve trained at any per-epoch mix of
    lo..hi workers lies within the bounds (and the bounds are reached)."""
    from rlsched.core.planning import convergence_gains
    from rlsched.sim.convergence import ConvergenceModel

    conv = {"tau": 2.0, "noise": 0.0, "acc_max": 0.8}
    m = ConvergenceModel(1, tau=2.0, acc_max=0.8)
    e, g_min, g_max = windowed_gain_bounds(conv, lo, hi, 20)
    rng = np.random.default_rng(0)
    effs = [m.efficiency(w) for w in range(lo, hi + 1)]
    for trial in range(300):
        per_epoch = rng.uniform(min(effs), max(effs), 20) if trial % 2 else rng.choice(effs, 20)
        gains = convergence_gains(m.accuracy_at(np.cumsum(per_epoch)))[1:]  # epochs 2..20
        assert np.all(gains >= g_min * (1 - 1e-12)) and np.all(gains <= g_max * (1 + 1e-12))
    if lo == hi:  # one worker count: the bounds are the gains
        gains = convergence_gains(m.accuracy_at(np.arange(1, 21) * m.efficiency(lo)))[1:]
        assert gains == pytest.approx(g_min) and gains == pytest.approx(g_max)


def test_converging_jobs_have_a_beta_clear_of_every_windowed_gain():
    """The β stop and the give-backs fall on the same evaluation whatever mix of worker
    counts the live clock gives a job: β is at least 5% away from every gain, and the
    stop comes at least two epochs before maxEpochs."""
    n = 0
    for seed in range(1, 6):
        for j in twin_jobs(20, seed):
            if j.convergence["noise"]:
                continue
            n += 1
            e, g_min, g_max = windowed_gain_bounds(j.convergence, j.min_workers, j.max_workers, j.max_epochs)
            assert 0.005 <= j.beta <= 0.008
            assert np.all((j.beta < 0.95 * g_min) | (j.beta > 1.05 * g_max)), j.id
            first_below = int(e[np.flatnonzero(g_max < j.beta)[0]])
            assert first_below + j.patience - 1 <= j.max_epochs - 2
    assert n > 20


class _Conv:
    """Stands in for a ConvergenceModel: accuracy = effective epochs / 100."""

    samples_per_epoch = 1000

    def efficiency(self, workers):
        return 1.0 / (1.0 + 0.05 * (workers - 1))

    def evaluate(self, epochs, eff):
        return np.asarray(eff) / 100.0

    def loss_at(self, eff):
        return 1.0 / (1.0 + eff)


def test_replay_trainer_runs_the_engine_job_model():
    """Without a cluster: the trainer's progress is the engine's — throughput at the
    placement's level, restart cost on resume and resize, effective epochs at each
    boundary, nothing beyond maxEpochs."""
    from rlsched.sim import JobSpec

    spec = JobSpec(id="j", submit_time=0.0, workers=1, min_workers=1, max_workers=2, gpus_per_worker=4,
                   samples_per_epoch=1000, max_epochs=5, compute_time=0.25, grad_gb=0.1, batch_per_worker=32)
    tr = ReplayTrainer.__new__(ReplayTrainer)
    tr.topology, tr.time_scale, tr.restart_wall = TOPO, 10.0, 3.0  # 30 simulated s
    from rlsched_dev.twin import _Replay

    r = _Replay(spec, _Conv())
    tr.reconfigure(r, [0], 0.0)  # first start: no restart cost
    rate = throughput(spec, 1, Level.NVLINK, TOPO.bandwidth)
    assert r.rate == pytest.approx(rate) and r.resume_at == 0.0
    t1 = 1000 / rate / 10.0  # wall seconds of one epoch
    out = tr.advance(r, t1 * 1.5)
    assert [e for e, _, _ in out] == [1] and out[0][1] == pytest.approx(0.01)
    tr.reconfigure(r, [0, 2], t1 * 1.5)  # resize across racks: restart, slower link
    assert r.resume_at == pytest.approx(t1 * 1.5 + 3.0)
    assert r.rate == pytest.approx(throughput(spec, 2, Level.BLOCK, TOPO.bandwidth))
    assert tr.advance(r, t1 * 1.5 + 3.0) == []  # the restart made no progress
    tr.reconfigure(r, [], t1 * 1.5 + 3.0)  # preempted
    assert tr.advance(r, 100.0) == [] and r.started
    tr.reconfigure(r, [1], 100.0)  # resume: restart cost again
    assert r.resume_at == pytest.approx(103.0) and len(r.runs) == 2
    out = tr.advance(r, 1e6)
    assert [e for e, _, _ in out] == [2, 3, 4, 5]  # capped at maxEpochs
    assert out[0][1] == pytest.approx(0.02)  # two epochs' samples, all at one worker
    assert r.work_done == 5 * 1000


def test_replay_trainer_charges_a_generation_restart_once_from_when_the_old_workers_stopped():
    """A resize is a new generation live: the old workers stop (pause), the new ones run
    later at the new size. No progress in between, the engine's one restart cost counted
    from the pause (the live gap is part of it), not a new gang run."""
    from rlsched.sim import JobSpec
    from rlsched_dev.twin import _Replay

    spec = JobSpec(id="j", submit_time=0.0, workers=1, min_workers=1, max_workers=2, gpus_per_worker=4,
                   samples_per_epoch=1000, max_epochs=5, compute_time=0.25, grad_gb=0.1, batch_per_worker=32)
    tr = ReplayTrainer.__new__(ReplayTrainer)
    tr.topology, tr.time_scale, tr.restart_wall = TOPO, 10.0, 3.0
    r = _Replay(spec, _Conv())
    tr.reconfigure(r, [0], 0.0)
    tr.advance(r, 1.0)
    tr.pause(r, 1.0)  # generation g stopped at t = 1
    assert r.rate == 0.0 and r.nodes == (0,)
    before = r.work_done
    assert tr.advance(r, 2.0) == [] and r.work_done == before  # nothing while restarting
    tr.reconfigure(r, [0, 0], 2.0)  # generation g+1 runs at t = 2 with 2 workers
    assert r.resume_at == pytest.approx(1.0 + 3.0)  # one restart, counted from the pause
    assert r.workers == 2 and len(r.runs) == 1 and r.sizes[-1] == (2.0, 2)
    tr.pause(r, 10.0)
    tr.reconfigure(r, [0, 0], 20.0)  # a restart slower than the restart cost: none extra
    assert r.resume_at == pytest.approx(20.0) and len(r.runs) == 1


# ------------------------------------------------------------------ adaptive global batch
#: the batch scenario's configuration (tests/dev/test_twin_k8s.py::test_twin_check_batch_size_change)
BATCH_CFG = TwinConfig(jobs=2, seed=1, allocator=SERVED.allocator)  # the served default (core/served.py)


@pytest.fixture(scope="module")
def batch_sim():
    from rlsched_dev.twin import batch_scenario

    return sim_side(batch_scenario(), TOPO, BATCH_CFG)


def test_batch_scenario_changes_the_global_batch_at_its_resizes(batch_sim):
    """Simulated: the goodput allocator starts bs-a at its batchSize (no gradient
    statistics yet: a larger batch buys nothing on faith), then every resize — the
    shrink to admit bs-b, the grow back when it ends — changes its global batch, within
    [batchSize, maxBatchSize]; the grow-back is decided on a step time bs-a reported at
    the batch the shrink gave it."""
    from rlsched_dev.twin import batch_scenario, batch_sequences, make_simulator

    spec = {s.id: s for s in batch_scenario()}
    a = spec["bs-a"]
    log_ = batch_sim["decisions"]
    runs = [d for d in sorted(log_, key=lambda d: d["t"]) if d["job"] == "bs-a" and d["kind"] in ("admit", "scale")]
    assert [d["kind"] for d in runs] == ["admit", "scale", "scale"]
    assert runs[1]["delta"] < -1 and runs[2]["delta"] > 1  # shrink-to-admit, grow back: several workers at once
    batches = [d["batch"] for d in runs]
    assert batches[0] == a.batch_size
    assert all(x != y for x, y in zip(batches, batches[1:]))  # each resize changed the global batch
    assert all(a.batch_size <= b <= a.max_batch_size for b in batches)
    assert batches[1] > a.batch_size  # the noise scale it reported makes a larger batch worth it
    assert batch_sequences(log_) == {"bs-a": batches}  # bs-b has no adaptive batch: nothing logged for it
    assert not batch_sim["unfinished"]
    # what the allocator had read of bs-a when it grew it back: a step time at the
    # batch the shrink set (reported with an epoch at one worker), besides the first
    sim = make_simulator(batch_scenario(), TOPO, BATCH_CFG)
    sim.advance_until(runs[2]["t"] - 1e-6)
    shapes = {(r.workers, r.batch) for r in sim._by_id["bs-a"].obs.shapes}
    assert shapes == {(runs[0]["workers"], batches[0]), (runs[1]["workers"], batches[1])}


def test_the_engine_runs_an_adaptive_batch_job_at_its_batch_and_reports_what_its_trainer_reports():
    """The engine's side of the batch: the rate is the job model's throughput at the
    batch the allocator set, the efficiency of a sample Pollux's at that batch with the
    job's noise scale, and the record the allocator reads holds the step time at that
    batch and the gradient statistics — the numbers the replay trainer reports live."""
    from rlsched.sim.job import batch_throughput
    from rlsched_dev.twin import batch_scenario, make_simulator

    a = batch_scenario()[0]
    sim = make_simulator([a], TOPO, BATCH_CFG)
    sim.advance_until(400.0)
    j = sim._by_id["bs-a"]
    v = sim.job("bs-a")
    batch = a.global_batch(v.workers, j.batch)
    level = TOPO.span_level({i: v.placement.count(i) * a.gpus_per_worker for i in set(v.placement)})
    assert j.rate == pytest.approx(batch_throughput(a, v.workers, level, TOPO.bandwidth, batch))
    assert sim.dynamics.efficiency(j) == pytest.approx((a.grad_noise_scale + a.batch_size) / (a.grad_noise_scale + batch))
    assert (j.obs.grad_sqr, j.obs.grad_var) == a.grad_stats()
    (shape,) = j.obs.shapes
    assert (shape.workers, shape.batch) == (v.workers, batch) and shape.step_time == pytest.approx(batch / j.rate)
    # at batch_per_worker per worker the adaptive model is the fixed-batch one
    per_worker = v.workers * a.batch_per_worker
    assert batch_throughput(a, v.workers, level, TOPO.bandwidth, per_worker) == pytest.approx(
        throughput(a.with_(batch_size=None, max_batch_size=None, grad_noise_scale=None), v.workers, level, TOPO.bandwidth))


def test_comparison_flags_a_run_at_another_batch(batch_sim):
    """The same decisions live, but one generation's pods carry another global batch:
    the batch check fails (no scaling edit to forgive it); the identical log passes."""
    from rlsched_dev.twin import batch_sequences

    rep = compare(batch_sim, copy.deepcopy(batch_sim), latency=BATCH_CFG.latency_sim)
    assert rep["ok"] and rep["batch"]["ok"] and rep["batch"]["changed_live"] == ["bs-a"], render_markdown(rep)

    live = copy.deepcopy(batch_sim)
    seq = batch_sequences(live["decisions"])["bs-a"]
    live["batches"] = {"bs-a": seq[:-1] + [seq[-1] * 2]}  # the grow-back generation at twice the batch
    rep = compare(batch_sim, live, latency=BATCH_CFG.latency_sim)
    assert not rep["ok"] and not rep["batch"]["ok"] and rep["batch"]["beyond_tolerance"] == ["bs-a"]
    assert rep["scaling"]["ok"] and rep["admissions"]["ok"] and rep["jct"]["ok"]  # only the batch differs
    assert "**FAIL**" in render_markdown(rep)

    live["batches"] = {"bs-a": [seq[0]] * len(seq)}  # the batch never changed live
    rep = compare(batch_sim, live, latency=BATCH_CFG.latency_sim)
    assert not rep["batch"]["ok"] and rep["batch"]["changed_live"] == []
    # a relative tolerance forgives a batch that close, not farther
    live["batches"] = {"bs-a": seq[:-1] + [seq[-1] + 1]}
    assert not compare(batch_sim, live, latency=BATCH_CFG.latency_sim)["batch"]["ok"]
    assert compare(batch_sim, live, latency=BATCH_CFG.latency_sim,
                   tol=Tolerances(batch_rel=1.0 / seq[-1]))["batch"]["ok"]


def test_a_batch_edit_is_forgiven_only_with_the_scaling_edit_that_caused_it(batch_sim):
    """A resize one run took and the other did not (one scaling edit, forgiven) adds a
    batch entry: forgiven with it; without the extra step the same batch entry is not."""
    from rlsched_dev.twin import batch_sequences

    live = copy.deepcopy(batch_sim)
    t = max(d["t"] for d in live["decisions"] if d["job"] == "bs-a" and d["kind"] == "scale")
    seq = batch_sequences(live["decisions"])["bs-a"]
    live["decisions"].append({"kind": "scale", "job": "bs-a", "t": t + 1.0, "delta": 1, "workers": 5,
                              "epoch": 9, "batch": seq[-1] + 100})
    rep = compare(batch_sim, live, latency=BATCH_CFG.latency_sim)
    assert rep["scaling"]["ok"] and rep["scaling"]["jobs"]["bs-a"]["edits"] == 1
    assert rep["batch"]["ok"] and rep["batch"]["jobs"]["bs-a"]["edits"] == 1
    live = copy.deepcopy(batch_sim)
    live["batches"] = {"bs-a": seq + [seq[-1] + 100]}
    assert not compare(batch_sim, live, latency=BATCH_CFG.latency_sim)["batch"]["ok"]


def test_replay_trainer_runs_an_adaptive_batch_at_its_pods_batch():
    """Live side, without a cluster: the trainer runs a generation at the global batch
    its pods carry — the engine's throughput at that batch, the efficiency of the batch
    — and reports the step time at it, the batch and the gradient statistics; a new
    batch is a new generation (restart cost)."""
    from rlsched.core.contract import ENV_BATCH_SIZE
    from rlsched.sim.job import batch_throughput
    from rlsched_dev.twin import _pod_batch, _Replay, batch_scenario

    a = batch_scenario()[0]
    tr = ReplayTrainer.__new__(ReplayTrainer)
    tr.topology, tr.time_scale, tr.restart_wall = TOPO, 10.0, 3.0
    r = _Replay(a, _Conv())
    tr.reconfigure(r, [0, 0, 0, 0], 0.0, 64)
    assert r.rate == pytest.approx(batch_throughput(a, 4, Level.NVLINK, TOPO.bandwidth, 64))
    rep = tr.speed(r, 0)
    assert rep["global_batch_size"] == 64 and rep["step_time_seconds"] == pytest.approx(64 / r.rate)
    assert (rep["grad_sqr"], rep["grad_var"]) == a.grad_stats() and rep["workers"] == 4
    t1 = a.samples_per_epoch / r.rate / 10.0
    out = tr.advance(r, t1)
    assert [e for e, _, _ in out] == [1] and out[0][1] == pytest.approx(a.batch_efficiency(64) / 100)
    tr.reconfigure(r, [0, 0, 0, 0], t1, 408)  # same workers, another batch: a new generation
    assert r.resume_at == pytest.approx(t1 + 3.0) and r.batch == 408
    assert [(w, b) for _, w, b in r.generations] == [(4, 64), (4, 408)]
    assert tr.speed(r, 1)["global_batch_size"] == 408
    before = r.eff
    tr.advance(r, t1 + 3.0 + 1.0)
    assert r.eff - before == pytest.approx(r.rate * 10.0 / a.samples_per_epoch * a.batch_efficiency(408))
    assert a.batch_efficiency(408) < a.batch_efficiency(64) == 1.0
    pod = {"spec": {"containers": [{"name": "trainer", "env": [{"name": "X", "value": "1"},
                                                               {"name": ENV_BATCH_SIZE, "value": "190"}]}]}}
    assert _pod_batch(pod, ENV_BATCH_SIZE) == 190 and _pod_batch({"spec": {"containers": [{}]}}, ENV_BATCH_SIZE) is None


def test_the_twin_manifest_carries_the_batch_bounds_the_operator_parses():
    from rlsched.operator.spec import parse_spec
    from rlsched_dev.twin import batch_scenario, manifest

    a, b = batch_scenario()
    ts = parse_spec(manifest(a, "ns")["spec"], name=a.id)
    assert (ts.batch_size, ts.max_batch_size) == (a.batch_size, a.max_batch_size)
    assert "batchSize" not in manifest(b, "ns")["spec"] and parse_spec(manifest(b, "ns")["spec"]).batch_size is None


def test_live_log_reads_the_new_batch_of_an_allocator_resize():
    events = [{"job": "a", "reason": "Admitted", "message": "starting gang of 4 workers x 2 GPUs from queue normal",
               "time": 1000.0},
              {"job": "a", "reason": "ScaledDown", "time": 1010.0,
               "message": "workers 4 -> 1, global batch 64 -> 190 (generation 0, goodput, at epoch 2)"}]
    dec, _, _ = live_log(events, {"a": 999.0}, {}, 1000.0, 10.0)
    assert dec[1]["batch"] == 190 and dec[1]["delta"] == -3 and dec[1]["epoch"] == 2 and "batch" not in dec[0]


def test_live_allocator_keeps_the_options_free_of_time_and_scales_the_others():
    """The served name's options reach the live operator: the adaptive threshold's quantile
    and the room rounds as given, the times (here an idle horizon) over ``time_scale``."""
    from rlsched.core.live_allocation import make_live_allocator

    cfg = TwinConfig(jobs=2, seed=1, allocator="goodput-rlpto@adaptive=0.8,room_rounds=30,idle_horizon=600")
    live, sim = make_live_allocator(cfg.live_allocator()), cfg.sim_allocator().allocator
    assert (live.demotion.q, live.room_rounds) == (sim.demotion.q, sim.room_rounds) == (0.8, 30)
    assert live.idle_horizon == pytest.approx(600 / cfg.time_scale)
    assert live.demotion.prior == pytest.approx(sim.demotion.prior / cfg.time_scale)


@pytest.mark.parametrize("allocator", ["goodput-learned", "goodput-rlpto"])
def test_live_allocator_of_a_learned_weight_keeps_its_weights_on_the_compressed_clock(allocator):
    """A learned allocator live (the served one among them), on a clock ``time_scale``
    times faster: its time constants, the learned weight's service and age units among
    them, are the simulated ones over ``time_scale``, so a job ``k`` times younger and
    less served live gets the weight its simulated twin gets (RLPTO's view on top is
    free of time: ranks and fractions)."""
    from rlsched.core.allocation import AllocJob, AllocNode
    from rlsched.core.live_allocation import make_live_allocator

    cfg = TwinConfig(jobs=2, seed=1, allocator=allocator)
    sim = cfg.sim_allocator().allocator
    live = make_live_allocator(cfg.live_allocator())
    k = cfg.time_scale
    assert live.growth is not None and sim.growth is not None and sim.growth.fallback_reason is None
    assert type(live.growth) is type(sim.growth) and live.growth.fallback_reason is None
    assert live.restart_delay == pytest.approx(sim.restart_delay / k)
    assert live.service_scale == pytest.approx(sim.service_scale / k) and live.growth.hour == pytest.approx(3600 / k)
    assert live.growth.service_scale == pytest.approx(sim.growth.service_scale / k)
    nodes = [AllocNode(index=0, gpus=4, name="n0")]

    def job(service: float, age: float) -> AllocJob:
        return AllocJob(id="j", submit_time=0.0, application="app", age=age, attained_service=service,
                        num_restarts=2, allocation=(0,), target_replicas=1, target_batch_size=64, min_replicas=1,
                        max_replicas=8, bounds=None, epoch=5, metrics=(0.1, 0.3, 0.4, 0.45, 0.47),
                        higher_is_better=True)

    def weight(alloc, j: AllocJob) -> float:
        alloc.growth.prepare([j], nodes)
        return alloc.growth.weight(j)

    for service, age in ((0.0, 0.0), (3 * 3600.0, 1800.0), (40 * 3600.0, 7 * 3600.0)):
        want = weight(sim, job(service, age))
        assert weight(live, job(service / k, age / k)) == pytest.approx(want)
        assert want != pytest.approx(weight(sim, job(service, 4 * age + 3600.0)))  # age counts


def test_a_job_admitted_by_a_shrink_counts_the_shrink_as_a_hand_off(batch_sim):
    """bs-b waits for bs-a to give back GPUs: live, the old pods must stop before bs-b's
    gang is admitted, one more latency on bs-b's path than its own admission. A
    grow of another job while it waited frees nothing and does not count."""
    from rlsched_dev.twin import _path_decisions

    log_ = batch_sim["decisions"]
    submit = batch_sim["submit"]["bs-b"]
    assert _path_decisions("bs-b", log_, submit) == 2  # its admission + bs-a's shrink
    grow = [dict(d, delta=abs(d["delta"])) if d["kind"] == "scale" else d for d in log_]
    assert _path_decisions("bs-b", grow, submit) == 1


def test_on_two_gpu_types_the_replay_trainer_runs_at_the_types_speed_and_the_manifest_declares_its_seed():
    from rlsched.core.topology import NodeSpec
    from rlsched.operator.spec import parse_spec
    from rlsched_dev.twin import _Replay, manifest, mixed_scenario

    a = mixed_scenario()[1]  # one worker of 4 GPUs at least
    mixed = Topology(list(TOPO.nodes) + [NodeSpec("t4-0", 4, gpu_model="Tesla-T4", rack="rack-t4")], TOPO.bandwidth)
    tr = ReplayTrainer.__new__(ReplayTrainer)
    tr.topology, tr.time_scale, tr.restart_wall = mixed, 10.0, 3.0
    tr.types = ["A100"] * 4 + ["Tesla-T4"]
    on = {}
    for node in (0, 4):
        r = _Replay(a, _Conv())
        tr.reconfigure(r, [node], 0.0)
        on[tr.types[node]] = r.rate
    assert on["A100"] == pytest.approx(throughput(a.on_gpu("A100"), 1, Level.NVLINK, TOPO.bandwidth))
    assert on["Tesla-T4"] == pytest.approx(throughput(a, 1, Level.NVLINK, TOPO.bandwidth)) and on["Tesla-T4"] < on["A100"]
    seed = parse_spec(manifest(a, "ns", {"A100", "Tesla-T4"})["spec"], name=a.id).seed_profile
    assert seed == (("A100", 32, a.compute_time / 1.2), ("Tesla-T4", 32, a.compute_time))
    assert "seedProfile" not in manifest(a, "ns")["spec"]
