"""Tenancy on Philly's virtual clusters: per-tenant JCT and GPU share under the served
goodput allocator, without and with teams' queues (issue 26).

Each ``pollux-gen`` workload carries its jobs' tenants — the Philly virtual cluster
(VC) of the Philly job each was sampled from (:mod:`rlsched.sim.traces.pollux`). On
the evaluation protocol's *test* seeds (:func:`rlsched.sim.protocol.seeds`: 20,000 ..;
reported here, never used to choose anything), at 1.0x load on the Pollux benchmark's
cluster (16 x 4 GPUs, 60 s interval, 30 s restart), the interval engine runs the served
allocator (``goodput``, :data:`rlsched.core.served.SERVED`) in four settings:

``none``
    no queues: today's served default (fairness between jobs, not tenants);
``fair``
    one queue per tenant, weight 1, no guarantee, no cap: pure weighted fair share
    between tenants (:meth:`rlsched.core.queues.QueueBook.who_runs`);
``fair-service``
    the same queues, fair share by weighted attained service instead of GPUs held now
    (``QueueBook(fair_share="service")``: the team whose unfinished jobs attained the
    fewest GPU-seconds goes first);
``nominal``
    one queue per tenant guaranteed ``nominal_gpus`` = its share of the workload's
    requested GPU-time times the 64 GPUs, unlimited borrowing, weight 1. The requested
    GPU-time of a job is what the trace knows of the request's size: the GPU-hours of
    the Philly job it was sampled from (``MeasuredTrace.philly_gpu_hours``; not the
    engine's work, which follows the job's model). Shares are rounded to whole GPUs by
    largest remainder, so the nominals sum to exactly 64 (tenants with a small share
    get none).

No queue has a minimum run time (as the served default: a running job may be shrunk
or stopped at any decision).

Measured per tenant, with tenants of fewer than ``--min-jobs`` jobs per seed on average
pooled as ``other`` (their shares summed):

* ``jobs`` (over all seeds) and their mean JCT (submission to completion);
* over the *contended* decisions in which the tenant had a submitted, unfinished job,
  the mean share of the cluster's GPUs it held after the decision, against its
  entitlement. A decision is contended when some submitted job got no GPU, or when
  the jobs' requests (``num_replicas`` each) add up to more than the cluster: the jobs
  are elastic, and the served allocator gives every job a GPU before any job a second
  one, so at 1.0x load jobs seldom wait and the GPUs are contended by growth instead.
  Entitlements: ``fair share`` — its weight over the summed weights of the tenants
  with such jobs at that decision (weights all 1: 1 / active tenants; the reference
  of ``none`` and ``fair``); ``max-min share`` — the same weighted share with each
  tenant capped at the GPUs its jobs ask for, the rest shared again (water-filling:
  what weighted max-min fairness gives a tenant that asks for less than its weight);
  ``nominal share`` — its nominal GPUs over 64 (the reference of ``nominal``);
  ``ratio``: held / the setting's reference;
* ``under``: the fraction of those decisions in which one of its tenants held fewer
  GPUs than its jobs asked for and more than one GPU less than its max-min share
  (``nominal``: than its nominal GPUs, as far as it asks for them) — one GPU of slack:
  shares are served in whole GPUs.

Overall: the mean JCT per setting over seeds, and ``fair`` and ``nominal`` against
``none`` as paired bootstrap 95% intervals (:func:`rlsched.sim.protocol.paired_bootstrap`).

    python bench/tenancy.py --seeds 5 --out docs/results/tenancy.json --plot docs/results/tenancy.png

Default: 5 seeds x 4 settings = 20 runs of 160 jobs on ``--procs`` (2) processes: 12
minutes on a 2-core machine shared with other work; ``--seeds N`` for more (at most
1,000), ``--load`` for another load (2.0: about twice as long), ``--nodes`` for a
smaller cluster (the smoke test's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

SETTINGS = ("none", "fair", "fair-service", "nominal")
OTHER = "other"


def nominal_gpus(gpu_hours: dict[str, float], total: int) -> dict[str, int]:
    """Whole GPUs per tenant in proportion to ``gpu_hours`` (largest remainder: they sum
    to ``total``; ties broken by tenant name)."""
    s = sum(gpu_hours.values())
    if s <= 0:
        return {t: 0 for t in gpu_hours}
    exact = {t: total * h / s for t, h in gpu_hours.items()}
    out = {t: int(np.floor(x)) for t, x in exact.items()}
    left = total - sum(out.values())
    for t in sorted(exact, key=lambda t: (-(exact[t] - out[t]), t))[:left]:
        out[t] += 1
    return out


def tenant_gpu_hours(trace) -> dict[str, float]:
    """Requested GPU-time per tenant: the GPU-hours of the Philly jobs its jobs were
    sampled from."""
    if not trace.philly_gpu_hours:
        raise SystemExit(f"{trace.name}: no Philly GPU-hours per job (a pollux-gen workload is needed)")
    out: dict[str, float] = defaultdict(float)
    for j in trace.jobs:
        out[j.tenant] += trace.philly_gpu_hours[j.id]
    return dict(out)


def queue_book(setting: str, trace, total: int):
    """The queues of ``setting`` for the trace's tenants (None for ``none``)."""
    from rlsched.core.queues import QueueBook, QueueSpec

    tenants = sorted({j.tenant for j in trace.jobs})
    if setting == "none":
        return None
    if setting == "fair":
        return QueueBook([QueueSpec(t, weight=1.0) for t in tenants])
    if setting == "fair-service":
        return QueueBook([QueueSpec(t, weight=1.0) for t in tenants], fair_share="service")
    if setting == "nominal":
        nom = nominal_gpus(tenant_gpu_hours(trace), total)
        return QueueBook([QueueSpec(t, nominal_gpus=nom[t], borrowing_limit=None, weight=1.0) for t in tenants])
    raise ValueError(f"unknown setting {setting!r}; known: {', '.join(SETTINGS)}")


def _one(seed: int, setting: str, jobs: int, load: float, data_dir: str | None, nodes: int | None = None) -> dict:
    from rlsched.core.served import SERVED
    from rlsched.sim.allocators import make_allocator
    from rlsched.sim.interval import IntervalConfig, IntervalSimulator
    from rlsched.sim.metrics import compute_metrics
    from rlsched.sim.protocol import split_of
    from rlsched.sim.traces import load_trace

    if split_of(seed) != "test":
        raise SystemExit(f"seed {seed} is not a test seed: this table reports on the test split only")
    trace = load_trace(f"pollux-gen:seed={seed},jobs={jobs},load={load:g}", data_dir=data_dir)
    if any(j.tenant is None for j in trace.jobs):
        raise SystemExit(f"{trace.name}: jobs without a tenant")
    n_nodes = nodes or trace.nodes
    total = n_nodes * trace.gpus_per_node
    book = queue_book(setting, trace, total)
    cfg = IntervalConfig(interval=trace.interval, restart_cost=trace.restart_cost)
    t0 = time.perf_counter()
    sim = IntervalSimulator(trace.jobs, trace.apps, make_allocator(SERVED.allocator, seed=seed), nodes=n_nodes,
                            gpus_per_node=trace.gpus_per_node, config=cfg, queues=book)
    res = sim.run()
    m = compute_metrics(res)
    tenant = {j.id: j.tenant for j in trace.jobs}
    jct: dict[str, list[float]] = defaultdict(list)
    for r in res.records:
        jct[tenant[r.id]].append(r.end - r.submit)
    return {
        "seed": seed, "setting": setting, "trace": trace.name, "total_gpus": total,
        "jct_mean": m["jct_mean"], "gpu_util_mean": m["gpu_util_mean"], "unfinished": len(res.unfinished),
        "jobs_by_tenant": {t: sum(1 for j in trace.jobs if j.tenant == t) for t in sorted(set(tenant.values()))},
        "nominal": nominal_gpus(tenant_gpu_hours(trace), total),
        "decisions": len(sim.queue_log),
        "wall_s": time.perf_counter() - t0,
        # in memory only (not written): per-job JCTs and the contended decisions
        "_jct": dict(jct),
        "_log": [(q.held, q.active, q.waiting, q.asked) for q in sim.queue_log
                 if q.contended or sum(q.asked.values()) > total],
    }


def groups_of(runs: list[dict], min_jobs: float) -> dict[str, str]:
    """Tenant -> its row: itself if it has ``min_jobs`` jobs per seed on average, else
    :data:`OTHER`."""
    per: dict[str, list[int]] = defaultdict(list)
    seeds = sorted({r["seed"] for r in runs})
    first = {r["seed"]: r for r in runs}
    for s in seeds:
        for t, n in first[s]["jobs_by_tenant"].items():
            per[t].append(n)
    return {t: (t if sum(ns) / len(seeds) >= min_jobs else OTHER) for t, ns in per.items()}


def max_min(total: float, caps: dict[str, float], weights: dict[str, float] | None = None) -> dict[str, float]:
    """Weighted max-min fair shares of ``total`` (water-filling): each tenant gets at
    most its cap, the rest is split in proportion to the weights of those still short."""
    weights = weights or {t: 1.0 for t in caps}
    out = {t: 0.0 for t in caps}
    left, open_ = float(total), sorted(caps, key=lambda t: caps[t] / weights[t])
    while open_ and left > 1e-12:
        w = sum(weights[t] for t in open_)
        t = open_[0]
        level = left / w  # GPUs per unit of weight if nobody else were capped
        if caps[t] / weights[t] <= level:  # the most constrained tenant is capped: fill it, share again
            out[t] = caps[t]
            left -= caps[t]
            open_.pop(0)
        else:
            for u in open_:
                out[u] = level * weights[u]
            left = 0.0
    return out


def summarise(runs: list[dict], min_jobs: float) -> dict:
    """The per-tenant table and the overall comparison (module docstring)."""
    from rlsched.sim.protocol import paired_bootstrap

    group = groups_of(runs, min_jobs)
    size = defaultdict(int)
    for r in runs:
        if r["setting"] == runs[0]["setting"]:
            for t, n in r["jobs_by_tenant"].items():
                size[group[t]] += n
    names = sorted(size, key=lambda g: (g == OTHER, -size[g], g))
    settings = [s for s in SETTINGS if any(r["setting"] == s for r in runs)]
    table: dict[str, dict] = {g: {"tenants": sorted(t for t in group if group[t] == g)} for g in names}
    overall: dict[str, dict] = {}
    for st in settings:
        acc = {g: defaultdict(float) for g in names}
        jcts: dict[str, list[float]] = defaultdict(list)
        mine = [r for r in runs if r["setting"] == st]
        n_dec = n_short = n_wait = 0
        for r in mine:
            total = r["total_gpus"]
            for t, xs in r["_jct"].items():
                jcts[group[t]].extend(xs)
            for t, n in r["jobs_by_tenant"].items():
                acc[group[t]]["jobs"] += n
                acc[group[t]]["nominal_gpus"] += r["nominal"][t] / len(mine)
            n_dec += r["decisions"]
            for held, active, waiting, asked in r["_log"]:
                waited = any(waiting.values())
                n_short += 1
                n_wait += waited
                fair = {t: 1.0 / len(active) for t in active}  # weights all 1
                mm = max_min(total, {t: float(asked[t]) for t in active})
                seen: dict[str, list] = {}
                for t in active:
                    h = held.get(t, 0)
                    nom = r["nominal"][t]
                    if st == "nominal":  # its guarantee, as far as it asks for it
                        under = h < asked[t] and h + 1 < min(nom, asked[t])
                    else:  # its max-min fair share of the GPUs, as far as it asks for them
                        under = h < asked[t] and h + 1 < mm[t]
                    g = seen.setdefault(group[t], [0.0, 0.0, 0.0, 0.0, False, False])
                    g[0] += h / total
                    g[1] += fair[t]
                    g[2] += mm[t] / total
                    g[3] += nom / total
                    g[4] = g[4] or under
                    g[5] = g[5] or waiting.get(t, 0) > 0
                for g, (h, f, m, nom, under, w) in seen.items():
                    a = acc[g]
                    a["decisions"] += 1
                    a["held"] += h
                    a["fair"] += f
                    a["maxmin"] += m
                    a["nominal"] += nom
                    a["under"] += under
                    a["waited"] += w
        for g in names:
            a = acc[g]
            d = a["decisions"]
            mean = (lambda k: a[k] / d) if d else (lambda k: float("nan"))
            ref = mean("nominal") if st == "nominal" else mean("fair")
            table[g]["nominal_gpus_mean"] = a["nominal_gpus"]
            table[g][st] = {
                "jobs": int(a["jobs"]), "finished": len(jcts[g]),
                "jct_mean": float(np.mean(jcts[g])) if jcts[g] else float("nan"),
                "contended_decisions": int(d), "held_share": mean("held"), "fair_share": mean("fair"),
                "max_min_share": mean("maxmin"), "nominal_share": mean("nominal"),
                "entitlement": "nominal_share" if st == "nominal" else "fair_share",
                "ratio": mean("held") / ref if d and ref > 0 else float("nan"),
                "under_served": mean("under"), "waited": mean("waited"),
            }
        overall[st] = {"decisions": n_dec, "contended": n_short, "contended_with_waiting_job": n_wait}
    by = {st: {r["seed"]: r["jct_mean"] for r in runs if r["setting"] == st} for st in settings}
    for st in settings:
        overall[st].update(jct_mean=float(np.mean(list(by[st].values()))), seeds=len(by[st]))
    for st in settings[1:]:
        common = sorted(set(by[st]) & set(by.get(SETTINGS[0], {})))
        if len(common) >= 2:
            d = paired_bootstrap([by[st][s] for s in common], [by[SETTINGS[0]][s] for s in common])
            overall[st]["vs_none"] = d.to_dict()
        else:
            overall[st]["vs_none"] = None  # a paired bootstrap needs >= 2 seeds (and the 'none' runs)
    return {"groups": names, "tenant_group": group, "table": table, "overall": overall}


def markdown(summary: dict) -> str:
    """The tables of docs/queues.md: JCT, shares, overall."""
    t, groups, o = summary["table"], summary["groups"], summary["overall"]
    st = [s for s in SETTINGS if s in t[groups[0]]]
    ref = "fair" if "fair" in st else st[0]

    def name(g: str) -> str:
        return g if g != OTHER else f"other ({len(t[g]['tenants'])} VCs)"

    def cells(row: dict, key: str, fmt: str) -> str:
        return " | ".join(format(row[s][key], fmt) if row[s][key] == row[s][key] else "—" for s in st)

    lines = ["| tenant (VC) | jobs | " + " | ".join(f"mean JCT {s} (s)" for s in st) + " |",
             "|---|--:|" + "--:|" * len(st)]
    for g in groups:
        lines.append(f"| {name(g)} | {t[g][st[0]]['jobs']} | {cells(t[g], 'jct_mean', ',.0f')} |")
    lines += ["", "| tenant (VC) | decisions | fair share | max-min share | nominal share (GPUs) | "
              + " | ".join(f"held {s}" for s in st) + " | " + " | ".join(f"held ÷ entitled {s}" for s in st)
              + " | " + " | ".join(f"under-served {s}" for s in st) + " |",
              "|---|--:|--:|--:|--:|" + "--:|" * (3 * len(st))]
    for g in groups:
        r = t[g]
        nom = r.get("nominal", r[ref])["nominal_share"]
        lines.append(
            f"| {name(g)} | {r[ref]['contended_decisions']} | {r[ref]['fair_share']:.1%} | {r[ref]['max_min_share']:.1%} | "
            f"{nom:.1%} ({r['nominal_gpus_mean']:.1f}) | {cells(r, 'held_share', '.1%')} | {cells(r, 'ratio', '.2f')} | "
            f"{cells(r, 'under_served', '.0%')} |")
    lines += ["", "| setting | mean JCT (s) | vs none [95% CI] | contended decisions (some job waited) |",
              "|---|--:|--:|--:|"]
    for s in st:
        d = o[s].get("vs_none")
        vs = "—" if s == SETTINGS[0] else (f"{d['rel']:+.1%} [{d['rel_lo']:+.1%}, {d['rel_hi']:+.1%}]" if d else "n/a (< 2 seeds)")
        lines.append(f"| {s} | {o[s]['jct_mean']:,.0f} | {vs} | {o[s]['contended']:,} of {o[s]['decisions']:,} "
                     f"({o[s]['contended_with_waiting_job']:,}) |")
    return "\n".join(lines)


def plot(summary: dict, path: Path, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, groups = summary["table"], summary["groups"]
    st = [s for s in SETTINGS if s in t[groups[0]]]
    x = np.arange(len(groups))
    w = 0.8 / len(st)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, s in enumerate(st):
        a1.bar(x + (i - (len(st) - 1) / 2) * w, [t[g][s]["jct_mean"] / 3600 for g in groups], w, label=s)
        a2.bar(x + (i - (len(st) - 1) / 2) * w, [t[g][s]["held_share"] for g in groups], w, label=f"held ({s})")
    a2.scatter(x, [t[g][st[0]]["fair_share"] for g in groups], marker="_", s=400, color="k", label="fair share (weights 1)")
    if "nominal" in st:
        a2.scatter(x, [t[g]["nominal"]["nominal_share"] for g in groups], marker="x", color="r", label="nominal share")
    for a in (a1, a2):
        a.set_xticks(x, groups, rotation=20)
    a1.set_ylabel("mean JCT (h)")
    a1.set_title("per-tenant mean JCT")
    a2.set_ylabel("share of the GPUs (contended decisions)")
    a2.set_title("GPUs held vs entitlement")
    a1.legend(fontsize=8)
    a2.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _finite(x):
    """``x`` with every NaN as None (strict JSON)."""
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def main(argv: list[str] | None = None) -> int:
    from rich.progress import Progress

    from rlsched.sim.protocol import seeds

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="test seeds (the first N of the split; default 5)")
    ap.add_argument("--jobs", type=int, default=160, help="jobs per workload at 1.0x (pollux-gen jobs=)")
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma list of {', '.join(SETTINGS)}")
    ap.add_argument("--min-jobs", type=float, default=5.0,
                    help="tenants with fewer jobs per seed on average are pooled as 'other' (default 5)")
    ap.add_argument("--nodes", type=int, default=None, help="nodes of 4 GPUs (default: the trace's 16)")
    ap.add_argument("--data-dir", default=None, help="default: $RLSCHED_DATA_DIR")
    ap.add_argument("--procs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--out", default="docs/results/tenancy.json")
    ap.add_argument("--plot", default=None, help="PNG of the table (default: none)")
    args = ap.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    bad = [s for s in settings if s not in SETTINGS]
    if bad or not settings:
        ap.error(f"--settings: unknown {bad}; known: {', '.join(SETTINGS)}")
    settings = [s for s in SETTINGS if s in settings]
    test_seeds = seeds("test", args.seeds)
    tasks = [(s, st) for s in test_seeds for st in settings]
    runs, t0 = [], time.perf_counter()
    with Progress() as bar, ProcessPoolExecutor(max(args.procs, 1)) as ex:
        task = bar.add_task("test runs", total=len(tasks))
        futs = [ex.submit(_one, s, st, args.jobs, args.load, args.data_dir, args.nodes) for s, st in tasks]
        for f in as_completed(futs):
            runs.append(f.result())
            bar.advance(task)
    runs.sort(key=lambda r: (r["seed"], SETTINGS.index(r["setting"])))
    summary = summarise(runs, args.min_jobs)
    wall = time.perf_counter() - t0
    md = markdown(summary)
    print(md)
    print(f"{len(runs)} runs in {wall:,.0f} s on {args.procs} processes")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_finite({
        "benchmark": "tenancy on Philly's virtual clusters: per-tenant JCT and GPU share, served goodput allocator",
        "command": "python bench/tenancy.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "procs": args.procs, "python": platform.python_version()},
        "seeds": test_seeds, "split": "test", "jobs": args.jobs, "load": args.load, "settings": settings,
        "cluster": {"nodes": args.nodes or 16, "gpus_per_node": 4}, "min_jobs": args.min_jobs,
        "definitions": {
            "contended": "a decision in which some submitted job got no GPU, or the jobs' requests "
                         "(num_replicas, each at most the cluster) add up to more than the cluster's GPUs",
            "held_share": "GPUs the tenant held after the decision / the cluster's GPUs, mean over the contended "
                          "decisions with a submitted, unfinished job of it (a pooled row: its tenants summed)",
            "fair_share": "1 / tenants with a submitted, unfinished job at the decision (all weights 1)",
            "max_min_share": "weighted max-min share (weights 1) with each tenant capped at the GPUs its jobs ask for",
            "nominal_share": "the tenant's nominal GPUs in setting 'nominal' / the cluster's GPUs",
            "ratio": "held_share / the setting's entitlement (fair_share; nominal_share for 'nominal')",
            "under_served": "share of those decisions in which one of its tenants held fewer GPUs than its jobs asked "
                            "for and more than one GPU less than its max-min share (nominal: than min(nominal, asked))",
            "waited": "share of those decisions in which a job of it got no GPU",
            "nominal_gpus": "the cluster's GPUs x the tenant's share of the GPU-hours of the Philly jobs its jobs "
                            "were sampled from, largest-remainder rounding (they sum to the cluster's GPUs), "
                            "unlimited borrowing, weight 1",
        },
        **summary,
        "markdown": md,
        "runs": [{k: v for k, v in r.items() if not k.startswith("_")} for r in runs],
        "wall_s": wall,
    }), indent=1, allow_nan=False))
    print(f"-> {out}")
    if args.plot:
        plot(summary, Path(args.plot), f"pollux-gen test seeds {test_seeds[0]}..{test_seeds[-1]}, {args.load:g}x load, "
             f"{(args.nodes or 16) * 4} GPUs, served goodput allocator")
        print(f"-> {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
