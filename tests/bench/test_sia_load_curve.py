"""bench/sia_load_curve.py: means over the same seeds, the candidate's paired interval
against each policy, a peer that did not run every seed at a load left out there."""

from __future__ import annotations

import json


def _runs(rows):
    return {f"{L:g}|{s}|{p}": {"load": L, "seed": s, "policy": p, "jct_mean": v} for L, s, p, v in rows}


def test_the_table_pairs_the_same_seeds_and_drops_a_missing_peer(bench_module):
    bench = bench_module("sia_load_curve")
    rows = []
    for k, s in enumerate(range(20000, 20004)):
        rows += [(1.0, s, "served", 100.0 + k), (1.0, s, "sia", 110.0 + k), (1.0, s, "gavel", 200.0 + k)]
        rows += [(1.5, s, "served", 150.0 + k), (1.5, s, "sia", 140.0 + k)]
    rows.append((1.0, 20004, "served", 1.0))  # beyond the 4 seeds asked for: not read
    rows.append((1.5, 20000, "gavel", 1.0))  # one seed of 4 at 1.5: gavel left out there
    t = bench.table(_runs(rows), [1.0, 1.5], 4, ["served", "sia", "gavel"], "served")
    one, high = t
    assert one["seeds"] == 4 and one["mean"] == {"served": 101.5, "sia": 111.5, "gavel": 201.5}
    assert one["vs"]["sia"]["rel_hi"] < 0 and one["vs"]["gavel"]["rel_hi"] < 0
    assert high["seeds"] == 4 and set(high["mean"]) == {"served", "sia"}
    assert high["vs"]["sia"]["rel_lo"] > 0  # the candidate higher on every seed


def test_the_plot_and_the_no_run_path(bench_module, tmp_path, capsys):
    bench = bench_module("sia_load_curve")
    rows = [(L, s, p, 100.0 * L + (s - 20000) + (5 if p == "sia" else 0))
            for L in (0.5, 1.0) for s in (20000, 20001, 20002) for p in ("served", "sia")]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(_runs(rows)))
    png = tmp_path / "curve.png"
    assert bench.main(["--no-run", "--loads", "0.5,1.0", "--seeds", "3", "--policies", "served,sia",
                       "--runs", str(path), "--plot", str(png)]) == 0
    assert png.stat().st_size > 1000
    out = capsys.readouterr().out
    assert "load 0.5 (3 seeds): served 51.0, sia 56.0" in out and "served vs sia: -" in out


def test_runs_of_another_setting_are_not_mixed_in(bench_module, tmp_path):
    """A runs file from before the suite's workloads changed (no spec, or another one)
    stops the run before anything is run or written."""
    import pytest

    bench = bench_module("sia_load_curve")
    path = tmp_path / "runs.json"
    old = _runs([(1.0, 20000, "served", 100.0)])
    path.write_text(json.dumps(old))
    with pytest.raises(SystemExit, match="other workloads"):
        bench.run([1.0], 1, ["served", "sia"], path, None)
    assert json.loads(path.read_text()) == old
