"""Topology building: the kwok GPU nodes of a core :class:`~rlsched.core.topology.Topology`.

One kwok Node per topology node, labelled as GPU Feature Discovery and the topology
levels would label it (``rlsched.core.topology.node_labels``), with the
``nvidia.com/gpu`` resource; created, deleted and waited for through the API server.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterable, Mapping

import yaml

from rlsched.core.contract import RESOURCE_GPU
from rlsched.core.topology import NodeSpec, Topology, node_labels

from .kwok import KWOK_NODE_ANNOTATION, KWOK_TAINT_KEY
from .proc import ClusterError

__all__ = [
    "create_gpu_nodes",
    "default_topology",
    "delete_gpu_nodes",
    "kwok_node",
    "load_topology",
    "wait_nodes_ready",
]

_NODE_STATE_TAINTS = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


def default_topology() -> Topology:
    """The small GPU cluster of the integration tests and the demo: 2 racks of 2 nodes,
    8 A100 each (32 GPUs)."""
    return Topology.uniform(4, gpus_per_node=8, racks=2, blocks=1, prefix="kwok-gpu")


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


def create_gpu_nodes(api_or_kubeconfig: Any, topology: Topology, *, taint: bool = False,
                     replace: bool = True) -> list[str]:
    """Create one kwok Node per topology node; returns their names.

    ``api_or_kubeconfig``: a ``kubernetes`` CoreV1Api/ApiClient or a kubeconfig path.
    ``replace`` deletes an existing node of the same name first. ``taint`` adds kwok's
    ``kwok.x-k8s.io/node=fake:NoSchedule`` taint (pods then need a toleration).
    """
    from kubernetes.client.exceptions import ApiException

    api = _core_api(api_or_kubeconfig)
    names = []
    for spec in topology.nodes:
        body = kwok_node(spec, taint=taint)
        try:
            api.create_node(body)
        except ApiException as exc:
            if exc.status != 409 or not replace:
                raise
            api.delete_node(spec.name, grace_period_seconds=0)
            _wait_gone(api, spec.name, 30.0)
            api.create_node(body)
        names.append(spec.name)
    return names


def _wait_gone(api, name: str, timeout: float) -> None:
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            api.read_node(name)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.1)
    raise ClusterError(f"node {name} still present after {timeout:.0f}s")


def delete_gpu_nodes(api_or_kubeconfig: Any, names: Iterable[str]) -> None:
    from kubernetes.client.exceptions import ApiException

    api = _core_api(api_or_kubeconfig)
    for name in names:
        try:
            api.delete_node(name, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise


def wait_nodes_ready(api_or_kubeconfig: Any, names: Iterable[str], timeout: float = 60.0) -> None:
    """Wait until every named node is Ready (set by kwok) and schedulable: the
    ``node.kubernetes.io/not-ready`` taint a new node starts with has been lifted."""
    api = _core_api(api_or_kubeconfig)
    pending = set(names)
    deadline = time.monotonic() + timeout
    while pending:
        for node in api.list_node().items:
            conds = {c.type: c.status for c in (node.status.conditions or [])}
            taints = {t.key for t in (node.spec.taints or [])}
            if conds.get("Ready") == "True" and not taints & _NODE_STATE_TAINTS:
                pending.discard(node.metadata.name)
        if not pending:
            return
        if time.monotonic() > deadline:
            raise ClusterError(
                f"nodes not Ready after {timeout:.0f}s: {sorted(pending)} "
                "(is the kwok controller running and managing them?)"
            )
        time.sleep(0.2)


def load_topology(path: str | os.PathLike | None) -> Topology:
    """The topology described by the YAML/JSON file ``path`` (core
    ``Topology.from_dict``); :func:`default_topology` without one."""
    if not path:
        return default_topology()
    with open(path) as f:
        data: Mapping = yaml.safe_load(f)
    return Topology.from_dict(data)
