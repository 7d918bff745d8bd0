"""``pollux:`` and ``pollux-gen:`` trace specs (sim/traces/pollux.py).

Two data folders: a tiny one built in tmp_path (fake profiles, hand-written rows) for
the rules and errors, and the real Pollux OSDI'21 data (``$RLSCHED_DATA_DIR``, else
``../shared/data`` beside the repository, the Makefile's default) for the published
workloads and the generator's fidelity. The real data is present in CI."""

from __future__ import annotations

import collections
import csv
import math
import os
from pathlib import Path

import pytest

from rlsched.sim.measured import ProfileError, load_applications
from rlsched.sim.traces import MeasuredTrace, TraceError, load_trace
from rlsched.sim.traces import pollux

APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
HEADER = "name,time,application,num_replicas,batch_size\n"


def _real() -> Path | None:
    env = os.environ.get("RLSCHED_DATA_DIR")
    cand = Path(env) if env else Path(__file__).resolve().parents[2].parent / "shared" / "data"
    return cand if (cand / "pollux-osdi21" / "traces" / "philly.csv").is_file() else None


REAL = _real()
needs_real = pytest.mark.skipif(REAL is None, reason="Pollux OSDI'21 data not found ($RLSCHED_DATA_DIR or ../shared/data)")


# ------------------------------------------------------------------ a tiny data folder
def _fake_profile(folder: Path) -> None:
    """Per-GPU batch 32..64, measured runs at total batch 128 and 4096."""
    folder.mkdir(parents=True)
    (folder / "placements.csv").write_text("placement,local_bsz,step_time,sync_time\n1,32,0.1,0.01\n1,64,0.2,0.01\n")
    for b in (128, 4096):
        (folder / f"validation-{b}.csv").write_text("progress,iteration,metric,grad_sqr,grad_var\n10,1,0.5,1,1\n20,2,0.9,1,1\n")


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """<tmp>/pollux-osdi21 with fake profiles of the six applications; returns the data folder."""
    root = tmp_path / "data" / "pollux-osdi21"
    for a in APPS:
        _fake_profile(root / "traces" / a)
    (root / "w").mkdir()
    return tmp_path / "data"


def _workload(data: Path, rows: str, name: str = "w/jobs.csv") -> Path:
    p = data / "pollux-osdi21" / name
    p.write_text(HEADER + rows)
    return p


def test_tiny_workload_loads_with_the_papers_setting(tiny):
    _workload(tiny, "a-0,0,cifar10,2,128\nb-1,30.5,cifar10,4,256\n")
    tr = load_trace("pollux:w/jobs", data_dir=tiny)
    assert isinstance(tr, MeasuredTrace)
    assert tr.name == "pollux:w/jobs"
    assert [(j.id, j.submit_time, j.application, j.num_replicas, j.batch_size) for j in tr.jobs] == [
        ("a-0", 0.0, "cifar10", 2, 128), ("b-1", 30.5, "cifar10", 4, 256)]
    assert (tr.nodes, tr.gpus_per_node, tr.interval, tr.restart_cost) == (16, 4, 60.0, 30.0)
    assert list(tr.apps) == ["cifar10"]  # only the applications the jobs use
    assert tr.skipped == {}


def test_unknown_application_names_file_and_line_even_with_skip_bad(tiny):
    p = _workload(tiny, "a-0,0,cifar10,2,128\nb-1,5,resnet,4,256\n")
    for skip in (False, True):
        with pytest.raises(TraceError, match=rf"{p}:3: unknown application 'resnet'"):
            load_trace("pollux:w/jobs", data_dir=tiny, skip_bad=skip)


def test_bad_number_raises_with_line_or_is_counted(tiny):
    p = _workload(tiny, "a-0,0,cifar10,2,128\nb-1,soon,cifar10,4,256\nc-2,9,cifar10,2.5,128\nd-3,9,cifar10,2,128\n")
    with pytest.raises(TraceError, match=rf"{p}:3: time is not a number"):
        load_trace("pollux:w/jobs", data_dir=tiny)
    tr = load_trace("pollux:w/jobs", data_dir=tiny, skip_bad=True)
    assert [j.id for j in tr.jobs] == ["a-0", "d-3"]
    assert tr.skipped == {"malformed": 2}


def test_repeated_name_and_negative_time_are_malformed(tiny):
    p = _workload(tiny, "a-0,0,cifar10,2,128\na-0,5,cifar10,2,128\n")
    with pytest.raises(TraceError, match=rf"{p}:3: repeated job name 'a-0'"):
        load_trace("pollux:w/jobs", data_dir=tiny)
    p = _workload(tiny, "a-0,-1,cifar10,2,128\n")
    with pytest.raises(TraceError, match=rf"{p}:2: negative time"):
        load_trace("pollux:w/jobs", data_dir=tiny)


def test_requests_outside_the_measured_profile(tiny):
    # fake profile: total batch 128..4096, per-GPU batch >= 32
    p = _workload(tiny, "a-0,0,cifar10,2,8192\nb-1,1,cifar10,8,128\nc-2,2,cifar10,1,64\nd-3,3,cifar10,1,1024\n")
    with pytest.raises(TraceError, match=rf"{p}:2: cifar10 batch_size 8192 outside the measured runs \[128, 4096\]"):
        load_trace("pollux:w/jobs", data_dir=tiny)
    tr = load_trace("pollux:w/jobs", data_dir=tiny, skip_bad=True)
    # 8 GPUs x 32 > 128: below the smallest per-GPU batch; 64 < 128: below the runs;
    # 1024 on one GPU (per-GPU 1024 > 64 measured) is gradient accumulation: kept
    assert [j.id for j in tr.jobs] == ["d-3"]
    assert tr.skipped == {"out_of_range": 3}


def test_a_broken_profile_is_a_profile_error_not_a_skipped_row(tiny):
    (tiny / "pollux-osdi21" / "traces" / "bert" / "placements.csv").write_text("placement,local_bsz\n1,4\n")
    _workload(tiny, "a-0,0,cifar10,2,128\nb-1,5,bert,4,256\n")
    with pytest.raises(ProfileError, match="bert/placements.csv: missing columns"):
        load_trace("pollux:w/jobs", data_dir=tiny, skip_bad=True)


def test_csv_suffix_optional_and_missing_columns(tiny):
    _workload(tiny, "a-0,0,cifar10,2,128\n")
    assert load_trace("pollux:w/jobs.csv", data_dir=tiny).jobs == load_trace("pollux:w/jobs", data_dir=tiny).jobs
    p = tiny / "pollux-osdi21" / "w" / "cols.csv"
    p.write_text("name,time,application,num_replicas\na,0,cifar10,2\n")
    with pytest.raises(TraceError, match=rf"{p}: missing columns \['batch_size'\]"):
        load_trace("pollux:w/cols", data_dir=tiny)


def test_path_traversal_is_refused(tiny):
    (tiny / "secret.csv").write_text(HEADER + "a,0,cifar10,2,128\n")
    for arg in ("../secret", "../secret.csv", "w/../../secret", str(tiny / "secret.csv")):
        with pytest.raises(TraceError, match="outside the data's folder"):
            load_trace(f"pollux:{arg}", data_dir=tiny)
    link = tiny / "pollux-osdi21" / "w" / "link.csv"
    link.symlink_to(tiny / "secret.csv")
    with pytest.raises(TraceError, match="outside the data's folder"):
        load_trace("pollux:w/link", data_dir=tiny)


def test_missing_folder_file_and_data_dir(tiny, tmp_path, monkeypatch):
    with pytest.raises(TraceError, match="pollux-osdi21: no such folder"):
        load_trace("pollux:workloads/workload-6", data_dir=tmp_path)
    with pytest.raises(TraceError, match="pollux-osdi21: no such folder"):
        load_trace("pollux-gen:seed=1", data_dir=tmp_path)
    with pytest.raises(TraceError, match=r"w/nope.csv: no such workload file"):
        load_trace("pollux:w/nope", data_dir=tiny)
    with pytest.raises(TraceError, match=r"unknown workload option 'nodes=4'; form: pollux:<folder>/<file>\[,cluster=NAME\]"):
        load_trace("pollux:w/jobs,nodes=4", data_dir=tiny)
    monkeypatch.delenv("RLSCHED_DATA_DIR", raising=False)
    with pytest.raises(TraceError, match="no data folder"):
        load_trace("pollux:workloads/workload-6")


def _philly(data: Path, rows: list[tuple[str, float, int, float]]) -> Path:
    p = data / "pollux-osdi21" / "traces" / "philly.csv"
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["timestamp", "duration", "num_gpus", "gpu_time", "cluster"])
        for ts, dur, g, gt in rows:
            w.writerow([ts, dur, g, gt, "c0"])
    return p


def test_generator_pool_and_buckets_on_a_tiny_philly(tiny):
    h = 3600.0
    _philly(tiny, [
        ("2017-10-01 02:00:10", 600, 1, 0.5 * h),     # < 1 GPU-h: cifar10 or ncf
        ("2017-10-02 03:00:00", 5 * h, 1, 5 * h),     # 1-10: deepspeech2 or bert
        ("2017-10-03 09:59:59", 50 * h, 1, 50 * h),   # 10-100: yolov3
        ("2017-10-04 05:00:00", 500 * h, 1, 500 * h), # 100-1000: imagenet
        ("2017-10-05 04:00:00", 30, 1, 30),           # shorter than 60 s: not sampled
        ("2017-10-06 04:00:00", 2000 * h, 1, 2000 * h),  # >= 1000 GPU-h: not sampled
        ("2017-10-07 10:00:00", 600, 1, 600),         # outside 02:00-10:00
        ("2017-10-08 01:59:59", 600, 1, 600),         # outside 02:00-10:00
    ])
    tr = load_trace("pollux-gen:seed=5,jobs=4", data_dir=tiny)
    got = [(j.submit_time, j.application) for j in tr.jobs]
    assert [t for t, _ in got] == [10.0, 3600.0, 3 * 3600.0, 8 * 3600 - 1.0]
    assert got[0][1] in ("cifar10", "ncf") and got[1][1] in ("deepspeech2", "bert")
    assert got[2][1] == "imagenet" and got[3][1] == "yolov3"
    assert [j.id for j in tr.jobs] == [f"{a}-{i}" for i, (_, a) in enumerate(got)]
    for j in tr.jobs:
        assert (j.num_replicas, j.batch_size) in pollux.APP_CONFIGS[j.application]
    with pytest.raises(TraceError, match="5 jobs asked but the 8 h window from 02:00 holds 4 Philly jobs"):
        load_trace("pollux-gen:seed=5,jobs=5", data_dir=tiny)
    # a window across midnight: 20:00 + 6 h holds the 01:59:59 job only
    tr = load_trace("pollux-gen:seed=5,jobs=1,start=20,hours=6", data_dir=tiny)
    assert [j.submit_time for j in tr.jobs] == [5 * 3600 + 59 * 60 + 59.0]


def test_generator_bad_philly_row_and_bad_options(tiny):
    for bad in ("yesterday", "2017-10-01", "2017-10-01T02:00:10"):
        p = _philly(tiny, [("2017-10-01 02:00:10", 600, 1, 600), (bad, 600, 1, 600)])
        with pytest.raises(TraceError, match=rf"{p}:3: timestamp is not"):
            load_trace("pollux-gen:seed=1,jobs=1", data_dir=tiny)
    p = _philly(tiny, [("2017-10-01 02:00:10", "long", 1, 600)])
    with pytest.raises(TraceError, match=rf"{p}:2: duration is not a number"):
        load_trace("pollux-gen:seed=1,jobs=1", data_dir=tiny)
    for arg, msg in (("seed=1,speed=2", "unknown option"), ("seed=x", "not a number"), ("seed=-1", "seed=-1"),
                     ("seed=1,jobs=0", "jobs=0"), ("seed=1,jobs=2.5", "jobs=2.5"), ("seed=1,hours=25", "hours=25"),
                     ("seed=1,load=0", "load=0"), ("seed=1,start=24", "start=24"), ("seed=1,load=nan", "not finite")):
        with pytest.raises(TraceError, match=msg):
            load_trace(f"pollux-gen:{arg}", data_dir=tiny)


# ------------------------------------------------------------------ the real data
@needs_real
def test_published_workload_6():
    tr = load_trace("pollux:workloads/workload-6", data_dir=REAL)
    assert tr.name == "pollux:workloads/workload-6"
    assert len(tr.jobs) == 160
    assert sorted(tr.apps) == list(APPS)  # the README's six applications
    assert collections.Counter(j.application for j in tr.jobs) == {
        "cifar10": 67, "ncf": 54, "deepspeech2": 16, "bert": 15, "yolov3": 5, "imagenet": 3}
    assert [(j.id, j.submit_time, j.application, j.num_replicas, j.batch_size) for j in tr.jobs[:5]] == [
        ("cifar10-0", 53.0, "cifar10", 6, 2048),
        ("cifar10-1", 154.0, "cifar10", 6, 2048),
        ("deepspeech2-2", 326.0, "deepspeech2", 8, 320),
        ("cifar10-3", 368.0, "cifar10", 16, 4096),
        ("bert-4", 735.0, "bert", 8, 384),
    ]
    assert tr.jobs == load_trace("pollux:workloads/workload-6.csv", data_dir=REAL).jobs
    assert tr.skipped == {}
    assert len(load_trace("pollux:workloads-1.5/workload-3", data_dir=REAL).jobs) == 240


@needs_real
def test_every_published_row_passes_the_rules_and_the_generator_asks_only_for_published_requests():
    root = REAL / "pollux-osdi21"
    apps = load_applications(root / "traces")
    published: set[tuple[str, int, int]] = set()
    n = 0
    for f in sorted(root.glob("workloads*/workload-*.csv")):
        with open(f, newline="") as fh:
            for r in csv.DictReader(fh):
                job = pollux._job(r, r["application"], set())
                pollux._check(job, apps[job.application])  # raises if a rule rejects it
                published.add((job.application, job.num_replicas, job.batch_size))
                n += 1
    assert n == 8 * (80 + 160 + 240)
    ours = {(a, r, b) for a, cfg in pollux.APP_CONFIGS.items() for r, b in cfg}
    assert ours == published


def _key(tr: MeasuredTrace) -> list[tuple]:
    return [(j.id, j.submit_time, j.application, j.num_replicas, j.batch_size) for j in tr.jobs]


@needs_real
def test_generator_is_deterministic_per_seed_and_respects_jobs_and_hours():
    a = load_trace("pollux-gen:seed=7", data_dir=REAL)
    assert a.name == "pollux-gen:seed=7,jobs=160,hours=8,load=1,start=2"
    assert _key(a) == _key(load_trace("pollux-gen:seed=7", data_dir=REAL))
    assert _key(a) == _key(load_trace("pollux-gen:", data_dir=REAL, seed=7))  # seed from load_trace
    assert _key(a) != _key(load_trace("pollux-gen:seed=8", data_dir=REAL))
    assert len(a.jobs) == 160 and all(0 <= j.submit_time < 8 * 3600 for j in a.jobs)
    assert (a.nodes, a.gpus_per_node, a.interval, a.restart_cost) == (16, 4, 60.0, 30.0)
    assert set(a.apps) == {j.application for j in a.jobs}
    b = load_trace("pollux-gen:seed=7,jobs=50,hours=2", data_dir=REAL)
    assert len(b.jobs) == 50 and all(0 <= j.submit_time < 2 * 3600 for j in b.jobs)
    assert [j.submit_time for j in b.jobs] == sorted(j.submit_time for j in b.jobs)


@needs_real
def test_generator_load_adds_jobs_to_the_same_window_like_the_published_loads():
    # published: workloads-0.5 / workloads / workloads-1.5 hold 80 / 160 / 240 jobs over
    # the same 8 hours, each lower load a subset of the higher one
    def jobs(t):
        return collections.Counter((j.submit_time, j.application, j.num_replicas, j.batch_size) for j in t.jobs)
    half, one, more = (load_trace(f"pollux-gen:seed=3,load={x}", data_dir=REAL) for x in (0.5, 1.0, 1.5))
    assert [len(t.jobs) for t in (half, one, more)] == [80, 160, 240]
    assert not jobs(half) - jobs(one) and not jobs(one) - jobs(more)
    for t in (half, one, more):
        assert max(j.submit_time for j in t.jobs) < 8 * 3600


@needs_real
def test_generator_mix_matches_the_published_mix(tmp_path):
    """Over 2,400 generated jobs (5 seeds × 480) each application's share is within 3 σ
    of its share among the 1,920 distinct published jobs (workloads-1.5; the lower
    loads are subsets), σ the standard error of the difference of two binomial
    shares: sqrt(p(1-p)(1/2400 + 1/1920)) — e.g. ±0.045 for cifar10, ±0.012 for
    imagenet. Checked by hand to fail for bucket edges of 0.5/5/50 or 2/20/200
    GPU-hours and for a cifar10:ncf split of 60:40; too weak to tell deepspeech2:bert
    58:42 (the measured split) from 50:50, or a last edge of 50 from 100 GPU-hours (the
    published data itself resolves those only at ~3 σ). The generator runs on a data
    folder holding only traces/: it must not need the published workloads."""
    only = tmp_path / "data" / "pollux-osdi21"
    only.mkdir(parents=True)
    (only / "traces").symlink_to(REAL / "pollux-osdi21" / "traces")
    pub = collections.Counter()
    for f in sorted((REAL / "pollux-osdi21" / "workloads-1.5").glob("workload-*.csv")):
        with open(f, newline="") as fh:
            pub.update(r["application"] for r in csv.DictReader(fh))
    n_pub = sum(pub.values())
    assert n_pub == 1920
    gen = collections.Counter()
    for s in range(5):
        gen.update(j.application for j in load_trace(f"pollux-gen:seed={s},jobs=480", data_dir=tmp_path / "data").jobs)
    n_gen = sum(gen.values())
    assert n_gen == 2400
    for app in APPS:
        p = pub[app] / n_pub
        tol = 3 * math.sqrt(p * (1 - p) * (1 / n_gen + 1 / n_pub))
        assert abs(gen[app] / n_gen - p) <= tol, (app, gen[app] / n_gen, p, tol)
