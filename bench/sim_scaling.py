"""How the simulation time of the served learned policies grows with the trace.

Issue 15: the learned ordering (``das``, the trained DAS ordering agent) and placement
(``das-agent``, the trained DAS placement agent) must simulate within 4x of
``fifo/firstfit`` and grow linearly with the number of jobs. For each job count this
replays the first N pods of the Alibaba GPU 2023 trace (``openb_pod_list_<list>.csv``;
the list is repeated, shifted past its own span with new ids, when N exceeds it) on the
trace's 1,213 GPU nodes, arrivals scaled so that the offered load is ``--load`` (1.2)
for those N jobs (:func:`rlsched.sim.traces.spec.scale_for_load`), once with
``fifo/firstfit`` and once with the learned pair, in the same process one after the
other (the machine may be shared: ratios are taken between runs of the same moment).

Reported per size (JSON): simulated events, seconds of ``Simulator.run`` (CPU seconds
of the process by default, steadier than wall seconds on a shared machine; both are
written; the best of ``--repeats``) for each policy, the ratio learned / FIFO, and the growth exponents:
the log-log slope between consecutive sizes and the least-squares slope over all sizes
(1 = linear). ``--reference-jobs`` also times the DAS agents as they were before issue
15 (``tests/oracles/das_reference.py``, the same decisions) at those sizes, and checks the
schedules are equal.

Run: ``python bench/sim_scaling.py --out bench-results/sim_scaling.json`` (data folder
from ``--data-dir`` or ``RLSCHED_DATA_DIR``).
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    # before numpy loads: one BLAS thread unless the caller sets these. The simulator is
    # single-threaded and its products are small; BLAS threads spinning on a shared
    # machine only add time (and CPU seconds) to the learned policies' runs.
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import argparse
import hashlib
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

from rlsched.core import make_ordering, make_placement
from rlsched.sim.engine import SimConfig, Simulator
from rlsched.sim.traces import TraceError, load_trace
from rlsched.sim.traces.spec import scale_for_load

#: the test oracles (the DAS agents' slow reference path): a checkout's, never in the wheel
ORACLES = Path(__file__).resolve().parents[1] / "tests" / "oracles"

__all__ = ["tiled_jobs", "run_once", "slopes", "main"]

LEARNED = "das/das-agent"
BASELINE = "fifo/firstfit"
TARGET_RATIO = 4.0


def tiled_jobs(jobs, n: int):
    """The first ``n`` jobs of ``jobs`` by submit time, the list repeated after its own
    span (plus one mean inter-arrival gap) with ids ``<id>~<copy>`` when ``n`` exceeds it."""
    base = sorted(jobs, key=lambda j: (j.submit_time, j.id))
    if not base:
        raise TraceError("the trace has no jobs")
    t0 = base[0].submit_time
    span = base[-1].submit_time - t0
    gap = span / max(len(base) - 1, 1)
    out = []
    copy = 0
    while len(out) < n:
        shift = copy * (span + gap)
        for j in base:
            if len(out) == n:
                break
            out.append(j if copy == 0 else j.with_(id=f"{j.id}~{copy}", submit_time=j.submit_time + shift))
        copy += 1
    return out


def _policies(name: str, reference: bool):
    o, p = name.split("/")
    if reference:
        if str(ORACLES) not in sys.path:
            sys.path.insert(0, str(ORACLES))
        from das_reference import ReferenceDASAgentPlacement, ReferenceDASOrdering

        if (o, p) != ("das", "das-agent"):
            raise ValueError("the reference path exists for das/das-agent only")
        return ReferenceDASOrdering(), ReferenceDASAgentPlacement()
    return make_ordering(o), make_placement(p)


def run_once(jobs, topology, policy: str, config: SimConfig, *, reference: bool = False, progress=None) -> dict:
    """One simulation; wall seconds of construction and of ``run``, events, a digest of
    the schedule (job, start, end) to compare runs."""
    ordering, placement = _policies(policy, reference)
    t0 = time.perf_counter()
    sim = Simulator(jobs, topology, ordering=ordering, placement=placement, seed=0, config=config)
    t1 = time.perf_counter()
    c1 = time.process_time()
    res = sim.run(progress=progress)
    c2 = time.process_time()
    t2 = time.perf_counter()
    sched = sorted((r.id, r.start, r.end) for r in res.records)
    return {
        "build_s": t1 - t0,
        "wall_s": t2 - t1,
        "cpu_s": c2 - c1,
        "events": res.events,
        "finished": len(res.records),
        "digest": hashlib.sha256(repr(sched).encode()).hexdigest()[:16],
        "mean_jct_s": float(np.mean([r.jct for r in res.records])) if res.records else math.nan,
    }


def slopes(ns, ts) -> dict:
    """Log-log slopes: between consecutive sizes, and least squares over all."""
    ns = np.asarray(ns, dtype=float)
    ts = np.asarray(ts, dtype=float)
    ok = (ns > 0) & (ts > 0)
    ns, ts = ns[ok], ts[ok]
    pair = [float(math.log(ts[k + 1] / ts[k]) / math.log(ns[k + 1] / ns[k])) for k in range(len(ns) - 1)]
    fit = float(np.polyfit(np.log(ns), np.log(ts), 1)[0]) if len(ns) >= 2 else math.nan
    return {"pairwise": pair, "fit": fit}


def _ints(text: str) -> list[int]:
    out = [int(x) for x in text.split(",") if x.strip()]
    if any(x < 1 for x in out):
        raise argparse.ArgumentTypeError("job counts must be >= 1")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    ap.add_argument("--jobs", type=_ints, default=[1000, 4000, 16000], help="job counts (default 1000,4000,16000)")
    ap.add_argument("--load", type=float, default=1.2, help="offered load of each replay (default 1.2)")
    ap.add_argument("--list", default="default", help="openb pod list (default: default)")
    ap.add_argument("--data-dir", help="trace data folder (default: $RLSCHED_DATA_DIR)")
    ap.add_argument("--policy", default=LEARNED, help=f"the learned ordering/placement (default {LEARNED})")
    ap.add_argument("--baseline", default=BASELINE, help=f"the baseline ordering/placement (default {BASELINE})")
    ap.add_argument("--repeats", type=int, default=1, help="runs per policy and size; the fastest counts (default 1)")
    ap.add_argument("--backfill", action="store_true", help="simulate with backfill")
    ap.add_argument("--reference-jobs", type=_ints, default=[],
                    help="also time the pre-issue-15 DAS agents at these job counts (e.g. 1000,4000)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="what the ratios and slopes compare: CPU seconds of this process (default; steadier "
                    "on a shared machine) or wall seconds; both are written")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    if args.repeats < 1 or not args.load > 0:
        ap.error("need --repeats >= 1 and --load > 0")
    clock = f"{args.clock}_s"

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    trace = load_trace(f"alibaba2023:{args.list}", data_dir=args.data_dir)
    topo = trace.topology
    config = SimConfig(backfill=args.backfill, record_series=False)
    sizes = sorted(set(args.jobs) | set(args.reference_jobs))
    rows = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=args.quiet, transient=False) as bar:
        for n in sizes:
            jobs = tiled_jobs(trace.jobs, n)
            trace.jobs, orig = jobs, trace.jobs
            scale = scale_for_load(trace, args.load)
            trace.jobs = orig
            jobs = [j.with_(submit_time=j.submit_time * scale) for j in jobs]
            runs: dict[str, list[dict]] = {}
            plan = []
            if n in args.jobs:
                plan += [(args.baseline, False), (args.policy, False)] * args.repeats
            if n in args.reference_jobs:
                plan += [(args.policy, True)]
            for name, ref in plan:
                label = f"{name} (before issue 15)" if ref else name
                task = bar.add_task(f"{n:>6} jobs  {label}", total=n)
                r = run_once(jobs, topo, name, config, reference=ref,
                             progress=lambda done, total, t=task: bar.update(t, completed=done, total=total))
                bar.update(task, completed=n)
                runs.setdefault(label, []).append(r)
            row = {"jobs": n, "arrival_scale": scale}
            for label, rs in runs.items():
                best = min(rs, key=lambda r: r[clock])
                row[label] = {**best, "run_s": best[clock], "runs_s": [r[clock] for r in rs]}
            digests = {r["digest"] for label, rs in runs.items() if label.startswith(args.policy) for r in rs}
            row["same_schedule_as_reference"] = (len(digests) == 1) if n in args.reference_jobs else None
            if args.baseline in runs and args.policy in runs:
                row["ratio"] = row[args.policy]["run_s"] / row[args.baseline]["run_s"]
                row["ratio_wall"] = (min(r["wall_s"] for r in runs[args.policy])
                                     / min(r["wall_s"] for r in runs[args.baseline]))
            rows.append(row)

    measured = [r for r in rows if args.policy in r and args.baseline in r]
    ns = [r["jobs"] for r in measured]
    out = {
        "bench": "sim_scaling",
        "trace": f"alibaba2023:{args.list}", "nodes": len(topo), "gpus": topo.total_gpus, "load": args.load,
        "backfill": args.backfill, "policy": args.policy, "compared_with": args.baseline, "repeats": args.repeats,
        "clock": args.clock,
        "blas_threads": {k: os.environ.get(k) for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        "target_ratio": TARGET_RATIO,
        "sizes": rows,
        "slope": {
            args.policy: slopes(ns, [r[args.policy]["run_s"] for r in measured]),
            args.baseline: slopes(ns, [r[args.baseline]["run_s"] for r in measured]),
        },
        "max_ratio": max((r["ratio"] for r in measured), default=math.nan),
        "host": {"python": sys.version.split()[0], "machine": platform.machine(), "numpy": np.__version__},
        "note": "run_s: seconds of Simulator.run by the chosen clock (CPU seconds of this process by default: "
                "the simulator is single-threaded and the machine may be shared), the best of the repeats; "
                "ratios are between runs made one after the other in this process",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for r in measured:
        print(f"{r['jobs']:>6} jobs: {args.policy} {r[args.policy]['run_s']:.2f} s, {args.baseline} "
              f"{r[args.baseline]['run_s']:.2f} s, ratio {r['ratio']:.2f} (target <= {TARGET_RATIO:g})")
    for r in rows:
        ref = r.get(f"{args.policy} (before issue 15)")
        if ref:
            print(f"{r['jobs']:>6} jobs: before issue 15 {ref['run_s']:.2f} s, same schedule: {r['same_schedule_as_reference']}")
    s = out["slope"][args.policy]
    print(f"growth exponent of {args.policy}: fit {s['fit']:.2f}, pairwise {', '.join(f'{x:.2f}' for x in s['pairwise'])}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
