"""Metrics of a simulation run, and their deterministic JSON form.

Per job: JCT = end − submit, wait = start − submit, slowdown = JCT / ideal run time
(the run time at the job's requested workers on the best placement the topology
allows). Over the run: makespan = last end − first submit; GPU utilization is the
time-weighted share of allocated GPUs between the first submit and the last event;
``frag_share_mean`` is the time-weighted share of *unallocated* GPUs while at least
one job waits (capacity idle although there is demand — fragmentation and
head-of-line blocking); fee = Σ GPU-hours × price per GPU model.

``clairvoyant`` marks a run whose policies saw the jobs' true run times
(``SimConfig.clairvoyant``): a reference, never a baseline.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .engine import SimResult

__all__ = ["compute_metrics", "write_metrics", "dumps", "SERIES_POINTS"]

#: time-series points kept in metrics.json
SERIES_POINTS = 200


def _pct(a: np.ndarray, q: float) -> float:
    return float(np.percentile(a, q)) if a.size else math.nan


def _mean(a: np.ndarray) -> float:
    return float(a.mean()) if a.size else math.nan


def _time_weighted(t: np.ndarray, y: np.ndarray, end: float, mask: np.ndarray | None = None) -> float:
    """Mean of the step function y (value y[k] on [t[k], t[k+1])) up to ``end``."""
    if t.size == 0:
        return math.nan
    dt = np.diff(np.append(t, max(end, t[-1])))
    if mask is not None:
        dt = np.where(mask, dt, 0.0)
    tot = dt.sum()
    return float((y * dt).sum() / tot) if tot > 0 else math.nan


def _downsample(t: np.ndarray, y: np.ndarray, end: float, points: int) -> tuple[list[float], list[float]]:
    """Time-weighted averages of a step function over ``points`` equal bins."""
    if t.size == 0:
        return [], []
    lo, hi = float(t[0]), float(max(end, t[-1]))
    if hi <= lo:
        return [lo], [float(y[-1])]
    edges = np.linspace(lo, hi, points + 1)
    # integral of the step function at every edge
    knots = np.append(t, hi)
    cum = np.concatenate([[0.0], np.cumsum(y * np.diff(knots))])
    k = np.clip(np.searchsorted(knots, edges, side="right") - 1, 0, len(t) - 1)
    at = cum[k] + y[k] * (edges - knots[k])
    avg = np.diff(at) / np.diff(edges)
    mid = (edges[:-1] + edges[1:]) / 2
    return mid.tolist(), avg.tolist()


def compute_metrics(res: SimResult, series_points: int = SERIES_POINTS) -> dict[str, Any]:
    """The metrics dictionary of a run (see module docstring)."""
    recs = res.records
    submit = np.array([r.submit for r in recs], dtype=float)
    start = np.array([r.start for r in recs], dtype=float)
    end = np.array([r.end for r in recs], dtype=float)
    ideal = np.array([r.ideal_runtime for r in recs], dtype=float)
    jct = end - submit
    wait = start - submit
    slow = jct / np.maximum(ideal, 1e-9)
    acc = np.array([r.accuracy for r in recs], dtype=float)
    acc = acc[~np.isnan(acc)]
    t_end = float(end.max()) if end.size else res.first_submit
    if res.series_t.size:
        t_end = max(t_end, float(res.series_t[-1]))
    total = max(res.total_gpus, 1)
    used = res.series_used.astype(float)
    queue = res.series_queue.astype(float)
    st = res.series_t
    m: dict[str, Any] = {
        "clairvoyant": bool(res.clairvoyant),
        "jobs_total": len(recs) + len(res.unfittable) + len(res.unfinished),
        "jobs_completed": len(recs),
        "jobs_unfittable": len(res.unfittable),
        "jobs_unfinished": len(res.unfinished),
        "jobs_skipped": int(sum(res.skipped.values())),
        "skipped": dict(sorted(res.skipped.items())),
        "unfittable_ids": sorted(res.unfittable)[:100],
        "jct_mean": _mean(jct),
        "jct_p50": _pct(jct, 50),
        "jct_p95": _pct(jct, 95),
        "jct_p99": _pct(jct, 99),
        "wait_mean": _mean(wait),
        "wait_p95": _pct(wait, 95),
        "slowdown_mean": _mean(slow),
        "slowdown_p95": _pct(slow, 95),
        "makespan": (float(end.max()) - res.first_submit) if end.size else 0.0,
        "fee_total": float(sum(r.fee for r in recs)),
        "gpu_util_mean": _time_weighted(st, used / total, t_end),
        "queue_len_mean": _time_weighted(st, queue, t_end),
        "frag_share_mean": _time_weighted(st, 1.0 - used / total, t_end, mask=queue > 0),
        "accuracy_final_mean": _mean(acc),
        "rescales_total": int(sum(r.rescales for r in recs)),
        "preemptions_total": int(sum(r.preemptions for r in recs)),
        "queued_mean": _mean(np.array([r.queued for r in recs], dtype=float)[~np.isnan([r.queued for r in recs])])
        if recs else math.nan,
        "events": res.events,
        "total_gpus": res.total_gpus,
    }
    ts, us = _downsample(st, used / total, t_end, series_points)
    _, qs = _downsample(st, queue, t_end, series_points)
    m["series"] = {"t": ts, "gpu_util": us, "queue_len": qs}
    return m


def _clean(x):
    """NaN/inf → None, numpy scalars → Python, floats rounded to 9 significant digits."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        if not math.isfinite(x):
            return None
        return float(f"{x:.9g}")
    return x


def dumps(obj: Any) -> str:
    """Deterministic JSON: sorted keys, rounded floats, NaN as null."""
    return json.dumps(_clean(obj), sort_keys=True, indent=2, allow_nan=False) + "\n"


def write_metrics(metrics: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(metrics))
    return path
