"""Box-bounded nonlinear least squares for many small problems at once.

Levenberg–Marquardt vectorised over a batch of independent problems (Madsen, Nielsen &
Tingleff, "Methods for non-linear least squares problems", 2004, §3.2; Moré, 1978),
bounds by active sets: a scheduling decision fits one small throughput model per job,
and fitted together they are one array program. Pure numpy, deterministic.
Damping and stopping rules: docs/design-notes.md.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["Residuals", "minimize"]

#: ``fun(x, rows) -> (r, J)``: residuals ``r[b, i]`` and their Jacobian ``J[b, i, k]``
#: at parameters ``x[b, k]`` of the problems ``rows`` (indices into the batch)
Residuals = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]

_DAMP_START, _DAMP_MAX = 1e-3, 1e16


def minimize(fun: Residuals, x0: np.ndarray, lower: np.ndarray, upper: np.ndarray, *,
             ftol: float = 1e-12, xtol: float = 1e-10, gtol: float = 1e-10,
             max_iter: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """Minimise ``½‖r_b(x_b)‖²`` within ``lower <= x_b <= upper`` for every problem ``b``.

    ``x0`` (``B × P``) must lie in the box. Returns ``(x, cost)``: the parameters
    (``B × P``) and ``½‖r‖²`` (``B``) of each problem at its last accepted point."""
    x = np.array(x0, dtype=float, copy=True)
    if x.ndim != 2:
        raise ValueError(f"x0 must be B x P, got shape {x.shape}")
    B, P = x.shape
    lower, upper = (np.asarray(b, dtype=float) for b in (lower, upper))
    # bounds of one shape for every problem stay one row (they broadcast)
    lower, upper = (b if b.shape == (P,) else np.broadcast_to(b, x.shape) for b in (lower, upper))
    if np.any(x < lower) or np.any(x > upper):
        raise ValueError("x0 must lie within the bounds")
    cost = np.zeros(B)
    if B == 0:
        return x, cost
    every = np.arange(B)
    r, J = fun(x, every)
    cost[:] = 0.5 * np.einsum("bi,bi->b", r, r)
    g = np.einsum("bik,bi->bk", J, r)
    H = np.einsum("bik,bil->bkl", J, J)
    damp = np.full(B, _DAMP_START)
    grow = np.full(B, 2.0)
    scale = np.maximum(np.einsum("bkk->bk", H), 1e-12)  # Moré: the largest diag(JᵀJ) seen
    live = every
    eye = np.eye(P)
    for _ in range(max_iter):
        if live.size == 0:
            break
        xl, gl, Hl, dl = x[live], g[live], H[live], damp[live]
        lo, hi = (b if b.ndim == 1 else b[live] for b in (lower, upper))
        held = ((xl <= lo) & (gl > 0)) | ((xl >= hi) & (gl < 0))
        free = ~held
        pg = np.where(free, gl, 0.0)
        done = np.max(np.abs(pg), axis=1) <= gtol
        # damped normal equations on the free parameters, identity on the held ones
        D = np.where(free, dl[:, None] * scale[live], 1.0)
        A = np.where(free[:, :, None] & free[:, None, :], Hl, 0.0) + eye * D[:, None, :]
        trial = np.clip(xl - np.linalg.solve(A, pg[:, :, None])[:, :, 0], lo, hi)
        h = trial - xl
        r_new, J_new = fun(trial, live)
        c_new = 0.5 * np.einsum("bi,bi->b", r_new, r_new)
        # gain ratio: the actual reduction over the Gauss-Newton model's at h
        predicted = -(np.einsum("bk,bk->b", gl, h) + 0.5 * np.einsum("bk,bkl,bl->b", h, Hl, h))
        actual = cost[live] - c_new
        gain = np.where(predicted > 0, actual / np.where(predicted > 0, predicted, 1.0), -1.0)
        better = np.isfinite(c_new) & (c_new < cost[live])
        small = (actual <= ftol * cost[live]) | (_norm(h) <= xtol * (xtol + _norm(xl)))
        acc = live[better]
        x[acc] = trial[better]
        cost[acc] = c_new[better]
        Jb, rb = (J_new, r_new) if acc.size == live.size else (J_new[better], r_new[better])
        g[acc] = np.einsum("bik,bi->bk", Jb, rb)
        H[acc] = np.einsum("bik,bil->bkl", Jb, Jb)
        scale[acc] = np.maximum(scale[acc], np.einsum("bkk->bk", H[acc]))
        # Nielsen: shrink by the gain on a success, grow geometrically on a miss
        shrink = np.maximum(1.0 / 3.0, 1.0 - (2.0 * np.clip(gain, 0.0, 1.0) - 1.0) ** 3)
        damp[live] = np.where(better, np.maximum(dl * shrink, 1e-15), dl * grow[live])
        grow[live] = np.where(better, 2.0, grow[live] * 2.0)
        stop = done | (better & small) | (damp[live] > _DAMP_MAX)
        live = live[~stop]
    return x, cost


def _norm(v: np.ndarray) -> np.ndarray:
    """The Euclidean norm of each row: :func:`numpy.linalg.norm` with ``axis=1``, the
    same sum, without its dispatch."""
    return np.sqrt(np.add.reduce(v * v, axis=1))
