"""Start/stop of the local control plane: `rlsched cluster up/down` leaves no process or
port behind, and a component that fails to start is reported with its log."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from rlsched_dev.cluster import LocalCluster
from rlsched_dev.proc import ClusterError
from rlsched_dev.tools import REQUIRED_TOOLS, find_tools

pytestmark = [pytest.mark.k8s, pytest.mark.runner_side(
    "starts and stops local control planes (rlsched cluster up/down, LocalCluster processes and ports)")]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, /proc was read
        return False


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlsched.cli", "cluster", *args],
                          capture_output=True, text=True, timeout=300, check=False)


def test_cluster_up_then_down_leaves_nothing_running(tmp_path):
    workdir = tmp_path / "kube"
    up = _cli("up", "--dir", str(workdir))
    assert up.returncode == 0, up.stderr
    state = json.loads((workdir / "state.json").read_text())
    pids, ports = state["pids"], state["ports"]
    assert set(pids) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                         "rlsched-scheduler", "kwok"}
    assert all(_alive(pid) for pid in pids.values())
    assert f"KUBECONFIG={workdir / 'kubeconfig'}" in up.stdout
    assert _listening(ports["apiserver"]) and _listening(ports["etcd"])
    # every component leads its own process group, so stopping it takes its children too
    assert all(os.getpgid(pid) == pid for pid in pids.values())

    down = _cli("down", "--dir", str(workdir))
    assert down.returncode == 0, down.stderr
    assert [n for n, pid in pids.items() if _alive(pid)] == []
    listening = [n for n, p in ports.items() if n != "extender" and _listening(p)]
    assert listening == []
    assert not (workdir / "state.json").exists()
    assert (workdir / "kubeconfig").exists()  # the user's folder is kept

    again = _cli("down", "--dir", str(workdir))
    assert again.returncode == 1 and "no cluster state" in again.stderr


def test_failing_component_is_reported_with_its_log_and_the_rest_stopped(tmp_path):
    real = find_tools()
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    for tool in REQUIRED_TOOLS:
        (fake_bin / tool).symlink_to(real / tool)
    (fake_bin / "kube-apiserver").unlink()
    (fake_bin / "kube-apiserver").write_text("#!/bin/sh\necho 'E0101 bad flag --nope' >&2\nexit 3\n")
    (fake_bin / "kube-apiserver").chmod(0o755)

    cluster = LocalCluster(tools_bin=fake_bin, start_timeout_s=30)
    with pytest.raises(ClusterError) as err:
        cluster.start()
    msg = str(err.value)
    assert "kube-apiserver" in msg and "exited with status 3" in msg and "bad flag --nope" in msg
    etcd_pid = cluster.processes["etcd"].pid
    deadline = time.monotonic() + 5
    while _alive(etcd_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(etcd_pid)
    assert cluster.workdir is not None and not cluster.workdir.exists()


_OWNER = """
import json, signal, sys
from rlsched_dev.cluster import LocalCluster
c = LocalCluster(start_timeout_s=120).start()
print(json.dumps({"pids": c.pids, "workdir": str(c.workdir)}), flush=True)
signal.pause()
"""


def test_components_die_with_a_killed_owner():
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(owner.stdout.readline())
    finally:
        owner.kill()
        owner.wait()
    pids = info["pids"]
    assert len(pids) == 6
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [n for n, p in pids.items() if _alive(p)] == []
    shutil.rmtree(info["workdir"], ignore_errors=True)  # SIGKILL left it behind


def test_start_retries_when_a_chosen_port_is_taken(monkeypatch):
    import rlsched_dev.cluster as dc

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real, calls = dc.free_ports, []

    def first_one_taken(n):
        ports = real(n)
        calls.append(n)
        return [taken, *ports[1:]] if len(calls) == 1 else ports  # etcd's port is taken

    monkeypatch.setattr(dc, "free_ports", first_one_taken)
    try:
        with LocalCluster(kwok=False) as cluster:
            assert len(calls) == 2
            assert cluster.ports["etcd"] != taken
            log = cluster.log_path("etcd").read_text()
            assert "address already in use" in log
    finally:
        squatter.close()
