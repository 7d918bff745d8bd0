"""End-to-end scheduling throughput: the stock kube-scheduler against the ``rlsched``
profile (kube-scheduler + the extender), on one local control plane.

One cluster (``rlsched_dev.cluster.LocalCluster``: etcd, kube-apiserver, the
controller manager, kwok, the stock ``default-scheduler`` process and the ``rlsched``
kube-scheduler process whose profile calls the extender) carries ``--nodes`` kwok
nodes of ``--gpus-per-node`` GPUs; the real extender (``rlsched extender serve``,
its own process watching the API server) serves the ``rlsched`` profile throughout.

A *burst*: the scheduler under test is stopped, ``--pods`` single-GPU pods of its
profile are created (they queue in the API server), the scheduler is started and a
watch records when each pod is seen bound. Throughput is pods/s from the first bind to
the last (the scheduler's start-up - informer sync, leader lease - is reported apart,
as ``first_bind_after_start_s``); the pods are then deleted before the next burst.
Both schedulers get the same bursts at each client setting:

- ``default``: kube-scheduler's default client limit (qps 50, burst 100), what a
  cluster runs unless told otherwise;
- ``raised``: qps 500, burst 1,000 for both;
- ``recommended``: the Helm chart's setting (``scheduler.kubeScheduler``:
  ``clientConnection`` and ``percentageOfNodesToScore`` in values.yaml, read from the
  chart) for the ``rlsched`` scheduler, against the stock one at the same client limit.

Within a repeat the two schedulers' bursts run back to back (order alternating
between repeats), and the ratio rlsched/stock is taken per repeat: on a shared,
noisy machine only ratios measured side by side mean anything. CPU seconds per
component (``/proc/<pid>/stat``, user + system) are taken from the scheduler's start
to the last bind: the scheduler under test, the other scheduler, the extender,
kube-apiserver, etcd, kwok and the controller manager. The JSON also carries how long
the ``--nodes`` kwok nodes took to become Ready and schedulable after creation.

    python bench/scheduling.py --out bench/results/scheduling.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import orjson
import yaml

from rlsched.core.contract import DEFAULT_SCHEDULER_NAME, RESOURCE_GPU
from rlsched.core.topology import Topology

CHART_VALUES = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "rlsched" / "values.yaml"
STOCK, RLSCHED = "stock", "rlsched"
#: scheduler name in the pods -> process of the local cluster that schedules them
PROCESS = {STOCK: "kube-scheduler", RLSCHED: "rlsched-scheduler"}
SCHEDULER_NAME = {STOCK: "default-scheduler", RLSCHED: DEFAULT_SCHEDULER_NAME}
SETTINGS = ("default", "raised", "recommended")
RAISED = {"qps": 500.0, "burst": 1000}
NAMESPACE = "sched-bench"
COMPONENTS = ("kube-scheduler", "rlsched-scheduler", "extender", "kube-apiserver", "etcd",
              "kwok", "kube-controller-manager")
_TICK = os.sysconf("SC_CLK_TCK")


def chart_recommendation(values: Path = CHART_VALUES) -> dict[str, Any]:
    """The chart's scheduler client limit and percentageOfNodesToScore (values.yaml)."""
    ks = yaml.safe_load(values.read_text())["scheduler"]["kubeScheduler"]
    cc = ks.get("clientConnection") or {}
    return {"qps": cc.get("qps"), "burst": cc.get("burst"),
            "percentageOfNodesToScore": ks.get("percentageOfNodesToScore")}


def tunings(setting: str, recommended: dict[str, Any]):
    """(stock, rlsched) :class:`SchedulerTuning` of a named setting."""
    from rlsched_dev.cluster import SchedulerTuning

    if setting == "default":
        return SchedulerTuning(), SchedulerTuning()
    if setting == "raised":
        t = SchedulerTuning(RAISED["qps"], RAISED["burst"])
        return t, t
    if setting == "recommended":
        qps, burst = recommended["qps"], recommended["burst"]
        return (SchedulerTuning(qps, burst),
                SchedulerTuning(qps, burst, recommended["percentageOfNodesToScore"]))
    if setting.startswith("custom:"):
        try:
            qps, burst, pct = setting.split(":")[1:]
            stock = SchedulerTuning(float(qps), int(burst))
            return stock, SchedulerTuning(float(qps), int(burst), int(pct) if pct else None)
        except ValueError as exc:
            raise ValueError(f"bad setting {setting!r} (custom:QPS:BURST:PERCENT, "
                             f"PERCENT may be empty): {exc}") from None
    raise ValueError(f"unknown setting {setting!r}; one of {SETTINGS} or custom:QPS:BURST:PERCENT")


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a live process (None when it is gone)."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def gpu_pod(name: str, scheduler_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "sched-bench"}},
        "spec": {
            "schedulerName": scheduler_name, "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "w", "image": "registry.invalid/bench:1",
                            "resources": {"requests": {"cpu": "100m", RESOURCE_GPU: "1"},
                                          "limits": {RESOURCE_GPU: "1"}}}],
        },
    }


class BindWatch:
    """A watch on the namespace's pods from ``resource_version``, read on a thread:
    the local time each pod is first seen with ``spec.nodeName``. Opened (reply
    headers in) before the scheduler starts, so receive times are bind times plus the
    watch's own latency, the same for both schedulers."""

    def __init__(self, core, namespace: str, resource_version: str, want: int, timeout_s: float) -> None:
        self.want = want
        self.bound: dict[str, float] = {}
        self.error: str | None = None
        self.reopened = 0
        self.done = threading.Event()
        self._core, self._ns, self._rv = core, namespace, resource_version
        self._deadline = time.monotonic() + timeout_s
        self._closed = False
        self._resp = self._open()
        self._thread = threading.Thread(target=self._read, name="bind-watch", daemon=True)
        self._thread.start()

    def _open(self):
        left = max(1, int(self._deadline - time.monotonic()) + 5)
        return self._core.list_namespaced_pod(
            self._ns, watch=True, resource_version=self._rv, allow_watch_bookmarks=True,
            timeout_seconds=left, _preload_content=False)

    def _read(self) -> None:
        try:
            while True:
                if self._read_stream():
                    return
                # the API server may end a watch early: go on from the last event seen
                if self._closed or time.monotonic() > self._deadline:
                    self.error = f"watch ended with {len(self.bound)}/{self.want} pods bound"
                    return
                self.reopened += 1
                self._resp = self._open()
        except Exception as exc:  # reported by wait(): the burst fails with it
            self.error = f"watch failed: {exc!r}"
        finally:
            self.done.set()

    def _read_stream(self) -> bool:
        """Read the current watch to its end; True once every pod is seen bound (or
        on a watch error, recorded in ``error``)."""
        from rlsched_dev.nodes import watch_event_batches

        for events in watch_event_batches(self._resp):
            for ev in events:
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    self.error = f"watch error: {obj.get('message') or obj}"
                    return True
                meta = obj.get("metadata") or {}
                self._rv = meta.get("resourceVersion") or self._rv
                name = meta.get("name")
                if ev.get("type") in ("ADDED", "MODIFIED") and name and name not in self.bound \
                        and (obj.get("spec") or {}).get("nodeName"):
                    self.bound[name] = time.monotonic()
                    if len(self.bound) >= self.want:
                        return True
        return False

    def wait(self, timeout_s: float, tick: Callable[[int], None] | None = None) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.done.wait(0.5):
            if tick:
                tick(len(self.bound))
            if time.monotonic() > deadline:
                self.error = f"{len(self.bound)}/{self.want} pods bound after {timeout_s:.0f}s"
                break
        if tick:
            tick(len(self.bound))
        self._closed = True
        self._resp.close()
        self._resp.release_conn()
        if len(self.bound) < self.want:
            raise RuntimeError(self.error or f"{len(self.bound)}/{self.want} pods bound")


@dataclass
class Burst:
    setting: str
    repeat: int
    scheduler: str
    pods: int
    created_s: float = 0.0
    bound: int = 0
    first_bind_after_start_s: float = 0.0
    seconds: float = 0.0  # first bind -> last bind
    pods_per_s: float = 0.0
    pods_per_s_from_start: float = 0.0
    #: first -> last bind from the pods' PodScheduled condition (1 s resolution), a
    #: cross-check of the watch's receive times
    seconds_by_condition: float = 0.0
    watch_reopened: int = 0
    cpu_s: dict[str, float | None] = field(default_factory=dict)


def _list_rv(core, namespace: str) -> str:
    raw = core.list_namespaced_pod(namespace, limit=1, _preload_content=False).data
    return orjson.loads(raw)["metadata"]["resourceVersion"]


def _create_pods(core, namespace: str, names: list[str], scheduler_name: str, parallelism: int) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def create(name: str) -> None:
        resp = core.create_namespaced_pod(namespace, gpu_pod(name, scheduler_name), _preload_content=False)
        resp.read()
        resp.release_conn()

    with ThreadPoolExecutor(parallelism) as pool:
        list(pool.map(create, names))


def _delete_pods(core, namespace: str, timeout_s: float) -> None:
    """Delete every pod of the namespace at once (grace 0: no kubelet round trip) and
    wait until the API server has none left."""
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0,
                                          _preload_content=False).read()
    deadline = time.monotonic() + timeout_s
    while True:
        raw = core.list_namespaced_pod(namespace, limit=1, _preload_content=False).data
        if not orjson.loads(raw)["items"]:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"pods of {namespace} still present after {timeout_s:.0f}s")
        time.sleep(0.5)


def run_burst(cluster, core, extender_pid: int | None, setting: str, repeat: int, scheduler: str,
              tuning, pods: int, *, parallelism: int = 16, say: Callable[[str], None] = print,
              tick: Callable[[int], None] | None = None) -> Burst:
    """One queued burst of ``pods`` single-GPU pods for ``scheduler`` (stock/rlsched)
    started with ``tuning``; see the module docstring."""
    proc_name = PROCESS[scheduler]
    b = Burst(setting, repeat, scheduler, pods)
    cluster.stop_scheduler(proc_name)
    tag = "".join(c if c.isalnum() else "-" for c in setting.lower()).strip("-")
    names = [f"{scheduler}-{tag}-{repeat}-{i:05d}" for i in range(pods)]
    t = time.monotonic()
    _create_pods(core, NAMESPACE, names, SCHEDULER_NAME[scheduler], parallelism)
    b.created_s = time.monotonic() - t
    say(f"  {setting} #{repeat} {scheduler}: {pods} pods queued in {b.created_s:.1f}s; starting "
        f"{proc_name} ({tuning.describe()})")
    timeout = 120.0 + pods / 5.0
    watch = BindWatch(core, NAMESPACE, _list_rv(core, NAMESPACE), pods, timeout)
    pids = {**cluster.pids, "extender": extender_pid}
    before = {c: cpu_seconds(pids.get(c)) for c in COMPONENTS if c != proc_name}
    t_start = time.monotonic()
    proc = cluster.start_scheduler(proc_name, tuning, wait=False)
    try:
        watch.wait(timeout, tick)
    finally:
        pids = {**cluster.pids, "extender": extender_pid}
        after = {c: cpu_seconds(pids.get(c)) for c in COMPONENTS}
    b.cpu_s = {c: (round(after[c] - before[c], 2) if after[c] is not None and before.get(c) is not None
                   else None) for c in COMPONENTS if c != proc_name}
    b.cpu_s[proc_name] = after[proc_name] if proc.pid == pids.get(proc_name) else None
    b.watch_reopened = watch.reopened
    times = sorted(watch.bound.values())
    b.bound = len(times)
    b.first_bind_after_start_s = round(times[0] - t_start, 3)
    b.seconds = round(times[-1] - times[0], 3)
    b.pods_per_s = round((len(times) - 1) / b.seconds, 2) if b.seconds > 0 else float("inf")
    b.pods_per_s_from_start = round(len(times) / (times[-1] - t_start), 2)
    raw = core.list_namespaced_pod(NAMESPACE, _preload_content=False).data
    stamps = sorted(c["lastTransitionTime"] for p in orjson.loads(raw)["items"]
                    for c in (p.get("status") or {}).get("conditions") or ()
                    if c.get("type") == "PodScheduled" and c.get("status") == "True")
    if stamps:
        from datetime import datetime

        ts = [datetime.fromisoformat(x.replace("Z", "+00:00")).timestamp() for x in (stamps[0], stamps[-1])]
        b.seconds_by_condition = ts[1] - ts[0]
    say(f"  {setting} #{repeat} {scheduler}: {b.bound} bound in {b.seconds:.1f}s = {b.pods_per_s:.1f} pods/s "
        f"(first bind {b.first_bind_after_start_s:.1f}s after start); CPU s "
        + ", ".join(f"{k} {v:.1f}" for k, v in b.cpu_s.items() if v is not None))
    _delete_pods(core, NAMESPACE, 120.0 + pods / 20.0)
    time.sleep(2.0)  # let the caches (schedulers, extender) see the deletions
    return b


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def summarize(bursts: list[Burst], settings: list[str], repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in settings:
        by = {(b.scheduler, b.repeat): b for b in bursts if b.setting == s}
        ratios = [round(by[(RLSCHED, r)].pods_per_s / by[(STOCK, r)].pods_per_s, 3)
                  for r in range(repeats) if (RLSCHED, r) in by and (STOCK, r) in by]
        entry: dict[str, Any] = {"ratio": _median(ratios), "ratios": ratios}
        for sched in (STOCK, RLSCHED):
            mine = [b for b in bursts if b.setting == s and b.scheduler == sched]
            entry[sched] = {
                "pods_per_s": [b.pods_per_s for b in mine],
                "pods_per_s_median": _median([b.pods_per_s for b in mine]),
                "pods_per_s_from_start_median": _median([b.pods_per_s_from_start for b in mine]),
                "cpu_s_median": {c: _median([b.cpu_s.get(c) for b in mine]) for c in COMPONENTS},
            }
        out[s] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    from kubernetes import client, config
    from rich.console import Console

    from rlsched_dev.cluster import LocalCluster
    from rlsched_dev.faults import ExtenderProcess
    from rlsched_dev.nodes import create_gpu_nodes, wait_nodes_ready

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--pods", type=int, default=2000, help="single-GPU pods per burst")
    ap.add_argument("--repeats", type=int, default=1, help="bursts per scheduler and setting")
    ap.add_argument("--settings", default=",".join(SETTINGS),
                    help=f"comma-separated, of {', '.join(SETTINGS)}, or custom:QPS:BURST:PERCENT "
                         "(both at QPS/BURST, the rlsched one at percentageOfNodesToScore PERCENT, "
                         "empty for adaptive)")
    ap.add_argument("--policy", default="das", help="the extender's placement policy")
    ap.add_argument("--parallelism", type=int, default=16, help="concurrent pod/node creations")
    ap.add_argument("--out", type=Path, default=Path("bench/results/scheduling.json"))
    args = ap.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    for s in settings:
        tunings(s, {"qps": 1, "burst": 1, "percentageOfNodesToScore": None})  # names checked
    if args.repeats < 1 or args.pods < 1 or args.nodes < 1:
        ap.error("--repeats, --pods and --nodes must be >= 1")
    if args.pods > args.nodes * args.gpus_per_node:
        ap.error("more pods than GPUs")
    recommended = chart_recommendation()
    console = Console(stderr=True)
    say = lambda msg: console.print(msg, highlight=False, soft_wrap=True)  # noqa: E731
    t0 = time.monotonic()
    report: dict[str, Any] = {
        "benchmark": "scheduling",
        "what": "queued burst of single-GPU pods: stock kube-scheduler vs the rlsched profile (extender)",
        "nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "pods_per_burst": args.pods,
        "repeats": args.repeats, "policy": args.policy,
        "chart_recommendation": recommended,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg_at_start": os.getloadavg()},
        "note": "ratios are rlsched/stock pods/s of bursts run back to back in one cluster; "
                "absolute figures depend on what else the machine runs",
    }
    with LocalCluster(progress=lambda m: say(f"cluster: {m}")) as cluster:
        conf = client.Configuration()
        config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=conf)
        conf.connection_pool_maxsize = args.parallelism + 4
        api = client.ApiClient(conf)
        core = client.CoreV1Api(api)
        topo = Topology.uniform(args.nodes, gpus_per_node=args.gpus_per_node,
                                racks=max(1, args.nodes // 20), blocks=max(1, args.nodes // 200),
                                prefix="bench-gpu")
        t = time.monotonic()
        names = create_gpu_nodes(core, topo, parallelism=args.parallelism)
        created = time.monotonic() - t
        say(f"{len(names)} kwok nodes created in {created:.1f}s; waiting for Ready")
        t = time.monotonic()
        last = [0.0]

        def node_progress(ready: int, total: int) -> None:
            if time.monotonic() - last[0] > 2.0 or ready == total:
                last[0] = time.monotonic()
                say(f"  nodes Ready {ready}/{total} after {time.monotonic() - t:.1f}s")

        wait_nodes_ready(core, names, timeout=120 + 0.2 * len(names), progress=node_progress)
        ready_s = time.monotonic() - t
        report["nodes_ready"] = {"nodes": len(names), "created_s": round(created, 2),
                                 "ready_after_creation_s": round(ready_s, 2),
                                 "target_ready_after_creation_s": 30}
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        port = cluster.extender_port
        ext = ExtenderProcess(cluster.kubeconfig, port, cluster.log_path("extender"),
                              ["--policy", args.policy])
        say(f"starting the extender (policy {args.policy}) on {ext.url}")
        ext.start(timeout=120)
        bursts: list[Burst] = []
        try:
            for setting in settings:
                stock_t, rl_t = tunings(setting, recommended)
                for r in range(args.repeats):
                    order = (STOCK, RLSCHED) if r % 2 == 0 else (RLSCHED, STOCK)
                    for sched in order:
                        bursts.append(run_burst(
                            cluster, core, ext.proc.pid, setting, r, sched,
                            stock_t if sched == STOCK else rl_t, args.pods,
                            parallelism=args.parallelism, say=say))
        finally:
            ext.close()
            api.close()
    summary = summarize(bursts, settings, args.repeats)
    report["settings"] = {s: {"stock_tuning": tunings(s, recommended)[0].describe(),
                              "rlsched_tuning": tunings(s, recommended)[1].describe(),
                              **summary[s]} for s in settings}
    # the must-show figures
    report["ratio_default_limit"] = summary.get("default", {}).get("ratio")
    report["ratio_raised_limit"] = summary.get("raised", {}).get("ratio")
    report["ratio_recommended"] = summary.get("recommended", {}).get("ratio")
    report["targets"] = {"ratio_raised_limit": ">= 0.9", "ratio_default_limit": "~1.0",
                         "nodes_ready_after_creation_s": "< 30"}
    report["bursts"] = [asdict(b) for b in bursts]
    report["seconds"] = round(time.monotonic() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    nr = report["nodes_ready"]
    print(f"{nr['nodes']} nodes Ready {nr['ready_after_creation_s']:.1f}s after creation "
          f"(created in {nr['created_s']:.1f}s)")
    for s in settings:
        e = report["settings"][s]
        print(f"{s:12s} stock {e['stock']['pods_per_s_median']} pods/s  rlsched "
              f"{e['rlsched']['pods_per_s_median']} pods/s  ratio {e['ratio']} {e['ratios']}")
    print(f"wrote {args.out} in {report['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
