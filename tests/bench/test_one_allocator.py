"""bench/one_allocator.py: both paths run and land in the JSON; a name that is not a
heuristic is refused."""

from __future__ import annotations

import json

import pytest


def test_both_paths_are_measured_and_written(bench_module, tmp_path):
    bench = bench_module("one_allocator")
    out = tmp_path / "rows.json"
    bench.main(["--trace", "synthetic:small,jobs=40", "--policy", "fifo/bestfit+nobackfill", "--seeds", "3",
                "--out", str(out)])
    (row,) = json.loads(out.read_text())
    assert row["passes"]["completed"] == row["allocator"]["completed"] == 40
    assert row["jct_difference"] == 0.0 and row["wall_ratio"] > 0  # FIFO: the same decisions


def test_only_heuristics_compare(bench_module, tmp_path):
    with pytest.raises(SystemExit, match="ordering/placement"):
        bench_module("one_allocator").compare("synthetic:small,jobs=10", "goodput", 0)


def test_a_scaling_heuristic_runs_both_ways_at_the_ticks_cadence(bench_module, tmp_path):
    bench = bench_module("one_allocator")
    out = tmp_path / "rows.json"
    bench.main(["--trace", "synthetic:small,jobs=20", "--policy", "drf/topology/fs+backfill", "--seeds", "3",
                "--scale-every", "300", "--out", str(out)])
    (row,) = json.loads(out.read_text())
    assert row["passes"]["completed"] == row["allocator"]["completed"] == 20
