"""End to end on the real control plane: kube-scheduler's ``rlsched`` profile calls
this extender (its own process, watching the API server) and the workers of one job
land on topology-compact nodes, where the default scheduler spreads the same pods."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

from rlsched.core.contract import LABEL_INDEX, LABEL_JOB, LABEL_ROLE

pytestmark = pytest.mark.k8s

WORKERS = 4
GPUS = 2


@pytest.fixture
def extender_process(kube_cluster, tmp_path, launch_extender):
    """``rlsched extender serve`` on the port the rlsched profile calls."""
    with launch_extender(kube_cluster, tmp_path / "extender.log", log_level="INFO") as url:
        yield url


def worker(job: str, index: int, scheduler: str):
    from kubernetes import client

    gpu = {"nvidia.com/gpu": str(GPUS)}
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=f"{job}-w{index}",
            labels={LABEL_JOB: job, LABEL_ROLE: "worker", LABEL_INDEX: str(index)},
        ),
        spec=client.V1PodSpec(
            scheduler_name=scheduler,
            restart_policy="Never",
            termination_grace_period_seconds=0,
            containers=[client.V1Container(
                name="trainer", image="registry.example/rlsched/worker:test",
                resources=client.V1ResourceRequirements(
                    requests={"cpu": "8", "memory": "8Gi", **gpu}, limits=gpu),
            )],
        ),
    )


def run_job(core, namespace: str, job: str, scheduler: str) -> list[str]:
    """Create the job's workers at once; the node each one was bound to."""
    for i in range(WORKERS):
        core.create_namespaced_pod(namespace, worker(job, i, scheduler))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_JOB}={job}").items
        nodes = [p.spec.node_name for p in pods]
        if len(nodes) == WORKERS and all(nodes):
            return sorted(nodes)
        time.sleep(0.2)
    raise AssertionError(f"{job}: not all workers bound after 60s: {nodes}")


def delete_job(core, namespace: str, job: str) -> None:
    core.delete_collection_namespaced_pod(namespace, label_selector=f"{LABEL_JOB}={job}", grace_period_seconds=0)
    deadline = time.monotonic() + 30
    while core.list_namespaced_pod(namespace, label_selector=f"{LABEL_JOB}={job}").items:
        assert time.monotonic() < deadline, "pods not deleted"
        time.sleep(0.2)


def test_job_lands_compact_with_the_extender_and_spreads_without(kube_cluster, core_api, namespace, extender_process):
    core = core_api
    topo = kube_cluster.topology
    rack = {n.name: n.rack for n in topo.nodes}
    assert len(topo.racks) >= 2 and WORKERS * GPUS <= max(n.gpus for n in topo.nodes)

    compact = run_job(core, namespace, "tj-rl", "rlsched")
    # DAS packs the gang: one rack, and here (8 GPUs fit one node) one node
    assert len({rack[n] for n in compact}) == 1, compact
    assert len(set(compact)) == 1, compact
    with urllib.request.urlopen(f"{extender_process}/debug/pods/{namespace}/tj-rl-w3", timeout=5) as r:
        assert b'"placed_workers"' in r.read()
    with urllib.request.urlopen(f"{extender_process}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert 'rlsched_extender_request_duration_seconds_count{verb="prioritize"}' in text
    delete_job(core, namespace, "tj-rl")

    spread = run_job(core, namespace, "tj-default", "default-scheduler")
    # LeastAllocated spreads the same pods over the nodes, across racks
    assert len(set(spread)) > 1, spread
    assert len({rack[n] for n in spread}) > 1, spread
    # the extender's watch counted the default scheduler's pods: a whole-node pod no
    # longer fits where they run
    pod = {"metadata": {"name": "probe", "namespace": namespace},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
    body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": sorted(rack)}).encode()
    deadline = time.monotonic() + 10
    while True:
        req = urllib.request.Request(f"{extender_process}/filter", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            result = json.loads(r.read())
        if set(result["FailedNodes"]) >= set(spread) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert set(result["FailedNodes"]) >= set(spread), result
    assert all("insufficient nvidia.com/gpu" in result["FailedNodes"][n] for n in spread)
    delete_job(core, namespace, "tj-default")
