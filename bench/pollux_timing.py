"""How long one interval of the released Pollux policy takes (rlsched.sim.peers.pollux).

Builds ``--jobs`` active jobs of the six measured applications on ``--nodes`` × 4 GPUs
(half of them running, each with throughput samples taken from the measured profiles on
placements it ran on, gradient statistics of a random epoch), then calls
``PolluxAllocator.allocate`` ``--intervals`` times, feeding each result back as the next
interval's allocation (and its placement into the job's samples), as the interval engine
does. Writes the seconds per call as JSON. Needs ``make pollux-env``.

    .venv/bin/python bench/pollux_timing.py --jobs 20,60 --nodes 16 --intervals 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from rlsched.core.allocation import AllocJob, AllocNode, ProfileSample, packed
from rlsched.sim.measured import load_applications, placement_of
from rlsched.sim.peers.pollux import PolluxAllocator, pollux_available


def _sample(app, nodes: tuple[int, ...], atomic: int) -> ProfileSample:
    place = placement_of(nodes)
    step, sync = app.step_time(place, atomic)
    return ProfileSample(len(place), len(nodes), int(atomic), step, sync)


def make_jobs(apps: dict, n: int, nodes: list[AllocNode], rng: random.Random) -> list[AllocJob]:
    free = {x.index: x.gpus for x in nodes}
    names = sorted(apps)
    jobs = []
    for k in range(n):
        name = names[k % len(names)]
        app = apps[name]
        b = app.bounds
        alloc: tuple[int, ...] = ()
        profile: list[ProfileSample] = []
        if k % 2 == 0:
            want = rng.choice([1, 2, 4])
            got = packed(want, {i: f for i, f in free.items() if f > 0})
            if got:
                alloc = got
                for i in got:
                    free[i] -= 1
                for r in sorted({1, len(got)}):
                    atomic = max(b.min_local_batch, min(b.largest_local, -(-b.init_batch // r)))
                    profile.append(_sample(app, tuple([got[0]] * r) if r == 1 else got, atomic))
        sqr, var = app.grad_stats(b.init_batch, rng.randrange(app.max_epochs))
        jobs.append(AllocJob(
            id=f"{name}-{k}", submit_time=float(k * 60), application=name, age=float(3600 - k * 30),
            attained_service=0.0, num_restarts=0, allocation=alloc, target_replicas=None,
            target_batch_size=None, min_replicas=0, max_replicas=64, bounds=b,
            grad_sqr=sqr if profile else None, grad_var=var if profile else None, profile=tuple(profile)))
    return jobs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", default="20,60", help="comma-separated numbers of active jobs")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--intervals", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", default=os.environ.get("RLSCHED_DATA_DIR", ""))
    ap.add_argument("--cluster", choices=("fixed", "autoscale"), default="fixed")
    ap.add_argument("--python", default=None, help="the Pollux environment's python")
    ap.add_argument("--out", default=None, help="JSON file (default: stdout)")
    args = ap.parse_args(argv)
    ok, why = pollux_available(args.python)
    if not ok:
        print(f"pollux_timing: skipped: {why}", file=sys.stderr)
        return 2
    if not args.data_dir:
        print("pollux_timing: need --data-dir (or RLSCHED_DATA_DIR) with pollux-osdi21/", file=sys.stderr)
        return 2
    apps = load_applications(Path(args.data_dir) / "pollux-osdi21" / "traces")
    nodes = [AllocNode(i, 4) for i in range(args.nodes)]
    results = {"nodes": args.nodes, "gpus_per_node": 4, "intervals": args.intervals, "cluster": args.cluster, "environment": why, "runs": []}
    for n in (int(x) for x in args.jobs.split(",")):
        rng = random.Random(args.seed)
        jobs = make_jobs(apps, n, nodes, rng)
        with PolluxAllocator(args.python, seed=args.seed, cluster=args.cluster) as pol:
            t0 = time.perf_counter()
            pol.start()
            startup = time.perf_counter() - t0
            bridge_s, used = [], []
            for k in range(args.intervals):
                out = pol.allocate(jobs, nodes, now=3600.0 + 60 * k)
                bridge_s.append(pol.last_info.get("seconds"))
                used.append(sum(a.replicas for a in out.values()))
                for j in jobs:  # the engine's feedback: new allocation, its placement measured
                    a = out.get(j.id)
                    j.allocation = a.nodes if a else ()
                    if a:
                        s = _sample(apps[j.application], a.nodes, a.atomic_bsz)
                        if all((p.num_nodes, p.num_replicas, p.atomic_bsz) != (s.num_nodes, s.num_replicas, s.atomic_bsz)
                               for p in j.profile):
                            j.profile = j.profile + (s,)
                        if j.grad_sqr is None:
                            j.grad_sqr, j.grad_var = apps[j.application].grad_stats(j.bounds.init_batch, 0)
            results["runs"].append({
                "jobs": n, "call_seconds": [round(x, 3) for x in pol.call_seconds],
                "bridge_seconds": [round(x, 3) for x in bridge_s], "gpus_allocated": used,
                "startup_seconds": round(startup, 3),
            })
    text = json.dumps(results, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
