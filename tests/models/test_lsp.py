"""LSP GRU forecaster: series building, training, export read by core.forecast."""

import argparse

import numpy as np
import pytest
import torch

from rlsched.core.forecast import GRUForecaster
from rlsched.models.cli import run
from rlsched.models.lsp import daily_volume, synthetic_volume, windows


def test_daily_volume_counts_per_day(tmp_path):
    day = 86400
    # day 0: 1 task (sparse lead-in), days 3..6 busy, day 7 partial
    times = [5] + [3 * day + 1] * 3 + [4 * day] * 4 + [6 * day + 7] * 2 + [7 * day] * 3
    csv = tmp_path / "pods.csv"
    csv.write_text("name,creation_time\n" + "\n".join(f"p{i},{t}" for i, t in enumerate(times)) + "\n")
    # min_tasks 2: busy days are 3, 4, 6, 7 -> days 3..6 kept (day 7 is the last, partial)
    np.testing.assert_array_equal(daily_volume(csv, min_tasks=2), [3, 4, 0, 2])


def test_windows():
    X, y = windows(np.arange(10.0), 7)
    assert X.shape == (3, 7)
    np.testing.assert_array_equal(X[0], np.arange(7.0))
    np.testing.assert_array_equal(y, [7.0, 8.0, 9.0])
    with pytest.raises(ValueError, match="too short"):
        windows(np.arange(5.0), 7)


def test_synthetic_series_is_seeded_and_weekly():
    a = synthetic_volume(np.random.default_rng(1), 70)
    np.testing.assert_array_equal(a, synthetic_volume(np.random.default_rng(1), 70))
    d = np.arange(70)
    assert a[d % 7 >= 5].mean() < 0.8 * a[d % 7 < 5].mean()


def test_train_exports_a_forecaster_that_beats_the_mean(tmp_path, monkeypatch):
    monkeypatch.delenv("RLSCHED_DATA_DIR", raising=False)
    assert run("train", "lsp", ["--source", "synthetic", "--days", "120", "--epochs", "150", "--hidden", "8",
                                "--runs-dir", str(tmp_path), "--run", "o"]) == 0
    w = tmp_path / "o" / "model.safetensors"
    log = np.loadtxt(tmp_path / "o" / "train.csv", delimiter=",", skiprows=1)
    assert log[-1, 1] < 0.5 * log[0, 1]  # training error fell by half at least
    f = GRUForecaster.from_file(w)
    assert f.window == 7
    s = synthetic_volume(np.random.default_rng(0), 120)
    X, y = windows(s, 7)
    pred = np.array([f.predict(x) for x in X[:-7]])
    # on its training windows the GRU beats predicting the overall mean
    assert np.mean(np.abs(pred - y[:-7])) < np.mean(np.abs(s.mean() - y[:-7]))
