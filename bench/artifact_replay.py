"""Our interval engine and the Pollux OSDI'21 artifact's simulator, side by side on the
same decisions (issue 25, item 4: find a difference in the engine before tuning any
policy).

Two directions, each on one published workload:

* ``--policy NAME``: our engine runs the allocation policy ``NAME`` and logs every
  decision (nodes per replica, per-GPU batch, accumulation steps); the artifact's
  ``Cluster`` replays the log (``bench/artifact_side.py``, run with the artifact's own
  Python) twice — with our batch (``ours``: the engines compared on identical
  decisions) and with the batch its job picks itself (``own``: the artifact's trainer
  choosing the batch). Per job: its JCT in both engines.
* ``--their-log FILE``: the artifact's own run (``python simulator.py
  workloads/workload-6.csv --policy pollux --output FILE``, the published Pollux) is
  replayed in our engine: its allocations and batches at each decision time. Per job:
  its JCT in both engines.

A job that one engine finishes later than the other may find no allocation in the log
after the other finished it; it is reported unfinished with its progress.

    python bench/artifact_replay.py --artifact PATH/simulator --artifact-python PATH/bin/python \\
        --policy goodput --workload 6 --out docs/results/artifact_replay_goodput_w6.json
    python bench/artifact_replay.py --their-log pollux6.log --workload 6 --out docs/results/artifact_replay_pollux_w6.json

The artifact is fetched, never vendored: a checkout of petuum/adaptdl at
``osdi21-artifact``, and an environment with its pins (numpy 1.23.5, scipy 1.10.1,
pandas 1.5.3, pymoo 0.4.2.1, autograd).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _trace(workload: int, data_dir: str | None):
    from rlsched.sim.traces import load_trace

    return load_trace(f"pollux:workloads/workload-{workload}", data_dir=data_dir)


def run_ours(policy: str, workload: int, data_dir: str | None) -> dict:
    """Our engine under ``policy`` on the workload, with its decision log."""
    from rlsched.sim.allocators import make_allocator
    from rlsched.sim.interval import IntervalConfig, IntervalSimulator

    trace = _trace(workload, data_dir)
    inner = make_allocator(policy)
    log: list[dict] = []

    class Logged:
        name, clairvoyant, type_aware = inner.name, inner.clairvoyant, inner.type_aware

        def allocate(self, jobs, nodes, now):
            out = inner.allocate(jobs, nodes, now)
            log.append({"t": now, "alloc": {k: [list(a.nodes), a.atomic_bsz, a.accum_steps]
                                            for k, a in out.items() if a.nodes}})
            return out

    cfg = IntervalConfig(interval=trace.interval, restart_cost=trace.restart_cost)
    sim = IntervalSimulator(trace.jobs, trace.apps, Logged(), nodes=trace.nodes, gpus_per_node=trace.gpus_per_node,
                            config=cfg)
    res = sim.run()
    return {"policy": policy, "ends": {r.id: [r.submit, r.end] for r in res.records}, "log": log,
            "nodes": trace.nodes, "gpus_per_node": trace.gpus_per_node, "interval": trace.interval}


def replay_theirs_in_ours(log_file: str, workload: int, data_dir: str | None) -> dict:
    """The artifact's own decisions (its ``--output`` log) in our engine."""
    import rlsched.sim.interval as interval
    from rlsched.core.allocation import Allocation

    recs = [json.loads(line) for line in open(log_file)]
    by_t = {int(r["timestamp"]): r for r in recs}
    trace = _trace(workload, data_dir)

    class Replay:
        name, clairvoyant, type_aware = "artifact-replay", False, False

        def allocate(self, jobs, nodes, now):
            r = by_t.get(int(round(now)))
            ids = {j.id for j in jobs}
            out = {}
            for s in (r["submitted_jobs"] if r else ()):
                if s["name"] in ids and s["allocation"]:
                    n, acc = len(s["allocation"]), int(s["accum_steps"])
                    out[s["name"]] = Allocation(tuple(s["allocation"]), int(round(s["batch_size"] / (n * (acc + 1)))),
                                                acc)
            return out

    cfg = interval.IntervalConfig(interval=trace.interval, restart_cost=trace.restart_cost,
                                  max_time=float(max(by_t) + trace.interval))
    sim = interval.IntervalSimulator(trace.jobs, trace.apps, Replay(), nodes=trace.nodes,
                                     gpus_per_node=trace.gpus_per_node, config=cfg)
    # the artifact caps a job's replicas by its largest batch, our engine by its target
    # batch (docs/benchmark.md): the replay gives its allocations as they are
    sim._max_replicas = lambda j: sim.total_gpus  # noqa: SLF001 (a diagnostic's override)
    res = sim.run()
    ours = {r.id: r.end for r in res.records}
    last = {s["name"]: s for s in recs[-1]["submitted_jobs"]}
    return {"jobs": {k: {"application": s["name"].rsplit("-", 1)[0], "submit": s["submission_time"],
                         "theirs": s["completion_time"], "ours": ours.get(k)} for k, s in last.items()},
            "unfinished_in_ours": list(res.unfinished)}


def compare(jobs: dict) -> dict:
    """Mean JCT of the jobs both engines finished, per application the median ratio
    ours / theirs, and the jobs one engine left unfinished."""
    both = {k: v for k, v in jobs.items() if v["ours"] is not None and v["theirs"] is not None}
    jo = np.array([v["ours"] - v["submit"] for v in both.values()])
    jt = np.array([v["theirs"] - v["submit"] for v in both.values()])
    per_app = collections.defaultdict(list)
    for v in both.values():
        per_app[v["application"]].append((v["ours"] - v["submit"]) / max(v["theirs"] - v["submit"], 1.0))
    return {
        "jobs": len(jobs), "both_finished": len(both),
        "unfinished_ours": sorted(k for k, v in jobs.items() if v["ours"] is None),
        "unfinished_theirs": sorted(k for k, v in jobs.items() if v["theirs"] is None),
        "jct_mean_ours": float(jo.mean()) if len(jo) else None,
        "jct_mean_theirs": float(jt.mean()) if len(jt) else None,
        "ratio_ours_over_theirs": float(jo.mean() / jt.mean()) if len(jo) else None,
        "per_application": {a: {"n": len(r), "median": float(np.median(r)), "mean": float(np.mean(r))}
                            for a, r in sorted(per_app.items())},
    }


def _show(title: str, c: dict) -> None:
    print(f"{title}: {c['both_finished']}/{c['jobs']} jobs finished by both; mean JCT ours {c['jct_mean_ours']:,.0f} s, "
          f"theirs {c['jct_mean_theirs']:,.0f} s (ours/theirs {c['ratio_ours_over_theirs']:.3f}); unfinished: ours "
          f"{len(c['unfinished_ours'])}, theirs {len(c['unfinished_theirs'])}")
    for a, r in c["per_application"].items():
        print(f"    {a:12s} n={r['n']:3d}  JCT ours/theirs median {r['median']:.3f}  mean {r['mean']:.3f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", type=int, default=6)
    ap.add_argument("--policy", help="our allocation policy whose decisions the artifact replays")
    ap.add_argument("--their-log", help="the artifact's own --output log, replayed in our engine")
    ap.add_argument("--artifact", help="the artifact's simulator/ folder (with --policy)")
    ap.add_argument("--artifact-python", help="the Python of the artifact's environment (with --policy)")
    ap.add_argument("--data-dir", default=None, help="default: $RLSCHED_DATA_DIR")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if bool(args.policy) == bool(args.their_log):
        ap.error("give --policy or --their-log")
    t0 = time.perf_counter()
    out: dict = {"benchmark": "our interval engine and the Pollux OSDI'21 artifact's simulator on the same decisions",
                 "command": "python bench/artifact_replay.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "workload": args.workload}
    if args.policy:
        if not (args.artifact and args.artifact_python):
            ap.error("--policy needs --artifact and --artifact-python")
        ours = run_ours(args.policy, args.workload, args.data_dir)
        ours["workload_csv"] = str(Path(args.artifact).resolve() / "workloads" / f"workload-{args.workload}.csv")
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "log.json")
            json.dump(ours, open(log, "w"))
            for batch in ("ours", "own"):
                res = os.path.join(tmp, f"{batch}.json")
                subprocess.run([args.artifact_python, str(ROOT / "bench" / "artifact_side.py"), log,
                                "--artifact", args.artifact, "--batch", batch, "--out", res], check=True,
                               stderr=subprocess.DEVNULL)
                theirs = json.load(open(res))
                jobs = {k: {"application": v["application"], "submit": v["submit"], "theirs": v["end"],
                            "ours": ours["ends"][k][1]} for k, v in theirs["jobs"].items()}
                c = compare(jobs)
                c["clamped_batches"] = theirs["clamped"]
                out[f"policy {args.policy}, batch {batch}"] = c
                _show(f"{args.policy} decisions, {batch} batch", c)
    else:
        res = replay_theirs_in_ours(args.their_log, args.workload, args.data_dir)
        c = compare(res["jobs"])
        out["artifact pollux decisions in our engine"] = c
        _show("the artifact's Pollux decisions in our engine", c)
    out["wall_s"] = time.perf_counter() - t0
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    json.dump(out, open(args.out, "w"), indent=1)
    print(f"-> {args.out} ({out['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
