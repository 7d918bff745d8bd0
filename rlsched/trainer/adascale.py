"""The learning rate and the progress of a run whose batch size the scheduler changes.

AdaScale (Johnson, Agrawal, Gu, Guestrin, ICML 2020, Algorithm 1), as AdaptDL applies
it: at scale ``S = B / B0`` the base schedule's learning rate is multiplied by the gain
ratio ``r`` (``1 <= r <= S``) and progress counts scale-invariant iterations, so a run
trains to a progress target whatever batches it gets. Fixed rules (``linear``,
``sqrt``, ``legw``) can replace the measured gain.
Formulas: docs/trainer.md, docs/design-notes.md.
"""

from __future__ import annotations

import math
from typing import Any, Callable

__all__ = ["AdaScale", "RULES", "gain_ratio", "rule_gain"]

#: the learning-rate rules, AdaScale's measured gain first
RULES = ("adascale", "linear", "sqrt", "legw")

#: AdaScale's gain while no gradient statistics exist (see the module docstring)
GAIN_BEFORE_STATISTICS = 1.0


def gain_ratio(grad_sqr: float, grad_var: float, base_batch: float, batch: float) -> float:
    """AdaScale's gain ``r`` at ``batch`` against ``base_batch`` from ``|G|^2`` and the
    per-sample ``tr(Sigma)``, clamped to the range between 1 and the scale (the
    estimates are noisy; the true ratio lies there). Negative estimates count as 0;
    with both 0, 1."""
    if base_batch <= 0 or batch <= 0:
        raise ValueError(f"batch sizes must be > 0, got base {base_batch} and {batch}")
    scale = batch / base_batch
    sqr, var = max(float(grad_sqr), 0.0), max(float(grad_var), 0.0)
    if not (math.isfinite(sqr) and math.isfinite(var)):
        raise ValueError(f"gradient statistics must be finite, got {grad_sqr}, {grad_var}")
    num, den = var / base_batch + sqr, var / batch + sqr
    r = num / den if den > 0 else 1.0
    return min(max(r, min(1.0, scale)), max(1.0, scale))


def rule_gain(rule: str, scale: float) -> float:
    """The gain of a fixed rule at ``scale``: ``linear`` ``S``, ``sqrt`` and ``legw``
    ``sqrt(S)``."""
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if rule == "linear":
        return float(scale)
    if rule in ("sqrt", "legw"):
        return math.sqrt(scale)
    raise ValueError(f"no fixed gain for rule {rule!r}; fixed rules: linear, sqrt, legw")


class AdaScale:
    """Sets an optimizer's learning rates from the base schedule and the gain, and
    counts progress in base-batch iterations.

    ``base_batch``: the global batch the script's learning rate was tuned for (``B0``).
    ``schedule``: the multiplier of each param group's base LR (the ``lr`` it has when
    this object is made) as a function of progress in base-batch iterations (default
    constant 1). ``rule``: one of :data:`RULES`. ``gns``: the
    :class:`~rlsched.trainer.gradstats.GradientNoiseScale` AdaScale reads (its latest
    estimates, restored ones included). ``warmup``: a linear warmup over that many
    base-batch iterations of progress (``legw``: over ``S * warmup * B0`` samples).
    ``dataset_size``: the samples of one epoch, for :attr:`epochs`.

    Every step, after the gradients are ready and before ``optimizer.step()``::

        ada.step(plan.global_batch, samples=step.global_size)

    sets the learning rates, steps the optimizer and advances :attr:`progress`."""

    def __init__(self, optimizer: Any, *, base_batch: int, schedule: Callable[[float], float] | None = None,
                 rule: str = "adascale", gns: Any = None, warmup: float = 0.0,
                 dataset_size: int | None = None) -> None:
        if rule not in RULES:
            raise ValueError(f"unknown learning-rate rule {rule!r}; known: {', '.join(RULES)}")
        if isinstance(base_batch, bool) or not isinstance(base_batch, int) or base_batch < 1:
            raise ValueError(f"base_batch must be a whole number >= 1, got {base_batch!r}")
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        if dataset_size is not None and dataset_size < 1:
            raise ValueError(f"dataset_size must be >= 1, got {dataset_size}")
        self.optimizer, self.base_batch, self.rule, self.gns = optimizer, base_batch, rule, gns
        self.schedule = schedule or (lambda _progress: 1.0)
        self.warmup, self.dataset_size = float(warmup), dataset_size
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups] if optimizer is not None else []
        #: base-batch iterations of progress so far (the paper's tau)
        self.progress = 0.0
        #: samples trained on so far (every batch size)
        self.samples = 0
        self.steps = 0
        #: the gain and scale of the last step
        self.last_gain = 1.0
        self.last_scale = 1.0

    # ------------------------------------------------------------------ pure part
    def gain(self, batch: int) -> float:
        """The gain at global batch ``batch`` by this object's rule."""
        scale = batch / self.base_batch
        if self.rule != "adascale":
            return rule_gain(self.rule, scale)
        stats = None if self.gns is None else self.gns.estimates()
        if stats is None:
            return GAIN_BEFORE_STATISTICS
        return gain_ratio(stats[0], stats[1], self.base_batch, batch)

    def lr_factor(self, batch: int) -> float:
        """What the base LRs are multiplied by at this step: gain x schedule x warmup."""
        return self.gain(batch) * float(self.schedule(self.progress)) * self._warmup_factor(batch)

    def _warmup_factor(self, batch: int) -> float:
        if self.warmup <= 0:
            return 1.0
        if self.rule == "legw":  # warmup epochs x S: samples against S * warmup * B0
            return min(1.0, (self.samples + batch) / (batch * self.warmup))
        return min(1.0, (self.progress + 1.0) / self.warmup)

    @property
    def progress_samples(self) -> float:
        """Progress in base-batch samples (``progress * B0``)."""
        return self.progress * self.base_batch

    @property
    def epochs(self) -> float | None:
        """Progress in base-batch epochs (``progress * B0 / dataset_size``; None without
        ``dataset_size``): what the progress reports carry as ``scaleInvariantEpochs``."""
        return None if self.dataset_size is None else self.progress_samples / self.dataset_size

    def reached(self, epochs: float) -> bool:
        """Whether progress has reached ``epochs`` base-batch epochs (needs
        ``dataset_size``; a relative 1e-9 absorbs rounding)."""
        if self.dataset_size is None:
            raise ValueError("reached(epochs) needs dataset_size")
        return self.progress_samples >= epochs * self.dataset_size * (1 - 1e-9)

    def advance(self, batch: int, samples: int | None = None, gain: float | None = None) -> float:
        """Count one step at global batch ``batch`` of which ``samples`` were taken (an
        epoch's last batch may be short: it counts ``samples / batch`` of the gain).
        Returns the progress added."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        samples = batch if samples is None else samples
        r = self.gain(batch) if gain is None else gain
        add = r * samples / batch
        self.progress += add
        self.samples += int(samples)
        self.steps += 1
        self.last_gain, self.last_scale = r, batch / self.base_batch
        return add

    # ------------------------------------------------------------------ with an optimizer
    def set_lr(self, batch: int) -> float:
        """Set every param group's ``lr`` to its base LR times :meth:`lr_factor`;
        returns the factor."""
        factor = self.lr_factor(batch)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor
        return factor

    def step(self, batch: int, samples: int | None = None, *, optimizer_step: Callable[[], Any] | None = None) -> float:
        """Set the learning rates for a step at global batch ``batch``, step the
        optimizer (``optimizer_step``, e.g. ``lambda: scaler.step(opt)`` under AMP;
        default ``optimizer.step()``) and advance the progress. Returns the gain."""
        r = self.gain(batch)
        self.set_lr(batch)
        (optimizer_step or self.optimizer.step)()
        self.advance(batch, samples, gain=r)
        return r

    def state_dict(self) -> dict[str, Any]:
        """Progress, base batch, rule and the gradient statistics' EMAs (what a restart
        at any batch size needs)."""
        return {"rule": self.rule, "base_batch": self.base_batch, "base_lrs": list(self.base_lrs),
                "progress": self.progress, "samples": self.samples, "steps": self.steps,
                "warmup": self.warmup, "gns": None if self.gns is None else self.gns.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output. The base batch and base LRs are the
        checkpoint's (progress is counted in its base batch), whatever batch this
        generation runs at; the rule is the script's own."""
        self.base_batch = int(state["base_batch"])
        if state.get("base_lrs"):
            self.base_lrs = [float(v) for v in state["base_lrs"]]
        self.progress, self.samples, self.steps = float(state["progress"]), int(state["samples"]), int(state["steps"])
        if self.gns is not None and state.get("gns") is not None:
            self.gns.load_state_dict(state["gns"])
