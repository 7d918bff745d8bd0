"""The evaluation protocol's fixed parts: disjoint seed splits and paired bootstrap CIs.

Seeds 0–9,999 train, 10,000–10,999 validate (checkpoints, hyper-parameters, the strongest
baselines), 20,000–20,999 test (the reported tables only); :func:`split_of` lets a
training entry point refuse test seeds. :func:`paired_bootstrap` gives the percentile
bootstrap 95% interval of a paired difference (Efron and Tibshirani, 1993, ch. 13).
Details: docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

__all__ = ["SPLITS", "SplitError", "seeds", "split_of", "PairedDiff", "paired_bootstrap"]

#: split name -> (first seed, last seed + 1); the ranges are disjoint.
SPLITS: dict[str, tuple[int, int]] = {
    "train": (0, 10_000),
    "validation": (10_000, 11_000),
    "test": (20_000, 21_000),
}


class SplitError(ValueError):
    """A seed outside its split, an unknown split, or more seeds than a split holds."""


def seeds(split: str, n: int) -> list[int]:
    """The first ``n`` seeds of ``split`` (deterministic, so every run pairs)."""
    try:
        lo, hi = SPLITS[split]
    except KeyError:
        raise SplitError(f"unknown seed split {split!r}; known: {', '.join(SPLITS)}") from None
    if not 1 <= n <= hi - lo:
        raise SplitError(f"split {split!r} holds {hi - lo} seeds; asked for {n}")
    return list(range(lo, lo + n))


def split_of(seed: int) -> str:
    for name, (lo, hi) in SPLITS.items():
        if lo <= seed < hi:
            return name
    raise SplitError(f"seed {seed} is in no split ({', '.join(f'{k} {lo}..{hi - 1}' for k, (lo, hi) in SPLITS.items())})")


@dataclass(frozen=True)
class PairedDiff:
    """``a`` against ``b`` over the same seeds; negative means ``a`` is lower (better JCT)."""

    n: int
    mean_a: float
    mean_b: float
    diff: float  # mean(a - b)
    diff_lo: float
    diff_hi: float
    rel: float  # mean(a) / mean(b) - 1
    rel_lo: float
    rel_hi: float

    def below(self) -> bool:
        """The whole 95% interval of the difference lies below zero."""
        return self.diff_hi < 0

    def above(self) -> bool:
        return self.diff_lo > 0

    def to_dict(self) -> dict:
        return asdict(self)


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, resamples: int = 10_000,
                     seed: int = 0, level: float = 0.95) -> PairedDiff:
    """Percentile bootstrap of the paired difference of ``a`` and ``b`` (same seeds, same order)."""
    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired samples need equal 1-D shapes, got {x.shape} and {y.shape}")
    if x.size < 2:
        raise ValueError("a paired bootstrap needs at least 2 seeds")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        raise ValueError("paired samples must be finite")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    xs, ys = x[idx].mean(axis=1), y[idx].mean(axis=1)
    d = xs - ys
    with np.errstate(divide="ignore", invalid="ignore"):
        r = xs / ys - 1.0
    q = [(1 - level) / 2 * 100, (1 + level) / 2 * 100]
    dlo, dhi = np.percentile(d, q)
    rlo, rhi = np.nanpercentile(r, q) if np.any(np.isfinite(r)) else (float("nan"), float("nan"))
    mb = float(y.mean())
    return PairedDiff(n=int(x.size), mean_a=float(x.mean()), mean_b=mb, diff=float((x - y).mean()),
                      diff_lo=float(dlo), diff_hi=float(dhi),
                      rel=float(x.mean() / mb - 1.0) if mb else float("nan"),
                      rel_lo=float(rlo), rel_hi=float(rhi))
