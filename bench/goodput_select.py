"""Choose the goodput allocator's settings on validation seeds only.

The goodput allocator (:mod:`rlsched.core.goodput_allocator`) has one choice of form —
the utility exponent ``p`` of its fairness between jobs (1: total speedup, 0:
proportional fairness, -1: Pollux's harmonic leaning) — and the restart delay it
weighs. This runs each setting of the grid on workloads generated from the Philly list
(``pollux-gen``) with *validation* seeds (:func:`rlsched.sim.protocol.seeds`: 10,000 ..;
test seeds are refused) on the Pollux benchmark's cluster (16 x 4 GPUs, 60 s interval,
30 s restart). The first setting is the incumbent (the served one; ``{}`` is the goodput
allocator's defaults, a learned weight is given as ``growth_model``/``rlpto_model``); a setting
replaces it only when its mean JCT, paired with the incumbent's over every seed and
load, is lower with the whole percentile-bootstrap 95% interval below zero
(:func:`choose`); of those, the lowest mean. The published workloads and the test
seeds are never read here.

    python bench/goodput_select.py --seeds 5 --loads 1.0 --out bench/results/goodput_select.json

The default of :class:`~rlsched.core.goodput_allocator.GoodputAllocator` is the setting
this chose (its docstring cites the run recorded in docs/results/goodput_select.json).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

GRID = {"p": (1.0, 0.5, 0.0, -1.0)}


def _one(setting: dict, seed: int, load: float, data_dir: str | None) -> dict:
    from rlsched.core.goodput_allocator import GoodputAllocator
    from rlsched.sim.interval import IntervalConfig, IntervalSimulator
    from rlsched.sim.metrics import compute_metrics
    from rlsched.sim.protocol import split_of
    from rlsched.sim.traces import load_trace

    if split_of(seed) != "validation":
        raise SystemExit(f"seed {seed} is not a validation seed: settings are chosen on validation only")
    trace = load_trace(f"pollux-gen:seed={seed},load={load:g}", data_dir=data_dir)
    cfg = IntervalConfig(interval=trace.interval, restart_cost=trace.restart_cost)
    t0 = time.perf_counter()
    sim = IntervalSimulator(trace.jobs, trace.apps, GoodputAllocator(**_arguments(setting)), nodes=trace.nodes,
                            gpus_per_node=trace.gpus_per_node, config=cfg)
    m = compute_metrics(sim.run())
    return {"setting": setting, "seed": seed, "load": load, "jct_mean": m["jct_mean"],
            "gpu_util_mean": m["gpu_util_mean"], "restarts": m["rescales_total"], "wall_s": time.perf_counter() - t0}


def _arguments(setting: dict) -> dict:
    """The allocator's keyword arguments of a setting (``prior``: ThroughputPrior fields)."""
    from rlsched.core.goodput import ThroughputPrior
    from rlsched.core.growth_weight import LearnedGrowthWeight
    from rlsched.core.rlpto_weight import RLPTOGrowthWeight

    out = dict(setting)
    # a learned weight from its file (rlsched train growth [--form rlpto]); one that
    # cannot be read stops the selection, since a fallback would compare the wrong weight
    for key, weight_type in (("growth_model", LearnedGrowthWeight), ("rlpto_model", RLPTOGrowthWeight)):
        if key in out:
            weight = weight_type(path=out.pop(key))
            if weight.fallback_reason:
                raise SystemExit(f"{key.replace('_', ' ')}: {weight.fallback_reason}")
            out["growth"] = weight
    if "prior" in out:
        out["prior"] = ThroughputPrior(**{k: tuple(v) if isinstance(v, list) else v for k, v in out["prior"].items()})
    return out


def choose(settings: list[dict], runs: list[dict]) -> tuple[dict, list[dict]]:
    """The setting chosen and the table: each setting's mean JCT and, for every one but
    the first (the incumbent), its paired difference against the incumbent over the same
    seeds and loads (:func:`rlsched.sim.protocol.paired_bootstrap`). A setting is chosen
    over the incumbent only when its whole interval lies below zero; of those, the one
    with the lowest mean; else the incumbent."""
    from rlsched.sim.protocol import paired_bootstrap

    def jcts(st):
        by = {(r["seed"], r["load"]): r["jct_mean"] for r in runs if r["setting"] == st}
        return by

    inc = jcts(settings[0])
    keys = sorted(inc)
    table = []
    for st in settings:
        mine = jcts(st)
        row = {"setting": st, "jct_mean": float(np.mean(list(mine.values()))), "runs": len(mine)}
        if st is not settings[0]:
            d = paired_bootstrap([mine[k] for k in keys], [inc[k] for k in keys])
            row.update(rel=d.rel, rel_lo=d.rel_lo, rel_hi=d.rel_hi,
                       lower=int(sum(mine[k] < inc[k] for k in keys)), below=bool(d.diff_hi < 0))
        table.append(row)
    table.sort(key=lambda r: r["jct_mean"])
    better = [r for r in table if r.get("below")]
    return (better[0]["setting"] if better else settings[0]), table


def main(argv: list[str] | None = None) -> int:
    from rich.progress import Progress

    from rlsched.sim.protocol import seeds

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5, help="validation seeds (the first N of the split)")
    ap.add_argument("--loads", default="1.0")
    ap.add_argument("--p", default=",".join(f"{p:g}" for p in GRID["p"]), help="comma list of utility exponents")
    ap.add_argument("--settings", default=None,
                    help="JSON list of settings (GoodputAllocator keyword arguments; 'prior': ThroughputPrior "
                         "fields; 'growth_model': a learned growth weight's .safetensors; 'rlpto_model': RLPTO's network on it) to compare instead of --p, e.g. '[{\"p\": 0.5, \"threshold\": 3600}]'")
    ap.add_argument("--data-dir", default=None, help="default: $RLSCHED_DATA_DIR")
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", default="bench/results/goodput_select.json")
    args = ap.parse_args(argv)
    loads = [float(x) for x in args.loads.split(",")]
    settings = json.loads(args.settings) if args.settings else [{"p": float(p)} for p in args.p.split(",")]
    if not isinstance(settings, list) or not all(isinstance(x, dict) for x in settings) or not settings:
        ap.error("--settings must be a non-empty JSON list of objects")
    tasks = list(itertools.product(range(len(settings)), seeds("validation", args.seeds), loads))
    runs, t0 = [], time.perf_counter()
    with Progress() as bar, ProcessPoolExecutor(max(args.procs, 1)) as ex:
        task = bar.add_task("validation runs", total=len(tasks))
        futs = [ex.submit(_one, settings[i], s, load, args.data_dir) for i, s, load in tasks]
        for f in as_completed(futs):
            runs.append(f.result())
            bar.advance(task)
    chosen, table = choose(settings, runs)
    for r in table:
        vs = (f"  vs the incumbent {r['rel']:+.1%} [{r['rel_lo']:+.1%}, {r['rel_hi']:+.1%}], lower on "
              f"{r['lower']}/{r['runs']}" if "rel" in r else "  (incumbent)")
        print(f"{json.dumps(r['setting']):>40}  mean JCT {r['jct_mean']:8,.0f} s over {r['runs']} runs{vs}")
    print(f"chosen on validation: {json.dumps(chosen)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "goodput allocator settings on validation pollux-gen seeds",
        "command": "python bench/goodput_select.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "rule": "the incumbent (first setting) unless a setting's paired 95% interval against it is below zero",
        "seeds": seeds("validation", args.seeds), "loads": loads, "table": table, "chosen": chosen,
        "runs": sorted(runs, key=lambda r: (json.dumps(r["setting"]), r["load"], r["seed"])),
        "wall_s": time.perf_counter() - t0,
    }, indent=1))
    print(f"-> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
