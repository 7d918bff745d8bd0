"""Simulator benchmark: events/s and jobs/s of FIFO/FirstFit.

    python bench/run.py --out bench/results [--jobs 100000] [--baseline-jobs 10000]

Times include building the simulator and running it (not loading or generating the
trace, reported apart as ``load_s``). Two workloads: the full Alibaba GPU 2023 trace (``alibaba2023:default``; skipped
with a note when no data folder is found) and a synthetic trace of ``--jobs`` jobs on
1,000 nodes x 8 GPUs. Each is also run with a naive full-scan first-fit placement
(:mod:`naive`) — on the whole Alibaba trace and on the first ``--baseline-jobs`` jobs
of the synthetic one, next to the indexed placement on the same jobs — so the
figures can be read as ratios measured on the same machine in the same run. Writes
``<out>/sim_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from naive import NaiveFirstFit  # noqa: E402

from rlsched.core import make_ordering, make_placement  # noqa: E402
from rlsched.sim import Simulator, compute_metrics  # noqa: E402
from rlsched.sim.traces import TraceError, load_trace  # noqa: E402


def _time_run(jobs, topology, placement, seed: int) -> dict:
    t0 = time.perf_counter()
    sim = Simulator(jobs, topology, ordering=make_ordering("fifo"), placement=placement, seed=seed)
    t1 = time.perf_counter()
    res = sim.run()
    t2 = time.perf_counter()
    m = compute_metrics(res)
    wall = t2 - t0  # building the simulator (accuracy curves of every job) + running it
    return {
        "placement": placement.name,
        "jobs": len(jobs),
        "events": res.events,
        "init_s": round(t1 - t0, 3),
        "run_s": round(t2 - t1, 3),
        "wall_s": round(wall, 3),
        "events_per_s": round(res.events / wall, 1),
        "jobs_per_s": round(len(res.records) / wall, 1),
        "jobs_completed": m["jobs_completed"],
        "jobs_unfittable": m["jobs_unfittable"],
        "jct_mean": m["jct_mean"],
    }


def _workload(name: str, spec: str, seed: int, baseline_jobs: int | None, progress) -> dict:
    t0 = time.perf_counter()
    trace = load_trace(spec, seed=seed)
    load_s = time.perf_counter() - t0
    progress(f"{name}: {len(trace.jobs)} jobs on {len(trace.topology)} nodes (loaded in {load_s:.1f} s)")
    out = {
        "trace": spec,
        "jobs": len(trace.jobs),
        "nodes": len(trace.topology),
        "gpus": trace.topology.total_gpus,
        "skipped": trace.skipped,
        "load_s": round(load_s, 3),
        "indexed": _time_run(trace.jobs, trace.topology, make_placement("firstfit"), seed),
    }
    progress(f"  indexed firstfit: {out['indexed']['wall_s']} s")
    sub = trace.jobs if baseline_jobs is None else trace.jobs[:baseline_jobs]
    if baseline_jobs is not None:
        out["indexed_subset"] = _time_run(sub, trace.topology, make_placement("firstfit"), seed)
        progress(f"  indexed firstfit, first {len(sub)} jobs: {out['indexed_subset']['wall_s']} s")
    out["naive"] = _time_run(sub, trace.topology, NaiveFirstFit(), seed)
    progress(f"  naive full-scan firstfit, {len(sub)} jobs: {out['naive']['wall_s']} s")
    ref = out.get("indexed_subset", out["indexed"])
    out["speedup_vs_naive"] = round(ref["jobs_per_s"] / out["naive"]["jobs_per_s"], 2)
    out["same_schedule_as_naive"] = ref["jct_mean"] == out["naive"]["jct_mean"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--baseline-jobs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args(argv)
    if args.data_dir:
        os.environ["RLSCHED_DATA_DIR"] = args.data_dir

    def progress(msg: str) -> None:
        print(msg, flush=True)

    result = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "workloads": {},
        "notes": [],
    }
    try:
        result["workloads"]["alibaba2023"] = _workload("alibaba2023", "alibaba2023:default", args.seed, None, progress)
    except TraceError as exc:
        note = f"alibaba2023 skipped: {exc}"
        result["notes"].append(note)
        progress(note)
    spec = f"synthetic:large,jobs={args.jobs},nodes=1000,gpus_per_node=8"
    result["workloads"]["synthetic"] = _workload("synthetic", spec, args.seed, args.baseline_jobs, progress)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sim_bench.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
