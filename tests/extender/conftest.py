"""Fixtures of the extender tests: a 16-node topology, pods shaped as kube-scheduler
sends them, and the extender app on a test client."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

from rlsched.core import Topology
from rlsched.core.contract import LABEL_JOB
from rlsched.extender.app import make_app
from rlsched.extender.config import build_extender, node_list


@pytest.fixture
def topology() -> Topology:
    """16 nodes x 8 GPUs, 4 racks (nodes 0-3, 4-7, ...), 2 blocks (racks 0-1, 2-3)."""
    return Topology.uniform(16, gpus_per_node=8, racks=4, blocks=2)


# A pod as kube-scheduler marshals its v1.Pod from the informer cache: empty TypeMeta
# (no kind/apiVersion), managedFields, defaulted spec fields, Pending status.
_POD: dict[str, Any] = {
    "metadata": {
        "name": "w-0",
        "namespace": "team-a",
        "uid": "6b1a3f8e-0000-4000-8000-000000000000",
        "resourceVersion": "4711",
        "creationTimestamp": "2026-11-21T19:00:00Z",
        "labels": {"rlsched.dev/role": "worker", "rlsched.dev/worker-index": "0"},
        "annotations": {},
        "ownerReferences": [
            {"apiVersion": "rlsched.dev/v1alpha1", "kind": "TrainingJob", "name": "tj", "uid": "abc",
             "controller": True, "blockOwnerDeletion": True}
        ],
        "managedFields": [
            {"manager": "kopf", "operation": "Update", "apiVersion": "v1", "time": "2026-11-21T19:00:00Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {".": {}}}}}
        ],
    },
    "spec": {
        "volumes": [{"name": "kube-api-access-x", "projected": {"sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}], "defaultMode": 420}}],
        "containers": [
            {
                "name": "trainer",
                "image": "registry.example/trainer:1",
                "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"nvidia.com/gpu": "2", "cpu": "4"}},
                "volumeMounts": [{"name": "kube-api-access-x", "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {},
        "schedulerName": "rlsched",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    },
    "status": {"phase": "Pending", "qosClass": "Burstable"},
}


@pytest.fixture
def make_pod() -> Callable[..., dict]:
    """``make_pod(name, gpus=2, job=None, node=None, annotations=None, spec=None)``."""

    def make(name: str = "w-0", gpus: int | str = 2, job: str | None = None, node: str | None = None,
             annotations: dict | None = None, spec: dict | None = None, namespace: str = "team-a",
             phase: str = "Pending") -> dict:
        pod = copy.deepcopy(_POD)
        pod["metadata"]["name"] = name
        pod["metadata"]["namespace"] = namespace
        pod["metadata"]["uid"] = f"uid-{namespace}-{name}"
        if job is not None:
            pod["metadata"]["labels"][LABEL_JOB] = job
        pod["metadata"]["annotations"].update(annotations or {})
        res = pod["spec"]["containers"][0]["resources"]
        res["limits"]["nvidia.com/gpu"] = str(gpus)
        res["requests"]["nvidia.com/gpu"] = str(gpus)
        if node is not None:
            pod["spec"]["nodeName"] = node
            phase = "Running" if phase == "Pending" else phase
        pod["status"]["phase"] = phase
        pod["spec"].update(spec or {})
        return pod

    return make


@pytest.fixture
def args_for() -> Callable[..., dict]:
    """ExtenderArgs as kube-scheduler sends them with nodeCacheCapable: true."""

    def make(pod: dict, names: list[str]) -> dict:
        return {"Pod": pod, "Nodes": None, "NodeNames": list(names)}

    return make


@pytest.fixture
def extender(topology):
    ext = build_extender("das")
    ext.cache.replace_nodes(node_list(topology)["items"])
    ext.cache.replace_pods([])
    return ext


@pytest.fixture
async def client(aiohttp_client, extender):
    return await aiohttp_client(make_app(extender, read_timeout=2.0, max_body=10 * 1024 * 1024))


@pytest.fixture
async def served(extender):
    """The extender app served as ``rlsched extender serve`` serves it (limits, logging),
    on a free loopback port."""
    from rlsched.extender.server import ServeLimits, serve_app

    srv = await serve_app(make_app(extender, read_timeout=2.0), "127.0.0.1", 0,
                          ServeLimits(header_timeout=5.0, idle_timeout=30.0, max_connections=64),
                          metrics=extender.metrics)
    yield srv
    await srv.close()


@pytest.fixture
async def served_client(served):
    """An HTTP client of :func:`served` (``post``/``get`` take paths)."""
    import aiohttp

    async with aiohttp.ClientSession(base_url=f"http://{served.host}:{served.port}") as session:
        yield session


@pytest.fixture(scope="session")
def serve_in_thread():
    """``with serve_in_thread(ext, limits, **app_kwargs) as (host, port):`` serves
    ``make_app(ext, **app_kwargs)`` as ``rlsched extender serve`` does (``serve_app``)
    from its own thread and event loop, for module-scoped servers that plain
    (synchronous) tests call over real sockets."""
    import asyncio
    import contextlib
    import threading

    from rlsched.extender.server import serve_app

    @contextlib.contextmanager
    def run(ext, limits, **app_kwargs):
        loop = asyncio.new_event_loop()
        ready = threading.Event()
        box: dict = {}

        async def start():
            box["served"] = await serve_app(make_app(ext, **app_kwargs), "127.0.0.1", 0, limits, metrics=ext.metrics)
            ready.set()

        def main():
            loop.run_until_complete(start())
            loop.run_forever()

        t = threading.Thread(target=main, daemon=True)
        t.start()
        assert ready.wait(10), "loopback server did not start"
        try:
            yield "127.0.0.1", box["served"].port
        finally:
            async def stop():
                await box["served"].close()
                # connections whose client hung up while aiohttp drained their body
                rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in rest:
                    task.cancel()
                await asyncio.gather(*rest, return_exceptions=True)

            asyncio.run_coroutine_threadsafe(stop(), loop).result(20)
            loop.call_soon_threadsafe(loop.stop)
            t.join(10)

    return run
