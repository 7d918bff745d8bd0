"""AdaScale and the fixed rules: the gain, the learning rates, progress accounting and
the state a restart at another batch size needs (exact answers, no torch needed)."""

import math

import pytest

from rlsched.trainer import AdaScale, GradientNoiseScale, gain_ratio, rule_gain


class _Opt:
    """An optimizer as AdaScale uses one: param groups with an ``lr``, and ``step``."""

    def __init__(self, *lrs):
        self.param_groups = [{"lr": lr} for lr in lrs]
        self.lrs_at_step = []

    def step(self):
        self.lrs_at_step.append([g["lr"] for g in self.param_groups])


class _Stats:
    def __init__(self, est):
        self.est = est

    def estimates(self):
        return self.est


def test_gain_ratio_by_hand():
    # |G|^2 = 1, tr(Sigma) = 32 per sample, B0 = 32: sigma^2 = 1 at the base batch
    assert gain_ratio(1.0, 32.0, 32, 96) == pytest.approx(1.5)   # (1 + 1) / (1/3 + 1)
    assert gain_ratio(1.0, 32.0, 32, 32) == 1.0                  # at the base batch
    assert gain_ratio(1.0, 32.0, 32, 16) == pytest.approx(2 / 3)  # a smaller batch: below 1
    assert gain_ratio(0.0, 32.0, 32, 96) == pytest.approx(3.0)    # all noise: linear
    assert gain_ratio(1.0, 0.0, 32, 96) == 1.0                    # no noise: no gain
    assert gain_ratio(-0.5, 32.0, 32, 96) == pytest.approx(3.0)   # a negative estimate counts as 0
    assert gain_ratio(0.0, 0.0, 32, 96) == 1.0
    with pytest.raises(ValueError):
        gain_ratio(1.0, float("nan"), 32, 96)


def test_fixed_rules():
    assert rule_gain("linear", 3.0) == 3.0
    assert rule_gain("sqrt", 4.0) == rule_gain("legw", 4.0) == 2.0
    with pytest.raises(ValueError):
        rule_gain("adascale", 3.0)
    with pytest.raises(ValueError):
        AdaScale(_Opt(0.1), base_batch=32, rule="cubic")


def test_adascale_sets_the_lr_and_counts_progress():
    opt = _Opt(0.1, 0.01)
    ada = AdaScale(opt, base_batch=32, gns=_Stats((1.0, 32.0)), dataset_size=320,
                   schedule=lambda t: 0.5 if t >= 2 else 1.0)
    assert ada.step(96) == pytest.approx(1.5)
    assert opt.lrs_at_step[-1] == pytest.approx([0.15, 0.015]) and ada.progress == pytest.approx(1.5)
    ada.step(96, samples=48)  # a short last batch: half the gain counts
    assert ada.progress == pytest.approx(2.25) and ada.samples == 144 and ada.steps == 2
    ada.step(96)  # the schedule reads the progress before the step: 2.25 >= 2
    assert opt.lrs_at_step[-1] == pytest.approx([0.075, 0.0075]) and ada.progress == pytest.approx(3.75)
    assert ada.progress_samples == pytest.approx(120.0) and ada.epochs == pytest.approx(0.375)
    assert not ada.reached(0.5)
    ada.step(32)  # back at the base batch: gain exactly 1
    assert ada.last_gain == 1.0 and ada.progress == pytest.approx(4.75)


def test_before_any_statistics_the_gain_is_one():
    opt = _Opt(0.1)
    ada = AdaScale(opt, base_batch=32, gns=GradientNoiseScale())
    assert ada.step(96) == 1.0 and opt.lrs_at_step == [[0.1]] and ada.progress == 1.0
    ada = AdaScale(_Opt(0.1), base_batch=32)  # no statistics object at all
    assert ada.gain(128) == 1.0


def test_fixed_rules_set_lr_and_progress():
    for rule, r in (("linear", 3.0), ("sqrt", math.sqrt(3.0)), ("legw", math.sqrt(3.0))):
        opt = _Opt(0.1)
        ada = AdaScale(opt, base_batch=32, rule=rule, gns=_Stats((1.0, 32.0)))  # statistics ignored
        ada.step(96)
        assert opt.lrs_at_step[-1] == pytest.approx([0.1 * r]) and ada.progress == pytest.approx(r)


def test_warmup_linear_in_progress_and_legw_stretched_in_epochs():
    opt = _Opt(0.1)
    ada = AdaScale(opt, base_batch=32, rule="linear", warmup=12)
    ada.step(96)  # (progress 0 + 1) / 12, times the gain 3
    assert opt.lrs_at_step[-1] == pytest.approx([0.1 * 3 / 12])
    ada.step(96)  # progress 3 -> 4 / 12
    assert opt.lrs_at_step[-1] == pytest.approx([0.1 * 3 * 4 / 12])
    # LEGW: sqrt(S) and the warmup's samples S times the base warmup's (12 x 32 at S = 1)
    opt = _Opt(0.1)
    ada = AdaScale(opt, base_batch=32, rule="legw", warmup=12)
    for k in range(1, 14):
        ada.step(96)
        assert opt.lrs_at_step[-1] == pytest.approx([0.1 * math.sqrt(3) * min(1.0, k / 12)])


def test_state_survives_a_restart_at_a_new_batch():
    """A checkpoint taken at batch 32 restores into a generation at batch 96: the base
    batch and base LRs are the checkpoint's, progress goes on from where it was, the
    gain comes from the restored statistics (not reported as measured)."""
    gns = GradientNoiseScale(decay=0.5)
    gns.update(5.0, 2.0, 2, 8)  # |G|^2 = 1, tr(Sigma) = 8
    opt = _Opt(0.1)
    ada = AdaScale(opt, base_batch=32, gns=gns, dataset_size=320)
    for _ in range(3):
        ada.step(32)
    state = ada.state_dict()
    assert state["progress"] == 3.0 and state["base_batch"] == 32

    opt2 = _Opt(0.1 * 1.75)  # the optimizer's restored lr is the last one set: not a base LR
    gns2 = GradientNoiseScale(decay=0.5)
    ada2 = AdaScale(opt2, base_batch=96, gns=gns2, dataset_size=320)  # the script's guess is overridden
    ada2.load_state_dict(state)
    assert (ada2.base_batch, ada2.base_lrs, ada2.progress, ada2.samples, ada2.steps) == (32, [0.1], 3.0, 96, 3)
    assert gns2.estimates() == gns.estimates() and gns2.grad_sqr is None
    r = (8 / 32 + 1) / (8 / 96 + 1)
    assert ada2.step(96) == pytest.approx(r)
    assert opt2.lrs_at_step[-1] == pytest.approx([0.1 * r]) and ada2.progress == pytest.approx(3.0 + r)
    assert ada2.epochs == pytest.approx((3.0 + r) * 32 / 320)
