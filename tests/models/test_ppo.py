"""Exact answers for the shared PPO pieces (hand-computed)."""

import math

import numpy as np
import pytest
import torch

from rlsched.models.ppo import (
    AdaptiveKL,
    PPOConfig,
    approx_kl,
    clipped_surrogate,
    discounted_returns,
    gae,
    kl_penalized_surrogate,
    n_step_returns,
    ppo_update,
    value_loss,
)

R = [1.0, 2.0, 3.0]
V = [0.5, 1.0, 1.5]
D = [0, 1, 0]  # the episode ends after step 1; step 2 starts a new one


def test_gae_three_steps_with_done():
    # gamma 0.9, lambda 0.8, V(s_3) = 2
    # t=2: delta = 3 + 0.9*2 - 1.5 = 3.3;         A = 3.3
    # t=1: delta = 2 - 1.0 = 1.0 (done: no bootstrap);  A = 1.0
    # t=0: delta = 1 + 0.9*1.0 - 0.5 = 1.4;       A = 1.4 + 0.72*1.0 = 2.12
    adv, ret = gae(R, V, D, last_value=2.0, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(adv, [2.12, 1.0, 3.3], atol=1e-12)
    np.testing.assert_allclose(ret, [2.62, 2.0, 4.8], atol=1e-12)


def test_discounted_returns_three_steps_with_done():
    # G2 = 3 + 0.9*2 = 4.8; G1 = 2 (done); G0 = 1 + 0.9*2 = 2.8
    np.testing.assert_allclose(discounted_returns(R, D, gamma=0.9, last_value=2.0), [2.8, 2.0, 4.8], atol=1e-12)


def test_gae_lambda_one_is_monte_carlo_and_batched():
    rng = np.random.default_rng(0)
    r, v = rng.normal(size=(7, 3)), rng.normal(size=(7, 3))
    d = (rng.random((7, 3)) < 0.3).astype(float)
    last = rng.normal(size=3)
    _, ret = gae(r, v, d, last, gamma=0.97, lam=1.0)
    np.testing.assert_allclose(ret, discounted_returns(r, d, 0.97, last), atol=1e-12)
    # lambda 0: one-step TD targets
    adv0, _ = gae(r, v, d, last, gamma=0.97, lam=0.0)
    nxt = np.vstack([v[1:], last[None]])
    np.testing.assert_allclose(adv0, r + 0.97 * nxt * (1 - d) - v, atol=1e-12)


def test_gae_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shapes differ"):
        gae([1.0, 2.0], [0.0], [0, 0], 0.0)


def test_clipped_surrogate_hand_numbers_and_gradient():
    old = torch.log(torch.tensor([0.5, 0.5, 0.2, 0.5]))
    new = torch.log(torch.tensor([0.8, 0.3, 0.2, 0.8])).requires_grad_()
    adv = torch.tensor([1.0, 1.0, -2.0, -1.0])
    # ratios 1.6, 0.6, 1.0, 1.6; min(rA, clip(r)A) = 1.2, 0.6, -2.0, -1.6 -> mean -0.45
    loss, info = clipped_surrogate(new, old, adv, clip=0.2)
    assert float(loss.detach()) == pytest.approx(0.45, abs=1e-6)
    assert info["ratio"] == pytest.approx((1.6 + 0.6 + 1.0 + 1.6) / 4, abs=1e-6)
    assert info["clipfrac"] == pytest.approx(0.75)  # 1.6, 0.6, 1.6 lie outside [0.8, 1.2]
    loss.backward()
    # the clipped term (element 0) has no gradient; others: -r*A/4
    np.testing.assert_allclose(new.grad.numpy(), [0.0, -0.15, 0.5, 0.4], atol=1e-6)


def test_approx_kl_and_kl_penalty():
    old = torch.log(torch.tensor([0.5]))
    new = torch.log(torch.tensor([0.8]))
    assert float(approx_kl(old, new)) == pytest.approx(0.6 - math.log(1.6), abs=1e-6)
    loss, _ = kl_penalized_surrogate(new, old, torch.tensor([2.0]), beta=0.5)
    assert float(loss) == pytest.approx(-1.6 * 2.0 + 0.5 * (0.6 - math.log(1.6)), abs=1e-6)


def test_adaptive_kl_coefficient_update():
    k = AdaptiveKL(beta=1.0, target=0.01)
    assert k.update(0.02) == 2.0  # > 1.5 * target: double
    assert k.update(0.012) == 2.0  # inside [target/1.5, 1.5 target]: unchanged
    assert k.update(0.005) == 1.0  # < target / 1.5: halve
    assert k.update(0.0) == 0.5
    k2 = AdaptiveKL(beta=1.0, target=0.01, beta_max=3.0)
    k2.update(1.0)
    assert k2.update(1.0) == 3.0  # clipped at beta_max


def test_value_loss_plain_and_clipped():
    v = torch.tensor([1.0, 3.0])
    r = torch.tensor([2.0, 2.0])
    assert float(value_loss(v, r)) == pytest.approx(0.5 * (1 + 1) / 2)
    old = torch.tensor([0.0, 0.0])
    # clipped values: 0.5, 0.5 -> errors 2.25, 2.25; max with 1, 1 -> 2.25
    assert float(value_loss(v, r, old, clip=0.5)) == pytest.approx(0.5 * 2.25)


def test_ppo_update_raises_the_advantaged_action():
    # one state, two actions; action 1 has positive advantage
    torch.manual_seed(0)
    logits = torch.nn.Parameter(torch.zeros(2))
    value = torch.nn.Parameter(torch.zeros(1))
    actions = torch.tensor([0, 1] * 16)
    adv = torch.where(actions == 1, 1.0, -1.0)

    def evaluate(mb):
        dist = torch.distributions.Categorical(logits=logits.expand(len(mb["act"]), 2))
        return dist.log_prob(mb["act"]), dist.entropy(), value.expand(len(mb["act"]))

    with torch.no_grad():
        logp = torch.distributions.Categorical(logits=logits).log_prob(actions)
    batch = {"act": actions, "logp": logp, "adv": adv, "ret": adv, "val": torch.zeros(32)}
    opt = torch.optim.Adam([logits, value], lr=0.05)
    for objective in ("clip", "kl"):
        cfg = PPOConfig(objective=objective, epochs=4, minibatch_size=8)
        stats = ppo_update(evaluate, [logits, value], opt, batch, cfg, np.random.default_rng(0), AdaptiveKL())
        assert stats["approx_kl"] >= 0
    assert torch.softmax(logits, 0)[1] > 0.6
    with pytest.raises(ValueError):
        PPOConfig(objective="bogus")


def test_n_step_returns_by_hand():
    r = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    v = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    d = np.array([0, 0, 1, 0, 0])  # the first episode ends after step 2
    g = 0.5
    got = n_step_returns(r, v, d, n=2, gamma=g)
    expect = [
        1 + g * 2 + g * g * 30,  # bootstrap from V(s_2)
        2 + g * 3,  # ends at step 2: no bootstrap
        3,
        4 + g * 5,  # the rollout ends at step 4 without done: nothing to bootstrap from
        5,
    ]
    np.testing.assert_allclose(got, expect)
    # n = 1 is one-step TD
    np.testing.assert_allclose(n_step_returns(r, v, d, 1, g), [1 + g * 20, 2 + g * 30, 3, 4 + g * 50, 5])
