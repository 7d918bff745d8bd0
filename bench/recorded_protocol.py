"""The protocol's bar from recorded runs: screen the pool on validation, pair a candidate
against the strongest on test, without running anything again.

    python bench/recorded_protocol.py --suite synthetic --validation out/syn_val.json \\
        --test out/syn_test_15.json --test out/syn_test_2.json \\
        --recorded docs/results/room_rounds_test.json \\
        --candidate 'goodput-rlpto@adaptive=0.8,room_rounds=30/das' --out docs/results/x.json

Every file is ``bench/event_decisions.py``'s JSON (``{"runs": [...]}``, or
``{"suites": [{"runs": [...]}]}``). Per load: the ``--top`` strongest of the pool on the
validation runs (``rlsched.sim.evaluate.select_strongest``, as ``rlsched eval
protocol`` screens), then the candidate's test runs paired by seed against each of them
and against the best of them on test, with percentile bootstrap 95% intervals
(``paired_bootstrap``). For a candidate whose decisions did not change since its runs
were recorded: the protocol's own command runs it again.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Iterable, Mapping


def runs_of(record: Mapping) -> list[dict]:
    """The runs of an ``event_decisions`` JSON, either layout."""
    if "suites" in record:
        return [r for s in record["suites"] for r in s["runs"]]
    return list(record["runs"])


def by_policy(runs: Iterable[Mapping], suite: str, load: float) -> dict[str, dict[int, float]]:
    """``policy -> {seed: mean JCT}`` of the runs on ``suite`` at ``load``."""
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        if r["suite"] == suite and float(r["load"]) == load and r.get("config", {}) == {}:
            out.setdefault(r["policy"], {})[int(r["seed"])] = float(r["jct_mean"])
    return out


def cell(validation: Mapping[str, Mapping[int, float]], test: Mapping[str, Mapping[int, float]],
         candidate: Mapping[int, float], top: int) -> dict:
    """One load: the strongest on validation, their test means, the candidate against each."""
    import numpy as np

    from rlsched.sim.evaluate import select_strongest
    from rlsched.sim.protocol import paired_bootstrap

    means = {p: float(np.mean(list(v.values()))) for p, v in validation.items()}
    strongest = select_strongest(means, top)
    missing = [p for p in strongest if p not in test]
    if missing:
        raise SystemExit(f"no test runs of the strongest {missing}")
    seeds = sorted(candidate)
    rows = []
    for p in strongest:
        if sorted(test[p]) != seeds:
            raise SystemExit(f"{p}: test seeds differ from the candidate's")
        d = paired_bootstrap([candidate[s] for s in seeds], [test[p][s] for s in seeds])
        rows.append({"compared_with": p, "test_mean": float(np.mean([test[p][s] for s in seeds])),
                     "lower_on": sum(candidate[s] < test[p][s] for s in seeds), **d.to_dict()})
    best = min(rows, key=lambda r: (r["test_mean"], r["compared_with"]))
    return {"validation_means": means, "strongest": strongest, "seeds": seeds,
            "candidate_mean": float(np.mean([candidate[s] for s in seeds])), "pairs": rows,
            "best_on_test": best["compared_with"], "bar_met": best["rel_hi"] <= 0.01}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", required=True)
    p.add_argument("--validation", action="append", required=True, help="the pool's validation runs (repeatable)")
    p.add_argument("--test", action="append", required=True, help="the strongest baselines' test runs (repeatable)")
    p.add_argument("--recorded", required=True, help="the candidate's recorded test runs")
    p.add_argument("--candidate", required=True)
    p.add_argument("--top", type=int, default=3)
    p.add_argument("--out", required=True)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)

    def load(paths):
        out = []
        for path in paths:
            with open(path) as f:
                out += runs_of(json.load(f))
        return out

    val, test, rec = load(args.validation), load(args.test), load([args.recorded])
    loads = sorted({float(r["load"]) for r in test if r["suite"] == args.suite})
    cells = {}
    for L in loads:
        cand = by_policy(rec, args.suite, L).get(args.candidate)
        if not cand:
            raise SystemExit(f"no recorded runs of {args.candidate!r} on {args.suite} at load {L}")
        c = cells[str(L)] = cell(by_policy(val, args.suite, L), by_policy(test, args.suite, L), cand, args.top)
        b = next(r for r in c["pairs"] if r["compared_with"] == c["best_on_test"])
        print(f"{args.suite} {L:g}: {args.candidate} {c['candidate_mean']:,.1f} vs {b['compared_with']} "
              f"{b['test_mean']:,.1f}: {b['rel']:+.1%} [{b['rel_lo']:+.1%}, {b['rel_hi']:+.1%}]"
              f"{'' if c['bar_met'] else '  (bar missed)'}")
    with open(args.out, "w") as f:
        json.dump({"command": "python bench/recorded_protocol.py " + " ".join(argv), "suite": args.suite,
                   "candidate": args.candidate, "cells": cells}, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
