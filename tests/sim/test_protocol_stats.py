"""The protocol's seed splits and paired bootstrap (sim/protocol.py)."""

import numpy as np
import pytest

from rlsched.sim.protocol import SPLITS, SplitError, paired_bootstrap, seeds, split_of


def test_splits_are_disjoint_and_seeds_stay_inside():
    ranges = sorted(SPLITS.values())
    for (lo1, hi1), (lo2, _) in zip(ranges, ranges[1:]):
        assert hi1 <= lo2
    for name in SPLITS:
        got = seeds(name, 20)
        assert len(set(got)) == 20 and {split_of(s) for s in got} == {name}
    assert set(seeds("validation", 5)).isdisjoint(seeds("test", 5))


def test_bad_splits_are_refused():
    with pytest.raises(SplitError):
        seeds("holdout", 3)
    with pytest.raises(SplitError):
        seeds("test", 10**6)
    with pytest.raises(SplitError):
        split_of(15_000)


def test_constant_difference_has_a_degenerate_interval():
    b = np.array([10.0, 20.0, 30.0, 40.0])
    d = paired_bootstrap(b - 2.0, b)
    assert d.diff == pytest.approx(-2.0) and d.diff_lo == pytest.approx(-2.0) and d.diff_hi == pytest.approx(-2.0)
    assert d.below() and not d.above()
    assert d.rel == pytest.approx(-2.0 / 25.0)


def test_pairing_removes_the_shared_seed_effect():
    rng = np.random.default_rng(1)
    base = rng.lognormal(8, 1, size=30)  # seeds differ wildly ...
    a = base * 0.9  # ... but a is 10% lower on every one
    d = paired_bootstrap(a, base)
    assert d.below() and d.rel_hi < 0 and d.rel == pytest.approx(-0.1)
    assert d.rel_lo == pytest.approx(-0.1) and d.rel_hi == pytest.approx(-0.1)


def test_noise_gives_an_interval_around_zero():
    rng = np.random.default_rng(2)
    a, b = rng.normal(100, 10, 40), rng.normal(100, 10, 40)
    d = paired_bootstrap(a, b)
    assert d.diff_lo < d.diff < d.diff_hi
    assert d.diff_lo < 0 < d.diff_hi


def test_bad_samples_are_refused():
    with pytest.raises(ValueError):
        paired_bootstrap([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [1.0])
    with pytest.raises(ValueError):
        paired_bootstrap([1.0, float("nan")], [1.0, 2.0])
