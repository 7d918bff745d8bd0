"""The artifact's side of ``bench/artifact_replay.py``: run inside the environment of
the Pollux OSDI'21 artifact's simulator (petuum/adaptdl, branch ``osdi21-artifact``,
``simulator/``; its pins: numpy 1.23, scipy 1.10, pandas 1.5, pymoo 0.4.2.1), never in
rlsched's. It imports the artifact from the folder given and drives its ``Cluster``
with a decision log of our interval engine: at each of the artifact's decision times
the allocation our engine decided at that time (nodes per replica), and with
``--batch ours`` also our per-GPU batch and accumulation steps (the artifact's job
otherwise picks its own batch with its own goodput model). Nothing of the artifact is
copied here; it is read and run side by side.

    python bench/artifact_side.py LOG.json --artifact PATH/simulator --batch ours --out OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="our engine's decision log (bench/artifact_replay.py)")
    ap.add_argument("--artifact", required=True, help="the artifact's simulator/ folder")
    ap.add_argument("--batch", choices=("ours", "own"), default="ours")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.abspath(args.artifact))
    os.chdir(args.artifact)  # the artifact finds its traces relative to itself
    import pandas
    import simulator as art
    from pollux import PolluxPolicy

    d = json.load(open(args.log))
    by_t = {int(round(e["t"])): e["alloc"] for e in d["log"]}
    workload = pandas.read_csv(d["workload_csv"])
    clamped = [0]

    class Replay(PolluxPolicy):  # the Cluster treats a PolluxPolicy's jobs as adaptive
        def __init__(self) -> None:
            pass

        def optimize(self, job_infos, node_infos, prev, node_template):
            now = by_t.get(int(round(cluster.current_time)), {})
            return {k: list(v[0]) for k, v in now.items() if k in job_infos}, len(node_infos)

    cluster = art.Cluster(workload, Replay(), d["nodes"], num_gpus=d["gpus_per_node"])
    if args.batch == "ours":
        own = art.Job.update_local_bsz

        def ours(job, placement):
            a = by_t.get(int(round(cluster.current_time)), {}).get(job.name)
            if a is None or a[1] is None or job.target_batch_size is not None:
                return own(job, placement)
            job.atomic_bsz, job.accum_steps = int(a[1]), int(a[2])
            r = sum(filter(None, placement))
            if job.atomic_bsz * r * (job.accum_steps + 1) < job.application.init_batch_size:
                # our rounding down of a split batch can fall under the smallest batch the
                # artifact has data for; the artifact rounds up
                clamped[0] += 1
                job.atomic_bsz = -(-job.application.init_batch_size // (r * (job.accum_steps + 1)))

        art.Job.update_local_bsz = ours
    last = max(by_t)
    while not cluster.all_complete() and cluster.current_time <= last + d["interval"]:
        cluster.step(d["interval"])
    jobs = {j.name: {"application": j.application.name, "submit": j.submission_time, "end": j.completion_time,
                     "progress": j.progress, "target": j.application.get_progress(j.application.max_epochs),
                     "restarts": j.num_restarts} for j in cluster.jobs}
    json.dump({"batch": args.batch, "clamped": clamped[0], "jobs": jobs}, open(args.out, "w"))


if __name__ == "__main__":
    main()
