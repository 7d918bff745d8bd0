"""The local control plane supervises its components as a kubelet would.

kube-scheduler exits when its cache is corrupted (a pod re-created under a reused
name, kubernetes#50916); kwok or the controller manager can die too. Killed with
SIGKILL, kube-scheduler and kwok come back (restart logged and counted) and a pod
created afterwards is scheduled and played; a scheduler stopped on purpose stays
stopped until started again.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import ssl
import time

import pytest
from kubernetes import client

pytestmark = [pytest.mark.k8s, pytest.mark.runner_side(
    "kills and restarts the local control plane's kube-scheduler and kwok processes (LocalCluster supervision)")]


@pytest.fixture(scope="module")
def cluster(kube_cluster):
    """The session's LocalCluster, or (against an external cluster) a small one of our own."""
    if kube_cluster.cluster is not None:
        yield kube_cluster.cluster
        return
    from rlsched_dev.cluster import LocalCluster

    with LocalCluster() as c:
        yield c


def _healthy(cluster, port_name: str, https: bool) -> bool:
    from rlsched_dev.probe import http_ok

    if not https:
        return http_ok(f"http://127.0.0.1:{cluster.ports[port_name]}/healthz", expect="ok")
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return http_ok(f"https://127.0.0.1:{cluster.ports[port_name]}/healthz", ctx, expect="ok")


def test_killed_scheduler_and_kwok_are_restarted_logged_and_counted(
        cluster, make_pod, wait_until, caplog):
    from kubernetes import config

    caplog.set_level(logging.WARNING, logger="rlsched_dev.cluster")
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
    before = dict(cluster.restarts)
    old = {n: cluster.pids[n] for n in ("kube-scheduler", "kwok")}
    for pid in old.values():
        os.kill(pid, signal.SIGKILL)

    def back() -> bool:
        pids = cluster.pids
        return all(pids.get(n) not in (None, old[n]) and cluster.processes[n].exited() is None
                   for n in old)

    wait_until(back, 30, "kube-scheduler and kwok restarted", every=0.1)
    for name in old:
        assert cluster.restarts.get(name, 0) == before.get(name, 0) + 1
    assert cluster.restarts.get("rlsched-scheduler", 0) == before.get("rlsched-scheduler", 0)
    wait_until(lambda: _healthy(cluster, "scheduler", True) and _healthy(cluster, "kwok", False),
               60, "the restarted kube-scheduler and kwok healthy")

    log = (cluster.workdir / "logs" / "supervisor.log").read_text()
    for name, pid in old.items():
        assert f"{name} (pid {pid}) exited unexpectedly with status -9" in log
        assert f"{name} restarted (pid {cluster.pids[name]}" in log
        assert "rlsched supervisor:" in cluster.log_path(name).read_text()
    logged = [r.getMessage() for r in caplog.records if r.name == "rlsched_dev.cluster"]
    assert any("kube-scheduler restarted" in m for m in logged)
    assert any("kwok restarted" in m for m in logged)

    # the dead ones' leases were released: the new kwok manages the nodes at once
    # (not after 120 s), the new scheduler leads at once (not after 15 s)
    assert re.search(r"deleted [1-9]\d* node leases of the exited kwok", log)
    assert "released 1 leader lease of the exited kube-scheduler" in log
    # A pod created afterwards is scheduled by the new kube-scheduler and played by kwok.
    ns = f"sup-{os.getpid()}-{int(time.time()) % 100000}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        core.create_namespaced_pod(ns, make_pod("after-kill", gpus=1, scheduler="default-scheduler"))

        def running():
            p = core.read_namespaced_pod("after-kill", ns)
            return p.spec.node_name if p.status.phase == "Running" else None

        node = wait_until(running, 30, "the pod created after the kill scheduled and Running")
        assert node in {n.metadata.name for n in core.list_node(label_selector="type=kwok").items}
    finally:
        core.delete_namespace(ns)


def test_a_scheduler_stopped_on_purpose_stays_stopped(cluster, wait_until):
    before = dict(cluster.restarts)
    cluster.stop_scheduler("kube-scheduler")
    try:
        proc = cluster.processes["kube-scheduler"]
        assert proc.exited() is not None
        time.sleep(1.5)  # three backoff periods
        assert cluster.processes["kube-scheduler"] is proc and proc.exited() is not None
        assert cluster.restarts == before
    finally:
        cluster.start_scheduler("kube-scheduler")
    assert cluster.processes["kube-scheduler"].exited() is None
    assert cluster.restarts == before
