"""Trace loaders on tiny fixture files in the documented formats (tests/sim/data)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlsched.sim.traces import TraceError, load_trace, synthetic

DATA = Path(__file__).parent / "data"


# ---------------------------------------------------------------- alibaba2023
def test_alibaba2023_default():
    tr = load_trace("alibaba2023:default", data_dir=DATA)
    # node-c has no GPU and is not a GPU node of the simulator
    assert [n.name for n in tr.topology.nodes] == ["node-a", "node-b", "node-d"]
    assert tr.topology.total_gpus == 2 + 8 + 4
    assert tr.topology.node("node-b").gpu_model == "V100M32"
    # pod-2 asks no GPU: skipped and counted
    assert tr.skipped == {"no_gpu": 1}
    jobs = {j.id: j for j in tr.jobs}
    assert sorted(jobs) == ["pod-0", "pod-1", "pod-3", "pod-4"]
    # times shift so the first submit is 0; duration = deletion - scheduled
    assert jobs["pod-0"].submit_time == 0 and jobs["pod-0"].duration == 300
    # GPU-sharing pod (460 milli) counts as one whole GPU; starts at scheduled_time 160
    assert jobs["pod-1"].gpus_per_worker == 1 and jobs["pod-1"].duration == 250 - 160
    assert jobs["pod-3"].gpu_models == frozenset({"V100M32"}) and jobs["pod-3"].gpus_per_worker == 8
    # no scheduled_time (Pending pod): duration from creation_time
    assert jobs["pod-4"].duration == 200 and jobs["pod-4"].gpu_models == frozenset({"P100", "T4"})
    assert any("GPU-sharing" in n for n in tr.notes)


def test_alibaba2023_malformed_row_names_file_and_line():
    with pytest.raises(TraceError) as exc:
        load_trace("alibaba2023:bad", data_dir=DATA)
    assert "openb_pod_list_bad.csv:3:" in str(exc.value) and "num_gpu" in str(exc.value)
    tr = load_trace("alibaba2023:bad", data_dir=DATA, skip_bad=True)
    # line 3 (not a number) and line 5 (deleted before created) are skipped
    assert tr.skipped == {"malformed": 2}
    assert [j.id for j in tr.jobs] == ["pod-0", "pod-2"]


def test_alibaba2023_needs_data_dir(monkeypatch):
    monkeypatch.delenv("RLSCHED_DATA_DIR", raising=False)
    with pytest.raises(TraceError, match="data folder"):
        load_trace("alibaba2023:default")
    monkeypatch.setenv("RLSCHED_DATA_DIR", str(DATA))
    assert len(load_trace("alibaba2023:default").jobs) == 4
    with pytest.raises(TraceError, match="known: bad, default, huge, notimes"):
        load_trace("alibaba2023:nope")


def test_alibaba2023_list_without_times():
    # the re-sampled openb lists (multigpu20) have no time columns
    tr = load_trace("alibaba2023:notimes", data_dir=DATA)
    assert [(j.id, j.submit_time, j.duration, j.gpus_per_worker) for j in tr.jobs] == [
        ("pod-0", 0.0, 3600.0, 1), ("pod-1", 1.0, 3600.0, 2)]
    assert any("no times" in n for n in tr.notes)


# ---------------------------------------------------------------- pai2020
def test_pai2020():
    tr = load_trace("pai2020:pai", data_dir=DATA)
    assert [n.name for n in tr.topology.nodes] == ["m1", "m2"]
    jobs = {j.id: j for j in tr.jobs}
    assert sorted(jobs) == ["job1/worker", "job2/tensorflow"]
    w = jobs["job1/worker"]
    assert (w.workers, w.gpus_per_worker, w.duration) == (4, 1, 800)
    assert w.gpu_models == frozenset({"V100"}) and w.cpu_milli == 6000
    t = jobs["job2/tensorflow"]
    assert t.gpus_per_worker == 1 and t.gpu_models is None  # 50 % of a GPU; MISC = any
    assert tr.skipped == {"no_gpu": 1, "no_time": 1}
    # submit times: job1 1000, job2 1100 -> shifted to 0 and 100
    assert (w.submit_time, t.submit_time) == (0, 100)


def test_pai2020_malformed():
    with pytest.raises(TraceError) as exc:
        load_trace("pai2020:pai_bad", data_dir=DATA)
    assert "pai_task_table.csv:2:" in str(exc.value) and "expected 10 columns" in str(exc.value)
    tr = load_trace("pai2020:pai_bad", data_dir=DATA, skip_bad=True)
    assert tr.skipped == {"malformed": 1} and len(tr.jobs) == 1


# ---------------------------------------------------------------- philly
def test_philly():
    tr = load_trace(f"philly:{DATA / 'philly_cluster_job_log.json'}")
    jobs = {j.id: j for j in tr.jobs}
    assert sorted(jobs) == ["application_1", "application_3"]
    a = jobs["application_1"]
    assert (a.workers, a.gpus_per_worker, a.duration, a.submit_time) == (2, 4, 600, 0)
    # two attempts: first start 10:06:30 to last end 10:10:00
    assert jobs["application_3"].duration == 210 and jobs["application_3"].submit_time == 360
    assert tr.skipped == {"no_attempt": 1}
    assert tr.topology is None


def test_philly_malformed():
    with pytest.raises(TraceError) as exc:
        load_trace("philly:philly_bad.json", data_dir=DATA)
    assert "philly_bad.json:2:" in str(exc.value)
    assert load_trace("philly:philly_bad.json", data_dir=DATA, skip_bad=True).skipped == {"malformed": 1}


# ---------------------------------------------------------------- helios
def test_helios():
    tr = load_trace("helios:helios_cluster_log.csv", data_dir=DATA)
    jobs = {j.id: j for j in tr.jobs}
    assert sorted(jobs) == ["j1", "j3"]
    assert (jobs["j1"].workers, jobs["j1"].gpus_per_worker, jobs["j1"].duration) == (2, 8, 3600)
    assert jobs["j3"].submit_time == 120
    assert tr.skipped == {"no_gpu": 1}


def test_helios_malformed():
    with pytest.raises(TraceError, match=r"helios_bad\.csv:3: negative duration"):
        load_trace("helios:helios_bad.csv", data_dir=DATA)
    assert load_trace("helios:helios_bad.csv", data_dir=DATA, skip_bad=True).skipped == {"malformed": 1}


# ---------------------------------------------------------------- job files
def test_job_file():
    tr = load_trace(str(DATA / "jobs.yaml"))
    assert len(tr.topology) == 2 and [j.id for j in tr.jobs] == ["a", "b", "c"]
    assert tr.jobs[2].fixed is False and tr.jobs[0].duration == 10


# ---------------------------------------------------------------- synthetic
def test_synthetic_is_seeded_and_parameterised():
    a = synthetic("small,jobs=50,nodes=8,racks=2,max_workers=4", seed=1)
    b = synthetic("small,jobs=50,nodes=8,racks=2,max_workers=4", seed=1)
    c = synthetic("small,jobs=50,nodes=8,racks=2,max_workers=4", seed=2)
    assert [j.to_dict() for j in a.jobs] == [j.to_dict() for j in b.jobs]
    assert [j.to_dict() for j in a.jobs] != [j.to_dict() for j in c.jobs]
    assert len(a.jobs) == 50 and len(a.topology) == 8 and len(a.topology.racks) == 2
    assert max(j.workers for j in a.jobs) <= 4
    assert any(j.workers > 1 for j in a.jobs)
    # an explicit seed in the spec wins over the run seed
    d = synthetic("small,jobs=5,seed=7", seed=1)
    e = synthetic("small,jobs=5,seed=7", seed=2)
    assert [j.to_dict() for j in d.jobs] == [j.to_dict() for j in e.jobs]
    # arrival_rate sets the mean gap between submits
    f = synthetic("small,jobs=2000,arrival_rate=0.5", seed=0)
    gaps = np.diff([j.submit_time for j in f.jobs])
    assert 1.8 < gaps.mean() < 2.2


def test_synthetic_runtime_sigma_widens_the_runtime_spread():
    def spread(sigma):
        tr = load_trace(f"synthetic:small,jobs=400,runtime_sigma={sigma}", seed=3)
        ideal = np.array([j.samples_per_epoch * j.max_epochs for j in tr.jobs], dtype=float)
        return np.log(ideal).std()

    assert spread(2.0) > spread(1.1) > spread(0.3)
    default = [(j.id, j.samples_per_epoch) for j in load_trace("synthetic:small", seed=3).jobs]
    same = [(j.id, j.samples_per_epoch) for j in load_trace("synthetic:small,runtime_sigma=1.1", seed=3).jobs]
    assert default == same
    with pytest.raises(TraceError):
        load_trace("synthetic:small,runtime_sigma=-1", seed=3)


# ---------------------------------------------------------------- specs and replay options (sim/traces/spec.py)
def test_bad_specs():
    with pytest.raises(TraceError, match="unknown trace spec"):
        load_trace("nonsense:1")
    with pytest.raises(TraceError, match="unknown parameter"):
        load_trace("synthetic:small,colour=red")
    with pytest.raises(TraceError, match="unknown synthetic preset"):
        load_trace("synthetic:enormous")


def test_arrival_scale():
    base = {j.id: j.submit_time for j in load_trace("alibaba2023:default", data_dir=DATA).jobs}
    tr = load_trace("alibaba2023:default,arrival_scale=0.5", data_dir=DATA)
    assert {j.id: j.submit_time for j in tr.jobs} == {k: v * 0.5 for k, v in base.items()}
    assert tr.jobs[0].duration == 300
    with pytest.raises(TraceError, match="unknown trace option"):
        load_trace("alibaba2023:default,speed=2", data_dir=DATA)


def test_nodes_option_keeps_every_kth_node_and_drops_jobs_that_fit_none():
    full = load_trace("alibaba2023:default", data_dir=DATA)
    names = [n.name for n in full.topology.nodes]  # GPU nodes in file order
    tr = load_trace("alibaba2023:default,nodes=2", data_dir=DATA)
    kept = [n.name for n in tr.topology.nodes]
    assert kept == [names[0], names[len(names) // 2]]
    biggest = max(n.gpus for n in tr.topology.nodes)
    assert all(j.gpus_per_worker <= biggest for j in tr.jobs)
    dropped = [j for j in full.jobs if not any(n.gpus >= j.gpus_per_worker and (j.gpu_models is None or n.gpu_model in j.gpu_models) for n in tr.topology.nodes)]
    assert tr.skipped.get("unfit_subset", 0) == len(dropped)
    assert len(tr.jobs) + len(dropped) == len(full.jobs)
    assert tr.name.endswith(",nodes=2")
    with pytest.raises(TraceError, match="only"):
        load_trace(f"alibaba2023:default,nodes={len(names) + 1}", data_dir=DATA)
    with pytest.raises(TraceError, match="whole number"):
        load_trace("alibaba2023:default,nodes=1.5", data_dir=DATA)


def test_load_option_sets_the_offered_load():
    tr = load_trace("alibaba2023:default,load=0.5", data_dir=DATA)
    work = sum(j.workers * j.gpus_per_worker * j.duration for j in tr.jobs)
    span = max(j.submit_time for j in tr.jobs) - min(j.submit_time for j in tr.jobs)
    assert work / (tr.topology.total_gpus * span) == pytest.approx(0.5)
    base = {j.id: j.submit_time for j in load_trace("alibaba2023:default", data_dir=DATA).jobs}
    ratios = {round(j.submit_time / base[j.id], 9) for j in tr.jobs if base[j.id] > 0}
    assert len(ratios) == 1  # one scale for every submit time; durations kept
    with pytest.raises(TraceError, match="not both"):
        load_trace("alibaba2023:default,load=1,arrival_scale=0.5", data_dir=DATA)
    with pytest.raises(TraceError, match="must be > 0"):
        load_trace("alibaba2023:default,load=0", data_dir=DATA)
