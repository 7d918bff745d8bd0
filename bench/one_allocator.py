"""A heuristic run by the event engine two ways, side by side: its own admission passes
(ordering + placement) and one allocator call per event (``LiveAllocation`` over the
gang allocator, as the operator's ``--allocator ordering/placement``).

    python bench/one_allocator.py --trace synthetic:small --policy fifo/bestfit+backfill \\
        --seeds 10000,10001 --out out/one_allocator.json

A scaling heuristic (``ordering/placement/scaling``) scales on the engine's scaling ticks
in its passes; ``--scale-every 300`` gives the allocator the same cadence.

Per seed: both mean JCTs, their difference, the preemptions and the wall-time and
CPU-time ratios (allocator over passes, same process; CPU time is steadier on a shared
machine). Validation seeds only.
"""

from __future__ import annotations

import argparse
import json
import time


def compare(spec: str, policy: str, seed: int, data_dir: str | None = None, scale_every: float | None = None,
            decision_gap: float = 0.0) -> dict:
    import numpy as np

    from rlsched.core import make_ordering, make_placement, make_scaling
    from rlsched.core.live_allocation import LiveAllocation
    from rlsched.core.served import parse_policy_name
    from rlsched.sim.engine import SimConfig, Simulator
    from rlsched.sim.metrics import compute_metrics
    from rlsched.sim.traces import default_topology, load_trace

    pol = parse_policy_name(policy)
    if pol.allocator or not pol.ordering:
        raise SystemExit(f"{policy!r}: give ordering/placement[/scaling][+backfill|+nobackfill]")
    trace = load_trace(spec, data_dir=data_dir, seed=seed)
    topo = trace.topology if trace.topology is not None else default_topology(trace.jobs)
    cfg = SimConfig(backfill=pol.backfill is not False, decision_gap=decision_gap)
    out = {"trace": spec, "policy": policy, "seed": seed, "decision_gap": decision_gap, "scale_every": scale_every}
    for path in ("passes", "allocator"):
        so, sp, ss = np.random.SeedSequence(seed).spawn(3)
        scaling = make_scaling(pol.scaling, rng=np.random.default_rng(ss)) if pol.scaling else None
        placement = make_placement(pol.placement, rng=np.random.default_rng(sp))
        t0, c0 = time.perf_counter(), time.process_time()
        if path == "passes":
            sim = Simulator(trace.jobs, topo, ordering=make_ordering(pol.ordering, rng=np.random.default_rng(so)),
                            placement=placement, scaling=scaling, seed=seed, config=cfg)
        else:
            sim = Simulator(trace.jobs, topo, placement=placement, seed=seed, config=cfg,
                            allocation=LiveAllocation.named(policy if scale_every is None or not pol.scaling
                                                            else f"{policy}@scale_every={scale_every:g}"))
        m = compute_metrics(sim.run())
        out[path] = {"jct_mean": m["jct_mean"], "preemptions": m["preemptions_total"],
                     "completed": m["jobs_completed"], "wall_s": time.perf_counter() - t0,
                     "cpu_s": time.process_time() - c0}
    out["jct_difference"] = out["allocator"]["jct_mean"] / out["passes"]["jct_mean"] - 1.0
    out["wall_ratio"] = out["allocator"]["wall_s"] / max(out["passes"]["wall_s"], 1e-9)
    out["cpu_ratio"] = out["allocator"]["cpu_s"] / max(out["passes"]["cpu_s"], 1e-9)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", required=True)
    p.add_argument("--policy", required=True, help="ordering/placement[+backfill|+nobackfill]")
    p.add_argument("--seeds", default="10000", help="comma-separated validation seeds")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--scale-every", type=float, default=None,
                   help="the allocator's seconds between scaling steps (default: every decision)")
    p.add_argument("--decision-gap", type=float, default=0.0,
                   help="the allocator's least seconds between decisions on events (default 0: every event, "
                        "as the passes decide)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from tqdm import tqdm

    rows = [compare(args.trace, args.policy, int(s), args.data_dir, args.scale_every, args.decision_gap)
            for s in tqdm(args.seeds.split(","), desc="seeds")]
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=2)
    for r in rows:
        print(f"seed {r['seed']}: passes {r['passes']['jct_mean']:.1f} s, allocator {r['allocator']['jct_mean']:.1f} s "
              f"({r['jct_difference']:+.2%}), wall x{r['wall_ratio']:.1f}, CPU x{r['cpu_ratio']:.1f} "
              f"({r['passes']['cpu_s']:.2f} s -> {r['allocator']['cpu_s']:.2f} s)")


if __name__ == "__main__":
    main()
