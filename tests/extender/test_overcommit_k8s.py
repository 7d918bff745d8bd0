"""No GPU promised twice, on the real control plane (issue 12, fault 1).

Reproduced before the fix: with ``ignoredByScheduler: true`` nothing but the
extender counted GPUs, kube-scheduler broke score ties onto other nodes than the one
the extender assumed, and a killed or stopped extender left nobody counting: 17-20
single-GPU pods bound on 16 free GPUs, one node at 12/8. The recommended configuration
(:class:`rlsched_dev.cluster.LocalCluster`'s, the chart's) lets kube-scheduler count
GPUs itself; these rounds keep it that way. ``make bench`` runs 20 rounds per mode
(``bench/faults.py``).
"""

from __future__ import annotations

import uuid

import pytest

from rlsched_dev.faults import ExtenderProcess, clear_pods, fill_to_free, overcommit, run_round

pytestmark = pytest.mark.k8s

FREE = 16
PODS = 20


@pytest.fixture
def fault_ns(kube_cluster, core_api, wait_until):
    """A namespace on a cluster where exactly ``FREE`` GPUs are free, spread evenly."""
    from kubernetes import client

    from rlsched.core.contract import pod_gpus

    wait_until(lambda: not [p for p in core_api.list_pod_for_all_namespaces().items
                            if p.spec.node_name and pod_gpus(client.ApiClient().sanitize_for_serialization(p))],
               90, "GPU pods of earlier tests to go")
    name = f"oc-{uuid.uuid4().hex[:8]}"
    core_api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    api = kube_cluster.api_client()
    fill_to_free(api, name, list(kube_cluster.node_names), FREE)
    wait_until(lambda: all(p.spec.node_name for p in core_api.list_namespaced_pod(name).items), 30, "filler pods")
    yield api, name
    core_api.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    core_api.delete_namespace(name)
    api.close()


def test_overcommit_counts_bound_gpus_beyond_allocatable():
    nodes = [{"metadata": {"name": "a"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}},
             {"metadata": {"name": "b"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}]

    def pod(node, gpus, phase="Running"):
        return {"spec": {"nodeName": node, "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
                "status": {"phase": phase}}

    assert overcommit(nodes, [pod("a", 8), pod("b", 4)]) == (0, {})
    assert overcommit(nodes, [pod("a", 8), pod("a", 3), pod("b", 9), pod("b", 9, "Succeeded")]) == (
        4, {"a": (11, 8), "b": (9, 8)})


@pytest.mark.runner_side("kills and stops a runner-side extender on the local port the rlsched profile calls")
@pytest.mark.parametrize(("mode", "rounds", "fault_after"), [("healthy", 2, 0), ("killed", 2, 3), ("stopped", 1, 12)])
def test_no_gpu_overcommitted_when_the_extender_is(mode, rounds, fault_after, kube_cluster, fault_ns, tmp_path):
    """20 single-GPU pods at once on 16 free GPUs: exactly 16 bind, none beyond a
    node's GPUs, whether the extender stays healthy, is SIGKILLed or SIGSTOPped once
    the first pods are bound. (A stopped extender costs kube-scheduler its httpTimeout
    twice per pod, so that round faults late: 4 pods bind with it hung.)"""
    api, ns = fault_ns
    ext = ExtenderProcess(kube_cluster.kubeconfig, kube_cluster.extender_port, tmp_path / "extender.log")
    ext.start()
    try:
        for k in range(rounds):
            if ext.proc.exited() is not None:
                ext.start()
            res = run_round(api, ns, mode=mode, index=k, pods=PODS, free_gpus=FREE, extender=ext,
                            fault_after=fault_after, timeout_s=180)
            assert res.overcommitted_gpus == 0, res
            assert res.bound == FREE, res
            if mode == "stopped":
                ext.close()
            clear_pods(api, ns, f"rlsched.dev/fault-round={k}")
    finally:
        ext.close()
