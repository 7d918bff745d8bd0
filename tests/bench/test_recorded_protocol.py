"""bench/recorded_protocol.py: the pool screened on validation runs, the candidate paired
against the strongest on test; hand-made numbers."""

from __future__ import annotations

import json

import pytest


def _runs(suite, load, policy, jct):
    return [{"suite": suite, "load": load, "seed": s, "policy": policy, "config": {}, "jct_mean": v}
            for s, v in jct.items()]


def test_screen_then_pair_on_test(bench_module, tmp_path, capsys):
    bench = bench_module("recorded_protocol")
    val = (_runs("synthetic", 1.5, "a", {10000: 100.0, 10001: 110.0})
           + _runs("synthetic", 1.5, "b", {10000: 90.0, 10001: 100.0})
           + _runs("synthetic", 1.5, "c", {10000: 200.0, 10001: 210.0}))
    seeds = {20000 + k: 100.0 + k for k in range(5)}
    test = (_runs("synthetic", 1.5, "a", {s: v * 0.9 for s, v in seeds.items()})
            + _runs("synthetic", 1.5, "b", {s: v * 1.1 for s, v in seeds.items()}))
    rec = {"suites": [{"runs": _runs("synthetic", 1.5, "cand", seeds)}]}
    paths = {}
    for name, data in (("val", {"runs": val}), ("test", {"runs": test}), ("rec", rec)):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(data))
    out = tmp_path / "out.json"
    bench.main(["--suite", "synthetic", "--validation", str(paths["val"]), "--test", str(paths["test"]),
                "--recorded", str(paths["rec"]), "--candidate", "cand", "--top", "2", "--out", str(out)])
    c = json.loads(out.read_text())["cells"]["1.5"]
    assert c["strongest"] == ["b", "a"]  # c is screened out on validation
    assert c["best_on_test"] == "a"  # a is stronger on test
    pair = {r["compared_with"]: r for r in c["pairs"]}
    assert pair["a"]["rel"] == pytest.approx(1 / 0.9 - 1) and pair["a"]["lower_on"] == 0
    assert pair["b"]["rel"] == pytest.approx(1 / 1.1 - 1) and pair["b"]["lower_on"] == 5
    assert c["bar_met"] is False  # 11% above a
    assert "(bar missed)" in capsys.readouterr().out


def test_a_strongest_baseline_without_test_runs_is_an_error(bench_module):
    bench = bench_module("recorded_protocol")
    with pytest.raises(SystemExit, match="no test runs"):
        bench.cell({"a": {1: 1.0}}, {}, {20000: 1.0}, 1)
