"""bench/event_decisions.py: each run's SimConfig overrides reach the engine, and every
run lands in the JSON."""

from __future__ import annotations

import json

import pytest


def test_overrides_reach_the_engine_and_every_run_is_written(bench_module, tmp_path):
    bench = bench_module("event_decisions")
    out = tmp_path / "runs.json"
    assert bench.main(["--suite", "synthetic", "--load", "1.0", "--seeds", "10000", "--jobs", "30",
                       "--run", "goodput/das", "--run", 'goodput/das {"allocate_on_events": false}',
                       "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["config"] for r in runs] == [{}, {"allocate_on_events": False}]
    assert all(r["jct_mean"] > 0 for r in runs)
    assert runs[0]["jct_mean"] != runs[1]["jct_mean"]  # deciding on events changed the run


def test_overrides_must_be_an_object(bench_module):
    with pytest.raises(Exception, match="JSON object"):
        bench_module("event_decisions")._run('goodput/das [1, 2]')


def test_the_pollux_suite_runs_on_the_interval_engine_one_workload_per_seed(bench_module, tmp_path):
    bench = bench_module("event_decisions")
    out = tmp_path / "runs.json"
    assert bench.main(["--suite", "pollux", "--load", "1.0", "--seeds", "10000,10001", "--jobs", "8",
                       "--run", "goodput-rlpto@adaptive=0.8/das", "--out", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["seed"] for r in runs] == [10000, 10001] and all(r["jct_mean"] > 0 for r in runs)
    assert runs[0]["jct_mean"] != runs[1]["jct_mean"]  # each seed its own generated workload
    assert bench._spec("pollux", 1.0, 8, 10001) == "pollux-gen:seed=10001,jobs=8,load=1"
