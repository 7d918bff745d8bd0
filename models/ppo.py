"""Proximal Policy Optimization pieces shared by every on-policy agent.

GAE and returns on numpy arrays (time first), the clipped and KL-penalised surrogate
losses and the adaptive-KL β (Schulman et al. 2017, eqs. 7 and 8, §4), and
:func:`ppo_update`, the epochs × minibatches loop for any actor-critic. ``dones[t] = 1``
when the episode ended after step ``t``: nothing is bootstrapped across it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Mapping

import numpy as np
import torch

__all__ = [
    "gae",
    "discounted_returns",
    "n_step_returns",
    "clipped_surrogate",
    "kl_penalized_surrogate",
    "value_loss",
    "approx_kl",
    "AdaptiveKL",
    "PPOConfig",
    "ppo_update",
]


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    dones: np.ndarray,
    last_value: np.ndarray | float,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimation (Schulman et al. 2016): ``(advantages, returns)``.

    ``δ_t = r_t + γ V(s_{t+1}) (1 − d_t) − V(s_t)`` and
    ``A_t = δ_t + γ λ (1 − d_t) A_{t+1}``; ``returns = A + V`` (the value targets).
    ``last_value`` is V of the state after the last step.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    dones = np.asarray(dones, dtype=np.float64)
    if not (rewards.shape == values.shape == dones.shape):
        raise ValueError(f"gae: shapes differ: rewards {rewards.shape}, values {values.shape}, dones {dones.shape}")
    adv = np.zeros_like(rewards)
    next_value = np.broadcast_to(np.asarray(last_value, dtype=np.float64), rewards.shape[1:])
    running = np.zeros(rewards.shape[1:])
    for t in range(len(rewards) - 1, -1, -1):
        keep = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * keep - values[t]
        running = delta + gamma * lam * keep * running
        adv[t] = running
        next_value = values[t]
    return adv, adv + values


def discounted_returns(
    rewards: np.ndarray, dones: np.ndarray, gamma: float = 0.99, last_value: np.ndarray | float = 0.0
) -> np.ndarray:
    """``G_t = r_t + γ (1 − d_t) G_{t+1}``, bootstrapped from ``last_value`` after the end."""
    rewards = np.asarray(rewards, dtype=np.float64)
    dones = np.asarray(dones, dtype=np.float64)
    out = np.zeros_like(rewards)
    g = np.broadcast_to(np.asarray(last_value, dtype=np.float64), rewards.shape[1:]).copy()
    for t in range(len(rewards) - 1, -1, -1):
        g = rewards[t] + gamma * (1.0 - dones[t]) * g
        out[t] = g
    return out


def n_step_returns(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, n: int, gamma: float) -> np.ndarray:
    """Multi-step TD targets ``G_t = sum_{k<m} g^k r_{t+k} + g^m V(s_{t+m})`` with
    ``m = min(n, steps to the episode end)``; nothing is bootstrapped past a ``done``
    (``dones[t] = 1`` when the episode ended after step ``t``). ``values[t] = V(s_t)``."""
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    dones = np.asarray(dones, dtype=bool)
    T = len(rewards)
    out = np.zeros(T)
    for t in range(T):
        g, disc, k = 0.0, 1.0, t
        while True:
            g += disc * rewards[k]
            disc *= gamma
            if dones[k]:
                break
            k += 1
            if k - t == n or k >= T:
                if k < T:
                    g += disc * values[k]
                break
        out[t] = g
    return out


def approx_kl(logp_old: torch.Tensor, logp_new: torch.Tensor) -> torch.Tensor:
    """Low-variance estimator of KL(old ‖ new) from samples of the old policy:
    ``mean((ρ − 1) − log ρ)`` with ``ρ = π_new / π_old`` (non-negative)."""
    log_ratio = logp_new - logp_old
    return ((log_ratio.exp() - 1.0) - log_ratio).mean()


def clipped_surrogate(
    logp_new: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, clip: float = 0.2
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-Clip loss ``−mean(min(ρA, clip(ρ, 1−ε, 1+ε)A))`` and diagnostics
    (mean ratio, fraction clipped, approximate KL)."""
    ratio = (logp_new - logp_old).exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * advantages
    loss = -torch.min(unclipped, clipped).mean()
    with torch.no_grad():
        info = {
            "ratio": float(ratio.mean()),
            "clipfrac": float(((ratio - 1.0).abs() > clip).float().mean()),
            "approx_kl": float(approx_kl(logp_old, logp_new)),
        }
    return loss, info


def kl_penalized_surrogate(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    beta: float,
    kl: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Adaptive-KL PPO loss ``−mean(ρA) + β·KL(old ‖ new)``.

    ``kl`` is the exact per-state KL when the caller has both distributions (preferred);
    otherwise the sample estimate :func:`approx_kl` is used.
    """
    ratio = (logp_new - logp_old).exp()
    kl_term = approx_kl(logp_old, logp_new) if kl is None else kl.mean()
    loss = -(ratio * advantages).mean() + beta * kl_term
    return loss, {"ratio": float(ratio.mean().detach()), "approx_kl": float(kl_term.detach())}


def value_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor | None = None,
    clip: float | None = None,
) -> torch.Tensor:
    """``0.5·mean((V − R)²)``; with ``clip`` the PPO2 clipped form
    ``0.5·mean(max((V − R)², (V_old + clip(V − V_old, ±c) − R)²))``."""
    err = (values - returns) ** 2
    if clip is not None and old_values is not None:
        v_clip = old_values + (values - old_values).clamp(-clip, clip)
        err = torch.max(err, (v_clip - returns) ** 2)
    return 0.5 * err.mean()


class AdaptiveKL:
    """The adaptive KL coefficient of PPO (Schulman et al. 2017, §4).

    After each policy update with measured ``kl``: if ``kl < target / 1.5`` then
    ``β ← β / 2``; if ``kl > 1.5·target`` then ``β ← 2β``; clipped to ``[beta_min, beta_max]``.
    """

    def __init__(self, beta: float = 1.0, target: float = 0.01, beta_min: float = 1e-4, beta_max: float = 1e4):
        if target <= 0 or beta <= 0:
            raise ValueError("AdaptiveKL: beta and target must be positive")
        self.beta = float(beta)
        self.target = float(target)
        self.beta_min = beta_min
        self.beta_max = beta_max

    def update(self, kl: float) -> float:
        if kl < self.target / 1.5:
            self.beta /= 2.0
        elif kl > self.target * 1.5:
            self.beta *= 2.0
        self.beta = min(max(self.beta, self.beta_min), self.beta_max)
        return self.beta


@dataclass
class PPOConfig:
    """Hyper-parameters of :func:`ppo_update` (defaults after Schulman et al. 2017)."""

    objective: str = "clip"  # "clip" or "kl"
    clip: float = 0.2
    kl_target: float = 0.01
    kl_beta: float = 1.0
    epochs: int = 4
    minibatch_size: int = 256
    vf_coef: float = 0.5
    vf_clip: float | None = None
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    normalize_advantages: bool = True
    target_kl_stop: float | None = None  # stop the epochs early past this KL (clip only)

    def __post_init__(self) -> None:
        if self.objective not in ("clip", "kl"):
            raise ValueError(f"PPOConfig.objective must be 'clip' or 'kl', not {self.objective!r}")

    def as_dict(self) -> dict:
        return asdict(self)


def ppo_update(
    evaluate: Callable[[Mapping[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    params,
    optimizer: torch.optim.Optimizer,
    batch: Mapping[str, torch.Tensor],
    cfg: PPOConfig,
    rng: np.random.Generator,
    kl_coef: AdaptiveKL | None = None,
) -> dict[str, float]:
    """Run ``cfg.epochs`` passes of minibatch PPO over one rollout.

    ``batch`` holds equal-length tensors: ``logp`` (old log-probabilities), ``adv``,
    ``ret`` (value targets), ``val`` (old values) and whatever ``evaluate`` needs;
    ``evaluate(minibatch)`` returns ``(logp, entropy, value)`` under the current
    parameters. ``params`` (for gradient clipping) is a list of parameters or a list of
    such lists, each clipped to ``cfg.max_grad_norm`` on its own. With ``cfg.objective == "kl"`` pass ``kl_coef``; its β is updated
    once from the KL measured over the last epoch. Minibatches are drawn with ``rng``.
    """
    if cfg.objective == "kl" and kl_coef is None:
        raise ValueError("ppo_update: the 'kl' objective needs an AdaptiveKL")
    params = list(params)
    # a list of parameter lists is clipped group by group (e.g. actor and critic
    # separately, so a large value loss does not shrink the policy's step)
    groups = [list(g) for g in params] if params and isinstance(params[0], (list, tuple)) else [params]
    n = len(batch["logp"])
    stats: dict[str, list[float]] = {"policy_loss": [], "value_loss": [], "entropy": [], "approx_kl": [], "clipfrac": []}
    stop = False
    for _ in range(cfg.epochs):
        perm = rng.permutation(n)
        epoch_kl = []
        for start in range(0, n, cfg.minibatch_size):
            idx = torch.as_tensor(perm[start : start + cfg.minibatch_size])
            mb = {k: v[idx] for k, v in batch.items()}
            logp, entropy, value = evaluate(mb)
            adv = mb["adv"]
            if cfg.normalize_advantages and len(adv) > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            if cfg.objective == "clip":
                pl, info = clipped_surrogate(logp, mb["logp"], adv, cfg.clip)
            else:
                pl, info = kl_penalized_surrogate(logp, mb["logp"], adv, kl_coef.beta)
            vl = value_loss(value, mb["ret"], mb.get("val"), cfg.vf_clip)
            ent = entropy.mean()
            loss = pl + cfg.vf_coef * vl - cfg.ent_coef * ent
            optimizer.zero_grad()
            loss.backward()
            if cfg.max_grad_norm:
                for g in groups:
                    torch.nn.utils.clip_grad_norm_(g, cfg.max_grad_norm)
            optimizer.step()
            stats["policy_loss"].append(float(pl.detach()))
            stats["value_loss"].append(float(vl.detach()))
            stats["entropy"].append(float(ent.detach()))
            stats["approx_kl"].append(info["approx_kl"])
            stats["clipfrac"].append(info.get("clipfrac", 0.0))
            epoch_kl.append(info["approx_kl"])
            if cfg.objective == "clip" and cfg.target_kl_stop is not None and info["approx_kl"] > cfg.target_kl_stop:
                stop = True
                break
        if stop:
            break
    out = {k: float(np.mean(v)) if v else 0.0 for k, v in stats.items()}
    if cfg.objective == "kl":
        out["kl_beta"] = kl_coef.update(float(np.mean(epoch_kl)))
    return out
