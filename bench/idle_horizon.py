"""Mean JCT of the served allocator (goodput-rlpto) with and without ``idle_horizon``
(core/goodput_allocator.py) on the Pollux OSDI'21 published workloads, interval engine,
16 x 4 GPUs: whether growing young jobs into GPUs nobody waits for pays in simulation.

    python bench/idle_horizon.py --folder workloads-0.5 --workloads 1,2,3,4,5,6,7,8 --horizon 600
"""

from __future__ import annotations

import argparse
import json
import statistics


def main(argv: list[str] | None = None) -> int:
    from rlsched.core.rlpto_weight import rlpto_goodput
    from rlsched.sim.interval import IntervalConfig, IntervalSimulator
    from rlsched.sim.metrics import compute_metrics
    from rlsched.sim.traces import load_trace

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--folder", default="workloads-0.5", help="pollux-osdi21 folder: workloads, workloads-0.5, -1.5")
    ap.add_argument("--workloads", default="1,2,3,4,5,6,7,8")
    ap.add_argument("--horizon", type=float, default=600.0)
    ap.add_argument("--data-dir", default=None, help="default: $RLSCHED_DATA_DIR")
    args = ap.parse_args(argv)
    rows = []
    for w in (int(x) for x in args.workloads.split(",")):
        trace = load_trace(f"pollux:{args.folder}/workload-{w}", data_dir=args.data_dir)
        jct = {}
        for h in (0.0, args.horizon):
            sim = IntervalSimulator(trace.jobs, trace.apps, rlpto_goodput(idle_horizon=h), nodes=16, gpus_per_node=4,
                                    config=IntervalConfig(interval=trace.interval))
            jct[h] = compute_metrics(sim.run())["jct_mean"]
        rows.append({"workload": w, "off": jct[0.0], "on": jct[args.horizon]})
        print(json.dumps(rows[-1]), flush=True)
    off, on = statistics.mean(r["off"] for r in rows), statistics.mean(r["on"] for r in rows)
    print(json.dumps({"folder": args.folder, "horizon": args.horizon, "mean_off": off, "mean_on": on,
                      "change": on / off - 1}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
