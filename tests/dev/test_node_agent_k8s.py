"""The test-only node agent (``rlsched_dev.node_agent``) on the real control plane.

Two agent nodes beside the session's kwok nodes; pods bound to them run as local
processes: exit codes become Succeeded/Failed with the container's terminated state,
deletion delivers SIGTERM within the grace period (SIGKILL after it) and removes the
pod, the environment is resolved as a kubelet does plus the agent's network mapping
(stable pod DNS names -> 127.0.0.1, the rendezvous port remapped per job), and the
per-pod kubeconfig carries the pod's ServiceAccount (its Role allows one object,
refuses another). kwok leaves the agent's nodes and pods alone.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest
from kubernetes import client

from rlsched_dev.node_agent import (AGENT_LABEL, NodeAgent, expand_vars, parse_node,
                                    resolve_env, rewrite_network)
from rlsched_dev.nodes import watch_event_batches

A, B = "agent-a", "agent-b"
k8s = pytest.mark.k8s


# --------------------------------------------------------------------------- pure parts
def test_env_resolution_and_network_mapping_without_a_cluster():
    pod = {"metadata": {"name": "p", "namespace": "ns1", "uid": "u-1", "labels": {"app": "x"}},
           "spec": {"nodeName": A}}
    c = {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "$(A)-$(NOPE)-$$(A)"},
                 {"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                 {"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                 {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                 {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu",
                                                                    "divisor": "1m"}}}],
         "resources": {"limits": {"cpu": "1500m"}}}
    env = resolve_env(pod, c)
    assert env == {"A": "1", "B": "1-$(NOPE)-$(A)", "N": "ns1", "L": "x", "IP": "127.0.0.1",
                   "CPU": "1500"}
    assert expand_vars("$(A)$(A)", {"A": "z"}) == "zz"

    ports: dict = {}
    port_for = lambda ns, addr, port: ports.setdefault((ns, addr, port), 40000 + len(ports))
    env = {"MASTER_ADDR": "j-0.j", "MASTER_PORT": "29500", "PET_MASTER_ADDR": "j-0.j",
           "PET_MASTER_PORT": "29500", "URL": "tcp://j-0.j.ns1.svc.cluster.local:29500/x",
           "FQ": "j-0.j.ns1", "OTHER": "j-0.j.example.com", "NOT": "xj-0.j",
           "PET_RDZV_ENDPOINT": "j-0.j.ns1.svc:29500"}
    out = rewrite_network(env, "ns1", {"j-0.j"}, port_for)
    assert out == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "40000",
                   "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "40000",
                   "URL": "tcp://127.0.0.1:29500/x", "FQ": "127.0.0.1",
                   "OTHER": "j-0.j.example.com", "NOT": "xj-0.j",
                   "PET_RDZV_ENDPOINT": "127.0.0.1:40000"}
    assert parse_node("n:2:rack-1").gpus == 2 and parse_node("n:2:rack-1").rack == "rack-1"
    with pytest.raises(ValueError):
        parse_node("n:x")


# --------------------------------------------------------------------------- on the cluster
@pytest.fixture(scope="module")
def agent(kube_cluster, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("node-agent")
    with NodeAgent(kube_cluster.kubeconfig, nodes=[f"{A}:2", f"{B}:2:rack-9"], log_dir=log_dir) as ag:
        yield ag
    # the agent deleted its nodes on the way out
    core = client.CoreV1Api(kube_cluster.api_client())
    assert not {A, B} & {n.metadata.name for n in core.list_node().items}


def _pod(name: str, code: str, *, node: str | None = A, env=(), grace: int = 10, **spec) -> dict:
    body = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": spec.pop("labels", {"app": name})},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace,
                 "containers": [{"name": "main", "image": "python:3.11",
                                 "command": ["python", "-c", textwrap.dedent(code)],
                                 "env": list(env)}],
                 **spec},
    }
    if node:
        body["spec"]["nodeName"] = node
    return body


def _get(core, ns: str, name: str) -> dict | None:
    try:
        return orjson.loads(core.read_namespaced_pod(name, ns, _preload_content=False).data)
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _done(core, ns: str, name: str):
    pod = _get(core, ns, name)
    return pod if pod and pod["status"].get("phase") in ("Succeeded", "Failed") else None


def _terminated(pod: dict) -> dict:
    return pod["status"]["containerStatuses"][0]["state"]["terminated"]


@k8s
def test_agent_nodes_are_ready_labelled_and_not_kwok(agent, core_api, kube_cluster):
    nodes = {n: core_api.read_node(n) for n in (A, B)}
    for n in nodes.values():
        labels = n.metadata.labels
        assert labels[AGENT_LABEL] == "true" and labels["type"] == "node-agent"
        assert "kwok.x-k8s.io/node" not in (n.metadata.annotations or {})
        assert n.status.allocatable["nvidia.com/gpu"] == "2"
        assert {c.type: c.status for c in n.status.conditions}["Ready"] == "True"
        assert not [t for t in n.spec.taints or () if t.key.startswith("node.kubernetes.io/")]
    assert nodes[B].metadata.labels["topology.rlsched.dev/rack"] == "rack-9"
    lease = client.CoordinationV1Api(core_api.api_client).read_namespaced_lease(A, "kube-node-lease")
    assert lease.spec.holder_identity == A and lease.spec.lease_duration_seconds == 40
    # kwok's own nodes are untouched
    assert all(core_api.read_node(n).metadata.annotations["kwok.x-k8s.io/node"] == "fake"
               for n in kube_cluster.node_names)


@k8s
def test_exit_codes_become_succeeded_and_failed(agent, core_api, namespace, wait_until):
    core_api.create_namespaced_pod(namespace, _pod("ok", "print('hello from the agent')"))
    core_api.create_namespaced_pod(namespace, _pod("three", "import sys; sys.exit(3)", node=B))
    # scheduled by the default scheduler onto an agent node (GPU request, node selector)
    sched = _pod("sched", "print('scheduled')", node=None,
                 nodeSelector={"kubernetes.io/hostname": B})
    sched["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    core_api.create_namespaced_pod(namespace, sched)

    ok = wait_until(lambda: _done(core_api, namespace, "ok"), 30, "pod ok done")
    assert ok["status"]["phase"] == "Succeeded", ok["status"]
    term = _terminated(ok)
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    assert term["startedAt"] <= term["finishedAt"]
    st = ok["status"]
    # our podIP (kwok would have given one of its 10.0.x.x and marked it Running forever)
    assert st["podIP"] == "127.0.0.1" and st["hostIP"] == "127.0.0.1" and st["startTime"]
    conds = {c["type"]: c["status"] for c in st["conditions"]}
    assert conds["PodScheduled"] == conds["Initialized"] == "True"
    assert conds["Ready"] == conds["ContainersReady"] == "False"
    assert st["containerStatuses"][0]["ready"] is False
    assert "hello from the agent" in agent.pod_log(namespace, "ok")

    three = wait_until(lambda: _done(core_api, namespace, "three"), 30, "pod three done")
    assert three["status"]["phase"] == "Failed"
    assert _terminated(three)["exitCode"] == 3 and _terminated(three)["reason"] == "Error"

    done = wait_until(lambda: _done(core_api, namespace, "sched"), 60, "scheduled pod done")
    assert done["spec"]["nodeName"] == B and done["status"]["phase"] == "Succeeded"
    assert "scheduled" in agent.pod_log(namespace, "sched")


@k8s
def test_a_running_pod_is_ready_and_deletion_sends_sigterm_within_the_grace(
        agent, core_api, namespace, wait_until, tmp_path):
    marker = tmp_path / "marker"
    trap = """
        import os, pathlib, signal, sys, time
        def bye(*_):
            pathlib.Path(os.environ["MARKER"]).write_text("SIGTERM")
            sys.exit(7)
        signal.signal(signal.SIGTERM, bye)
        print("ready", flush=True)
        time.sleep(120)
    """
    plain = "import time; print('ready', flush=True); time.sleep(120)"
    stubborn = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(120)")
    core_api.create_namespaced_pod(namespace, _pod("trap", trap, env=[{"name": "MARKER",
                                                                       "value": str(marker)}]))
    core_api.create_namespaced_pod(namespace, _pod("plain", plain, node=B))
    core_api.create_namespaced_pod(namespace, _pod("stubborn", stubborn, grace=1))
    names = ("trap", "plain", "stubborn")
    wait_until(lambda: all("ready" in agent.pod_log(namespace, n) for n in names), 30,
               "the three processes ready")
    running = wait_until(lambda: (p := _get(core_api, namespace, "trap"))
                         and p["status"].get("phase") == "Running" and p, 15, "trap Running")
    cs = running["status"]["containerStatuses"][0]
    assert cs["ready"] is True and "running" in cs["state"]
    assert {c["type"]: c["status"] for c in running["status"]["conditions"]}["Ready"] == "True"

    rv = core_api.list_namespaced_pod(namespace).metadata.resource_version
    t0 = time.monotonic()
    for n in names:
        core_api.delete_namespaced_pod(n, namespace)  # the pod's own grace period
    last: dict[str, dict] = {}
    gone: dict[str, float] = {}
    resp = core_api.list_namespaced_pod(namespace, watch=True, resource_version=rv,
                                        timeout_seconds=30, _preload_content=False)
    try:
        for batch in watch_event_batches(resp):
            for ev in batch:
                obj = ev["object"]
                last[obj["metadata"]["name"]] = obj
                if ev["type"] == "DELETED":
                    gone[obj["metadata"]["name"]] = time.monotonic() - t0
            if set(gone) >= set(names):
                break
    finally:
        resp.close()
        resp.release_conn()
    assert set(gone) >= set(names), f"not all deleted: {gone}"
    assert marker.read_text() == "SIGTERM"
    assert _terminated(last["trap"])["exitCode"] == 7 and last["trap"]["status"]["phase"] == "Failed"
    assert _terminated(last["plain"])["exitCode"] == 143
    assert _terminated(last["stubborn"])["exitCode"] == 137  # SIGKILL after its 1 s
    assert gone["trap"] < 10 and gone["plain"] < 10, gone
    assert 1.0 <= gone["stubborn"] < 10, gone

    # the deletion was finalized: the name can be used again at once
    core_api.create_namespaced_pod(namespace, _pod("plain", "print('second life')", node=B))
    again = wait_until(lambda: _done(core_api, namespace, "plain"), 30, "re-created pod done")
    assert again["status"]["phase"] == "Succeeded"
    assert len(agent.pod_logs(namespace, "plain")) == 2
    assert "second life" in agent.pod_log(namespace, "plain")


_SHOW_ENV = """
    import json, os, sys
    keys = ["MASTER_ADDR", "MASTER_PORT", "PET_MASTER_ADDR", "PET_MASTER_PORT",
            "PET_RDZV_ENDPOINT", "NS", "POD", "APP", "POD_IP", "NODE", "COMBO", "OTHER",
            "HOSTNAME", "KUBECONFIG"]
    env = {k: os.environ.get(k) for k in keys}
    env["executable"], env["cwd"] = sys.executable, os.getcwd()
    print(json.dumps(env), flush=True)
"""
_SERVE = _SHOW_ENV + """
    import socket
    s = socket.create_server((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
    s.settimeout(30)
    conn, _ = s.accept()
    conn.sendall(b"hello from rank 0")
    conn.close()
"""
_BIND = _SHOW_ENV + """
    import socket, time
    s = socket.create_server((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
    time.sleep(1)
"""
_CONNECT = _SHOW_ENV + """
    import socket, time
    for _ in range(300):
        try:
            c = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])), 1)
            break
        except OSError:
            time.sleep(0.1)
    print("got", c.recv(100).decode(), flush=True)
"""


def _job_env(job: str) -> list[dict]:
    master = f"{job}-0.{job}"
    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}
    return [
        {"name": "NS", **field("metadata.namespace")},
        {"name": "POD", **field("metadata.name")},
        {"name": "APP", **field("metadata.labels['app']")},
        {"name": "POD_IP", **field("status.podIP")},
        {"name": "NODE", **field("spec.nodeName")},
        {"name": "COMBO", "value": "$(NS)/$(POD)"},
        {"name": "MASTER_ADDR", "value": master},
        {"name": "MASTER_PORT", "value": "29500"},
        {"name": "PET_MASTER_ADDR", "value": master},
        {"name": "PET_MASTER_PORT", "value": "29500"},
        {"name": "PET_RDZV_ENDPOINT", "value": f"{master}.$(NS).svc.cluster.local:29500"},
        {"name": "OTHER", "value": f"{master}.example.com"},
    ]


@k8s
def test_env_fieldrefs_and_the_hostname_and_port_mapping(agent, core_api, namespace, wait_until):
    # job a: rank 0 serves on MASTER_ADDR:MASTER_PORT, rank 1 (other node) connects;
    # job b uses the same default port 29500 at the same time
    core_api.create_namespaced_pod(namespace, _pod("a-0", _SERVE, env=_job_env("a"),
                                                   hostname="a-0", subdomain="a"))
    core_api.create_namespaced_pod(namespace, _pod("a-1", _CONNECT, node=B, env=_job_env("a"),
                                                   hostname="a-1", subdomain="a"))
    core_api.create_namespaced_pod(namespace, _pod("b-0", _BIND, env=_job_env("b"),
                                                   hostname="b-0", subdomain="b"))
    envs = {}
    for n in ("a-0", "a-1", "b-0"):
        pod = wait_until(lambda n=n: _done(core_api, namespace, n), 45, f"pod {n} done")
        out = agent.pod_log(namespace, n)
        assert pod["status"]["phase"] == "Succeeded", out
        envs[n] = json.loads(out.splitlines()[0])
    assert "got hello from rank 0" in agent.pod_log(namespace, "a-1")

    a0, a1, b0 = envs["a-0"], envs["a-1"], envs["b-0"]
    port_a, port_b = a0["MASTER_PORT"], b0["MASTER_PORT"]
    assert port_a == a1["MASTER_PORT"] == a0["PET_MASTER_PORT"] == a1["PET_MASTER_PORT"]
    assert port_a != "29500" and port_b != "29500" and port_a != port_b
    for e in (a0, a1, b0):
        assert e["MASTER_ADDR"] == e["PET_MASTER_ADDR"] == "127.0.0.1"
        assert e["PET_RDZV_ENDPOINT"] == f"127.0.0.1:{e['MASTER_PORT']}"
        assert e["NS"] == namespace and e["POD_IP"] == "127.0.0.1"
        assert e["executable"] == sys.executable  # the venv's python for "python"
        assert e["cwd"] == str(Path(__file__).resolve().parents[2])  # the repository root
        assert e["KUBECONFIG"] and Path(e["KUBECONFIG"]).is_file()
    assert a0["OTHER"] == "a-0.a.example.com"  # not a pod's stable name
    assert (a0["POD"], a0["APP"], a0["NODE"], a0["HOSTNAME"]) == ("a-0", "a-0", A, "a-0")
    assert a1["NODE"] == B and a1["COMBO"] == f"{namespace}/a-1"


@k8s
def test_pod_kubeconfig_carries_the_service_account_rbac(agent, core_api, namespace, wait_until):
    rbac = client.RbacAuthorizationV1Api(core_api.api_client)
    core_api.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    for name in ("allowed", "denied"):
        core_api.create_namespaced_config_map(namespace, {"metadata": {"name": name},
                                                          "data": {"k": f"value of {name}"}})
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "read-allowed"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                   "resourceNames": ["allowed"]}]})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-allowed"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}]})
    code = """
        import os
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
        config.load_kube_config()
        core, ns = client.CoreV1Api(), os.environ["NS"]
        print("allowed:", core.read_namespaced_config_map("allowed", ns).data["k"], flush=True)
        try:
            core.read_namespaced_config_map("denied", ns)
            print("denied: readable")
        except ApiException as exc:
            print("denied:", exc.status)
    """
    env = [{"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]
    core_api.create_namespaced_pod(namespace, _pod("rbac", code, env=env, serviceAccountName="reader"))
    pod = wait_until(lambda: _done(core_api, namespace, "rbac"), 45, "rbac pod done")
    out = agent.pod_log(namespace, "rbac")
    assert pod["status"]["phase"] == "Succeeded", out
    assert "allowed: value of allowed" in out and "denied: 403" in out, out


@k8s
@pytest.mark.runner_side("restarts the kube-apiserver of its own LocalCluster")
def test_the_agent_survives_an_api_server_restart(tmp_path, wait_until):
    """Its own small control plane (the session's must keep its API server): a process
    that ends while kube-apiserver is down is reported once it is back, and the pod
    watch recovers (a pod created afterwards runs)."""
    import threading

    from kubernetes import config

    import socket

    from rlsched_dev.cluster import LocalCluster

    def api_down() -> bool:
        try:
            socket.create_connection(("127.0.0.1", cluster.ports["apiserver"]), 0.5).close()
            return False
        except OSError:
            return True

    gate = tmp_path / "gate"
    code = """
        import os, time
        while not os.path.exists(os.environ["GATE"]):
            time.sleep(0.02)
        print("through the gate", flush=True)
    """
    with LocalCluster(kwok=False) as cluster, \
            NodeAgent(cluster.kubeconfig, nodes=["agent-r:1"], log_dir=tmp_path / "agent") as ag:
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
        core.create_namespaced_pod("default", _pod("gated", code, node="agent-r",
                                                   env=[{"name": "GATE", "value": str(gate)}]))
        wait_until(lambda: (p := _get(core, "default", "gated")) and p["status"].get("phase") == "Running",
                   30, "gated Running")

        def open_gate_while_down() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if api_down():
                    gate.touch()
                    return
                time.sleep(0.01)

        opener = threading.Thread(target=open_gate_while_down, daemon=True)
        opener.start()
        cluster.restart_apiserver(grace=3.0)  # it lingers on SIGTERM: SIGKILL after 3 s
        opener.join(5)
        assert gate.exists(), "the API server never looked down"
        done = wait_until(lambda: _done(core, "default", "gated"), 60, "gated reported after the restart")
        assert done["status"]["phase"] == "Succeeded" and _terminated(done)["exitCode"] == 0
        assert "through the gate" in ag.pod_log("default", "gated")

        core.create_namespaced_pod("default", _pod("after", "print('after the restart')", node="agent-r"))
        after = wait_until(lambda: _done(core, "default", "after"), 60, "a pod created after the restart done")
        assert after["status"]["phase"] == "Succeeded"
        assert ag.alive()
