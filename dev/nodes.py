"""Topology building: the kwok GPU nodes of a core :class:`~rlsched.core.topology.Topology`.

One kwok Node per topology node, labelled as GPU Feature Discovery and the topology
levels would label it (``rlsched.core.topology.node_labels``), with the
``nvidia.com/gpu`` resource; created, deleted and waited for through the API server.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Iterable, Iterator, Mapping

import yaml

from rlsched.core.contract import RESOURCE_GPU
from rlsched.core.topology import NodeSpec, Topology, node_labels

from .kwok import KWOK_NODE_ANNOTATION, KWOK_TAINT_KEY
from .proc import ClusterError

__all__ = [
    "watch_event_batches",
    "DEFAULT_PARALLELISM",
    "count_ready",
    "create_gpu_nodes",
    "default_topology",
    "mixed_topology",
    "MIXED_GPU_TYPES",
    "delete_gpu_nodes",
    "kwok_node",
    "load_topology",
    "node_schedulable_ready",
    "wait_nodes_ready",
]

_NODE_STATE_TAINTS = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def default_topology() -> Topology:
    """The small GPU cluster of the integration tests and the demo: 2 racks of 2 nodes,
    8 A100 each (32 GPUs)."""
    return Topology.uniform(4, gpus_per_node=8, racks=2, blocks=1, prefix="kwok-gpu")


#: GPU Feature Discovery's product strings of :func:`mixed_topology` -> the GPU types of
#: the measured profiles (``../shared/data/sia-sosp23``: ``aws`` is T4, ``dgx-ext`` A100),
#: the operator's ``--gpu-types`` for it
MIXED_GPU_TYPES = {"Tesla-T4": "aws", "NVIDIA-A100-SXM4-40GB": "dgx-ext"}


def mixed_topology(t4_nodes: int = 2, a100_nodes: int = 2, prefix: str = "kwok-gpu") -> Topology:
    """A cluster of two GPU types as GPU Feature Discovery labels them
    (``nvidia.com/gpu.product``): ``t4_nodes`` nodes of 4 ``Tesla-T4`` in one rack and
    ``a100_nodes`` nodes of 8 ``NVIDIA-A100-SXM4-40GB`` in another (the GPUs per node of
    the measured ``aws`` and ``dgx-ext`` types; :data:`MIXED_GPU_TYPES`)."""
    if t4_nodes < 1 or a100_nodes < 1:
        raise ValueError("need at least one node of each type")
    specs = [NodeSpec(f"{prefix}-t4-{i}", 4, gpu_model="Tesla-T4", rack="rack-t4", block="block-0",
                      nvlink_domain_size=4) for i in range(t4_nodes)]
    specs += [NodeSpec(f"{prefix}-a100-{i}", 8, gpu_model="NVIDIA-A100-SXM4-40GB", rack="rack-a100",
                       block="block-0") for i in range(a100_nodes)]
    return Topology(specs)


def kwok_node(spec: NodeSpec, *, taint: bool = False, pods: int = 110) -> dict[str, Any]:
    """The Node object kwok manages for one topology node (a plain dict)."""
    labels = {
        **node_labels(spec),
        "type": "kwok",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": f"gpu-{spec.gpu_model.lower()}-x{spec.gpus}",
    }
    resources = {
        "cpu": f"{spec.cpu_milli}m",
        "memory": f"{spec.memory_mib}Mi",
        "pods": str(pods),
        RESOURCE_GPU: str(spec.gpus),
    }
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }
    if taint:
        node["spec"]["taints"] = [{"key": KWOK_TAINT_KEY, "value": "fake", "effect": "NoSchedule"}]
    return node


def _core_api(api_or_kubeconfig: Any):
    from kubernetes import client, config

    if isinstance(api_or_kubeconfig, client.CoreV1Api):
        return api_or_kubeconfig
    if isinstance(api_or_kubeconfig, client.ApiClient):
        return client.CoreV1Api(api_or_kubeconfig)
    return client.CoreV1Api(config.new_client_from_config(config_file=str(api_or_kubeconfig)))


#: concurrent node creations/deletions: the API server and kwok keep up far beyond one
#: request at a time (1,000 nodes: ~30 s one by one, a few seconds this way)
DEFAULT_PARALLELISM = 16


def _parallel(fn, items: list, parallelism: int) -> list:
    """``fn(item)`` for every item on ``parallelism`` threads; results in order. The
    first error is raised once the others have finished (nothing is left running)."""
    from concurrent.futures import ThreadPoolExecutor

    if parallelism < 1:
        raise ValueError("parallelism must be >= 1")
    if parallelism == 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(parallelism, len(items)), thread_name_prefix="nodes") as pool:
        futures = [pool.submit(fn, x) for x in items]
        errors = [f.exception() for f in futures]
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return [f.result() for f in futures]


def _pooled_api(api_or_kubeconfig: Any, parallelism: int):
    """A CoreV1Api whose connection pool holds ``parallelism`` connections (the client's
    default, 5 per CPU, would make the threads queue for a connection)."""
    from kubernetes import client, config

    if isinstance(api_or_kubeconfig, (client.CoreV1Api, client.ApiClient)):
        return _core_api(api_or_kubeconfig)
    conf = client.Configuration()
    config.load_kube_config(config_file=str(api_or_kubeconfig), client_configuration=conf)
    conf.connection_pool_maxsize = max(parallelism, 1)
    return client.CoreV1Api(client.ApiClient(conf))


def _drain(resp) -> None:
    """Read an undecoded reply (``_preload_content=False``) to its end and hand the
    connection back to the pool (unread bytes would corrupt the next request)."""
    resp.read()
    resp.release_conn()


def create_gpu_nodes(api_or_kubeconfig: Any, topology: Topology, *, taint: bool = False,
                     replace: bool = True, parallelism: int = DEFAULT_PARALLELISM) -> list[str]:
    """Create one kwok Node per topology node; returns their names.

    ``api_or_kubeconfig``: a ``kubernetes`` CoreV1Api/ApiClient or a kubeconfig path.
    ``replace`` deletes an existing node of the same name first. ``taint`` adds kwok's
    ``kwok.x-k8s.io/node=fake:NoSchedule`` taint (pods then need a toleration).
    ``parallelism``: requests in flight at once (replies are not decoded: the caller
    gets the names, and the API server's answer is read only for errors).
    """
    from kubernetes.client.exceptions import ApiException

    api = _pooled_api(api_or_kubeconfig, parallelism)

    def create(spec: NodeSpec) -> str:
        body = kwok_node(spec, taint=taint)
        try:
            _drain(api.create_node(body, _preload_content=False))
        except ApiException as exc:
            if exc.status != 409 or not replace:
                raise
            api.delete_node(spec.name, grace_period_seconds=0)
            _wait_gone(api, spec.name, 30.0)
            _drain(api.create_node(body, _preload_content=False))
        return spec.name

    return _parallel(create, list(topology.nodes), parallelism)


def _wait_gone(api, name: str, timeout: float) -> None:
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            _drain(api.read_node(name, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.1)
    raise ClusterError(f"node {name} still present after {timeout:.0f}s")


def delete_gpu_nodes(api_or_kubeconfig: Any, names: Iterable[str], *,
                     parallelism: int = DEFAULT_PARALLELISM) -> None:
    from kubernetes.client.exceptions import ApiException

    api = _pooled_api(api_or_kubeconfig, parallelism)

    def delete(name: str) -> None:
        try:
            _drain(api.delete_node(name, grace_period_seconds=0, _preload_content=False))
        except ApiException as exc:
            if exc.status != 404:
                raise

    _parallel(delete, list(names), parallelism)


def node_schedulable_ready(node: Mapping) -> bool:
    """A Node (a plain camelCase dict as the API serves it) that kwok reports Ready and
    whose ``node.kubernetes.io/not-ready``/``unreachable`` taint the node lifecycle
    controller has lifted: what kube-scheduler needs to place pods on it."""
    conds = {c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or ()}
    taints = {t.get("key") for t in (node.get("spec") or {}).get("taints") or ()}
    return conds.get("Ready") == "True" and not taints & _NODE_STATE_TAINTS


def count_ready(api_or_kubeconfig: Any, names: Iterable[str]) -> int:
    """How many of the named nodes are Ready and schedulable right now
    (:func:`node_schedulable_ready`); one list from the API server's watch cache."""
    return len(set(names) & _ready_names(_core_api(api_or_kubeconfig)))


def _ready_names(api) -> set[str]:
    return {n for n, ok in _list_nodes(api)[0].items() if ok}


def _list_nodes(api) -> tuple[dict[str, bool], str]:
    """name -> schedulable-ready of every node, and the list's resourceVersion."""
    import orjson

    # resourceVersion "0": served from the API server's watch cache, not etcd; the
    # reply is parsed with orjson (the client's own decoding of 1,000 nodes takes
    # seconds of CPU, which a busy machine's control plane needs)
    doc = orjson.loads(api.list_node(resource_version="0", _preload_content=False).data)
    return ({n["metadata"]["name"]: node_schedulable_ready(n) for n in doc["items"]},
            doc["metadata"]["resourceVersion"])


def _watch_nodes(api, rv: str, seconds: int, state: dict[str, bool], on_batch: Callable[[], bool]) -> str:
    """Apply the node events after ``rv`` to ``state`` for up to ``seconds`` (the API
    server ends the watch then); ``on_batch()`` after each chunk read, True stops.
    Returns the last resourceVersion seen; raises ``_Expired`` when ``rv`` is too old."""
    resp = api.list_node(watch=True, resource_version=rv, allow_watch_bookmarks=True,
                         timeout_seconds=max(1, seconds), _preload_content=False)
    try:
        for events in watch_event_batches(resp):
            for ev in events:
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    raise _Expired(obj.get("message") or str(obj))
                meta = obj.get("metadata") or {}
                rv = meta.get("resourceVersion") or rv
                if ev.get("type") in ("ADDED", "MODIFIED"):
                    state[meta["name"]] = node_schedulable_ready(obj)
                elif ev.get("type") == "DELETED":
                    state.pop(meta["name"], None)
            if on_batch():
                break
    finally:
        resp.close()
        resp.release_conn()
    return rv


def watch_event_batches(resp: Any) -> Iterator[list[dict]]:
    """The events of a raw watch response (``_preload_content=False``), decoded with
    orjson, one list per chunk read (an event cut across chunks comes with the chunk
    that ends it)."""
    import orjson

    rest = b""
    for chunk in resp.stream(None, decode_content=False):
        lines = (rest + chunk if rest else chunk).split(b"\n")
        rest = lines.pop()
        yield [orjson.loads(line) for line in lines if line.strip()]


class _Expired(Exception):
    """The node watch's resourceVersion is gone (list again)."""


def wait_nodes_ready(api_or_kubeconfig: Any, names: Iterable[str], timeout: float = 60.0, *,
                     progress: Callable[[int, int], None] | None = None,
                     every: float = 0.5) -> None:
    """Wait until every named node is Ready (set by kwok) and schedulable: the
    ``node.kubernetes.io/not-ready`` taint a new node starts with has been lifted.

    One list, then a watch on the nodes (a poll would have the API server encode
    every node again and again while it is busiest). ``progress(ready, total)`` is
    called at most every ``every`` s and once at the end."""
    api = _core_api(api_or_kubeconfig)
    wanted = set(names)
    deadline = time.monotonic() + timeout
    state, rv = _list_nodes(api)
    last = [0.0, -1]  # time of the last progress call, count it reported

    def ready_count() -> int:
        return sum(1 for n in wanted if state.get(n))

    def on_batch() -> bool:
        ready = ready_count()
        done = ready == len(wanted)
        if progress is not None and ((done and last[1] != ready) or time.monotonic() - last[0] >= every):
            last[:] = [time.monotonic(), ready]
            progress(ready, len(wanted))
        return done or time.monotonic() > deadline

    while not on_batch():
        try:
            rv = _watch_nodes(api, rv, min(5, int(deadline - time.monotonic()) + 1), state, on_batch)
        except _Expired:
            state, rv = _list_nodes(api)
    if ready_count() < len(wanted):
        shown = sorted(n for n in wanted if not state.get(n))
        more = f" and {len(shown) - 10} more" if len(shown) > 10 else ""
        raise ClusterError(
            f"{len(shown)} nodes not Ready after {timeout:.0f}s: {shown[:10]}{more} "
            "(is the kwok controller running and managing them?)"
        )


def load_topology(path: str | os.PathLike | None) -> Topology:
    """The topology described by the YAML/JSON file ``path`` (core
    ``Topology.from_dict``); :func:`default_topology` without one, :func:`mixed_topology`
    for ``mixed``."""
    if not path:
        return default_topology()
    if str(path) == "mixed":
        return mixed_topology()
    with open(path) as f:
        data: Mapping = yaml.safe_load(f)
    return Topology.from_dict(data)
