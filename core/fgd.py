"""The fragmentation measure of FGD (Weng et al., "Beware of Fragmentation", ATC'23).

A node's free GPU capacity is fragmented for a task when the task could not use it; a
node's expected fragmentation under a workload weighs its task classes by popularity,
and FGD places a task where it grows least. :func:`fragmentation` works on per-GPU free
milli-GPU vectors (the ``fgd`` placement, ``bench/fragmentation.py``).
Definition: docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

__all__ = ["MILLI", "Workload", "fragmentation", "fragmentation_by_class", "whole_gpu_free_milli"]

#: milli-GPU in one GPU
MILLI = 1000


@dataclass(frozen=True, eq=False)
class Workload:
    """Target workload: task classes with their probability.

    ``gpu_milli[m]`` is the GPU demand of class ``m`` in milli-GPU: ``< 1000`` shares
    one GPU, ``k * 1000`` takes ``k`` whole GPUs, ``0`` asks for no GPU.
    ``cpu_milli[m]`` is its CPU demand (0 to ignore CPU).
    """

    gpu_milli: np.ndarray
    prob: np.ndarray
    cpu_milli: np.ndarray

    def __post_init__(self) -> None:
        g = np.asarray(self.gpu_milli, dtype=np.int64).ravel()
        p = np.asarray(self.prob, dtype=float).ravel()
        c = np.asarray(self.cpu_milli, dtype=np.int64).ravel()
        if not (len(g) == len(p) == len(c)) or len(g) == 0:
            raise ValueError("workload needs one gpu_milli, prob and cpu_milli per class, at least one class")
        if (g < 0).any() or ((g > MILLI) & (g % MILLI != 0)).any():
            raise ValueError(f"GPU demands must be 0..1000 milli or whole GPUs, got {g.tolist()}")
        if (p < 0).any() or p.sum() <= 0 or not np.isfinite(p).all():
            raise ValueError("class probabilities must be >= 0 and sum to > 0")
        object.__setattr__(self, "gpu_milli", g)
        object.__setattr__(self, "prob", p / p.sum())
        object.__setattr__(self, "cpu_milli", c)

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[float, float]]) -> "Workload":
        """From ``(gpus, probability)`` pairs; ``gpus`` may be fractional (0.5 GPU)."""
        pairs = list(pairs)
        if not pairs:
            raise ValueError("workload needs at least one (gpus, probability) pair")
        gpus = np.array([float(g) for g, _ in pairs])
        return cls(np.rint(gpus * MILLI).astype(np.int64), np.array([p for _, p in pairs], float), np.zeros(len(pairs), np.int64))

    @classmethod
    def from_requests(
        cls, gpu_milli: Iterable[int], cpu_milli: Iterable[int] | None = None, weights: Iterable[float] | None = None
    ) -> "Workload":
        """Empirical distribution of observed task requests (identical requests merged)."""
        g = np.asarray(list(gpu_milli), dtype=np.int64)
        c = np.zeros_like(g) if cpu_milli is None else np.asarray(list(cpu_milli), dtype=np.int64)
        w = np.ones(len(g)) if weights is None else np.asarray(list(weights), dtype=float)
        if len(g) == 0:
            raise ValueError("no task requests to learn a workload from")
        if not (len(c) == len(g) == len(w)):
            raise ValueError("gpu_milli, cpu_milli and weights must have the same length")
        keys, inv = np.unique(np.stack([g, c], axis=1), axis=0, return_inverse=True)
        prob = np.bincount(inv.ravel(), weights=w, minlength=len(keys))
        return cls(keys[:, 0], prob, keys[:, 1])

    def _tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(φ over 0..1000 free milli, sorted whole-GPU class sizes, cumulative mass)."""
        cached = self.__dict__.get("_tables_cache")
        if cached is None:
            v = np.arange(MILLI + 1, dtype=float)
            phi = np.zeros(MILLI + 1)
            whole: dict[int, float] = {}
            for d, p in zip(self.gpu_milli.tolist(), self.prob.tolist()):
                if d == 0:
                    phi += p * v
                elif d < MILLI:
                    phi += p * np.where(v < d, v, 0.0)
                else:
                    whole[d // MILLI] = whole.get(d // MILLI, 0.0) + p
            ks = np.array(sorted(whole), dtype=np.int64)
            cum = np.concatenate([[0.0], np.cumsum([whole[k] for k in ks.tolist()])])
            cached = (phi, ks, cum)
            object.__setattr__(self, "_tables_cache", cached)
        return cached

    def _cpu_groups(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """GPU demand -> (sorted CPU demands, mass of classes with CPU above each)."""
        cached = self.__dict__.get("_cpu_cache")
        if cached is None:
            cached = {}
            for d in np.unique(self.gpu_milli[self.cpu_milli > 0]).tolist():
                sel = (self.gpu_milli == d) & (self.cpu_milli > 0)
                order = np.argsort(self.cpu_milli[sel], kind="stable")
                cpus = self.cpu_milli[sel][order].astype(float)
                mass = self.prob[sel][order]
                # tail[i] = mass of classes with cpu > cpus[i-1]; searchsorted(right) picks it
                tail = np.concatenate([np.cumsum(mass[::-1])[::-1], [0.0]])
                cached[d] = (cpus, tail)
            object.__setattr__(self, "_cpu_cache", cached)
        return cached

    def pairs(self) -> list[tuple[float, float]]:
        return [(g / MILLI, float(p)) for g, p in zip(self.gpu_milli.tolist(), self.prob)]

    def __repr__(self) -> str:
        return f"Workload({self.pairs()})"


def _class_fragmentation(fm, total, partial, full, d: int) -> np.ndarray:
    """``F_n(m)`` of one task class with GPU demand ``d`` milli (CPU aside)."""
    if d == 0:
        return total
    if d < MILLI:
        # GPUs with less than d free cannot take the task; if none can, this is every
        # free share on the node, as the definition asks
        return np.where(fm < d, fm, 0).sum(axis=-1).astype(float)
    return np.where(full >= d // MILLI, partial, total)


def fragmentation(
    free_milli: np.ndarray, workload: Workload, cpu_free: np.ndarray | float | None = None
) -> np.ndarray:
    """Expected fragmentation ``F_n(M)`` in milli-GPU of each node.

    ``free_milli`` has shape ``(..., G)``: the free milli-GPU of each GPU of a node
    (pad nodes with fewer GPUs with 0). ``cpu_free`` (broadcast to the leading shape)
    enables the CPU test for classes with ``cpu_milli > 0``. Returns shape ``(...)``.

    Computed as ``Σ_g φ(free_g) + partial · P(K ≤ full) + total · P(K > full)``: the
    classes that share a GPU (or need none) contribute per GPU through the table
    ``φ(v) = Σ_m p_m v [v < d_m]``, the whole-GPU classes (``K`` GPUs) through the
    node's count of idle GPUs. The same as summing ``p_m F_n(m)`` class by class
    (:func:`fragmentation_by_class`), in a few array operations.
    """
    fm = _check(free_milli)
    total = fm.sum(axis=-1).astype(float)
    partial = np.where(fm < MILLI, fm, 0).sum(axis=-1).astype(float)
    full = (fm == MILLI).sum(axis=-1)
    phi, ks, cum = workload._tables()
    idx = np.searchsorted(ks, full, side="right")
    fits = cum[idx]
    out = phi[fm].sum(axis=-1) + partial * fits + total * (cum[-1] - fits)
    return _cpu_correction(out, fm, total, partial, full, workload, cpu_free)


def fragmentation_by_class(
    free_milli: np.ndarray, workload: Workload, cpu_free: np.ndarray | float | None = None
) -> np.ndarray:
    """:func:`fragmentation` written as the definition: ``Σ_m p_m F_n(m)``."""
    fm = _check(free_milli)
    total = fm.sum(axis=-1).astype(float)
    partial = np.where(fm < MILLI, fm, 0).sum(axis=-1).astype(float)
    full = (fm == MILLI).sum(axis=-1)
    out = np.zeros(total.shape)
    cpu = None if cpu_free is None else np.broadcast_to(np.asarray(cpu_free, float), total.shape)
    for d, p, c in zip(workload.gpu_milli.tolist(), workload.prob.tolist(), workload.cpu_milli.tolist()):
        f = _class_fragmentation(fm, total, partial, full, d)
        if cpu is not None and c > 0:
            f = np.where(cpu < c, total, f)
        out += p * f
    return out


def _check(free_milli) -> np.ndarray:
    fm = np.asarray(free_milli, dtype=np.int64)
    if fm.ndim == 0:
        raise ValueError("free_milli needs a trailing GPU axis")
    if fm.size and (fm.min() < 0 or fm.max() > MILLI):
        raise ValueError("free milli-GPU per GPU must lie in 0..1000")
    return fm


def _cpu_correction(out, fm, total, partial, full, workload, cpu_free):
    """Add ``p_m (total − F_n(m))`` for every class whose CPU demand exceeds the
    node's free CPU, grouping classes by GPU demand (one GPU-axis pass per group)."""
    if cpu_free is None or not (workload.cpu_milli > 0).any():
        return out
    cpu = np.broadcast_to(np.asarray(cpu_free, float), total.shape)
    for d, (cpus, tail) in workload._cpu_groups().items():
        # mass of the classes with this GPU demand that need more CPU than is free
        short = tail[np.searchsorted(cpus, cpu, side="right")]
        if short.any():
            f = _class_fragmentation(fm, total, partial, full, d)
            out = out + short * (total - f)
    return out


def whole_gpu_free_milli(free: np.ndarray, width: int) -> np.ndarray:
    """Per-GPU free milli of nodes that allocate whole GPUs: ``free[n]`` idle GPUs."""
    free = np.asarray(free, dtype=np.int64)
    return np.where(np.arange(width) < free[..., None], MILLI, 0)
