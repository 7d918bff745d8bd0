import logging

import numpy as np
import pytest

from rlsched.core import nn
from rlsched.core.forecast import GRUForecaster, LSPForecast, arima_forecast, combine, ewma, recommended_nodes


def test_ewma_exact():
    # s0 = 10; s1 = .8*10 + .2*20 = 12; s2 = .8*12 + .2*5 = 10.6
    assert ewma([10, 20, 5], rho=0.8) == pytest.approx(10.6)
    assert ewma([7], rho=0.8) == 7
    assert ewma([1, 2, 3], rho=0.0) == 3
    with pytest.raises(ValueError):
        ewma([], 0.8)
    with pytest.raises(ValueError):
        ewma([1], 1.5)


def test_combination_and_fallback():
    assert combine(100.0, 50.0, alpha=0.6) == pytest.approx(80.0)
    assert combine(None, 50.0, alpha=0.6) == 50.0


def test_recommended_nodes_rounds_up_and_never_negative():
    assert recommended_nodes(80.0, 10.6) == 8
    assert recommended_nodes(80.0, 10.0) == 8
    assert recommended_nodes(-5.0, 10.0) == 0
    with pytest.raises(ValueError):
        recommended_nodes(1.0, 0.0)


def test_arima_short_history_falls_back_to_recent_mean(caplog):
    with caplog.at_level(logging.INFO):
        assert arima_forecast([4, 6, 8]) == pytest.approx(6.0)
    assert "too short" in caplog.text


def test_arima_follows_a_trend():
    y = np.arange(30, dtype=float) * 2 + 10  # 10, 12, ..., 68
    f = arima_forecast(y, order=(1, 1, 0))
    assert 66 < f < 74


def gru_weights(rng, hidden=4):
    return {
        "gru.weight_ih_l0": rng.normal(size=(3 * hidden, 1)), "gru.weight_hh_l0": rng.normal(size=(3 * hidden, hidden)),
        "gru.bias_ih_l0": rng.normal(size=3 * hidden), "gru.bias_hh_l0": rng.normal(size=3 * hidden),
        "head.weight": rng.normal(size=(1, hidden)), "head.bias": rng.normal(size=1),
    }


def test_gru_forward_matches_a_hand_unrolled_cell():
    rng = np.random.default_rng(0)
    w = gru_weights(rng)
    g = GRUForecaster(w, mean=10.0, std=2.0, window=7)
    x = np.arange(1.0, 11.0)  # 10 days; only the last 7 are used
    h = np.zeros(4)
    for v in (x[-7:] - 10.0) / 2.0:
        h = nn.gru_cell(np.array([v]), h, w["gru.weight_ih_l0"], w["gru.weight_hh_l0"], w["gru.bias_ih_l0"], w["gru.bias_hh_l0"])
    want = float((w["head.weight"] @ h + w["head.bias"])[0]) * 2.0 + 10.0
    assert g.predict(x) == pytest.approx(want)
    with pytest.raises(ValueError, match="last 7 days"):
        g.predict([1, 2, 3])


def test_lsp_mixes_gru_and_arima(caplog):
    rng = np.random.default_rng(1)
    hist = [20, 22, 21, 23, 22, 24, 23, 25, 24, 26, 25, 27]
    gru = GRUForecaster(gru_weights(rng), mean=20, std=5)
    with_gru = LSPForecast(gru=gru, order=(1, 0, 0)).forecast(hist, [5, 6, 5])
    assert with_gru.used_gru
    assert with_gru.volume == pytest.approx(0.6 * with_gru.gru + 0.4 * with_gru.arima)
    assert with_gru.tasks_per_node == pytest.approx(ewma([5, 6, 5], 0.8))
    assert with_gru.nodes == recommended_nodes(with_gru.volume, with_gru.tasks_per_node)
    with caplog.at_level(logging.INFO):
        alone = LSPForecast(order=(1, 0, 0)).forecast(hist, [5, 6, 5])
    assert not alone.used_gru and alone.volume == alone.arima == with_gru.arima
    assert "ARIMA only" in caplog.text


def test_gru_weights_validated():
    with pytest.raises(ValueError, match="head.weight"):
        GRUForecaster({"gru.weight_hh_l0": np.zeros((3, 1))})
