"""Each job's GPU type and count as one binary program over configurations.

Sia's formulation (Jayaram Subramanya et al., SOSP'23, §3.2, Eq. 1): a job's goodput on
every configuration (GPU type, GPUs: powers of two within a node, whole nodes beyond),
normalised by its smallest, damped by a re-allocation factor off the configuration it
holds, raised to ``p < 0``; at most one configuration per job, each type's GPUs within
its capacity; solved by HiGHS (:func:`scipy.optimize.milp`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from .allocation import AllocNode

__all__ = ["Config", "ProgramError", "configurations", "cost", "solve"]

#: the paper's fairness exponent and no-allocation penalty (§3.2)
SIA_P = -0.5
SIA_LAMBDA = 1.1


class ProgramError(RuntimeError):
    """The solver found no assignment that meets the constraints (configurations kept,
    jobs that must run); without them one always exists: nothing allocated."""


@dataclass(frozen=True, slots=True)
class Config:
    """A configuration: ``gpus`` GPUs of ``gpu_type`` over ``nodes`` nodes."""

    gpu_type: str
    nodes: int
    gpus: int


def configurations(nodes: Sequence[AllocNode]) -> list[Config]:
    """The paper's configuration set (§3.2) of each GPU type: powers of two up to a node's
    GPUs on one node, then whole nodes (2, 3 ... all of that type). Types in order of
    first appearance; a type's node size is its largest node's."""
    out: list[Config] = []
    by_type: dict[str, list[int]] = {}
    for n in nodes:
        by_type.setdefault(n.gpu_type, []).append(n.gpus)
    for t, sizes in by_type.items():
        r = max(sizes)
        k = 1
        while k < r:
            out.append(Config(t, 1, k))
            k *= 2
        out.append(Config(t, 1, r))
        for m in range(2, len(sizes) + 1):
            out.append(Config(t, m, m * r))
    return out


def cost(normalised: np.ndarray, p: float = SIA_P, lambda_n: float = SIA_LAMBDA, clip: float = 3000.0) -> np.ndarray:
    """What the program minimises for a job on a configuration whose damped goodput over
    the job's smallest is ``normalised``: ``min(v^p, clip) − λ`` (``p < 0``), else
    ``−(min(v^p, clip) + λ)``."""
    u = np.minimum(np.power(np.maximum(normalised, 1e-12), p), clip)
    return u - lambda_n if p < 0 else -(u + lambda_n)


def solve(J: int, configs: Sequence[Config], capacity: Mapping[str, int], rows: Sequence[int],
          cols: Sequence[int], vals: Sequence[float], forced: Sequence[tuple[int, int]] = (),
          groups: Sequence[tuple[Sequence[int], float]] = (), must: Sequence[int] = (),
          mip_rel_gap: float = 1e-4, presolve: bool = True) -> tuple[dict[int, int], float]:
    """Eq. (1) as a binary program: one variable per (job row, configuration) pair given,
    costing ``vals``; at most one per job, exactly one for the rows in ``must``; per
    type, GPUs within ``capacity``; ``forced`` pairs fixed at 1; ``groups``: (job rows,
    most GPUs) each, e.g. a team's quota. Returns job row -> configuration index, and the
    solver's seconds; :class:`ProgramError` when no assignment meets them all.
    ``presolve=False`` skips HiGHS' presolve: an optimum within the same gap in a third
    to two thirds of the time on these programs (few rows over many columns)."""
    if not vals:
        return {}, 0.0
    n = len(vals)
    rows_a, cols_a = np.asarray(rows), np.asarray(cols)
    types = list(capacity)
    t_of = np.array([types.index(c.gpu_type) for c in configs])
    gpus = np.array([c.gpus for c in configs], dtype=float)
    one = coo_matrix((np.ones(n), (rows_a, np.arange(n))), shape=(J, n)).tocsr()
    use = coo_matrix((gpus[cols_a], (t_of[cols_a], np.arange(n))), shape=(len(types), n)).tocsr()
    lb = np.zeros(n)
    if len(forced):
        pairs = rows_a * (len(configs) + 1) + cols_a
        lb[np.isin(pairs, [r * (len(configs) + 1) + c for r, c in forced])] = 1.0
    least = np.full(J, -np.inf)
    least[list(must)] = 1.0
    cons = [LinearConstraint(one, least, 1.0),
            LinearConstraint(use, -np.inf, np.array([capacity[t] for t in types], dtype=float))]
    if groups:
        member = np.zeros((len(groups), J))
        for g, (members, _) in enumerate(groups):
            member[g, list(members)] = 1.0
        quota = coo_matrix(member[:, rows_a] * gpus[cols_a])
        cons.append(LinearConstraint(quota, -np.inf, np.array([most for _, most in groups], dtype=float)))
    t0 = time.perf_counter()
    res = milp(np.asarray(vals, dtype=float), integrality=np.ones(n), bounds=Bounds(lb, np.ones(n)),
               constraints=cons, options={"mip_rel_gap": mip_rel_gap, "presolve": presolve})
    dt = time.perf_counter() - t0
    if res.x is None or res.status != 0:
        raise ProgramError(f"the solver found no optimal assignment ({res.message})")
    x = np.round(res.x).astype(int)
    return {int(rows_a[k]): int(cols_a[k]) for k in np.nonzero(x)[0]}, dt
