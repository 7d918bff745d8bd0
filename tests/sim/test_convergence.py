"""The convergence model and the β stop rule (sim/convergence.py)."""

from __future__ import annotations

import numpy as np
import pytest

from rlsched.sim.convergence import ConvergenceModel, stop_epoch


def test_convergence_curves():
    m = ConvergenceModel(1000, acc_max=0.9, acc0=0.1, tau=5.0, gamma=0.1, noise=0.0)
    accs = [m.accuracy(s) for s in (0, 1000, 5000, 50_000)]
    assert accs[0] == pytest.approx(0.1) and accs == sorted(accs) and accs[-1] < 0.9
    # accuracy(E) = 0.9 - 0.8 * exp(-E / 5): after 5 epochs 0.9 - 0.8 / e
    assert m.accuracy(5000) == pytest.approx(0.9 - 0.8 * np.exp(-1))
    # diminishing returns: the same samples are worth less with more workers
    assert m.accuracy(5000, workers=8) < m.accuracy(5000, workers=1)
    assert m.efficiency(8) == pytest.approx(1 / 1.7)
    assert m.loss(0) == pytest.approx(2.3) and m.loss(50_000) < m.loss(5000)
    assert m.epochs_to(0.9 - 0.8 * np.exp(-1)) == pytest.approx(5.0)


def test_convergence_noise_is_seeded():
    a = ConvergenceModel(1000, noise=0.01, seed=1).noise_at(np.arange(1, 10))
    b = ConvergenceModel(1000, noise=0.01, seed=1).noise_at(np.arange(1, 10))
    c = ConvergenceModel(1000, noise=0.01, seed=2).noise_at(np.arange(1, 10))
    assert (a == b).all() and not (a == c).all()


def test_stop_epoch():
    # one-evaluation gains (window 1): accuracies after epochs 1..6; gains: inf, .1, .0005, .0005, .2, .0001
    accs = np.array([0.5, 0.6, 0.6005, 0.601, 0.801, 0.8011])
    assert stop_epoch(accs, 1, (), 0, beta=0.001, patience=2, max_epochs=10, window=1) == 4
    assert stop_epoch(accs, 1, (), 0, beta=0.001, patience=3, max_epochs=10, window=1) == 10
    # a prior streak of 1 small gain: epoch 1's gain (0.5 - 0.4995 = .0005) makes 2
    assert stop_epoch(accs, 1, (0.4995,), 1, beta=0.001, patience=2, max_epochs=10, window=1) == 1
    assert stop_epoch(accs, 1, (), 0, beta=0.001, patience=2, max_epochs=3, window=1) == 3
    # the planner's default: the mean gain over the last 5 evaluations. Those gains of
    # the curve above are inf, .1, .1005/2, .101/3, .301/4, .3011/5: never below β
    assert stop_epoch(accs, 1, (), 0, beta=0.001, patience=1, max_epochs=10) == 10


def test_stop_epoch_on_the_windowed_gain():
    # flat after epoch 2: mean gains over up to 5 evaluations after epochs 2..8 are
    # .1, .1/2, .1/3, .1/4, .1/5, 0, 0 -> two small gains in a row at epoch 8
    flat = np.array([0.5] + [0.6] * 7)
    assert stop_epoch(flat, 1, (), 0, beta=0.001, patience=2, max_epochs=20) == 8
    # resumed after epoch 3 (prior holds epochs 1..3): the same epoch, whatever the split
    assert stop_epoch(flat[3:], 4, flat[:3], 0, beta=0.001, patience=2, max_epochs=20) == 8
    # one-evaluation gains would stop at epoch 4 (gains 0 at epochs 3 and 4)
    assert stop_epoch(flat, 1, (), 0, beta=0.001, patience=2, max_epochs=20, window=1) == 4
