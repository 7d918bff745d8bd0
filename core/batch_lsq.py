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
    # the state of the problems still running, one row each: compacted as they stop
    live = np.arange(B)
    r, J = fun(x, live)
    cost[:] = 0.5 * np.einsum("bi,bi->b", r, r)
    xl, cl = x.copy(), cost.copy()
    gl = np.einsum("bik,bi->bk", J, r)
    Hl = np.einsum("bik,bil->bkl", J, J)
    dl, gr = np.full(B, _DAMP_START), np.full(B, 2.0)
    sl = np.maximum(np.einsum("bkk->bk", Hl), 1e-12)  # Moré: the largest diag(JᵀJ) seen
    eye = np.eye(P)
    for _ in range(max_iter):
        if live.size == 0:
            break
        lo, hi = (b if b.ndim == 1 else b[live] for b in (lower, upper))
        held = ((xl <= lo) & (gl > 0)) | ((xl >= hi) & (gl < 0))
        free = ~held
        pg = np.where(free, gl, 0.0)
        done = np.abs(pg).max(axis=1) <= gtol
        # damped normal equations on the free parameters, identity on the held ones
        D = np.where(free, dl[:, None] * sl, 1.0)
        A = np.where(free[:, :, None] & free[:, None, :], Hl, 0.0) + eye * D[:, None, :]
        trial = np.clip(xl - np.linalg.solve(A, pg[:, :, None])[:, :, 0], lo, hi)
        h = trial - xl
        r_new, J_new = fun(trial, live)
        c_new = 0.5 * np.einsum("bi,bi->b", r_new, r_new)
        # gain ratio: the actual reduction over the Gauss-Newton model's at h
        predicted = -(np.einsum("bk,bk->b", gl, h) + 0.5 * np.einsum("bk,bkl,bl->b", h, Hl, h))
        actual = cl - c_new
        gain = np.where(predicted > 0, actual / np.where(predicted > 0, predicted, 1.0), -1.0)
        better = np.isfinite(c_new) & (c_new < cl)
        small = (actual <= ftol * cl) | (_norm(h) <= xtol * (xtol + _norm(xl)))
        if better.all():
            xl, cl = trial, c_new
            gl, Hl = np.einsum("bik,bi->bk", J_new, r_new), np.einsum("bik,bil->bkl", J_new, J_new)
            sl = np.maximum(sl, np.einsum("bkk->bk", Hl))
        elif better.any():
            xl, cl = np.where(better[:, None], trial, xl), np.where(better, c_new, cl)
            Jb = J_new[better]
            gl, Hl, sl = gl.copy(), Hl.copy(), sl.copy()
            gl[better] = np.einsum("bik,bi->bk", Jb, r_new[better])
            Hl[better] = np.einsum("bik,bil->bkl", Jb, Jb)
            sl[better] = np.maximum(sl[better], np.einsum("bkk->bk", Hl[better]))
        # Nielsen: shrink by the gain on a success, grow geometrically on a miss
        shrink = np.maximum(1.0 / 3.0, 1.0 - (2.0 * np.clip(gain, 0.0, 1.0) - 1.0) ** 3)
        dl, gr = np.where(better, np.maximum(dl * shrink, 1e-15), dl * gr), np.where(better, 2.0, gr * 2.0)
        stop = done | (better & small) | (dl > _DAMP_MAX)
        if stop.any():
            x[live[stop]], cost[live[stop]] = xl[stop], cl[stop]
            keep = ~stop
            live, xl, cl, gl, Hl, dl, gr, sl = (a[keep] for a in (live, xl, cl, gl, Hl, dl, gr, sl))
    x[live], cost[live] = xl, cl
    return x, cost


def _norm(v: np.ndarray) -> np.ndarray:
    """The Euclidean norm of each row: :func:`numpy.linalg.norm` with ``axis=1``, the
    same sum, without its dispatch."""
    return np.sqrt(np.add.reduce(v * v, axis=1))
