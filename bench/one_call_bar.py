"""A candidate's recorded test-split runs against a heuristic baseline run both ways: the
event engine's passes and the one allocator call (``bench/one_allocator.py``'s rows).

    python bench/one_call_bar.py --recorded docs/results/room_rounds_test.json \\
        --candidate 'goodput-rlpto@adaptive=0.8,room_rounds=30/das' --suite synthetic \\
        --rows 1.5=out/syn_15_nobackfill.json --rows 2=out/syn_2_nobackfill.json \\
        --out docs/results/one_call_bar.json

Per load and baseline: the paired difference of the candidate's mean JCT against the
baseline's through each path, with percentile bootstrap 95% intervals (the protocol's
``paired_bootstrap``), on the seeds both have. The passes' figures must equal the
recorded baseline's where the record has that baseline: a check that the rows are the
protocol's runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Mapping


def recorded_runs(recorded: Mapping, suite: str, load: float, policy: str) -> dict[int, float]:
    """Seed -> mean JCT of ``policy``'s runs on ``suite`` at ``load`` in an
    ``event_decisions`` record (``{"suites": [{"runs": [...]}]}``)."""
    return {int(r["seed"]): float(r["jct_mean"]) for s in recorded["suites"] for r in s["runs"]
            if r["suite"] == suite and float(r["load"]) == load and r["policy"] == policy}


def bar(candidate: Mapping[int, float], rows: list[dict], baseline: Mapping[int, float] | None = None) -> dict:
    """The candidate against ``rows``' passes and allocator, paired by seed."""
    from rlsched.sim.protocol import paired_bootstrap

    seeds = [r["seed"] for r in rows if r["seed"] in candidate]
    by_seed = {r["seed"]: r for r in rows}
    if baseline:
        off = [s for s in seeds if s in baseline and by_seed[s]["passes"]["jct_mean"] != baseline[s]]
        if off:
            raise SystemExit(f"the passes differ from the recorded baseline on seeds {off}: not the protocol's runs")
    out = {"policy": rows[0]["policy"], "trace": rows[0]["trace"], "seeds": seeds}
    cand = [candidate[s] for s in seeds]
    for path in ("passes", "allocator"):
        d = paired_bootstrap(cand, [by_seed[s][path]["jct_mean"] for s in seeds])
        out[path] = d.to_dict()
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recorded", required=True, help="an event_decisions JSON with the candidate's runs")
    p.add_argument("--candidate", required=True, help="the candidate's policy name in that record")
    p.add_argument("--suite", required=True)
    p.add_argument("--rows", action="append", required=True, help="LOAD=one_allocator.json (repeatable)")
    p.add_argument("--out", required=True)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    with open(args.recorded) as f:
        recorded = json.load(f)
    results = []
    for item in args.rows:
        load, _, path = item.partition("=")
        with open(path) as f:
            rows = json.load(f)
        cand = recorded_runs(recorded, args.suite, float(load), args.candidate)
        base = recorded_runs(recorded, args.suite, float(load), rows[0]["policy"])
        results.append({"load": float(load), **bar(cand, rows, base)})
    with open(args.out, "w") as f:
        json.dump({"command": "python bench/one_call_bar.py " + " ".join(argv), "results": results}, f, indent=2)
    for r in results:
        for path in ("passes", "allocator"):
            d = r[path]
            print(f"{args.suite} {r['load']:g}x vs {r['policy']} ({path}): {d['rel']:+.1%} "
                  f"[{d['rel_lo']:+.1%}, {d['rel_hi']:+.1%}], n={d['n']}")


if __name__ == "__main__":
    main()
