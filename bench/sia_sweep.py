"""Mean JCT of allocator settings on the Sia benchmark's cluster, one run at a time.

Runs each named setting on ``pollux-gen`` workloads drawn for ``sia-64`` (validation
seeds, 10,000 ..) or on the Sia paper's Philly workloads (seeds 1..8:
``sia:workloads/philly/workload-N``, the test set), in the interval engine as ``rlsched
sim run`` builds it, and prints the mean JCT per seed, then each setting paired with
the first (and with ``--against``) by a percentile bootstrap over the seeds
(:func:`rlsched.sim.protocol.paired_bootstrap`). Results are appended to ``--out`` as
JSON lines, and a run already there is read back instead of run again.

    python bench/sia_sweep.py --seeds 10000-10005 --jobs 160 --load 1 \\
        served=goodput-rlpto sia=sia 'm=goodput-rlpto:{"measured_restart":true}'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _setting(text: str) -> tuple[str, str, dict]:
    """``label=policy[:{json options}]``."""
    label, _, rest = text.partition("=")
    policy, _, opts = rest.partition(":")
    return label, policy, json.loads(opts) if opts else {}


def _spec(seed: int, jobs: int, load: float) -> str:
    """The sia suite's trace for ``seed``: its published Philly workload (1..8) or a
    ``pollux-gen`` draw (``rlsched eval protocol --suite sia``)."""
    from rlsched.sim.evaluate import SUITES

    suite = SUITES["sia"]
    if seed < 100:
        return suite.published[0][1].format(w=seed)
    return suite._spec(load, seed, jobs)


def run_one(spec: str, policy: str, options: dict) -> dict:
    from rlsched.sim.allocators import make_allocator
    from rlsched.sim.interval import IntervalSimulator
    from rlsched.sim.metrics import compute_metrics
    from rlsched.sim.traces import load_trace

    trace = load_trace(spec)
    t0 = time.perf_counter()
    sim = IntervalSimulator(trace.jobs, trace.apps, make_allocator(policy, **options), cluster=trace.cluster,
                            config=trace.interval_config(), seeds=trace.seeds)
    m = compute_metrics(sim.run())
    return {"jct_mean": float(m["jct_mean"]), "restarts": int(m["rescales_total"]),
            "unfinished": len(sim.result().unfinished), "wall_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("settings", nargs="+", help="label=policy[:{json options}]; the first is the reference")
    ap.add_argument("--seeds", required=True, help="e.g. 10000-10005, or 1-8 for the Philly workloads")
    ap.add_argument("--jobs", type=int, default=160)
    ap.add_argument("--load", type=float, default=1.0)
    ap.add_argument("--against", default=None, help="a label also paired with every setting (e.g. sia)")
    ap.add_argument("--out", type=Path, default=Path("out/sia_sweep.jsonl"))
    a = ap.parse_args(argv)
    from rlsched.sim.protocol import paired_bootstrap

    seeds = _seeds(a.seeds)
    settings = [_setting(s) for s in a.settings]
    done: dict[tuple, dict] = {}
    if a.out.exists():
        for line in a.out.read_text().splitlines():
            r = json.loads(line)
            done[(r["spec"], r["policy"], json.dumps(r["options"], sort_keys=True))] = r
    a.out.parent.mkdir(parents=True, exist_ok=True)
    table: dict[str, list[float]] = {}
    for label, policy, options in settings:
        row = []
        for s in seeds:
            spec = _spec(s, a.jobs, a.load)
            key = (spec, policy, json.dumps(options, sort_keys=True))
            if key not in done:
                r = {"spec": spec, "policy": policy, "options": options, **run_one(spec, policy, options)}
                with a.out.open("a") as f:
                    f.write(json.dumps(r) + "\n")
                done[key] = r
            row.append(done[key]["jct_mean"])
            print(f"{label:>14} {spec}: {done[key]['jct_mean']:.2f} s, restarts {done[key]['restarts']}, "
                  f"unfinished {done[key]['unfinished']}", file=sys.stderr, flush=True)
        table[label] = row
    print("| setting | mean | " + " | ".join(str(s) for s in seeds) + " |")
    print("|---|---:|" + "---:|" * len(seeds))
    for label, row in table.items():
        print(f"| {label} | {sum(row) / len(row):,.2f} | " + " | ".join(f"{x:,.2f}" for x in row) + " |")
    refs = [settings[0][0]] + ([a.against] if a.against and a.against in table else [])
    for ref in refs:
        for label, row in table.items():
            if label == ref or len(seeds) < 2:
                continue
            d = paired_bootstrap(row, table[ref])
            lower = sum(x < y for x, y in zip(row, table[ref]))
            print(f"{label} vs {ref}: {d.rel:+.1%} [{d.rel_lo:+.1%}, {d.rel_hi:+.1%}], lower on {lower} of {len(seeds)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
