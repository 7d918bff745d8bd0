"""Benchmark: time from N TrainingJobs submitted to all admitted (enough GPUs).

Starts the local control plane (or uses ``--kubeconfig``) with kwok GPU nodes holding
one GPU per job, runs the operator in-process, submits N one-worker jobs as fast as the
API server takes them, and records when each was admitted (``status.admittedTime``) and
when all were Running. Writes JSON (``--out``)::

    python bench/operator_admission.py --jobs 200 --out bench/results
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import threading
import time
import uuid
from pathlib import Path

import numpy as np

from rlsched.core.contract import API_VERSION, GROUP, KIND, PLURAL, VERSION


def _job(name: str) -> dict:
    return {
        "apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
        "spec": {"minWorkers": 1, "maxWorkers": 1, "gpusPerWorker": 1,
                 "template": {"spec": {"containers": [{"name": "t", "image": "registry.example/bench:1"}]}}},
    }


def run(jobs: int, cycle_s: float, kubeconfig: str | None, out: Path) -> dict:
    from kubernetes import client
    from rich.progress import Progress

    from rlsched.core import Topology
    from rlsched_dev.cluster import kube_env
    from rlsched.operator.controller import OperatorConfig
    from rlsched.operator.main import install_crd, operator

    nodes = math.ceil(jobs / 8)
    topo = Topology.uniform(nodes, gpus_per_node=8, racks=max(1, nodes // 8), blocks=1, prefix="bench-gpu")
    with kube_env(topo, kubeconfig=kubeconfig) as env:
        api = env.api_client()
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        install_crd(api)
        time.sleep(1.0)  # discovery catches up
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        cfg = OperatorConfig(kubeconfig=str(env.kubeconfig), namespace=ns, cycle_s=cycle_s, metrics_port=None,
                             forecast_interval_s=0, start_timeout_s=600,
                             allocator="fifo/das+nobackfill")  # the old admission defaults as one allocator
        stop = threading.Event()
        th = threading.Thread(target=lambda: asyncio.run(operator(cfg, stop_flag=stop)), daemon=True)
        th.start()
        time.sleep(2.0)  # operator watching
        t0 = time.time()
        with Progress(transient=True) as prog:
            task = prog.add_task("submitting", total=jobs)
            for i in range(jobs):
                custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, _job(f"j{i:04d}"))
                prog.advance(task)
            t_submitted = time.time()
            task2 = prog.add_task("admitted", total=jobs)
            admitted: dict[str, float] = {}
            t_admitted = t_running = None
            deadline = time.time() + 600
            while time.time() < deadline:
                items = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
                now = time.time()
                running = 0
                for it in items:
                    st = it.get("status") or {}
                    if st.get("admittedTime") and it["metadata"]["name"] not in admitted:
                        admitted[it["metadata"]["name"]] = now
                    running += st.get("phase") == "Running"
                prog.update(task2, completed=len(admitted))
                if len(admitted) == jobs and t_admitted is None:
                    t_admitted = now
                if running == jobs:
                    t_running = now
                    break
                time.sleep(0.25)
        stop.set()
        th.join(30)
        core.delete_namespace(ns)
        api.close()
    waits = np.array(sorted(admitted.values())) - t0
    result = {
        "benchmark": "operator_admission",
        "jobs": jobs, "gpus": topo.total_gpus, "nodes": len(topo), "cycle_s": cycle_s,
        "submit_seconds": round(t_submitted - t0, 3),
        "all_admitted_seconds": None if t_admitted is None else round(t_admitted - t0, 3),
        "all_running_seconds": None if t_running is None else round(t_running - t0, 3),
        "admitted_after_last_submit_seconds": None if t_admitted is None else round(t_admitted - t_submitted, 3),
        "admission_p50_seconds": round(float(np.percentile(waits, 50)), 3) if waits.size else None,
        "admission_p95_seconds": round(float(np.percentile(waits, 95)), 3) if waits.size else None,
        "note": "poll granularity 0.25 s; times from the first submission",
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "operator_admission.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--cycle", type=float, default=1.0, help="operator cycle seconds")
    ap.add_argument("--kubeconfig", help="use this cluster instead of starting the local control plane")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(json.dumps(run(args.jobs, args.cycle, args.kubeconfig, args.out), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
