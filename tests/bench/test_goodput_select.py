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


def test_a_setting_names_a_learned_weight_by_its_file(bench_module, tmp_path):
    """``growth_model`` and ``rlpto_model`` load the weight; a file that cannot be read
    stops the selection (a fallback would compare the wrong weight)."""
    from types import SimpleNamespace

    import numpy as np
    import pytest

    from rlsched.core.rlpto_weight import RLPTOGrowthWeight
    from rlsched.models.growth import _export

    arguments = bench_module("goodput_select")._arguments
    with pytest.raises(SystemExit, match="rlpto model"):
        arguments({"rlpto_model": str(tmp_path / "none.safetensors")})
    path = tmp_path / "net.safetensors"
    args = SimpleNamespace(loads="0.5,1.5", generations=1, pairs=1, form="rlpto", hidden=2)
    _export(path, np.zeros(RLPTOGrowthWeight.size(2)), args, "test", [{"seed": 1, "pop_relative_jct": 1.0}],
            np.array([-1.0, 0, 0, 0, 0]))
    out = arguments({"rlpto_model": str(path), "p": 0.5})
    assert isinstance(out["growth"], RLPTOGrowthWeight) and out["p"] == 0.5 and "rlpto_model" not in out
