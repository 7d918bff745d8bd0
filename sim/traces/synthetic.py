"""``synthetic:<small|medium|large>[,key=value...]``: the seeded generator of
multi-worker training jobs (:func:`synthetic`)."""

from __future__ import annotations

import math

import numpy as np

from rlsched.core import Level, Topology

from ..job import JobSpec, comm_time, ideal_level, topology_limits
from .common import ESTIMATE_ERROR, Trace, TraceError, with_estimates

__all__ = ["FORM", "SYNTHETIC_PRESETS", "MODEL_ZOO", "synthetic"]

FORM = "synthetic:<small|medium|large>[,k=v...]"

SYNTHETIC_PRESETS = {
    "small": dict(jobs=200, nodes=16, gpus_per_node=8, racks=2),
    "medium": dict(jobs=2000, nodes=64, gpus_per_node=8, racks=8),
    "large": dict(jobs=100_000, nodes=1000, gpus_per_node=8, racks=50),
}

#: (name, compute seconds per step, gradient GB, batch per worker, weight)
MODEL_ZOO = (
    ("resnet50", 0.12, 0.10, 64, 0.30),
    ("vgg16", 0.15, 0.55, 64, 0.15),
    ("bert-base", 0.25, 0.44, 32, 0.25),
    ("transformer", 0.30, 0.80, 32, 0.15),
    ("gpt2-medium", 0.40, 1.40, 8, 0.15),
)


def _parse_kv(arg: str) -> tuple[str, dict[str, str]]:
    parts = [p.strip() for p in arg.split(",") if p.strip()]
    preset = "small"
    kv: dict[str, str] = {}
    for p in parts:
        if "=" in p:
            k, _, v = p.partition("=")
            kv[k.strip()] = v.strip()
        else:
            preset = p
    return preset, kv


def synthetic(arg: str = "small", *, seed: int = 0) -> Trace:
    """Seeded multi-worker training jobs on a uniform cluster.

    ``arg`` = ``<small|medium|large>[,jobs=N,nodes=N,gpus_per_node=N,racks=N,
    arrival_rate=X,max_workers=N,load=X,runtime_sigma=X,estimates=F,estimate_error=S,
    seed=N]``. Each job picks a model from
    :data:`MODEL_ZOO`, a worker count (powers of two up to ``max_workers``) and GPUs
    per worker, a target ideal run time (log-normal, median 30 min, shape
    ``runtime_sigma``, default 1.1; clipped to 2 min .. 7 days) from which its
    dataset size follows, and a convergence threshold ``beta``. Arrivals are Poisson;
    without ``arrival_rate`` the rate gives an offered load of ``load`` (default 0.6)
    of the cluster's GPUs.

    Users' run-time estimates: a share ``estimates`` of the jobs (default 0: none, as
    a TrainingJob without ``spec.estimatedRuntime`` and as every real trace loaded
    here) carries one, ``estimate_factor`` × its true ideal run time with a
    log-normal factor of median 1 and shape ``estimate_error`` (default 0.5: half the
    estimates within ×0.71..×1.40, one in twenty off by more than ×2.66);
    :func:`~rlsched.sim.traces.common.with_estimates`. These draws come after all
    the others, so the jobs are otherwise the same as without the option.
    """
    preset, kv = _parse_kv(arg)
    if preset not in SYNTHETIC_PRESETS:
        raise TraceError(f"unknown synthetic preset {preset!r}; known: {', '.join(SYNTHETIC_PRESETS)}")
    p: dict[str, float] = dict(SYNTHETIC_PRESETS[preset])
    p.update(max_workers=8, load=0.6, runtime_sigma=1.1, estimates=0.0, estimate_error=ESTIMATE_ERROR, seed=seed)
    known = set(p) | {"arrival_rate"}
    for k, v in kv.items():
        if k not in known:
            raise TraceError(f"synthetic: unknown parameter {k!r}; known: {', '.join(sorted(known))}")
        try:
            p[k] = float(v) if k in ("arrival_rate", "load", "runtime_sigma", "estimates", "estimate_error") else int(v)
        except ValueError:
            raise TraceError(f"synthetic: {k}={v!r} is not a number") from None
    n, nodes, gpn, racks = int(p["jobs"]), int(p["nodes"]), int(p["gpus_per_node"]), int(p["racks"])
    if n < 1 or nodes < 1 or gpn < 1 or racks < 1 or p["max_workers"] < 1 or p["load"] <= 0 or p["runtime_sigma"] < 0:
        raise TraceError("synthetic: jobs, nodes, gpus_per_node, racks, max_workers must be >= 1, load > 0, runtime_sigma >= 0")
    if not (0 <= p["estimates"] <= 1 and p["estimate_error"] >= 0):
        raise TraceError("synthetic: estimates must be in [0, 1] and estimate_error >= 0")
    topo = Topology.uniform(nodes, gpn, racks=min(racks, nodes), blocks=max(1, min(racks, nodes) // 10))
    rng = np.random.default_rng(int(p["seed"]))

    zoo_w = np.array([m[4] for m in MODEL_ZOO])
    model = rng.choice(len(MODEL_ZOO), size=n, p=zoo_w / zoo_w.sum())
    max_w = int(p["max_workers"])
    w_choices = [w for w in (1, 2, 4, 8, 16, 32, 64) if w <= max_w] or [1]
    w_p = np.array([0.5 ** k for k in range(len(w_choices))])
    workers = np.array(w_choices)[rng.choice(len(w_choices), size=n, p=w_p / w_p.sum())]
    g_choices = [g for g in (1, 2, 4, 8) if g <= gpn] or [1]
    g_p = np.array([0.55, 0.2, 0.1, 0.15][: len(g_choices)])
    gpw = np.array(g_choices)[rng.choice(len(g_choices), size=n, p=g_p / g_p.sum())]
    runtime = np.clip(rng.lognormal(math.log(1800.0), float(p["runtime_sigma"]), size=n), 120.0, 7 * 86400.0)
    beta = rng.choice([0.001, 0.002, 0.004], size=n)
    tau = rng.uniform(3.0, 8.0, size=n)
    acc_max = rng.uniform(0.7, 0.95, size=n)
    max_epochs = rng.integers(20, 61, size=n)

    gpus = workers * gpw
    if "arrival_rate" in p:
        rate = float(p["arrival_rate"])
        if rate <= 0:
            raise TraceError("synthetic: arrival_rate must be > 0")
    else:
        rate = p["load"] * topo.total_gpus / float((gpus * runtime).mean())
    submit = np.cumsum(rng.exponential(1.0 / rate, size=n))
    submit -= submit[0]

    limits = topology_limits(topo)
    bw = topo.bandwidth
    width = len(str(n - 1))
    fastest: dict[int, float] = {}  # GPUs -> best bandwidth any placement reaches
    jobs = []
    for k in range(n):
        name, ct, grad, batch, _ = MODEL_ZOO[int(model[k])]
        w, g = int(workers[k]), int(gpw[k])
        n_gpu = w * g
        best_bw = fastest.get(n_gpu)
        if best_bw is None:
            lvl = int(ideal_level(n_gpu, limits))
            best_bw = fastest[n_gpu] = max(bw.at(Level(v)) for v in range(lvl, int(Level.CLUSTER) + 1))
        step = ct + comm_time(grad, n_gpu, best_bw)
        thr = w * batch / step
        # epochs to converge (noise-free): where the per-epoch gain falls below beta
        span = float(acc_max[k]) - 0.1
        eff = 1.0 / (1.0 + 0.05 * (w - 1))
        e_conv = max(tau[k] * math.log(max(span * eff / (tau[k] * beta[k]), 1.0 + 1e-9)) / eff, 1.0)
        e_run = min(e_conv + 3, float(max_epochs[k]))
        jobs.append(
            JobSpec(
                id=f"job-{k:0{width}d}",
                submit_time=float(submit[k]),
                workers=w,
                gpus_per_worker=g,
                min_workers=1,
                max_workers=min(2 * w, 2 * max_w),
                compute_time=ct,
                grad_gb=grad,
                batch_per_worker=batch,
                samples_per_epoch=max(int(runtime[k] * thr / e_run), batch),
                max_epochs=int(max_epochs[k]),
                beta=float(beta[k]),
                convergence={"tau": float(tau[k]), "acc_max": float(acc_max[k])},
            )
        )
    if p["estimates"] > 0:
        jobs = with_estimates(jobs, float(p["estimates"]), float(p["estimate_error"]), rng)
    return Trace(f"synthetic:{arg}", jobs, topo)
