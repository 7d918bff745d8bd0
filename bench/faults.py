"""Fault injection: GPUs promised twice, on the real control plane.

For each extender mode (healthy, SIGKILLed, SIGSTOPped once the round's first pods
are bound) runs N rounds of ``--pods`` single-GPU pods created at once on a cluster
with ``--free`` GPUs free, and reports per mode the pods bound and the GPUs bound
beyond a node's allocatable (must be 0). The same rounds run, fewer of them, on a
control plane configured the unsafe way the docs once recommended
(``ignoredByScheduler: true``: only the extender counts GPUs) as the reference that
shows the measurement can see an over-commit.

    python bench/faults.py --rounds 20 --out bench/results/faults.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
import uuid
from pathlib import Path

from rlsched_dev.faults import MODES, RoundResult, overcommit_rounds, summarize


def _cluster_rounds(*, unsafe: bool, modes, rounds: int, pods: int, free: int, timeout_s: float,
                    progress, task) -> list[RoundResult]:
    from kubernetes import client, config

    from rlsched_dev.cluster import LocalCluster
    from rlsched_dev.nodes import create_gpu_nodes, default_topology, wait_nodes_ready

    topo = default_topology()
    with tempfile.TemporaryDirectory(prefix="rlsched-faults-") as tmp, LocalCluster(
        extender_timeout_s=timeout_s, gpu_ignored_by_scheduler=unsafe
    ) as cluster:
        names = create_gpu_nodes(cluster.kubeconfig, topo)
        wait_nodes_ready(cluster.kubeconfig, names)
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core = client.CoreV1Api(api)
        ns = f"faults-{uuid.uuid4().hex[:6]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        try:
            return overcommit_rounds(
                api, cluster.kubeconfig, ns, list(names), modes=modes, rounds=rounds, pods=pods,
                free_gpus=free, extender_port=cluster.extender_port, log_dir=Path(tmp),
                on_round=lambda r: progress.advance(task),
            )
        finally:
            api.close()


def main(argv: list[str] | None = None) -> int:
    from rich.progress import Progress

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--reference-rounds", type=int, default=3,
                    help="rounds per mode with the unsafe configuration (0: skip)")
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--free", type=int, default=16)
    ap.add_argument("--http-timeout", type=float, default=0.5,
                    help="kube-scheduler's extender httpTimeout, seconds (a stopped extender costs it per call)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/faults.json"))
    args = ap.parse_args(argv)
    t0 = time.time()
    runs = [("recommended", False, args.rounds)]
    if args.reference_rounds > 0:
        runs.append(("unsafe_reference", True, args.reference_rounds))
    report: dict = {
        "benchmark": "faults", "what": "GPU over-commit under extender faults",
        "pods_per_round": args.pods, "free_gpus": args.free, "http_timeout_s": args.http_timeout,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "configurations": {},
    }
    with Progress() as progress:
        for label, unsafe, rounds in runs:
            task = progress.add_task(f"{label}: rounds", total=rounds * len(MODES))
            res = _cluster_rounds(unsafe=unsafe, modes=MODES, rounds=rounds, pods=args.pods, free=args.free,
                                  timeout_s=args.http_timeout, progress=progress, task=task)
            report["configurations"][label] = {
                "ignoredByScheduler": unsafe,
                "modes": summarize(res),
                "rounds": [r.to_dict() for r in res],
            }
    rec = report["configurations"]["recommended"]["modes"]
    report["overcommitted_gpus_recommended"] = sum(m["overcommitted_gpus"] for m in rec.values())
    report["seconds"] = time.time() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    for label, c in report["configurations"].items():
        for mode, m in c["modes"].items():
            print(f"{label:17s} {mode:8s} rounds {m['rounds']:3d}  bound {m['pods_bound']:4d}/{m['pods_created']:4d}"
                  f"  over-committed GPUs {m['overcommitted_gpus']:3d} in {m['rounds_overcommitted']} rounds")
    print(f"wrote {args.out}")
    return 0 if report["overcommitted_gpus_recommended"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
