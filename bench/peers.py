"""The peers side by side on the Pollux OSDI'21 benchmark: the fidelity table.

Our Tiresias (``tiresias-2q``), our Optimus+Oracle (``optimus-oracle``, a clairvoyant
reference) and the released Pollux policy (``pollux``, PyPI ``adaptdl-sched==0.2.11``
through its bridge; ``make pollux-env``) run in our interval engine on the published
workloads 1-8 at 0.5x, 1.0x and 1.5x load (16 nodes x 4 GPUs, 60 s interval, 30 s
restart), against the paper's published mean JCTs (the data README).

    python bench/peers.py --out bench/results/peers.json            # the full table
    python bench/peers.py --loads 1.0 --workloads 6 --policies tiresias-2q

Writes the JSON (every run's mean JCT and wall time, the per-load means, the published
figure and our ratio to it) and a plot beside it (``.png``). Runs in parallel
processes (``--procs``, default the machine's cores). Runs measured apart (some
workloads on another machine) become one report with ``--merge``: it reads their
outputs, runs nothing, and keeps each source's machine::

    python bench/peers.py --merge out/w1.json,out/w2.json --out docs/results/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

#: the paper's published mean JCT in seconds (Qiao et al. OSDI'21; data README):
#: (policy, load) -> mean over workloads 1-8; "w6" for workload 6 alone at 1.0x
PUBLISHED = {
    ("pollux", 1.0): 2751.0, ("tiresias-2q", 1.0): 4038.0, ("optimus-oracle", 1.0): 5682.0,
    ("pollux", 0.5): 1534.0, ("tiresias-2q", 0.5): 2092.0,
    ("pollux", 1.5): 3685.0, ("tiresias-2q", 1.5): 6182.0,
}
PUBLISHED_W6 = {"pollux": 2446.0, "tiresias-2q": 3470.0, "optimus-oracle": 5302.0}
FOLDERS = {0.5: "workloads-0.5", 1.0: "workloads", 1.5: "workloads-1.5"}
POLICIES = ("tiresias-2q", "optimus-oracle", "pollux")
TOLERANCE = 0.15


def _one(policy: str, load: float, workload: int, data_dir: str | None, generated: bool = False) -> dict:
    from rlsched.sim.cli import run_allocator
    from rlsched.sim.interval import IntervalConfig
    from rlsched.sim.traces import load_trace

    spec = f"pollux-gen:seed={workload},load={load:g}" if generated else f"pollux:{FOLDERS[load]}/workload-{workload}"
    trace = load_trace(spec, data_dir=data_dir)
    cfg = IntervalConfig(interval=trace.interval, restart_cost=trace.restart_cost)
    t0 = time.perf_counter()
    calls = [0]

    def tick(done: int, total: int) -> None:  # slow policies (Pollux): a line every 100 decisions
        calls[0] += 1
        if calls[0] % 100 == 0:
            print(f"  {policy} {load:g}x workload-{workload}: {calls[0]} decisions, {done}/{total} jobs done, "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)

    res, m = run_allocator(trace, (trace.nodes, trace.gpus_per_node), policy, cfg, progress=tick)
    return {
        "policy": policy, "load": load, "workload": workload, "trace": spec, "generated": generated,
        "jct_mean": m["jct_mean"], "jct_p95": m["jct_p95"], "queued_mean": m["queued_mean"],
        "makespan": m["makespan"], "gpu_util_mean": m["gpu_util_mean"], "jobs_completed": m["jobs_completed"],
        "jobs_unfinished": m["jobs_unfinished"], "restarts": m["rescales_total"],
        "preemptions": m["preemptions_total"], "clairvoyant": m["clairvoyant"],
        "wall_s": time.perf_counter() - t0,
    }


def summarise(runs: list[dict]) -> list[dict]:
    """Per (policy, load): the mean over workloads of each workload's mean JCT, the
    published figure and our ratio to it (within ``TOLERANCE``?)."""
    out = []
    runs = [r for r in runs if not r.get("generated")]
    keys = sorted({(r["policy"], r["load"]) for r in runs}, key=lambda k: (POLICIES.index(k[0]) if k[0] in POLICIES else 9, k[1]))
    for pol, load in keys:
        rs = [r for r in runs if r["policy"] == pol and r["load"] == load]
        mean = float(np.mean([r["jct_mean"] for r in rs]))
        pub = PUBLISHED.get((pol, load))
        row = {"policy": pol, "load": load, "workloads": sorted(r["workload"] for r in rs), "jct_mean": mean,
               "clairvoyant": any(r["clairvoyant"] for r in rs), "published": pub,
               # the published figure is the mean over workloads 1-8: compared only with all 8
               "ratio": mean / pub if pub and len(rs) == 8 else None,
               "within_tolerance": (abs(mean / pub - 1) <= TOLERANCE) if pub and len(rs) == 8 else None,
               "wall_s": float(sum(r["wall_s"] for r in rs))}
        w6 = [r for r in rs if r["workload"] == 6]
        if w6 and load == 1.0 and pol in PUBLISHED_W6:
            row["workload6"] = {"jct_mean": w6[0]["jct_mean"], "published": PUBLISHED_W6[pol],
                                "ratio": w6[0]["jct_mean"] / PUBLISHED_W6[pol]}
        out.append(row)
    return out


def summarise_generated(runs: list[dict]) -> list[dict]:
    """Per (policy, load) over the held-out generated workloads: mean of the mean JCTs."""
    gen = [r for r in runs if r.get("generated")]
    out = []
    for pol, load in sorted({(r["policy"], r["load"]) for r in gen}):
        rs = [r for r in gen if r["policy"] == pol and r["load"] == load]
        out.append({"policy": pol, "load": load, "seeds": sorted(r["workload"] for r in rs),
                    "jct_mean": float(np.mean([r["jct_mean"] for r in rs])),
                    "clairvoyant": any(r["clairvoyant"] for r in rs)})
    return out


def plot(summary: list[dict], runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pols = [p for p in POLICIES if any(s["policy"] == p for s in summary)]
    pols += sorted({s["policy"] for s in summary} - set(pols))
    loads = sorted({s["load"] for s in summary})
    fig, axes = plt.subplots(1, len(loads), figsize=(4.2 * len(loads), 4), squeeze=False, sharey=False)
    for ax, load in zip(axes[0], loads):
        for i, pol in enumerate(pols):
            s = next((s for s in summary if s["policy"] == pol and s["load"] == load), None)
            if s is None:
                continue
            ax.bar(i - 0.18, s["jct_mean"], 0.36, color="C0", label="ours" if i == 0 else None)
            if s["published"]:
                ax.bar(i + 0.18, s["published"], 0.36, color="C1", label="published" if i == 0 else None)
            pts = [r["jct_mean"] for r in runs if r["policy"] == pol and r["load"] == load]
            ax.scatter([i - 0.18] * len(pts), pts, s=8, color="k", zorder=3)
        ax.set_xticks(range(len(pols)))
        ax.set_xticklabels([p + ("*" if p == "optimus-oracle" else "") for p in pols], fontsize=8, rotation=20)
        ax.set_title(f"{load:g}x load")
        ax.set_ylabel("mean JCT (s)")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Pollux OSDI'21 benchmark in our engine vs published (dots: workloads 1-8; *clairvoyant)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="bench/results/peers.json")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--loads", default="0.5,1.0,1.5")
    ap.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--generated", default="",
                    help="also run held-out workloads generated from Philly: comma list of pollux-gen seeds")
    ap.add_argument("--data-dir", default=None, help="default: $RLSCHED_DATA_DIR")
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--merge", default="", help="comma list of outputs of this script to merge into --out; runs nothing")
    args = ap.parse_args(argv)
    if args.merge:
        return merge([Path(x) for x in args.merge.split(",") if x], Path(args.out))
    from rich.progress import Progress

    policies = [p for p in args.policies.split(",") if p]
    skipped = {}
    if "pollux" in policies:
        from rlsched.sim.peers.pollux import pollux_available

        ok, why = pollux_available()
        if not ok:
            print(f"pollux: skipped: {why}", file=sys.stderr)
            skipped["pollux"] = why
            policies.remove("pollux")
    loads = [float(x) for x in args.loads.split(",")]
    wls = [int(x) for x in args.workloads.split(",") if x]
    gens = [int(x) for x in args.generated.split(",") if x]
    tasks = [(p, ld, w, False) for p in policies for ld in loads for w in wls]
    tasks += [(p, ld, g, True) for p in policies for ld in loads for g in gens]
    from rlsched.sim.traces import TraceError, data_dir

    try:  # the data must be there before any process starts
        ddir = data_dir(args.data_dir)
        if ddir is None or not (ddir / "pollux-osdi21").is_dir():
            raise TraceError(f"no pollux-osdi21/ under the data folder {ddir}: pass --data-dir or set RLSCHED_DATA_DIR")
    except TraceError as e:
        print(f"bench/peers.py: error: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runs = []
    with Progress() as prog, ProcessPoolExecutor(max_workers=max(args.procs, 1)) as pool:
        task = prog.add_task("peers", total=len(tasks))
        futs = {pool.submit(_one, p, ld, w, args.data_dir, gen): (p, ld, w, gen) for p, ld, w, gen in tasks}
        for f in as_completed(futs):
            runs.append(f.result())
            prog.advance(task)
    wall = time.perf_counter() - t0
    write_report(runs, out, skipped=skipped, wall_s=wall, procs=args.procs,
                 machine={"python": platform.python_version(), "cpus": os.cpu_count(),
                          "platform": platform.platform()})
    print(f"wall {wall:.0f} s on {args.procs} processes -> {out}, {out.with_suffix('.png')}")
    return 0


def write_report(runs: list[dict], out: Path, **extra) -> dict:
    """The report of ``runs`` (per-load summaries against the published figures, the
    held-out means, the runs, and ``extra``) at ``out``, its plot beside it, the
    summary printed; the report."""
    runs.sort(key=lambda r: (r.get("generated", False), r["policy"], r["load"], r["workload"]))
    summary = summarise(runs)
    held_out = summarise_generated(runs)
    report = {
        "benchmark": "Pollux OSDI'21 workloads, 16 nodes x 4 GPUs, 60 s interval, 30 s restart",
        "published_source": "Qiao et al., Pollux, OSDI 2021 (data README)",
        "tolerance": TOLERANCE, "summary": summary, "held_out": held_out, "runs": runs, **extra,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    plot(summary, runs, out.with_suffix(".png"))
    for s in summary:
        pub = f"{s['published']:,.0f}" if s["published"] else "-"
        ratio = f"{s['ratio']:.3f}" if s["ratio"] else "-"
        print(f"{s['policy']:16s} {s['load']:.1f}x  ours {s['jct_mean']:8,.0f} s  published {pub:>6s}  ratio {ratio}"
              + ("  (clairvoyant)" if s["clairvoyant"] else ""))
    for s in held_out:
        print(f"{s['policy']:16s} {s['load']:.1f}x  held-out pollux-gen seeds {s['seeds']}: {s['jct_mean']:8,.0f} s"
              + ("  (clairvoyant)" if s["clairvoyant"] else ""))
    return report


def merge(sources: list[Path], out: Path) -> int:
    """One report of the runs in ``sources`` (outputs of this script); a policy, load
    and workload measured twice is an error, not a silent choice."""
    runs, seen, machines, skipped = [], set(), [], {}
    for src in sources:
        rep = json.loads(src.read_text())
        for r in rep["runs"]:
            key = (r["policy"], r["load"], r["workload"], r.get("generated", False))
            if key in seen:
                print(f"bench/peers.py: error: {key} is in more than one of the merged files", file=sys.stderr)
                return 2
            seen.add(key)
            runs.append(r)
        machines.append({"source": str(src), "procs": rep.get("procs"), "wall_s": rep.get("wall_s"),
                         "machine": rep.get("machine"), "runs": len(rep["runs"])})
        skipped.update(rep.get("skipped", {}))
    write_report(runs, out, skipped=skipped, merged_from=machines)
    print(f"merged {len(runs)} runs from {len(sources)} files -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
