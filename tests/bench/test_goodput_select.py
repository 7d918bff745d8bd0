"""bench/goodput_select.py's rule: the incumbent stays unless a setting's paired
interval against it lies wholly below zero."""

from __future__ import annotations


def _runs(setting, jcts):
    return [{"setting": setting, "seed": 10_000 + i, "load": 1.0, "jct_mean": v} for i, v in enumerate(jcts)]


def test_the_incumbent_stays_unless_a_setting_is_lower_with_confidence(bench_module):
    choose = bench_module("goodput_select").choose
    base = [100.0, 200.0, 150.0, 120.0, 180.0, 160.0]
    noisy = [90.0, 215.0, 140.0, 125.0, 170.0, 165.0]  # lower mean, but up and down
    steady = [v - 5.0 for v in base]  # 5 s lower on every seed
    settings = [{}, {"p": 1.0}, {"p": 0.0}]
    runs = _runs({}, base) + _runs({"p": 1.0}, noisy)
    chosen, table = choose(settings[:2], runs)
    assert chosen == {} and table[0]["setting"] == {"p": 1.0} and not table[0]["below"]
    chosen, table = choose(settings, runs + _runs({"p": 0.0}, steady))
    assert chosen == {"p": 0.0}
    row = next(r for r in table if r["setting"] == {"p": 0.0})
    assert row["below"] and row["lower"] == 6 and row["rel_hi"] < 0
    assert "rel" not in next(r for r in table if r["setting"] == {})
