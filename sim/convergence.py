"""A small, pure model of how training accuracy and loss evolve.

Accuracy and loss are saturating functions of effective epochs (samples over the
dataset, discounted by the statistical efficiency of the global batch), so adding
workers has diminishing returns; evaluation noise comes from the model's own seed. The
simulator, the fake trainer and the RL environments all use it.
Formulas: docs/design-notes.md.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from rlsched.core.planning import CONVERGENCE_WINDOW, convergence_gains

__all__ = ["ConvergenceModel", "stop_epoch"]


class ConvergenceModel:
    """Accuracy/loss curves of one training job (see module docstring for formulas)."""

    __slots__ = (
        "samples_per_epoch",
        "acc_max",
        "acc0",
        "loss0",
        "loss_min",
        "tau",
        "gamma",
        "noise",
        "seed",
        "_noise_cache",
        "_noise_given",
    )
    # the noise sequence may be given (``noise_values``: standard normals, one per
    # epoch starting at epoch 1) instead of drawn from ``seed``; the simulator draws
    # all jobs' sequences in one call, which is much faster than one Generator per job

    def __init__(
        self,
        samples_per_epoch: int,
        *,
        acc_max: float = 0.9,
        acc0: float = 0.1,
        loss0: float = 2.3,
        loss_min: float = 0.05,
        tau: float = 6.0,
        gamma: float = 0.05,
        noise: float = 0.002,
        seed: int = 0,
        noise_values: np.ndarray | None = None,
    ) -> None:
        if samples_per_epoch <= 0:
            raise ValueError(f"samples_per_epoch must be > 0, got {samples_per_epoch}")
        if not (0.0 <= acc0 <= acc_max <= 1.0):
            raise ValueError(f"need 0 <= acc0 <= acc_max <= 1, got {acc0}, {acc_max}")
        if tau <= 0 or gamma < 0 or noise < 0:
            raise ValueError("need tau > 0, gamma >= 0, noise >= 0")
        self.samples_per_epoch = int(samples_per_epoch)
        self.acc_max = float(acc_max)
        self.acc0 = float(acc0)
        self.loss0 = float(loss0)
        self.loss_min = float(loss_min)
        self.tau = float(tau)
        self.gamma = float(gamma)
        self.noise = float(noise)
        self.seed = int(seed)
        self._noise_cache: np.ndarray | None = None
        self._noise_given = noise_values  # turned into the cache on first use

    def __repr__(self) -> str:
        return (
            f"ConvergenceModel(samples_per_epoch={self.samples_per_epoch}, acc_max={self.acc_max}, "
            f"tau={self.tau}, gamma={self.gamma}, noise={self.noise}, seed={self.seed})"
        )

    # ------------------------------------------------------------------ curves
    def efficiency(self, workers: int) -> float:
        """Statistical efficiency of one sample at ``workers`` data-parallel workers."""
        return 1.0 / (1.0 + self.gamma * (max(int(workers), 1) - 1))

    def effective_epochs(self, samples: float, workers: int = 1) -> float:
        return samples / self.samples_per_epoch * self.efficiency(workers)

    def accuracy_at(self, eff_epochs):
        """Noise-free accuracy after ``eff_epochs`` effective epochs (scalar or array)."""
        return self.acc_max - (self.acc_max - self.acc0) * np.exp(-np.asarray(eff_epochs) / self.tau)

    def loss_at(self, eff_epochs):
        return self.loss_min + (self.loss0 - self.loss_min) * np.exp(-np.asarray(eff_epochs) / self.tau)

    def accuracy(self, samples: float, workers: int = 1) -> float:
        """Noise-free accuracy after ``samples`` samples at a constant ``workers``."""
        e = self.effective_epochs(samples, workers)
        return self.acc_max - (self.acc_max - self.acc0) * math.exp(-e / self.tau)

    def loss(self, samples: float, workers: int = 1) -> float:
        e = self.effective_epochs(samples, workers)
        return self.loss_min + (self.loss0 - self.loss_min) * math.exp(-e / self.tau)

    def epochs_to(self, accuracy: float, workers: int = 1) -> float:
        """Raw epochs needed to reach ``accuracy`` (noise-free) at ``workers``; inf if never."""
        gap = (self.acc_max - accuracy) / (self.acc_max - self.acc0) if self.acc_max > self.acc0 else 0.0
        if gap <= 0:
            return math.inf
        if gap >= 1:
            return 0.0
        return -self.tau * math.log(gap) / self.efficiency(workers)

    # ------------------------------------------------------------------ noise
    def noise_at(self, epochs) -> np.ndarray:
        """Evaluation noise after each epoch in ``epochs`` (1-based ints), deterministic."""
        e = np.asarray(epochs, dtype=np.int64)
        if self.noise == 0.0 or e.size == 0:
            return np.zeros(e.shape)
        need = int(e.max()) + 1
        if self._noise_cache is None and self._noise_given is not None:
            self._noise_cache = np.concatenate([[0.0], np.asarray(self._noise_given, dtype=float)]) * self.noise
        cache = self._noise_cache
        if cache is None or len(cache) < need:
            n = max(need, 64, 0 if cache is None else 2 * len(cache))
            fresh = np.random.default_rng(self.seed).standard_normal(n) * self.noise
            if cache is not None:  # keep given values, extend from the seed
                fresh[: len(cache)] = cache
            cache = self._noise_cache = fresh
        return cache[e]

    def evaluate(self, epochs, eff_epochs) -> np.ndarray:
        """Reported accuracy after ``epochs`` (1-based) at ``eff_epochs``: curve + noise,
        clipped to [0, 1]."""
        return np.clip(self.accuracy_at(eff_epochs) + self.noise_at(epochs), 0.0, 1.0)


def stop_epoch(
    accs: np.ndarray,
    first_epoch: int,
    prior: Sequence[float],
    streak: int,
    beta: float,
    patience: int,
    max_epochs: int,
    window: int = CONVERGENCE_WINDOW,
) -> int:
    """The epoch at which training stops: RLPTO's β stop as core's
    :class:`~rlsched.core.planning.ScalingPlanner` judges it.

    ``accs[k]`` is the accuracy reported after epoch ``first_epoch + k``; ``prior`` the
    accuracies reported before it, oldest first (empty when no epoch was evaluated
    yet), and ``streak`` the number of consecutive evaluations so far whose gain was
    below ``beta``. The gain after an evaluation is
    :func:`~rlsched.core.planning.convergence_gain` (the mean gain over the last
    ``window`` evaluations, with the same arithmetic). Training stops after
    ``patience`` consecutive gains below ``beta`` or at ``max_epochs``. Returns
    ``max_epochs`` when the criterion never fires in ``accs``.
    """
    if patience < 1:
        raise ValueError("patience must be >= 1")
    n = len(accs)
    if n == 0:
        return max_epochs
    before = np.asarray(prior, dtype=float)[-window:] if len(prior) else np.empty(0)
    gains = convergence_gains(np.concatenate([before, np.asarray(accs, dtype=float)]), window)[len(before):]
    small = gains < beta
    # length of the run of small gains ending at each index, counting the prior streak
    idx = np.arange(n)
    last_big = np.maximum.accumulate(np.where(small, -1, idx))
    run = idx - last_big
    run = np.where(last_big < 0, run + streak, run)  # no big gain yet: extend prior streak
    hit = np.flatnonzero(run >= patience)
    if hit.size:
        return min(first_epoch + int(hit[0]), max_epochs)
    return max_epochs
