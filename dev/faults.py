"""Fault injection on a real control plane: GPU over-commit rounds.

One *round* creates ``pods`` single-GPU pods at once for the ``rlsched`` scheduler
profile (kube-scheduler calling the extender) while the cluster has exactly
``free_gpus`` GPUs free, waits until the binding stops, and counts per node the GPUs
of the bound pods against the node's allocatable GPUs. The extender is either
healthy, killed (SIGKILL) or stopped (SIGSTOP: connections hang until kube-scheduler's
``httpTimeout``) once the first pods of the round are bound, i.e. under load. A GPU
promised twice shows up as ``overcommitted_gpus > 0``.

Used by the regression tests (few rounds) and by ``bench/faults.py`` (``make
bench``: 20 rounds per mode). Dev tooling only: nothing here is part of the serving
package.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from rlsched.core.contract import DEFAULT_SCHEDULER_NAME, RESOURCE_GPU, node_gpus, pod_gpus

from .proc import ClusterError, Process, wait_for

__all__ = [
    "MODES",
    "ExtenderProcess",
    "RoundResult",
    "overcommit",
    "fill_to_free",
    "run_round",
    "clear_pods",
    "overcommit_rounds",
    "summarize",
]

#: what happens to the extender once the round's first pods are bound
MODES = ("healthy", "killed", "stopped")

_FILL_LABEL = "rlsched.dev/fault-fill"
_ROUND_LABEL = "rlsched.dev/fault-round"


class ExtenderProcess:
    """``rlsched extender serve`` as a child process that can be killed or stopped."""

    def __init__(self, kubeconfig: str | os.PathLike, port: int, log: Path,
                 extra_args: Iterable[str] = ()) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.proc = Process(
            "extender",
            [sys.executable, "-m", "rlsched.cli", "extender", "serve", "--host", "127.0.0.1",
             "--port", str(port), "--kubeconfig", str(kubeconfig), "--log-level", "WARNING",
             *extra_args],
            log,
        )
        self.stopped = False

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    def start(self, timeout: float = 60.0) -> None:
        self.proc.start(Path.cwd(), {**os.environ, "PYTHONUNBUFFERED": "1"})
        self.stopped = False
        wait_for(self._ready, timeout, "extender /readyz", self.proc, every=0.2)

    def kill(self) -> None:
        """SIGKILL: the port refuses connections from now on."""
        if self.proc.pid and self.proc.exited() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            if self.proc.popen is not None:
                self.proc.popen.wait()

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel and never answered."""
        if self.proc.pid and self.proc.exited() is None:
            os.killpg(self.proc.pid, signal.SIGSTOP)
            self.stopped = True

    def close(self) -> None:
        if self.proc.pid and self.proc.exited() is None:
            if self.stopped:
                os.killpg(self.proc.pid, signal.SIGCONT)
            self.proc.stop(5.0)
        self.stopped = False


@dataclass
class RoundResult:
    """One round: how many pods bound, and GPUs bound beyond a node's allocatable."""

    mode: str
    round: int
    pods: int
    free_gpus: int
    bound: int
    overcommitted_gpus: int
    seconds: float
    #: node -> (GPUs of bound pods, allocatable GPUs) for the nodes over their GPUs
    overcommitted_nodes: dict[str, tuple[int, int]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def overcommit(nodes: Iterable[Mapping], pods: Iterable[Mapping]) -> tuple[int, dict[str, tuple[int, int]]]:
    """GPUs of bound, unfinished pods beyond each node's allocatable GPUs (total, and
    per node over its capacity). Plain dicts as the API serves them."""
    cap = {n["metadata"]["name"]: node_gpus(n) for n in nodes}
    used: Counter[str] = Counter()
    for p in pods:
        node = (p.get("spec") or {}).get("nodeName")
        if node and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            used[node] += pod_gpus(p)
    over = {n: (u, cap.get(n, 0)) for n, u in used.items() if u > cap.get(n, 0)}
    return sum(u - c for u, c in over.values()), over


def _list(api: Any, kind: str) -> list[dict]:
    """All nodes or pods as plain camelCase dicts (what the core parsers read)."""
    import orjson
    from kubernetes import client

    core = client.CoreV1Api(api)
    call = core.list_node if kind == "nodes" else core.list_pod_for_all_namespaces
    return orjson.loads(call(_preload_content=False).data)["items"]


def _gpu_pod(name: str, labels: dict[str, str], *, scheduler: str | None, node: str | None = None,
             gpus: int = 1) -> dict:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "c", "image": "registry.example/rlsched/fault:test",
                        "resources": {"requests": {RESOURCE_GPU: str(gpus)},
                                      "limits": {RESOURCE_GPU: str(gpus)}}}],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def fill_to_free(api: Any, namespace: str, nodes: list[str], free_gpus: int) -> int:
    """Pin filler pods (``nodeName`` set, no scheduler) so that exactly ``free_gpus``
    GPUs stay free, spread evenly over ``nodes``; returns the GPUs filled."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    objs = {n["metadata"]["name"]: n for n in _list(api, "nodes")}
    caps = [node_gpus(objs[n]) for n in nodes]
    total = sum(caps)
    if not 0 <= free_gpus <= total:
        raise ValueError(f"free_gpus must be within 0..{total}")
    keep = [free_gpus // len(nodes) + (1 if i < free_gpus % len(nodes) else 0) for i in range(len(nodes))]
    if any(k > c for k, c in zip(keep, caps)):
        raise ValueError("nodes too small to spread the free GPUs evenly")
    filled = 0
    for i, (node, c, k) in enumerate(zip(nodes, caps, keep)):
        if c - k > 0:
            core.create_namespaced_pod(namespace, _gpu_pod(f"fill-{i}", {_FILL_LABEL: "1"}, scheduler=None,
                                                           node=node, gpus=c - k))
            filled += c - k
    return filled


def clear_pods(api: Any, namespace: str, selector: str, timeout: float = 60.0) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.delete_collection_namespaced_pod(namespace, label_selector=selector, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(namespace, label_selector=selector).items,
             timeout, f"pods {selector} to be deleted")


def run_round(
    api: Any,
    namespace: str,
    *,
    mode: str,
    index: int,
    pods: int,
    free_gpus: int,
    extender: ExtenderProcess | None,
    fault_after: int = 3,
    settle_s: float = 2.0,
    timeout_s: float = 120.0,
    scheduler: str = DEFAULT_SCHEDULER_NAME,
) -> RoundResult:
    """Create ``fault_after`` single-GPU pods and wait until they are bound (the
    extender has scored and assumed them), apply the fault of ``mode`` to
    ``extender``, create the other ``pods - fault_after`` at once; wait until every pod is bound or
    the bound count has not changed for ``settle_s`` after reaching ``free_gpus``
    (or ``timeout_s``); then count over-committed GPUs on all nodes. The round's pods
    stay for the caller to delete (:func:`clear_pods`)."""
    from kubernetes import client

    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}")
    core = client.CoreV1Api(api)
    t0 = time.monotonic()
    labels = {_ROUND_LABEL: str(index)}
    selector = f"{_ROUND_LABEL}={index}"

    def bound_now() -> int:
        return sum(1 for p in core.list_namespaced_pod(namespace, label_selector=selector).items if p.spec.node_name)

    first = min(fault_after, pods)
    for k in range(first):
        core.create_namespaced_pod(namespace, _gpu_pod(f"r{index}-p{k}", labels, scheduler=scheduler))
    while bound_now() < first and time.monotonic() - t0 < timeout_s:
        time.sleep(0.1)
    if mode != "healthy":
        if extender is None:
            raise ClusterError(f"mode {mode} needs an extender process to fault")
        (extender.kill if mode == "killed" else extender.pause)()
    for k in range(first, pods):
        core.create_namespaced_pod(namespace, _gpu_pod(f"r{index}-p{k}", labels, scheduler=scheduler))
    bound, last_change, last = 0, time.monotonic(), -1
    while time.monotonic() - t0 < timeout_s:
        bound = bound_now()
        now = time.monotonic()
        if bound != last:
            last, last_change = bound, now
        if bound >= pods or (bound >= min(pods, free_gpus) and now - last_change >= settle_s):
            break
        time.sleep(0.2)
    total, over = overcommit(_list(api, "nodes"), _list(api, "pods"))
    return RoundResult(mode=mode, round=index, pods=pods, free_gpus=free_gpus, bound=bound,
                       overcommitted_gpus=total, seconds=time.monotonic() - t0, overcommitted_nodes=over)


def overcommit_rounds(
    api: Any,
    kubeconfig: str | os.PathLike,
    namespace: str,
    nodes: list[str],
    *,
    modes: Iterable[str] = MODES,
    rounds: int = 20,
    pods: int = 20,
    free_gpus: int = 16,
    extender_port: int,
    log_dir: Path,
    timeout_s: float = 120.0,
    on_round: Callable[[RoundResult], None] | None = None,
) -> list[RoundResult]:
    """``rounds`` rounds per mode in ``namespace`` (created by the caller) on ``nodes``.
    A fresh extender serves every round of a faulting mode; the healthy mode keeps
    one for all its rounds."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    fill_to_free(api, namespace, nodes, free_gpus)
    wait_for(lambda: all(p.spec.node_name for p in core.list_namespaced_pod(
        namespace, label_selector=_FILL_LABEL).items), 30, "filler pods")
    out: list[RoundResult] = []
    k = 0
    try:
        for mode in modes:
            ext = ExtenderProcess(kubeconfig, extender_port, log_dir / f"extender-{mode}.log")
            ext.start()
            try:
                for _ in range(rounds):
                    if mode != "healthy" and (ext.stopped or ext.proc.exited() is not None):
                        ext.close()
                        ext.start()
                    res = run_round(api, namespace, mode=mode, index=k, pods=pods, free_gpus=free_gpus,
                                    extender=ext, timeout_s=timeout_s)
                    out.append(res)
                    if on_round is not None:
                        on_round(res)
                    if ext.stopped:  # let the deletions reach a live extender's watch
                        os.killpg(ext.proc.pid, signal.SIGCONT)
                        ext.stopped = False
                    clear_pods(api, namespace, f"{_ROUND_LABEL}={k}")
                    k += 1
            finally:
                ext.close()
    finally:
        clear_pods(api, namespace, _FILL_LABEL)
    return out


def summarize(results: list[RoundResult]) -> dict[str, dict[str, Any]]:
    """Per mode: rounds, pods bound (total, min per round), over-committed GPUs."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        m = out.setdefault(r.mode, {"rounds": 0, "pods_created": 0, "pods_bound": 0, "min_bound": None,
                                     "overcommitted_gpus": 0, "rounds_overcommitted": 0, "seconds": 0.0})
        m["rounds"] += 1
        m["pods_created"] += r.pods
        m["pods_bound"] += r.bound
        m["min_bound"] = r.bound if m["min_bound"] is None else min(m["min_bound"], r.bound)
        m["overcommitted_gpus"] += r.overcommitted_gpus
        m["rounds_overcommitted"] += int(r.overcommitted_gpus > 0)
        m["seconds"] += r.seconds
    return out
