"""Gradient statistics for the scheduler's statistical efficiency (gradient noise scale).

Pollux (Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for Goodput-Optimized
Deep Learning", OSDI'21, §3.1) judges a batch size by the gradient noise scale
``B_noise = tr(Sigma) / |G|^2`` of McCandlish et al. ("An Empirical Model of
Large-Batch Training", 2018, appendix A), estimated while training from the gradient
norms data parallelism computes anyway. With ``g_b`` a gradient over ``b`` samples,
``E|g_b|^2 = |G|^2 + tr(Sigma)/b``; measuring it at two batch sizes — each worker's
local gradient over its ``b`` samples (``|g_b|^2`` averaged over workers) and the
all-reduced gradient over the global batch ``B`` (``|g_B|^2``) — gives the unbiased
estimates

    |G|^2     ~= (B |g_B|^2 - b |g_b|^2) / (B - b)
    tr(Sigma) ~= (|g_b|^2 - |g_B|^2) / (1/b - 1/B)

(McCandlish et al., eqs. A.2-A.3). Single estimates are very noisy, so both are
smoothed with an exponential moving average (bias-corrected as in Adam: Kingma & Ba
2015, §3) before they are reported as ``gradSqr`` (``|G|^2``) and ``gradVar``
(``tr(Sigma)``, the per-sample variance).

Uneven shares: worker ``r`` with ``s_r`` samples has ``E|g_r|^2 = |G|^2 + tr(Sigma)/s_r``,
so the workers' mean is the same law with ``b = 1 / mean_r(1/s_r)`` (the harmonic mean
of the shares); that is the ``b`` used. One worker has no second batch size: nothing is
estimated (a script may feed :meth:`GradientNoiseScale.update` from two micro-batches
itself). With an adaptive optimizer, Pollux measures preconditioned gradients; this
estimator measures the raw ones.

:class:`GradientNoiseScale` reads the local gradients through a
DistributedDataParallel communication hook (the bucket *before* the all-reduce), so no
extra backward pass or gradient copy is made; the cost per step is one norm per bucket,
one norm of the reduced gradient and an all-reduce of one number.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["noise_estimate", "GradientNoiseScale"]


def noise_estimate(local_sqr: float, global_sqr: float, local_batch: float, global_batch: float) -> tuple[float, float]:
    """``(|G|^2, tr(Sigma))`` from one observation: ``local_sqr`` the workers' mean
    squared norm of gradients over ``local_batch`` samples, ``global_sqr`` the squared
    norm of the gradient over ``global_batch`` samples (McCandlish et al. 2018, A.2-A.3)."""
    b, big = float(local_batch), float(global_batch)
    if not (0 < b < big):
        raise ValueError(f"need 0 < local batch < global batch, got {local_batch} and {global_batch}")
    grad_sqr = (big * global_sqr - b * local_sqr) / (big - b)
    grad_var = (local_sqr - global_sqr) / (1.0 / b - 1.0 / big)
    return grad_sqr, grad_var


class GradientNoiseScale:
    """Bias-corrected EMAs of ``|G|^2`` and ``tr(Sigma)``.

    With DDP: :meth:`attach` the wrapped model (registers the communication hook), then
    every step ``begin_step(step.shares, rank)`` before the backward passes and
    :meth:`end_step` after the last one (a collective: every rank calls it). Without
    DDP, feed :meth:`update` directly."""

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1), got {decay}")
        self.decay = decay
        self._sqr = 0.0
        self._var = 0.0
        self._weight = 0.0  # 1 - decay^t: the EMA's bias correction
        self.updates = 0
        self._local = None  # tensor: sum of squared norms of this step's local buckets
        self._scale = 1.0
        self._shares: tuple[int, ...] = ()
        self._model: Any = None

    # ------------------------------------------------------------------ pure part
    def update(self, local_sqr: float, global_sqr: float, local_batch: float, global_batch: float) -> None:
        """Fold one observation into the EMAs (non-finite observations are skipped)."""
        g, v = noise_estimate(local_sqr, global_sqr, local_batch, global_batch)
        if not (math.isfinite(g) and math.isfinite(v)):
            return
        d = self.decay
        self._sqr = d * self._sqr + (1 - d) * g
        self._var = d * self._var + (1 - d) * v
        self._weight = d * self._weight + (1 - d)
        self.updates += 1

    @property
    def grad_sqr(self) -> float | None:
        """Smoothed ``|G|^2`` (None before the first observation)."""
        return self._sqr / self._weight if self._weight > 0 else None

    @property
    def grad_var(self) -> float | None:
        """Smoothed ``tr(Sigma)`` (None before the first observation)."""
        return self._var / self._weight if self._weight > 0 else None

    @property
    def noise_scale(self) -> float | None:
        """``B_noise = tr(Sigma) / |G|^2`` (None while unknown or ``|G|^2 <= 0``)."""
        g, v = self.grad_sqr, self.grad_var
        return v / g if g is not None and v is not None and g > 0 else None

    def state_dict(self) -> dict[str, float]:
        return {"decay": self.decay, "sqr": self._sqr, "var": self._var, "weight": self._weight,
                "updates": self.updates}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._sqr, self._var = float(state["sqr"]), float(state["var"])
        self._weight, self.updates = float(state["weight"]), int(state["updates"])

    # ------------------------------------------------------------------ with DDP
    def attach(self, ddp_model: Any) -> "GradientNoiseScale":
        """Register the communication hook on a ``DistributedDataParallel`` model: it
        records each bucket's squared norm before doing DDP's usual averaging
        all-reduce."""
        ddp_model.register_comm_hook(None, self._hook)
        self._model = ddp_model
        return self

    def _hook(self, state, bucket):  # no annotations: DDP checks them against its own types
        import torch
        import torch.distributed as dist

        buf = bucket.buffer()
        sqr = torch.linalg.vector_norm(buf, dtype=torch.float64).pow(2)
        self._local = sqr if self._local is None else self._local + sqr
        buf.div_(dist.get_world_size())
        fut = dist.all_reduce(buf, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    def begin_step(self, shares: tuple[int, ...], rank: int) -> None:
        """Before this step's backward passes: every rank's sample count (``Step.shares``)
        and this rank's index. The local gradient is ``W/B`` times the sum of its
        per-sample gradients (:func:`~rlsched.trainer.batching.loss_scale`), so the
        per-worker mean gradient is the local one times ``B / (W s_r)``."""
        total, w, mine = sum(shares), len(shares), shares[rank]
        self._shares = tuple(shares)
        self._scale = (total / (w * mine)) ** 2 if mine else 0.0
        self._local = None

    def end_step(self) -> bool:
        """After the step's last backward pass (before the optimizer step): measure and
        fold in this step's observation. A collective when there is more than one rank;
        every rank calls it. Returns whether an observation was made (not with one
        worker, nor on a step where some rank had no sample)."""
        import torch
        import torch.distributed as dist

        shares, local = self._shares, self._local
        self._local = None
        if self._model is None or len(shares) < 2 or min(shares) == 0 or local is None:
            return False
        params = [p for p in self._model.parameters() if p.grad is not None]
        global_sqr = sum(torch.linalg.vector_norm(p.grad, dtype=torch.float64).pow(2) for p in params)
        local = local * self._scale
        dist.all_reduce(local)
        w = len(shares)
        b = w / sum(1.0 / s for s in shares)  # harmonic mean of the shares
        self.update(float(local) / w, float(global_sqr), b, float(sum(shares)))
        return True
