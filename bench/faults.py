"""Fault injection: GPUs promised twice, on the real control plane.

Over-commit. For each extender mode (healthy, SIGKILLed, SIGSTOPped once the round's first pods
are bound) runs N rounds of ``--pods`` single-GPU pods created at once on a cluster
with ``--free`` GPUs free, and reports per mode the pods bound and the GPUs bound
beyond a node's allocatable (must be 0). The same rounds run, fewer of them, on a
control plane configured the unsafe way the docs once recommended
(``ignoredByScheduler: true``: only the extender counts GPUs) as the reference that
shows the measurement can see an over-commit.

Cycles lost. The operator runs ``--cycles`` cycles on a fresh control plane with
poison objects beside valid jobs (pods the API server refuses, a name too long for
its workers, a gang that never fits, a template asking for extra GPUs, a privileged
hostPath pod with a Secret, a foreign pod
whose GPU count no parser accepts, a plain gang pod, a hostile ``targetWorkers``
patch): it reports cycles lost (must be 0), the cycle by which each valid job was
admitted and what became of every poison object.

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


IMAGE = "registry.example/rlsched/fault:test"


def _tj(name: str, workers: int, gpus: int, *, klass: str = "normal", max_workers: int | None = None,
        template: dict | None = None) -> dict:
    from rlsched.core.contract import API_VERSION, KIND

    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name},
            "spec": {"minWorkers": workers, "maxWorkers": max_workers or workers, "gpusPerWorker": gpus,
                     "priority": {"class": klass, "value": 0},
                     "template": template or {"spec": {"containers": [{"name": "t", "image": IMAGE}]}}}}


def _poison_run(cycles: int, cycle_s: float, progress, task) -> dict:
    """The operator in-process on a fresh control plane with poison objects beside
    valid jobs: cycles run and lost, when each valid job was admitted, what happened
    to each poison object."""
    from kopf.testing import KopfRunner
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    from rlsched.core.contract import GROUP, LABEL_JOB, PLURAL, RESOURCE_GPU, VERSION
    from rlsched.operator.controller import OperatorConfig
    from rlsched.operator.handlers import OperatorRuntime, build_registry
    from rlsched.operator.main import install_crd, install_trainer_policy
    from rlsched_dev.cluster import LocalCluster
    from rlsched_dev.nodes import create_gpu_nodes, default_topology, wait_nodes_ready

    with LocalCluster() as cluster:
        names = create_gpu_nodes(cluster.kubeconfig, default_topology())
        wait_nodes_ready(cluster.kubeconfig, names)
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        install_crd(api)
        install_trainer_policy(api)
        time.sleep(1.0)  # discovery catches up
        ns = f"poison-{uuid.uuid4().hex[:6]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        cfg = OperatorConfig(kubeconfig=str(cluster.kubeconfig), namespace=ns, cycle_s=cycle_s, metrics_port=0,
                             forecast_interval_s=0, start_timeout_s=600, grace_period_s=1,
                             allocator="fifo/das+nobackfill")  # the old admission defaults as one allocator
        rt = OperatorRuntime(cfg)
        gpu = {RESOURCE_GPU: "2M"}
        poison = {
            "forbidden_priority_class": _tj("forbidden", 2, 8, klass="urgent", template={"spec": {
                "priorityClassName": "no-such-class", "containers": [{"name": "t", "image": IMAGE}]}}),
            "invalid_container_name": _tj("invalid", 1, 8, klass="urgent", template={"spec": {
                "containers": [{"name": "Bad_Name", "image": IMAGE}]}}),
            "name_over_63": _tj("poison-" + "x" * 53, 1, 1, klass="urgent"),
            "never_fits": _tj("never-fits", 1024, 64, klass="urgent"),
            "privileged_hostpath_secret": _tj("escalate", 1, 1, template={"spec": {
                "containers": [{"name": "t", "image": IMAGE, "securityContext": {"privileged": True},
                                "volumeMounts": [{"name": "root", "mountPath": "/host"},
                                                 {"name": "s", "mountPath": "/s"}]}],
                "volumes": [{"name": "root", "hostPath": {"path": "/"}},
                            {"name": "s", "secret": {"secretName": "anything"}}]}}),
            "extra_gpu_container": _tj("extra-gpus", 1, 1, template={"spec": {"containers": [
                {"name": "t", "image": IMAGE},
                {"name": "side", "image": IMAGE, "resources": {"limits": {RESOURCE_GPU: "1"}}}]}}),
        }
        # 18 GPUs in all: they fit beside the 8 the foreign pod is charged with
        valid = {f"good-{i}": _tj(f"good-{i}", 1 + i % 2, 2, max_workers=2 + i % 2) for i in range(6)}
        result: dict = {"cycles": cycles}
        try:
            with KopfRunner(["run", "--standalone", "--namespace", ns], registry=build_registry(cfg, rt), timeout=60):
                deadline = time.monotonic() + 60
                while (rt.controller is None or rt.controller.cycles < 1) and time.monotonic() < deadline:
                    time.sleep(0.1)
                # foreign objects: a pod whose GPU count no parser accepts, a plain gang pod
                core.create_namespaced_pod(ns, {"metadata": {"name": "absurd-gpus"}, "spec": {
                    "nodeName": names[0], "containers": [{"name": "c", "image": IMAGE,
                                                          "resources": {"limits": gpu, "requests": gpu}}]}})
                core.create_namespaced_pod(ns, {"metadata": {"name": "gang-a", "labels": {LABEL_JOB: "gang-x"}},
                                                "spec": {"containers": [{"name": "c", "image": IMAGE}]}})
                for body in [*poison.values(), *valid.values()]:
                    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
                m = rt.controller.metrics.registry
                val = lambda n, **lb: m.get_sample_value(n, lb or None) or 0.0  # noqa: E731
                # cycles before the poison arrives (the first may meet the new CRD's
                # storage still initializing: a 429 the next cycle retries) are reported apart
                cycles0, lost0 = val("rlsched_operator_cycles_total"), val("rlsched_operator_cycle_errors_total")
                start = rt.controller.cycles
                admitted: dict[str, int] = {}
                hostile_max = 0
                patched = False
                while rt.controller.cycles < start + cycles:
                    c = rt.controller.cycles - start
                    for name in valid:
                        st = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name).get("status") or {}
                        if name not in admitted and st.get("phase") in ("Starting", "Running"):
                            admitted[name] = c
                    if not patched and admitted.get("good-0") is not None:
                        # a hostile status on a running job (as admin: no admission policy applies)
                        custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, "good-0",
                                                                     {"status": {"targetWorkers": 40}})
                        patched = True
                    if patched:
                        hostile_max = max(hostile_max, sum(
                            1 for p in core.list_namespaced_pod(ns).items
                            if p.metadata.deletion_timestamp is None
                            and any(r.name == "good-0" and r.controller for r in p.metadata.owner_references or [])))
                    progress.update(task, completed=min(c, cycles))
                    time.sleep(cycle_s / 2)
                result.update({
                    "cycles_run": int(val("rlsched_operator_cycles_total") - cycles0),
                    "cycles_lost": int(val("rlsched_operator_cycle_errors_total") - lost0),
                    "cycles_before_poison": int(cycles0),
                    "cycles_lost_before_poison": int(lost0),
                    "job_errors": {k: int(val("rlsched_operator_job_errors_total", kind=k))
                                   for k in ("rejected", "transient", "unexpected")},
                    "valid_jobs": len(valid),
                    "valid_admitted": len(admitted),
                    "admitted_by_cycle": admitted,
                    "max_cycle_to_admit": max(admitted.values()) if admitted else None,
                    "hostile_target_workers_max_pods": hostile_max,
                    "hostile_job_max_workers": valid["good-0"]["spec"]["maxWorkers"],
                })
                outcome = {}
                for label, body in poison.items():
                    st = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL,
                                                             body["metadata"]["name"]).get("status") or {}
                    conds = [f"{c['type']}={c['status']} {c.get('reason', '')}" for c in st.get("conditions") or []
                             if c.get("status") == "False"]
                    outcome[label] = {"phase": st.get("phase"), "conditions": conds}
                result["poison"] = outcome
                foreign = {}
                for name in ("absurd-gpus", "gang-a"):
                    try:
                        p = core.read_namespaced_pod(name, ns)
                        foreign[name] = "untouched" if p.metadata.deletion_timestamp is None else "deleting"
                    except ApiException as exc:
                        foreign[name] = f"gone ({exc.status})"
                result["foreign_pods"] = foreign
        finally:
            api.close()
        return result


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
    ap.add_argument("--cycles", type=int, default=20, help="operator cycles with poison objects (0: skip)")
    ap.add_argument("--cycle-s", type=float, default=0.5)
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
        if args.cycles > 0:
            task = progress.add_task("operator cycles with poison objects", total=args.cycles)
            report["operator"] = _poison_run(args.cycles, args.cycle_s, progress, task)
    rec = report["configurations"]["recommended"]["modes"]
    report["overcommitted_gpus_recommended"] = sum(m["overcommitted_gpus"] for m in rec.values())
    report["seconds"] = time.time() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    for label, c in report["configurations"].items():
        for mode, m in c["modes"].items():
            print(f"{label:17s} {mode:8s} rounds {m['rounds']:3d}  bound {m['pods_bound']:4d}/{m['pods_created']:4d}"
                  f"  over-committed GPUs {m['overcommitted_gpus']:3d} in {m['rounds_overcommitted']} rounds")
    op = report.get("operator")
    if op:
        print(f"operator: {op['cycles_run']} cycles with poison objects, {op['cycles_lost']} lost (before them: "
              f"{op['cycles_before_poison']} cycles, {op['cycles_lost_before_poison']} lost); "
              f"{op['valid_admitted']}/{op['valid_jobs']} "
              f"valid jobs admitted by cycle {op['max_cycle_to_admit']}; a targetWorkers=40 patch gave at most "
              f"{op['hostile_target_workers_max_pods']} pods (maxWorkers {op['hostile_job_max_workers']}); "
              f"foreign pods {op['foreign_pods']}")
        for label, o in op["poison"].items():
            print(f"  {label:26s} {o['phase']}  {'; '.join(o['conditions'])}")
    print(f"wrote {args.out}")
    ok = report["overcommitted_gpus_recommended"] == 0 and (not op or op["cycles_lost"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
