"""Gradient statistics for the scheduler's statistical efficiency (gradient noise scale).

Pollux (Qiao et al., OSDI'21, §3.1) judges a batch size by the gradient noise scale
``tr(Sigma) / |G|^2`` (McCandlish et al., "An Empirical Model of Large-Batch Training",
2018, appendix A), estimated from the local and all-reduced gradient norms data
parallelism computes anyway, smoothed and reported as ``gradSqr`` and ``gradVar``.
:class:`GradientNoiseScale` reads them through a DDP communication hook.
Estimators: docs/trainer.md, docs/design-notes.md.
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

    With DDP: :meth:`attach` the wrapped model (registers the communication hook and,
    for one worker, a hook on each parameter's gradient accumulation), then every step
    ``begin_step(step.shares, rank, step.micro_batches)`` before the backward passes
    and :meth:`end_step` after the last one (a collective: every rank calls it).
    Without DDP, :meth:`attach` the module (one worker) or feed :meth:`update`.

    :attr:`grad_sqr`/:attr:`grad_var` (what is reported) are None until this object
    has measured something itself: estimates restored by :meth:`load_state_dict` are
    kept for the smoothing and for :meth:`estimates` (AdaScale's gain), never reported
    as measured."""

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must lie in [0, 1), got {decay}")
        self.decay = decay
        self._sqr = 0.0
        self._var = 0.0
        self._weight = 0.0  # 1 - decay^t: the EMA's bias correction
        self.updates = 0
        self._measured = False  # an observation made since construction or the last restore
        self._local = None  # tensor: sum of squared norms of this step's local buckets
        self._scale = 1.0
        self._shares: tuple[int, ...] = ()
        self._micro: tuple[int, ...] = ()
        self._first: dict[int, Any] = {}  # one worker: squared norm of each gradient after the first micro-batch
        self._armed = False
        self._params: list[Any] = []
        self._user_hook: Any = None
        self._handles: list[Any] = []

    # ------------------------------------------------------------------ pure part
    def update(self, local_sqr: float, global_sqr: float, local_batch: float, global_batch: float) -> bool:
        """Fold one observation into the EMAs; non-finite observations are skipped.
        Returns whether it was folded in."""
        g, v = noise_estimate(local_sqr, global_sqr, local_batch, global_batch)
        if not (math.isfinite(g) and math.isfinite(v)):
            return False
        d = self.decay
        self._sqr = d * self._sqr + (1 - d) * g
        self._var = d * self._var + (1 - d) * v
        self._weight = d * self._weight + (1 - d)
        self.updates += 1
        self._measured = True
        return True

    def estimates(self) -> tuple[float, float] | None:
        """The smoothed ``(|G|^2, tr(Sigma))``, restored ones included (None before any)."""
        if self._weight <= 0:
            return None
        return self._sqr / self._weight, self._var / self._weight

    @property
    def measured(self) -> bool:
        """Whether an observation was made since construction or the last restore."""
        return self._measured

    @property
    def grad_sqr(self) -> float | None:
        """Smoothed ``|G|^2`` (None before this object's first observation)."""
        est = self.estimates()
        return est[0] if est is not None and self._measured else None

    @property
    def grad_var(self) -> float | None:
        """Smoothed ``tr(Sigma)`` (None before this object's first observation)."""
        est = self.estimates()
        return est[1] if est is not None and self._measured else None

    @property
    def noise_scale(self) -> float | None:
        """``B_noise = tr(Sigma) / |G|^2`` (None while unknown or ``|G|^2 <= 0``)."""
        g, v = self.grad_sqr, self.grad_var
        return v / g if g is not None and v is not None and g > 0 else None

    def state_dict(self) -> dict[str, float]:
        return {"decay": self.decay, "sqr": self._sqr, "var": self._var, "weight": self._weight,
                "updates": self.updates}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore the EMAs; they are not reported until a new observation is made."""
        self._sqr, self._var = float(state["sqr"]), float(state["var"])
        self._weight, self.updates = float(state["weight"]), int(state["updates"])
        self._measured = False

    # ------------------------------------------------------------------ with a model
    def attach(self, model: Any, comm_hook: Any = None, hook_state: Any = None) -> "GradientNoiseScale":
        """Hook into ``model``: a ``DistributedDataParallel`` model gets a communication
        hook that records each bucket's squared norm, then runs ``comm_hook(hook_state,
        bucket)`` (a user's hook: fp16 compression, PowerSGD...) or, without one, DDP's
        averaging all-reduce; every parameter gets a gradient-accumulation hook (it only
        records, on the first micro-batch of a one-worker step). A plain module gets the
        latter only."""
        if hasattr(model, "register_comm_hook"):
            self._user_hook = comm_hook
            model.register_comm_hook(hook_state, self._hook)
        elif comm_hook is not None:
            raise ValueError("comm_hook needs a DistributedDataParallel model")
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self._params]
        return self

    def _hook(self, state, bucket):  # no annotations: DDP checks them against its own types
        import torch
        import torch.distributed as dist

        buf = bucket.buffer()
        sqr = torch.linalg.vector_norm(buf, dtype=torch.float64).pow(2)
        self._local = sqr if self._local is None else self._local + sqr
        if self._user_hook is not None:
            return self._user_hook(state, bucket)
        buf.div_(dist.get_world_size())
        fut = dist.all_reduce(buf, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    def _on_grad(self, param) -> None:
        if self._armed and id(param) not in self._first and param.grad is not None:
            import torch

            self._first[id(param)] = torch.linalg.vector_norm(param.grad.detach(), dtype=torch.float64).pow(2)

    def begin_step(self, shares: tuple[int, ...], rank: int, micro_batches: Any = None) -> None:
        """Before this step's backward passes: every rank's sample count (``Step.shares``),
        this rank's index and its micro-batches (``Step.micro_batches``, or their sizes;
        one worker measures from them). The local gradient is ``W/B`` times the sum of
        its per-sample gradients (:func:`~rlsched.trainer.batching.loss_scale`), so the
        per-worker mean gradient is the local one times ``B / (W s_r)``."""
        total, w, mine = sum(shares), len(shares), shares[rank]
        self._shares = tuple(shares)
        self._scale = (total / (w * mine)) ** 2 if mine else 0.0
        self._local = None
        sizes = tuple(m if isinstance(m, int) else len(m) for m in (micro_batches or ()))
        self._micro = sizes
        self._first = {}
        self._armed = w == 1 and len(sizes) >= 2 and 0 < sizes[0] < total

    def end_step(self, amp_scale: float | None = None) -> bool:
        """After the step's last backward pass (before the optimizer step, and before a
        GradScaler's ``unscale_``): measure and fold in this step's observation. A
        collective when there is more than one rank; every rank calls it.
        ``amp_scale``: the loss scale the gradients carry (``scaler.get_scale()``);
        squared norms are divided by its square, and a step whose gradients are not
        finite is skipped. Returns whether an observation was folded in (not with one
        worker without micro-batches, nor on a step where some rank had no sample)."""
        import torch
        import torch.distributed as dist

        shares, local, first = self._shares, self._local, self._first
        self._local, self._first, self._armed = None, {}, False
        if amp_scale is not None and not (math.isfinite(amp_scale) and amp_scale > 0):
            raise ValueError(f"amp_scale must be a finite number > 0, got {amp_scale}")
        unscale = 1.0 if amp_scale is None else 1.0 / (float(amp_scale) ** 2)
        params = [p for p in self._params if p.grad is not None]
        if not params or not shares or min(shares) == 0:
            return False
        if len(shares) == 1:
            sizes = self._micro
            if not first or len(sizes) < 2:
                return False
            global_sqr = float(sum(torch.linalg.vector_norm(p.grad, dtype=torch.float64).pow(2) for p in params))
            total = float(shares[0])
            # after the first micro-batch the gradient is (b1/B) times that micro-batch's mean
            first_sqr = float(sum(first.values())) * (total / sizes[0]) ** 2
            return self.update(first_sqr * unscale, global_sqr * unscale, sizes[0], total)
        if local is None:
            return False
        global_sqr = sum(torch.linalg.vector_norm(p.grad, dtype=torch.float64).pow(2) for p in params)
        local = local * self._scale
        dist.all_reduce(local)
        w = len(shares)
        b = w / sum(1.0 / s for s in shares)  # harmonic mean of the shares
        return self.update(float(local) / w * unscale, float(global_sqr) * unscale, b, float(sum(shares)))
