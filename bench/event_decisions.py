"""Mean JCT on the protocol's suites under engine settings, per validation seed: when an
allocation policy decides (on events, with a gap; or every interval) and its options.
The pollux suite runs on the interval engine (overrides: ``IntervalConfig`` fields).

    python bench/event_decisions.py --suite alibaba --load 1.0 --seeds 10000,10001,10002 \\
        --run 'goodput-rlpto/das' --run 'goodput-rlpto/das {"allocate_on_events": false}' \\
        --run 'tiresias/das+backfill' --procs 2 --out out/event_decisions.json

    python bench/event_decisions.py --suite pollux --jobs 160 --load 1.0 --run 'rlsched' \\
        --run 'goodput-rlpto@adaptive=0.8/das' --run 'tiresias-2q'

Each ``--run`` is a policy name (``rlsched sim`` spelling, allocator options with
``@key=value``) and, optionally, a JSON object of ``SimConfig`` overrides. Validation
seeds only: choices made here are checked on the protocol's test split.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace

#: the protocol's suites (sim/evaluate.py SUITES) whose trace specs are used
EVENT_SUITES = ("alibaba", "synthetic", "pollux")


def _spec(suite: str, load: float, jobs: int, seed: int) -> str:
    """The protocol's trace spec of ``suite`` at ``load`` for validation seed ``seed``."""
    from rlsched.sim.evaluate import SUITES

    return SUITES[suite]._spec(load, seed, jobs)


def _one(task: tuple) -> dict:
    from rlsched.core.served import parse_policy_name
    from rlsched.sim.cli import policy_config, run_allocator, run_policy
    from rlsched.sim.engine import SimConfig
    from rlsched.sim.traces import MeasuredTrace, default_topology, load_trace

    suite, load, jobs, seed, name, overrides, data_dir = task
    trace = load_trace(_spec(suite, load, jobs, seed), data_dir=data_dir, seed=seed)
    pol = parse_policy_name(name)
    t0 = time.perf_counter()
    if isinstance(trace, MeasuredTrace):  # the interval engine, as the protocol runs it
        cfg = replace(trace.interval_config(), **overrides)
        _, m = run_allocator(trace, trace.cluster, pol.label, cfg, seed=seed)
    else:
        topo = trace.topology if trace.topology is not None else default_topology(trace.jobs)
        cfg = replace(policy_config(SimConfig(), pol), **overrides)
        _, m = run_policy(trace, topo, pol.ordering, pol.placement, pol.scaling, seed, cfg, allocator=pol.allocator)
    return {"suite": suite, "load": load, "seed": seed, "policy": name, "config": overrides,
            "jct_mean": m["jct_mean"], "wall_s": time.perf_counter() - t0}


def _run(text: str) -> tuple[str, dict]:
    name, _, rest = text.strip().partition(" ")
    overrides = json.loads(rest) if rest.strip() else {}
    if not isinstance(overrides, dict):
        raise argparse.ArgumentTypeError(f"{text!r}: the overrides must be a JSON object")
    return name, overrides


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", choices=EVENT_SUITES, required=True)
    ap.add_argument("--load", type=float, action="append", required=True)
    ap.add_argument("--seeds", default="10000,10001,10002", help="validation seeds (10000..)")
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--run", type=_run, action="append", required=True, help="'policy [JSON SimConfig overrides]'")
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--data-dir", default=None, help="default: $RLSCHED_DATA_DIR")
    ap.add_argument("--out", default=None, help="JSON file of every run")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    tasks = [(args.suite, L, args.jobs, s, name, over, args.data_dir)
             for L in args.load for s in seeds for name, over in args.run]
    rows = []
    with ProcessPoolExecutor(max(args.procs, 1)) as ex:
        for row in tqdm(ex.map(_one, tasks), total=len(tasks), desc="runs"):
            rows.append(row)
    for name, over in args.run:
        for L in args.load:
            vals = [r["jct_mean"] for r in rows if r["policy"] == name and r["config"] == over and r["load"] == L]
            print(f"{args.suite} {L:g} {name} {json.dumps(over)}: mean JCT {sum(vals) / len(vals):,.0f} s "
                  f"({', '.join(f'{v:,.0f}' for v in vals)})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"suite": args.suite, "seeds": seeds, "runs": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
