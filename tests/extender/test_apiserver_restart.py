"""The extender survives an API server restart and loses nothing.

A second, small :class:`~rlsched_dev.cluster.LocalCluster` (the shared session cluster
must not lose its API server under other tests) with the real extender process
watching it: a GPU pod is bound through the ``rlsched`` profile, kube-apiserver is
restarted, the extender keeps answering meanwhile, and afterwards its view (read
through ``/filter`` answers) converges on nodes and pods changed after the restart.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.request
import uuid

import pytest

pytestmark = [pytest.mark.k8s, pytest.mark.runner_side(
    "restarts the kube-apiserver of its own LocalCluster, under a runner-side extender watching it")]

GPUS = 8
PROBE = "probe"  # name of the never-created pod the test asks /filter about


@pytest.fixture(scope="module")
def cluster():
    """Its own control plane with two 8-GPU kwok nodes."""
    from rlsched.core import Topology
    from rlsched_dev.cluster import LocalCluster
    from rlsched_dev.nodes import create_gpu_nodes, wait_nodes_ready

    topo = Topology.uniform(2, gpus_per_node=GPUS, racks=1, blocks=1, prefix="rs-gpu")
    with LocalCluster() as c:
        wait_nodes_ready(c.kubeconfig, create_gpu_nodes(c.kubeconfig, topo))
        yield c


@pytest.fixture(scope="module")
def extender_url(cluster, tmp_path_factory, launch_extender):
    """``rlsched extender serve`` watching ``cluster`` on the port its rlsched profile calls."""
    log = tmp_path_factory.mktemp("restart") / "extender.log"
    with launch_extender(cluster, log, log_level="INFO") as url:
        yield url


@pytest.fixture(scope="module")
def core(cluster):
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))


def gpu_pod(name: str, gpus: int, *, node: str | None = None) -> dict:
    """A pod asking for ``gpus`` GPUs: scheduled by ``rlsched``, or bound to ``node``."""
    gpu = {"nvidia.com/gpu": str(gpus)}
    spec = {
        "schedulerName": "rlsched",
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "w", "image": "registry.example/rlsched/worker:test",
                        "resources": {"requests": {"cpu": "1", **gpu}, "limits": gpu}}],
    }
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


def probe(url: str, names: list[str]) -> dict:
    """``/filter`` for a pod wanting a whole node: which of ``names`` have all 8 GPUs
    free in the extender's cache; the others with the reason."""
    body = json.dumps({"Pod": gpu_pod(PROBE, GPUS) | {"metadata": {
        "name": PROBE, "namespace": PROBE, "uid": "probe-uid"}},
        "Nodes": None, "NodeNames": names}).encode()
    req = urllib.request.Request(f"{url}/filter", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200
        out = json.loads(r.read())
    assert out["Error"] == "", out
    return out


def view(url: str, names: list[str]) -> dict[str, str]:
    """Node -> "free" / "full" / "unknown" as the extender sees it."""
    out = probe(url, names)
    failed = {**out["FailedNodes"], **out["FailedAndUnresolvableNodes"]}
    state = {n: "free" for n in out["NodeNames"]}
    for n, why in failed.items():
        state[n] = "unknown" if "unknown node" in why else "full" if "insufficient" in why else why
    return state


def converge(url: str, names: list[str], want: dict[str, str], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    got: dict[str, str] = {}
    while time.monotonic() < deadline:
        got = view(url, names)
        if got == want:
            return
        time.sleep(0.2)
    raise AssertionError(f"extender view did not converge ({what}) in {timeout:.0f}s: "
                         f"want {want}, got {got}")


def wait_bound(core, ns: str, name: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = core.read_namespaced_pod(name, ns).spec.node_name
        if node:
            return node
        time.sleep(0.2)
    raise AssertionError(f"pod {ns}/{name} not bound after {timeout:.0f}s")


def api_ready(server: str) -> bool:
    """kube-apiserver answers /readyz with 200 (anonymous, certificate not checked)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"{server}/readyz", timeout=2, context=ctx) as r:
            return r.status == 200
    except OSError:  # refused, reset, HTTP error status
        return False


def test_extender_recovers_from_apiserver_restart(cluster, extender_url, core):
    from rlsched.core import Topology
    from rlsched_dev.nodes import create_gpu_nodes, delete_gpu_nodes

    ns = f"rs-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    a, b = "rs-gpu-0", "rs-gpu-1"

    # (a) a whole-node pod bound through the rlsched profile (which calls the extender)
    core.create_namespaced_pod(ns, gpu_pod("before", GPUS))
    x = wait_bound(core, ns, "before")
    y = b if x == a else a
    converge(extender_url, [a, b], {x: "full", y: "free"}, 30, "pod bound before the restart")

    # (b) restart kube-apiserver (from this thread: the components die with the thread
    # that started them) while (c) another thread keeps asking the extender
    old_pid = cluster.pids["kube-apiserver"]
    done = threading.Event()
    seen: dict[str, list] = {"api_down": [], "answers": [], "errors": []}

    def ask() -> None:
        while not done.is_set():
            try:
                seen["api_down"].append(not api_ready(cluster.server))
                assert _get(f"{extender_url}/healthz") == (200, "ok")
                # the cache keeps the last state it saw while the API server is away
                seen["answers"].append(view(extender_url, [a, b]))
            except BaseException as exc:  # reported by the test thread below
                seen["errors"].append(exc)
                return
            time.sleep(0.05)

    th = threading.Thread(target=ask, daemon=True)
    th.start()
    try:
        cluster.restart_apiserver()
    finally:
        done.set()
        th.join(30)
    if seen["errors"]:
        raise seen["errors"][0]
    assert cluster.pids["kube-apiserver"] != old_pid
    assert any(seen["api_down"]), "the API server never looked down while restarting"
    assert seen["answers"] and all(v == {x: "full", y: "free"} for v in seen["answers"])

    # (d) changes right after the restart (the extender is likely still backing off)
    create_gpu_nodes(core, Topology.uniform(1, gpus_per_node=GPUS, racks=1, blocks=1,
                                            prefix="rs-new"))
    c = "rs-new-0"
    core.delete_namespaced_pod("before", ns, grace_period_seconds=0)
    core.create_namespaced_pod(ns, gpu_pod("after", GPUS, node=y))
    nodes = [a, b, c]
    converge(extender_url, nodes, {x: "free", y: "full", c: "free"}, 60,
             "node created, pod deleted and pod bound after the restart")

    delete_gpu_nodes(core, [c])
    converge(extender_url, nodes, {x: "free", y: "full", c: "unknown"}, 30,
             "node deleted after the restart")

    # drop the probe's own assumption (it was the only fit on x), then the whole path
    # still works: a pod scheduled through the extender lands on x (once the rlsched
    # scheduler, restarted after losing its lease, has taken the lease again)
    assert view(extender_url, [y]) == {y: "full"}
    core.create_namespaced_pod(ns, gpu_pod("late", 2))
    assert wait_bound(core, ns, "late") == x
    assert _get(f"{extender_url}/readyz") == (200, "ok")
    core.delete_namespace(ns)
