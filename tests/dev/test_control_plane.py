"""The real control plane: API server version, kwok GPU nodes, both schedulers, kwok
Stages (Running, Succeeded after a duration), and the extender wiring of the
``rlsched`` scheduler profile."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from rlsched.core.contract import RESOURCE_GPU
from rlsched.core.topology import node_labels
from rlsched_dev.kwok import DURATION_ANNOTATION

pytestmark = pytest.mark.k8s


def _scheduled_by(core_api, namespace: str, pod: str) -> set[str]:
    events = core_api.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={pod},reason=Scheduled").items
    return {e.reporting_component or e.source.component for e in events}


def test_version_is_kubernetes_1_35(kube_cluster):
    info = client.VersionApi(kube_cluster.api_client()).get_code()
    assert info.major == "1" and info.minor == "35"
    assert info.git_version.startswith("v1.35.")


def test_gpu_nodes_follow_the_topology(core_api, kube_cluster):
    nodes = {n.metadata.name: n for n in core_api.list_node(label_selector="type=kwok").items}
    topo = kube_cluster.topology
    assert set(kube_cluster.node_names) <= set(nodes)
    for spec in topo.nodes:
        node = nodes[spec.name]
        for key, value in node_labels(spec).items():
            assert node.metadata.labels[key] == value
        assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
        assert node.status.allocatable[RESOURCE_GPU] == str(spec.gpus)
        assert node.status.capacity[RESOURCE_GPU] == str(spec.gpus)
        ready = {c.type: c.status for c in node.status.conditions}["Ready"]
        assert ready == "True"


@pytest.mark.parametrize("scheduler", ["rlsched", "default-scheduler"])
def test_gpu_pod_is_bound_to_a_kwok_node_and_runs(core_api, kube_cluster, namespace, make_pod,
                                                  wait_until, scheduler):
    core_api.create_namespaced_pod(namespace, make_pod("gpu", gpus=2, scheduler=scheduler))

    def running():
        pod = core_api.read_namespaced_pod("gpu", namespace)
        return pod if pod.status.phase == "Running" else None

    pod = wait_until(running, 60, "pod Running")
    assert pod.spec.node_name in kube_cluster.node_names
    assert pod.status.container_statuses[0].state.running is not None
    assert wait_until(lambda: _scheduled_by(core_api, namespace, "gpu"), 20, "Scheduled event") \
        == {scheduler}


def test_pod_wanting_more_gpus_than_any_node_stays_pending(core_api, kube_cluster, namespace,
                                                           make_pod, wait_until):
    too_many = max(n.gpus for n in kube_cluster.topology.nodes) + 1
    core_api.create_namespaced_pod(namespace, make_pod("big", gpus=too_many,
                                                       scheduler="default-scheduler"))

    def unschedulable():
        events = core_api.list_namespaced_event(
            namespace, field_selector="involvedObject.name=big,reason=FailedScheduling").items
        return events

    events = wait_until(unschedulable, 60, "FailedScheduling event")
    assert RESOURCE_GPU in events[0].message
    pod = core_api.read_namespaced_pod("big", namespace)
    assert pod.spec.node_name is None and pod.status.phase == "Pending"


def test_duration_annotation_makes_the_pod_succeed(core_api, namespace, make_pod, wait_until):
    core_api.create_namespaced_pod(
        namespace, make_pod("short", annotations={DURATION_ANNOTATION: "2"}))
    core_api.create_namespaced_pod(namespace, make_pod("endless"))

    def phase(name):
        return core_api.read_namespaced_pod(name, namespace).status.phase

    wait_until(lambda: phase("short") == "Running", 60, "short pod Running")
    wait_until(lambda: phase("short") == "Succeeded", 30, "short pod Succeeded")
    pod = core_api.read_namespaced_pod("short", namespace)
    term = pod.status.container_statuses[0].state.terminated
    assert term is not None and term.exit_code == 0
    assert phase("endless") == "Running"


def test_deleted_pod_goes_away(core_api, namespace, make_pod, wait_until):
    core_api.create_namespaced_pod(namespace, make_pod("gone"))
    wait_until(lambda: core_api.read_namespaced_pod("gone", namespace).status.phase == "Running",
             60, "pod Running")
    core_api.delete_namespaced_pod("gone", namespace)
    wait_until(lambda: not core_api.list_namespaced_pod(namespace).items, 30, "pod deleted")


class _Extender(BaseHTTPRequestHandler):
    """A minimal scheduler extender: admits only ``self.server.allowed``."""

    def do_POST(self):  # noqa: N802 (http.server API)
        args = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        names = args.get("NodeNames") or []
        self.server.calls.append((self.path, args["Pod"]["metadata"]["name"], names))
        if self.path.endswith("/filter"):
            ok = [n for n in names if n == self.server.allowed]
            body = {"NodeNames": ok, "FailedNodes": {n: "not the chosen one" for n in names
                                                      if n not in ok}, "Error": ""}
        else:
            body = [{"Host": n, "Score": 10 if n == self.server.allowed else 0} for n in names]
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.mark.runner_side("serves a stand-in extender on the local port the rlsched profile calls; "
                         "the chart's profile calls the sidecar in its own pod")
def test_rlsched_profile_calls_the_extender(core_api, kube_cluster, namespace, make_pod, wait_until):
    if kube_cluster.extender_port is None:
        pytest.skip("extender URL is not local (cluster given by RLSCHED_KUBECONFIG)")
    server = ThreadingHTTPServer(("127.0.0.1", kube_cluster.extender_port), _Extender)
    server.calls, server.allowed = [], kube_cluster.node_names[-1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        core_api.create_namespaced_pod(namespace, make_pod("picked", gpus=1))
        pod = wait_until(lambda: (p := core_api.read_namespaced_pod("picked", namespace))
                       .spec.node_name and p, 60, "pod bound")
    finally:
        server.shutdown()
        server.server_close()
    assert pod.spec.node_name == server.allowed
    paths = {path for path, name, _ in server.calls if name == "picked"}
    assert "/filter" in paths
    # nodeCacheCapable: the extender gets node names, not full Node objects
    assert all(names for _, _, names in server.calls)
