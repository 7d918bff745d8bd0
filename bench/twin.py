"""The twin check at bench scale: about 20 seeded TrainingJobs live and simulated.

Runs :func:`rlsched_dev.twin.twin_check` on a fresh local control plane (etcd,
kube-apiserver, kube-scheduler, kwok; the operator, the extender and the replay
trainer) and writes the comparison as JSON (and markdown beside it): matching
admissions, preemptions and scaling decisions, per-job JCT differences, the live
latencies measured and the wall time.

    python bench/twin.py --jobs 20 --out bench/results/twin.json
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

from rlsched_dev.cluster import kube_env
from rlsched_dev.twin import TwinConfig, render_markdown, twin_check


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-scale", type=float, default=TwinConfig.time_scale,
                    help="simulated seconds per wall second of the live run")
    ap.add_argument("--cycle", type=float, default=TwinConfig.cycle_s, help="operator cycle (wall s)")
    ap.add_argument("--out", default="bench/results/twin.json")
    ap.add_argument("--strict", action="store_true", help="exit 1 when the comparison fails (default: report only)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cfg = TwinConfig(jobs=args.jobs, seed=args.seed, time_scale=args.time_scale, cycle_s=args.cycle,
                     max_wall_s=1200.0)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with kube_env(progress=lambda m: logging.info("%s", m)) as env:
        report = twin_check(cfg, env, out.parent / (out.stem + "-logs"), progress=lambda m: logging.info("%s", m))
    report["bench"] = {"wall_s_total": time.monotonic() - t0, "python": platform.python_version(),
                       "machine": platform.machine(), "config": asdict(cfg)}
    out.write_text(json.dumps(report, indent=2, default=str))
    md = render_markdown(report, title=f"Twin check, {args.jobs} jobs, seed {args.seed}")
    out.with_suffix(".md").write_text(md)
    print(md)
    lat = report["live_latency"]
    print(f"live wall {report['wall_s']:.0f} s (with the control plane {report['bench']['wall_s_total']:.0f} s); "
          + "; ".join(f"{k} latency mean {_s(v['mean_s'])} p95 {_s(v['p95_s'])} max {_s(v['max_s'])} (n={v['n']})"
                      for k, v in lat.items()))
    return 0 if report["ok"] or not args.strict else 1


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
