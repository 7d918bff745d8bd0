"""bench/one_call_bar.py: a recorded candidate paired by seed against a baseline's two
paths, hand-made numbers; rows that are not the recorded baseline's runs are refused."""

from __future__ import annotations

import json

import pytest


def _rows(passes, allocator):
    return [{"policy": "drf/x+backfill", "trace": "t", "seed": s, "passes": {"jct_mean": p},
             "allocator": {"jct_mean": a}} for s, p, a in zip((1, 2, 3), passes, allocator)]


def _record(candidate, baseline):
    runs = [{"suite": "syn", "load": 1.5, "seed": s, "policy": pol, "jct_mean": j}
            for pol, js in (("cand", candidate), ("drf/x+backfill", baseline)) for s, j in zip((1, 2, 3), js)]
    return {"suites": [{"runs": runs}]}


def test_the_candidate_against_both_paths(bench_module, tmp_path):
    bench = bench_module("one_call_bar")
    rec, rows = tmp_path / "rec.json", tmp_path / "rows.json"
    rec.write_text(json.dumps(_record([90.0, 99.0, 108.0], [100.0, 110.0, 120.0])))
    rows.write_text(json.dumps(_rows([100.0, 110.0, 120.0], [90.0, 99.0, 108.0])))
    out = tmp_path / "bar.json"
    bench.main(["--recorded", str(rec), "--candidate", "cand", "--suite", "syn", "--rows", f"1.5={rows}",
                "--out", str(out)])
    (r,) = json.loads(out.read_text())["results"]
    assert r["load"] == 1.5 and r["seeds"] == [1, 2, 3]
    assert r["passes"]["rel"] == pytest.approx(-0.1) and r["passes"]["rel_hi"] == pytest.approx(-0.1)
    assert r["allocator"]["rel"] == pytest.approx(0.0) and r["allocator"]["diff"] == pytest.approx(0.0)


def test_rows_that_are_not_the_recorded_runs_are_refused(bench_module):
    bench = bench_module("one_call_bar")
    with pytest.raises(SystemExit, match=r"seeds \[2\]"):
        bench.bar({1: 1.0, 2: 1.0, 3: 1.0}, _rows([100.0, 111.0, 120.0], [1.0, 1.0, 1.0]),
                  {1: 100.0, 2: 110.0, 3: 120.0})
