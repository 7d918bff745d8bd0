"""Many kwok nodes at once on the real control plane: created in parallel, all Ready
and schedulable (kwok's node Stage, the lifecycle controller's not-ready taint lifted),
each with the node lease that is its heartbeat, and all gone again when deleted.
(How fast is measured in ``bench/scheduling.py``, not asserted here.)"""

from __future__ import annotations

import orjson
import pytest
from kubernetes import client

from rlsched.core.topology import Topology
from rlsched_dev.kwok import NODE_LEASE_DURATION_S
from rlsched_dev.nodes import (count_ready, create_gpu_nodes, delete_gpu_nodes,
                               node_schedulable_ready, wait_nodes_ready)

pytestmark = pytest.mark.k8s

MANY = 300


def test_hundreds_of_nodes_become_ready_with_leases_and_go_away(kube_cluster, core_api, wait_until):
    topo = Topology.uniform(MANY, gpus_per_node=8, racks=15, blocks=3, prefix="many")
    names = create_gpu_nodes(core_api, topo)
    try:
        assert names == [s.name for s in topo.nodes] and len(set(names)) == MANY
        seen: list[int] = []
        wait_nodes_ready(core_api, names, timeout=300, progress=lambda r, t: seen.append(r))
        assert seen[-1] == MANY and seen == sorted(seen)
        assert count_ready(core_api, names) == MANY
        items = orjson.loads(core_api.list_node(label_selector="type=kwok",
                                                _preload_content=False).data)["items"]
        mine = {n["metadata"]["name"]: n for n in items if n["metadata"]["name"] in set(names)}
        assert len(mine) == MANY and all(node_schedulable_ready(n) for n in mine.values())
        assert {n["status"]["allocatable"]["nvidia.com/gpu"] for n in mine.values()} == {"8"}
        # the heartbeat is kwok's node lease, one per node, owned by the node
        coord = client.CoordinationV1Api(core_api.api_client)
        leases = {x.metadata.name: x for x in coord.list_namespaced_lease("kube-node-lease").items}
        assert set(names) <= set(leases)
        lease = leases[names[0]]
        assert lease.spec.lease_duration_seconds == NODE_LEASE_DURATION_S
        assert lease.spec.renew_time is not None
        assert [o.name for o in lease.metadata.owner_references] == [names[0]]
    finally:
        delete_gpu_nodes(core_api, names)
    left = lambda: not {n.metadata.name for n in core_api.list_node().items} & set(names)
    wait_until(left, 120, "the many nodes deleted", every=1.0)
    # the session's own nodes are untouched
    assert count_ready(core_api, kube_cluster.node_names) == len(kube_cluster.node_names)


def test_creating_an_existing_node_replaces_it(kube_cluster, core_api):
    topo = Topology.uniform(3, gpus_per_node=4, racks=1, blocks=1, prefix="twice")
    names = create_gpu_nodes(core_api, topo)
    try:
        uid = {n: core_api.read_node(n).metadata.uid for n in names}
        assert create_gpu_nodes(core_api, topo) == names
        assert all(core_api.read_node(n).metadata.uid != uid[n] for n in names)
        wait_nodes_ready(core_api, names, timeout=120)
    finally:
        delete_gpu_nodes(core_api, names)
