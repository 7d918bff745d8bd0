"""Mean JCT against load on the sia suite's held-out workloads (pollux-gen on sia-64).

Runs each policy on the protocol's test seeds at each load (``rlsched eval protocol``'s
trace specs and runner), keeps every run in a JSON file (a rerun skips what it holds,
so a policy can be added or rerun alone), prints the candidate's paired bootstrap 95%
interval against each other policy per load, and plots mean JCT against load.

    python bench/sia_load_curve.py --loads 1.0 --seeds 20 --policies goodput-rlpto,sia \\
        --runs docs/results/sia_load_curve.json
    python bench/sia_load_curve.py --loads 0.5,1.0,1.5 --seeds 5 \\
        --policies goodput-rlpto,sia,gavel,pollux-paper --runs docs/results/sia_load_curve.json \\
        --plot docs/results/sia_load_curve.png

Test seeds only: nothing here is chosen; the candidate was chosen on validation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def _key(load: float, seed: int, policy: str) -> str:
    return f"{load:g}|{seed}|{policy}"


def run(loads: list[float], n: int, policies: list[str], path: Path, data_dir: str | None) -> dict[str, dict]:
    """Every (load, test seed, policy) run not yet in ``path``; returns all runs held."""
    from rich.progress import Progress

    from rlsched.sim.evaluate import DEFAULT_JOBS, SUITES, run_unit
    from rlsched.sim.protocol import seeds

    suite = SUITES["sia"]
    runs: dict[str, dict] = json.loads(path.read_text()) if path.exists() else {}
    spec = {(L, s): suite._spec(L, s, DEFAULT_JOBS["sia"]) for L in loads for s in seeds("test", n)}
    other = sorted({r.get("spec", "?") for r in runs.values() if (r["load"], r["seed"]) in spec}
                   - set(spec.values()))
    if other:  # runs of another setting of the suite are not mixed in
        raise SystemExit(f"{path} holds runs of other workloads than the suite's now, e.g. {other[0]}")
    todo = [(L, s, p) for L in loads for s in seeds("test", n) for p in policies if _key(L, s, p) not in runs]
    with Progress() as bar:
        task = bar.add_task("sia suite runs", total=len(todo))
        for L, s, p in todo:
            row = run_unit(spec[L, s], s, [(p, False)], "interval", data_dir)[0]
            if row["jobs_unfinished"]:
                raise SystemExit(f"{p} left {row['jobs_unfinished']} jobs unfinished at load {L:g}, seed {s}")
            runs[_key(L, s, p)] = {"load": L, "seed": s, "policy": p, "spec": spec[L, s], "jct_mean": row["jct_mean"],
                                   "wall_s": round(row["wall_s"], 2)}
            path.write_text(json.dumps(runs, indent=1, sort_keys=True))
            bar.advance(task)
    return runs


def table(runs: dict[str, dict], loads: list[float], n: int, policies: list[str], candidate: str) -> list[dict]:
    """Per load: each policy's mean JCT over the seeds all policies ran, and the
    candidate's paired difference against each other policy."""
    from rlsched.sim.protocol import paired_bootstrap, seeds

    rows = []
    for L in loads:
        # the policies that ran on all n seeds at this load (a slow peer may be left
        # out at one), so each mean is over the same workloads
        ss = seeds("test", n)
        here = [p for p in policies if all(_key(L, s, p) in runs for s in ss)]
        jct = {p: [runs[_key(L, s, p)]["jct_mean"] for s in ss] for p in here}
        row = {"load": L, "seeds": len(ss), "mean": {p: float(np.mean(v)) for p, v in jct.items()}}
        if len(ss) >= 2 and candidate in here:
            row["vs"] = {p: paired_bootstrap(jct[candidate], jct[p]).to_dict() for p in here if p != candidate}
        rows.append(row)
    return rows


def plot(rows: list[dict], policies: list[str], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in policies:
        pts = [(r["load"], r["mean"][p]) for r in rows if p in r["mean"]]
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
    ax.set_xlabel("load (arrival rate relative to the Philly workloads)")
    ax.set_ylabel("mean JCT (s)")
    seeds = ", ".join(f"{r['load']:g}: {r['seeds']}" for r in rows)
    ax.set_title(f"sia-64, held-out pollux-gen test seeds (seeds per load {seeds})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loads", default="1.0", help="comma list of loads of the sia suite")
    ap.add_argument("--seeds", type=int, default=20, help="the first N test seeds")
    ap.add_argument("--policies", default="goodput-rlpto,sia", help="comma list; the first is the candidate")
    ap.add_argument("--runs", required=True, help="JSON file of the runs (read, extended, written)")
    ap.add_argument("--plot", default=None, help="PNG of mean JCT against load")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--no-run", action="store_true", help="only tabulate and plot what the file holds")
    a = ap.parse_args(argv)
    loads = [float(x) for x in a.loads.split(",")]
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    path = Path(a.runs)
    runs = json.loads(path.read_text()) if a.no_run else run(loads, a.seeds, policies, path, a.data_dir)
    rows = table(runs, loads, a.seeds, policies, policies[0])
    for r in rows:
        means = ", ".join(f"{p} {m:,.1f}" for p, m in r["mean"].items())
        print(f"load {r['load']:g} ({r['seeds']} seeds): {means}")
        for p, d in r.get("vs", {}).items():
            print(f"  {policies[0]} vs {p}: {100 * d['rel']:+.1f}% [{100 * d['rel_lo']:+.1f}, {100 * d['rel_hi']:+.1f}]")
    if a.plot:
        plot(rows, policies, Path(a.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
