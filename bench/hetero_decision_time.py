"""How long one allocation decision takes on clusters of three GPU types, as a ratio to
FIFO's in the same run (``fifo/bestfit``, the gang allocator), with Sia's solve beside.

    python bench/hetero_decision_time.py --out bench/results/hetero_decision_time.json

Inputs are what the interval engine hands an allocator mid-run on Sia's 64-GPU mix
(``sia:workloads/philly/workload-1`` under the served allocator, every tenth decision
after the first hour): jobs with their per-type reports and seed profiles. A size is the
mix scaled ``k`` times (``sia-64`` x1: 64 GPUs; x32: 2,048 GPUs) and a job count; jobs
are drawn from the recorded lists (new ids), each running job's GPUs put back on nodes of
its own type with room (best fit), else it waits. Per policy: one warm-up, then
``--repeats`` decisions on fresh instances (``median_s``: every fit from scratch), and
``--repeats`` steady ones (``steady_median_s``): the instance that took the fresh decision
decides again after every running job reported one more step time, as between two
decisions of a run (the operator and the engines keep their allocator). Beside each
wall-clock median, the median CPU time of the process (``cpu_median_s``,
``steady_cpu_median_s``): what the decision costs when other work shares the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from typing import Sequence

import numpy as np

from rlsched.core.allocation import AllocJob, AllocNode

#: (mix scale, jobs): the issue's two sizes
DEFAULT_SIZES = "1:160,32:1000"
DEFAULT_POLICIES = "fifo/bestfit,goodput-rlpto,sia,gavel"


class _Recorder:
    """Wraps the driving allocator and keeps the engine's job lists; changes nothing."""

    def __init__(self, inner, every: int, start: float) -> None:
        self.inner, self.every, self.start = inner, every, start
        self.name, self.clairvoyant = inner.name, inner.clairvoyant
        self.type_aware = inner.type_aware
        self.calls, self.snapshots = 0, []

    def allocate(self, jobs, nodes, now):
        if now >= self.start and self.calls % self.every == 0 and jobs:
            self.snapshots.append(list(jobs))
        self.calls += 1
        return self.inner.allocate(jobs, nodes, now)


def capture(spec: str, driver: str, hours: float, data_dir: str | None) -> tuple[list[list[AllocJob]], object]:
    from rlsched.sim.allocators import make_allocator
    from rlsched.sim.interval import IntervalConfig, IntervalSimulator
    from rlsched.sim.traces import load_trace

    trace = load_trace(spec, data_dir=data_dir)
    rec = _Recorder(make_allocator(driver, seed=0), every=10, start=3600.0)
    cfg = dataclasses.replace(trace.interval_config(), max_time=hours * 3600.0, record_series=False)
    IntervalSimulator(trace.jobs, trace.apps, rec, cluster=trace.cluster, config=cfg,
                      seeds=getattr(trace, "seeds", None)).run()
    if not rec.snapshots:
        raise SystemExit(f"no job lists recorded from {spec} in {hours} h")
    return rec.snapshots, trace.cluster


def build_inputs(snapshots, cluster, scale: int, jobs: int, rng: np.random.Generator
                 ) -> tuple[list[AllocJob], list[AllocNode], float]:
    """``jobs`` recorded jobs on the mix scaled ``scale`` times (module docstring)."""
    nodes = [AllocNode(i, g, f"node-{i}", gpu_model=t, gpu_type=t)
             for i, (t, g) in enumerate((t, g) for _ in range(scale) for t, g in cluster.node_types())]
    old_type = dict(enumerate(t for t, _ in cluster.node_types()))
    free = np.array([n.gpus for n in nodes])
    now = 0.0
    out: list[AllocJob] = []
    while len(out) < jobs:
        snap = snapshots[int(rng.integers(len(snapshots)))]
        for j in snap[: jobs - len(out)]:
            alloc: tuple[int, ...] = ()
            if j.allocation:
                kind = old_type[j.allocation[0]]
                need = len(j.allocation)
                room = [i for i, n in enumerate(nodes) if n.gpu_type == kind and free[i] >= need]
                if room:  # whole on the fullest node of its type that holds it
                    best = min(room, key=lambda i: (free[i], rng.random()))
                    free[best] -= need
                    alloc = (best,) * need
            now = max(now, j.submit_time + j.age)
            out.append(dataclasses.replace(j, id=f"{j.id}#{len(out)}", allocation=alloc,
                                           **({} if alloc else {"batch_size": 0, "atomic_bsz": 0, "accum_steps": 0})))
    return out, nodes, now


def reported_once_more(jobs: Sequence[AllocJob], k: int) -> list[AllocJob]:
    """``jobs`` after each running one reported its ``k``-th further step time: its last
    sample again, a hair slower (so every running job's fit is asked for again)."""
    out = []
    for j in jobs:
        if j.allocation and j.profile:
            last = j.profile[-1]
            extra = dataclasses.replace(last, step_time=last.step_time * (1.0 + 1e-3 * k))
            out.append(dataclasses.replace(j, profile=j.profile + (extra,)))
        else:
            out.append(dataclasses.replace(j))
    return out


def time_policy(name: str, jobs, nodes, now: float, repeats: int) -> dict:
    from rlsched.sim.allocators import make_allocator

    fresh, steady, fresh_cpu, steady_cpu = [], [], [], []
    for k in range(repeats + 1):
        alloc = make_allocator(name, seed=0)
        copies = [dataclasses.replace(j) for j in jobs]
        t0, c0 = time.perf_counter(), time.process_time()
        alloc.allocate(copies, nodes, now)
        if k:  # the first call warms caches and imports
            fresh.append(time.perf_counter() - t0)
            fresh_cpu.append(time.process_time() - c0)
            again = reported_once_more(jobs, k)
            t0, c0 = time.perf_counter(), time.process_time()
            alloc.allocate(again, nodes, now + 1.0)
            steady.append(time.perf_counter() - t0)
            steady_cpu.append(time.process_time() - c0)
    return {"policy": name, "median_s": statistics.median(fresh), "max_s": max(fresh),
            "steady_median_s": statistics.median(steady), "steady_max_s": max(steady),
            "cpu_median_s": statistics.median(fresh_cpu), "steady_cpu_median_s": statistics.median(steady_cpu),
            "repeats": repeats}


def main(argv: Sequence[str] | None = None) -> int:
    from tqdm import tqdm

    from rlsched.core.policy import allocator_names
    from rlsched.sim.allocators import is_allocator

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="comma list of SCALE:JOBS (the sia-64 mix x SCALE)")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--trace", default="sia:workloads/philly/workload-1")
    ap.add_argument("--driver", default="goodput-rlpto")
    ap.add_argument("--hours", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args(argv)
    allocator_names()
    policies = [p for p in args.policies.split(",") if "/" in p or is_allocator(p)]
    missing = sorted(set(args.policies.split(",")) - set(policies))
    snapshots, cluster = capture(args.trace, args.driver, args.hours, args.data_dir)
    rng = np.random.default_rng(args.seed)
    rows = []
    for size in args.sizes.split(","):
        scale, n = (int(x) for x in size.split(":"))
        jobs, nodes, now = build_inputs(snapshots, cluster, scale, n, rng)
        for name in tqdm(policies, desc=f"{sum(x.gpus for x in nodes)} GPUs, {n} jobs"):
            row = time_policy(name, jobs, nodes, now, args.repeats)
            rows.append({"gpus": sum(x.gpus for x in nodes), "jobs": n, "types": len(cluster.gpu_types),
                         "running": sum(1 for j in jobs if j.allocation), **row})
    for r in rows:
        base = next(b for b in rows if b["gpus"] == r["gpus"] and b["policy"] == policies[0])
        r["ratio_to_fifo"] = r["median_s"] / base["median_s"]
        r["steady_ratio_to_fifo"] = r["steady_median_s"] / base["steady_median_s"]
    with open(args.out, "w") as f:
        json.dump({"trace": args.trace, "driver": args.driver, "not_registered": missing, "rows": rows}, f, indent=2)
    for r in rows:
        print(f"{r['gpus']:>5} GPUs {r['jobs']:>5} jobs  {r['policy']:<16} fresh {r['median_s'] * 1e3:9.1f} ms "
              f"x{r['ratio_to_fifo']:.1f} FIFO  steady {r['steady_median_s'] * 1e3:9.1f} ms "
              f"x{r['steady_ratio_to_fifo']:.1f} FIFO  (CPU {r['cpu_median_s'] * 1e3:.1f} / "
              f"{r['steady_cpu_median_s'] * 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
