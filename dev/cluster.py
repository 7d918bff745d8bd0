"""A real Kubernetes control plane as local processes, for tests and manual work.

:class:`LocalCluster` runs etcd, kube-apiserver, kube-controller-manager, two
kube-scheduler processes and the kwok controller on 127.0.0.1, all built from Go
modules by ``make tools`` (see ``tools/build.sh`` and ``docs/control-plane.md``).
Every instance picks free ports and works in its own directory, so several test runs
can share one machine.

The two schedulers: ``default-scheduler`` (stock configuration) and ``rlsched`` (one
profile, ``schedulerName: rlsched``, with the rlsched extender and its own
leader-election lease). Extenders in a KubeSchedulerConfiguration apply to every
profile of a process, so the extender profile lives in its own process, as it does
when deployed beside a cluster's own scheduler.

Nodes are kwok nodes made from :class:`rlsched.core.topology.Topology` by
:func:`create_gpu_nodes`; kwok Stages make bound pods Running and, when they carry
the ``rlsched.dev/duration-seconds`` annotation, Succeeded after that many seconds.

Command line: ``rlsched cluster up|down|status [--dir D]``.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import yaml

from rlsched.core.topology import RESOURCE_GPU, NodeSpec, Topology, node_labels

__all__ = [
    "stop_process_group",
    "ClusterError",
    "LocalCluster",
    "KwokController",
    "KubeEnv",
    "kube_env",
    "find_tools",
    "create_gpu_nodes",
    "delete_gpu_nodes",
    "wait_nodes_ready",
    "kwok_node",
    "default_topology",
    "KWOK_STAGES",
    "DURATION_ANNOTATION",
    "KWOK_NODE_ANNOTATION",
    "register",
]

DURATION_ANNOTATION = "rlsched.dev/duration-seconds"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_TAINT_KEY = "kwok.x-k8s.io/node"
SCHEDULER_NAME = "rlsched"
REQUIRED_TOOLS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
_STATE_FILE = "state.json"
_NODE_STATE_TAINTS = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}

ProgressFn = Callable[[str], None]


class ClusterError(RuntimeError):
    """The control plane (or one of its components) failed to start or stop."""


# --------------------------------------------------------------------------- tools
def find_tools(bin_dir: str | os.PathLike | None = None) -> Path:
    """Directory holding the built binaries.

    Looked up in order: ``bin_dir``, ``$RLSCHED_TOOLS_BIN``, ``tools/build.sh
    --print-bin`` of this source tree (same cache key as ``make tools``), and the
    ``current`` link the last build left in the cache. Raises :class:`ClusterError`
    naming ``make tools`` when the binaries are missing.
    """
    candidates: list[Path] = []
    if bin_dir:
        candidates.append(Path(bin_dir))
    elif os.environ.get("RLSCHED_TOOLS_BIN"):
        candidates.append(Path(os.environ["RLSCHED_TOOLS_BIN"]))
    else:
        script = Path(__file__).resolve().parents[1] / "tools" / "build.sh"
        if script.is_file() and shutil.which(os.environ.get("GO", "go")):
            out = subprocess.run(
                ["bash", str(script), "--print-bin"], capture_output=True, text=True, check=False
            )
            if out.returncode == 0 and out.stdout.strip():
                candidates.append(Path(out.stdout.strip()))
        cache = os.environ.get("RLSCHED_TOOLS_CACHE") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rlsched", "tools"
        )
        candidates.append(Path(cache) / "current" / "bin")
    for cand in candidates:
        if all((cand / t).is_file() and os.access(cand / t, os.X_OK) for t in REQUIRED_TOOLS):
            return cand
    tried = ", ".join(str(c) for c in candidates) or "(nothing)"
    raise ClusterError(
        f"control-plane binaries not found (tried {tried}); build them with `make tools` "
        "or point RLSCHED_TOOLS_BIN at their directory"
    )


# --------------------------------------------------------------------------- helpers
def _free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now (held open while choosing)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise ClusterError("openssl is needed to create the cluster's certificates")
    res = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args[:2])} failed: {res.stderr.strip()}")


_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign, digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, IP:10.96.0.1, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
"""


def _make_pki(pki: Path) -> None:
    """CA, API server serving cert, admin client cert, service-account key (EC P-256)."""
    pki.mkdir(parents=True, exist_ok=True)
    (pki / "openssl.cnf").write_text(_OPENSSL_CNF)
    for key in ("ca", "server", "admin", "sa"):
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                 "-out", f"{key}.key", cwd=pki)
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-config", "openssl.cnf",
             "-extensions", "ca", "-subj", "/CN=rlsched-devcluster-ca", "-days", "3650",
             "-out", "ca.crt", cwd=pki)
    for name, subj, ext in (
        ("server", "/CN=kube-apiserver", "server"),
        ("admin", "/O=system:masters/CN=rlsched-admin", "client"),
    ):
        _openssl("req", "-new", "-key", f"{name}.key", "-config", "openssl.cnf",
                 "-subj", subj, "-out", f"{name}.csr", cwd=pki)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "365",
                 "-extfile", "openssl.cnf", "-extensions", ext, "-out", f"{name}.crt", cwd=pki)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def _kubeconfig(server: str, pki: Path, name: str = "rlsched-dev") -> dict:
    b64 = lambda p: base64.b64encode((pki / p).read_bytes()).decode()  # noqa: E731
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {
            "server": server, "certificate-authority-data": b64("ca.crt")}}],
        "users": [{"name": "admin", "user": {
            "client-certificate-data": b64("admin.crt"), "client-key-data": b64("admin.key")}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "admin"}}],
        "current-context": name,
    }


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux prctl)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


@dataclass
class _Process:
    """One component: a child in its own process group, output in a log file.

    Unless ``detach``, the child is tied to this process (it gets SIGTERM when we die,
    e.g. a test run killed mid-way); detached ones outlive us (``rlsched cluster up``).
    """

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen | None = None
    pid: int | None = None
    detach: bool = False

    def start(self, cwd: Path) -> None:
        tie = None if self.detach or not sys.platform.startswith("linux") else _die_with_parent
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=tie,
            )
        self.pid = self.popen.pid

    def exited(self) -> int | None:
        if self.popen is not None:
            return self.popen.poll()
        return None if self.pid and _alive(self.pid) else -1

    def error(self, what: str) -> ClusterError:
        rc = self.exited()
        state = f"exited with status {rc}" if rc is not None else "still running"
        return ClusterError(
            f"{self.name}: {what} ({state}); last lines of {self.log}:\n{_tail(self.log)}"
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def stop_process_group(pid: int, popen: subprocess.Popen | None = None, grace: float = 5.0) -> None:
    """SIGTERM the process group ``pid``, then SIGKILL what is left after ``grace``
    (``popen``: our own handle on its leader, reaped here)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if popen is not None and popen.poll() is not None and not _group_alive(pid):
            return
        if popen is None and not _group_alive(pid):
            return
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if popen is not None:
        popen.wait(timeout=10)
    else:
        end = time.monotonic() + 10
        while _group_alive(pid) and time.monotonic() < end:
            time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Only zombies left (reaped by nobody yet)?  Look for a live member.
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def _http_ok(url: str, ctx: ssl.SSLContext | None, expect: str | None = "ok") -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            body = resp.read().decode(errors="replace")
            return resp.status == 200 and (expect is None or expect in body)
    except (OSError, http.client.HTTPException):  # URLError and SSLError are OSErrors
        return False


# --------------------------------------------------------------------------- kwok stages
KWOK_STAGES = """\
# kwok Stages of the rlsched dev cluster: Nodes become Ready and keep a heartbeat;
# bound Pods become Running; Pods annotated rlsched.dev/duration-seconds become
# Succeeded that many seconds after they started running; deleted Pods go away.
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: rlsched-node-ready
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $now | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
      addresses:
      - address: {{ NodeIP | Quote }}
        type: InternalIP
      - address: {{ .metadata.name | Quote }}
        type: Hostname
      allocatable:
      {{ YAML .status.allocatable 1 }}
      capacity:
      {{ YAML .status.capacity 1 }}
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
        kubeProxyVersion: {{ printf "kwok-%s" Version | Quote }}
        containerRuntimeVersion: {{ printf "kwok-%s" Version | Quote }}
        kernelVersion: {{ printf "kwok-%s" Version | Quote }}
        machineID: ""
        bootID: ""
        osImage: ""
        systemUUID: ""
      phase: Running
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: rlsched-node-heartbeat
spec:
  resourceRef: {apiGroup: v1, kind: Node}
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: In
      values: ['True']
  delay:
    durationMilliseconds: 20000
    jitterDurationMilliseconds: 25000
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range .status.conditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ .lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
  immediateNextStage: true
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: rlsched-pod-running
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.phase'
      operator: In
      values: ['Pending']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ['True']
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Initialized}
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: Ready}
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: ContainersReady}
      - {lastTransitionTime: {{ $now | Quote }}, status: "True", type: PodScheduled}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      {{ with NodeIPWith .spec.nodeName }}
      hostIP: {{ . | Quote }}
      {{ end }}
      {{ with PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      podIP: {{ . | Quote }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: rlsched-pod-succeeded
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: DoesNotExist
    - key: '.status.phase'
      operator: In
      values: ['Running']
    - key: '.metadata.annotations["rlsched.dev/duration-seconds"]'
      operator: Exists
  delay:
    durationMilliseconds: 0
    durationFrom:
      jq:
        expression: '.metadata.annotations["rlsched.dev/duration-seconds"] + "s"'
  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      - {lastTransitionTime: {{ $now | Quote }}, status: "False", reason: PodCompleted, type: Ready}
      - {lastTransitionTime: {{ $now | Quote }}, status: "False", reason: PodCompleted, type: ContainersReady}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            reason: Completed
            finishedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: rlsched-pod-delete
spec:
  resourceRef: {apiGroup: v1, kind: Pod}
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: Exists
  next:
    finalizers: {empty: true}
    delete: true
"""


def _kwok_config(stages: str) -> str:
    conf = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector": f"{KWOK_NODE_ANNOTATION}=fake",
            "nodeLeaseDurationSeconds": 40,
            # kwok leaves these at 0 (and refuses to start) when read from a file
            "nodeLeaseParallelism": 4,
            "podPlayStageParallelism": 4,
            "nodePlayStageParallelism": 4,
            "podsOnNodeSyncParallelism": 2,
        },
    }
    return yaml.safe_dump(conf, sort_keys=False) + "---\n" + stages


class KwokController:
    """The kwok controller as a local process, against any API server.

    Used by :class:`LocalCluster`, and on its own for a cluster handed over as a
    kubeconfig (kind in CI), so the fake nodes behave the same everywhere.
    """

    def __init__(self, kubeconfig: str | os.PathLike, workdir: str | os.PathLike,
                 *, tools_bin: str | os.PathLike | None = None, stages: str = KWOK_STAGES,
                 port: int | None = None, log: str | os.PathLike | None = None,
                 detach: bool = False) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.workdir = Path(workdir)
        self.bin = find_tools(tools_bin)
        self.stages = stages
        self.port = port or _free_ports(1)[0]
        self.log = Path(log) if log else self.workdir / "kwok.log"
        self.detach = detach
        self.process: _Process | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "kwok.yaml"
        conf.write_text(_kwok_config(self.stages))
        self.process = _Process("kwok", [
            str(self.bin / "kwok"), f"--kubeconfig={self.kubeconfig}", f"--config={conf}",
            f"--server-address=127.0.0.1:{self.port}", "--node-ip=10.0.0.1",
            "--cidr=10.0.0.1/16",
        ], self.log, detach=self.detach)
        self.process.start(self.workdir)

    def ready(self) -> bool:
        return _http_ok(f"http://127.0.0.1:{self.port}/healthz", None)

    def stop(self, grace: float = 5.0) -> None:
        if self.process and self.process.pid:
            stop_process_group(self.process.pid, self.process.popen, grace)

    def __enter__(self) -> "KwokController":
        self.start()
        _wait_for(self.ready, 30.0, self.process, "healthz")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _wait_for(check: Callable[[], bool], timeout: float, proc: _Process | None, what: str,
              others: Iterable[_Process] = ()) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for p in [proc, *others]:
            if p is not None and p.exited() is not None:
                raise p.error(f"exited while waiting for {what}")
        if check():
            return
        if time.monotonic() > deadline:
            if proc is None:
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
            raise proc.error(f"not ready after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


# --------------------------------------------------------------------------- cluster
class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager + 2 kube-schedulers + kwok.

    ``kwok=False`` leaves out the kwok controller (for a second, external one).
    The components die with this process unless ``detach`` (then stop them with
    :meth:`attach` + :meth:`stop`, as ``rlsched cluster down`` does).
    ``workdir`` holds certificates, configs, etcd data, logs (``logs/<name>.log``) and
    ``kubeconfig``; by default a fresh temporary directory removed by :meth:`stop`.
    ``extender_url`` is where the ``rlsched`` scheduler profile calls the extender;
    by default ``http://127.0.0.1:<free port>``, a port the test can then serve on.

    >>> with LocalCluster() as c:             # doctest: +SKIP
    ...     print(c.kubeconfig, c.server, c.extender_url)
    """

    def __init__(
        self,
        workdir: str | os.PathLike | None = None,
        *,
        tools_bin: str | os.PathLike | None = None,
        extender_url: str | None = None,
        extender_weight: int = 5,
        extender_timeout_s: float = 5.0,
        gpu_ignored_by_scheduler: bool = True,
        start_timeout_s: float = 90.0,
        kwok: bool = True,
        detach: bool = False,
        keep_workdir: bool | None = None,
        progress: ProgressFn | None = None,
    ) -> None:
        if extender_weight < 1:
            raise ValueError("extender_weight must be >= 1")
        if extender_timeout_s <= 0 or start_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self._own_dir = workdir is None
        self.workdir = Path(workdir).resolve() if workdir else None
        self.keep_workdir = (not self._own_dir) if keep_workdir is None else keep_workdir
        self._tools_arg = tools_bin
        self.tools_bin: Path | None = None
        self._extender_url = extender_url
        self.extender_weight = extender_weight
        self.extender_timeout_s = extender_timeout_s
        self.gpu_ignored_by_scheduler = gpu_ignored_by_scheduler
        self.start_timeout_s = start_timeout_s
        self.with_kwok = kwok
        self.detach = detach
        self._progress = progress or (lambda msg: None)
        self.ports: dict[str, int] = {}
        self.processes: dict[str, _Process] = {}
        self._kwok: KwokController | None = None
        self.started = False

    # -- public properties
    @property
    def kubeconfig(self) -> Path:
        return self._dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def extender_url(self) -> str:
        return self._extender_url or f"http://127.0.0.1:{self.ports['extender']}"

    @property
    def extender_port(self) -> int | None:
        """Port of :attr:`extender_url` when it is a local one."""
        from urllib.parse import urlsplit

        parts = urlsplit(self.extender_url)
        return parts.port if parts.hostname in ("127.0.0.1", "localhost") else None

    @property
    def pids(self) -> dict[str, int]:
        return {n: p.pid for n, p in self.processes.items() if p.pid}

    @property
    def _dir(self) -> Path:
        if self.workdir is None:
            raise ClusterError("cluster not started")
        return self.workdir

    def log_path(self, component: str) -> Path:
        return self._dir / "logs" / f"{component}.log"

    # -- lifecycle
    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "LocalCluster":
        """Start every component and wait until the API server, the schedulers, the
        controller manager and kwok are healthy. On failure everything started so far
        is stopped and a :class:`ClusterError` carries the failing component's log."""
        if self.started:
            raise ClusterError("cluster already started")
        self.tools_bin = find_tools(self._tools_arg)
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="rlsched-cluster-"))
        elif (self.workdir / _STATE_FILE).exists():
            raise ClusterError(f"{self.workdir} already holds a cluster; run `rlsched cluster "
                               f"down --dir {self.workdir}` first")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.started = True
        for attempt in range(3):
            try:
                self._start()
                return self
            except ClusterError as exc:
                # A port chosen free can be taken (e.g. as a client's source port)
                # before the component binds it: try again with new ports.
                if "address already in use" not in str(exc) or attempt == 2:
                    self.stop()
                    raise
                self._stop_processes(grace=2.0)
                self.processes, self._kwok = {}, None
                self._progress("a port was taken meanwhile; retrying with new ports")
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _start(self) -> None:
        t0 = time.monotonic()
        d = self._dir
        (d / "logs").mkdir(exist_ok=True)
        shutil.rmtree(d / "etcd", ignore_errors=True)  # a cluster always starts empty
        names = ["etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler",
                 "rlsched-scheduler", "kwok", "extender"]
        self.ports = dict(zip(names, _free_ports(len(names))))
        self._progress("creating certificates")
        pki = d / "pki"
        _make_pki(pki)
        self.kubeconfig.write_text(yaml.safe_dump(_kubeconfig(self.server, pki), sort_keys=False))
        self.kubeconfig.chmod(0o600)
        self._write_state()

        self._progress(f"starting etcd on 127.0.0.1:{self.ports['etcd']}")
        etcd = self._spawn("etcd", self._etcd_argv())
        _wait_for(lambda: _http_ok(f"http://127.0.0.1:{self.ports['etcd']}/health", None,
                                   '"health":"true"'), self.start_timeout_s, etcd, "etcd /health")

        self._progress(f"starting kube-apiserver on {self.server}")
        api = self._spawn("kube-apiserver", self._apiserver_argv(pki))
        ctx = self._ssl_context()
        _wait_for(lambda: _http_ok(f"{self.server}/readyz", ctx), self.start_timeout_s, api,
                  "kube-apiserver /readyz", [etcd])

        self._progress("starting kube-controller-manager, kube-schedulers and kwok")
        kcm = self._spawn("kube-controller-manager", self._kcm_argv(pki))
        sched = self._spawn("kube-scheduler", self._scheduler_argv("scheduler", extender=False))
        rsched = self._spawn("rlsched-scheduler",
                             self._scheduler_argv("rlsched-scheduler", extender=True))
        if self.with_kwok:
            self._kwok = KwokController(self.kubeconfig, d, tools_bin=self.tools_bin,
                                        port=self.ports["kwok"], log=self.log_path("kwok"),
                                        detach=self.detach)
            self._kwok.start()
            assert self._kwok.process is not None
            self.processes["kwok"] = self._kwok.process
            self._write_state()
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        waits = [
            (kcm, f"https://127.0.0.1:{self.ports['controller-manager']}/healthz", insecure),
            (sched, f"https://127.0.0.1:{self.ports['scheduler']}/healthz", insecure),
            (rsched, f"https://127.0.0.1:{self.ports['rlsched-scheduler']}/healthz", insecure),
        ]
        if self._kwok and self._kwok.process:
            waits.append((self._kwok.process, f"http://127.0.0.1:{self.ports['kwok']}/healthz",
                          None))
        for proc, url, c in waits:
            _wait_for(lambda u=url, c=c: _http_ok(u, c), self.start_timeout_s, proc,
                      f"{proc.name} {url}", [api, etcd])
        # Pods need the default ServiceAccount, which the controller manager creates.
        sa = f"{self.server}/api/v1/namespaces/default/serviceaccounts/default"
        _wait_for(lambda: _http_ok(sa, ctx, expect=None), self.start_timeout_s, kcm,
                  "the default ServiceAccount", [api])
        self._progress(f"control plane ready in {time.monotonic() - t0:.1f}s")

    def restart_apiserver(self, grace: float = 30.0) -> None:
        """Stop kube-apiserver (SIGTERM, SIGKILL after ``grace`` seconds) and start it
        again with the same port, certificates and etcd data; return once /readyz
        answers. Components that exited meanwhile (the schedulers exit when they cannot
        renew their leader lease) are started again, as a kubelet would, and waited
        for; the others reconnect on their own. Call it from the thread that started
        the cluster: components die with the thread that spawned them."""
        old = self.processes.get("kube-apiserver")
        if not self.started or old is None or old.popen is None:
            raise ClusterError("no kube-apiserver started by this handle to restart")
        self._progress("restarting kube-apiserver")
        stop_process_group(old.pid, old.popen, grace)
        api = self._spawn("kube-apiserver", self._apiserver_argv(self._dir / "pki"))
        ctx = self._ssl_context()
        _wait_for(lambda: _http_ok(f"{self.server}/readyz", ctx), self.start_timeout_s, api,
                  "kube-apiserver /readyz", [self.processes["etcd"]])
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE
        for name, port in (("kube-controller-manager", "controller-manager"),
                           ("kube-scheduler", "scheduler"),
                           ("rlsched-scheduler", "rlsched-scheduler")):
            proc = self.processes.get(name)
            if proc is None or proc.exited() is None:
                continue
            self._progress(f"{name} exited during the restart; starting it again")
            proc = self._spawn(name, proc.argv)
            url = f"https://127.0.0.1:{self.ports[port]}/healthz"
            _wait_for(lambda u=url: _http_ok(u, insecure), self.start_timeout_s, proc,
                      f"{name} {url}", [api])

    def _tool(self, name: str) -> str:
        if self.tools_bin is None:
            raise ClusterError("cluster not started")
        return str(self.tools_bin / name)

    def _spawn(self, name: str, argv: list[str]) -> _Process:
        proc = _Process(name, argv, self.log_path(name), detach=self.detach)
        proc.start(self._dir)
        self.processes[name] = proc
        self._write_state()
        return proc

    def _ssl_context(self) -> ssl.SSLContext:
        pki = self._dir / "pki"
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        return ctx

    def _etcd_argv(self) -> list[str]:
        p = self.ports
        client, peer = f"http://127.0.0.1:{p['etcd']}", f"http://127.0.0.1:{p['etcd-peer']}"
        return [
            self._tool("etcd"), "--name=rlsched", f"--data-dir={self._dir / 'etcd'}",
            f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=rlsched={peer}", "--initial-cluster-state=new",
            "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=2147483648",
        ]

    def _apiserver_argv(self, pki: Path) -> list[str]:
        return [
            self._tool("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['apiserver']}",
            "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki / 'server.crt'}", f"--tls-private-key-file={pki / 'server.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            # front-proxy (aggregation) settings, so delegated authn in the controller
            # manager and schedulers finds a complete extension-apiserver-authentication
            f"--requestheader-client-ca-file={pki / 'ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            "--enable-priority-and-fairness=false", "--profiling=false",
            f"--cert-dir={pki}",
        ]

    def _kcm_argv(self, pki: Path) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            self._tool("kube-controller-manager"),
            f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['controller-manager']}",
            f"--cert-dir={self._dir / 'kcm-certs'}", "--leader-elect=false",
            # The node lifecycle controller lifts the not-ready taint once kwok reports a
            # node Ready. No eviction (a slow kwok on a busy machine must not evict pods),
            # no pod CIDRs (kwok assigns pod IPs).
            "--controllers=*,-taint-eviction-controller,-node-ipam-controller",
            "--node-monitor-period=2s",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}", "--profiling=false",
        ]

    def scheduler_config(self, extender: bool) -> dict[str, Any]:
        """The KubeSchedulerConfiguration of the default (``extender=False``) or the
        ``rlsched`` scheduler process."""
        conf: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig)},
            "enableProfiling": False,
            "leaderElection": {"leaderElect": True, "resourceNamespace": "kube-system",
                               "resourceName": "kube-scheduler"},
            "profiles": [{"schedulerName": "default-scheduler"}],
        }
        if extender:
            conf["leaderElection"]["resourceName"] = "rlsched-scheduler"
            conf["profiles"] = [{"schedulerName": SCHEDULER_NAME}]
            conf["extenders"] = [{
                "urlPrefix": self.extender_url,
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "weight": self.extender_weight,
                "enableHTTPS": False,
                "nodeCacheCapable": True,
                "ignorable": True,
                "httpTimeout": f"{self.extender_timeout_s:g}s",
                "managedResources": [{"name": RESOURCE_GPU,
                                      "ignoredByScheduler": self.gpu_ignored_by_scheduler}],
            }]
        return conf

    def _scheduler_argv(self, name: str, extender: bool) -> list[str]:
        path = self._dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(self.scheduler_config(extender), sort_keys=False))
        kc = str(self.kubeconfig)
        return [
            self._tool("kube-scheduler"), f"--config={path}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports[name]}",
            f"--cert-dir={self._dir / (name + '-certs')}",
        ]

    # -- state for `rlsched cluster down` in another process
    def _write_state(self) -> None:
        state = {
            "server": self.server if "apiserver" in self.ports else None,
            "extender_url": self.extender_url if self.ports else self._extender_url,
            "ports": self.ports,
            "pids": self.pids,
            "own_dir": self._own_dir,
        }
        tmp = self._dir / (_STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self._dir / _STATE_FILE)

    def _stop_processes(self, grace: float) -> None:
        for name in reversed(list(self.processes)):
            proc = self.processes[name]
            if proc.pid:
                stop_process_group(proc.pid, proc.popen, grace)

    @classmethod
    def attach(cls, workdir: str | os.PathLike) -> "LocalCluster":
        """A handle on a cluster started by another process in ``workdir`` (for stop)."""
        d = Path(workdir).resolve()
        try:
            state = json.loads((d / _STATE_FILE).read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster state in {d}") from None
        self = cls.__new__(cls)
        self.workdir, self._own_dir = d, bool(state.get("own_dir"))
        self.keep_workdir = not self._own_dir
        self._extender_url = state.get("extender_url")
        self.ports = {k: int(v) for k, v in state.get("ports", {}).items()}
        self.processes = {}
        for name, pid in state.get("pids", {}).items():
            if _belongs_to(int(pid), d):
                self.processes[name] = _Process(name, [], d / "logs" / f"{name}.log", pid=int(pid))
        self._kwok = None
        self.started = True
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Stop all components (SIGTERM to each process group, SIGKILL after
        ``grace`` seconds), newest first, and remove a temporary workdir."""
        if not self.started:
            return
        self._stop_processes(grace)
        self.started = False
        if self.workdir is None:
            return
        if self.keep_workdir:
            state = self.workdir / _STATE_FILE
            state.unlink(missing_ok=True)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _belongs_to(pid: int, workdir: Path) -> bool:
    """True when ``pid`` is alive and was started with ``workdir`` as its cwd."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")).resolve() == workdir
    except OSError:
        return False


# --------------------------------------------------------------------------- nodes
def default_topology() -> Topology:
    """The small GPU cluster of the integration tests: 2 racks of 2 nodes, 8 A100 each."""
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


# --------------------------------------------------------------------------- test env
@dataclass
class KubeEnv:
    """A cluster ready for integration tests: kubeconfig, GPU nodes, extender URL."""

    kubeconfig: Path
    server: str
    topology: Topology
    node_names: list[str]
    extender_url: str | None
    cluster: LocalCluster | None = None

    @property
    def extender_port(self) -> int | None:
        """Local port the ``rlsched`` scheduler calls the extender on (None if remote)."""
        from urllib.parse import urlsplit

        if not self.extender_url:
            return None
        parts = urlsplit(self.extender_url)
        return parts.port if parts.hostname in ("127.0.0.1", "localhost") else None

    def api_client(self):
        """A new ``kubernetes.client.ApiClient`` for this cluster."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))


@contextmanager
def kube_env(
    topology: Topology | None = None,
    *,
    kubeconfig: str | os.PathLike | None = None,
    extender_url: str | None = None,
    workdir: str | os.PathLike | None = None,
    progress: ProgressFn | None = None,
) -> Iterator[KubeEnv]:
    """Start a :class:`LocalCluster` (or use the cluster of ``kubeconfig`` with a local
    kwok controller), create the kwok GPU nodes of ``topology``, yield a
    :class:`KubeEnv`, and tear everything down afterwards."""
    topo = topology or default_topology()
    if kubeconfig is None:
        with LocalCluster(workdir, extender_url=extender_url, progress=progress) as cluster:
            names = create_gpu_nodes(cluster.kubeconfig, topo)
            wait_nodes_ready(cluster.kubeconfig, names)
            yield KubeEnv(cluster.kubeconfig, cluster.server, topo, names,
                          cluster.extender_url, cluster)
        return
    from kubernetes import config

    kc = Path(kubeconfig).resolve()
    server = config.new_client_from_config(config_file=str(kc)).configuration.host
    own = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="rlsched-kwok-")) if own else Path(workdir)
    try:
        with KwokController(kc, wd):
            names = create_gpu_nodes(kc, topo)
            try:
                wait_nodes_ready(kc, names)
                yield KubeEnv(kc, server, topo, names, extender_url)
            finally:
                delete_gpu_nodes(kc, names)
    finally:
        if own:
            shutil.rmtree(wd, ignore_errors=True)


# --------------------------------------------------------------------------- CLI
def _load_topology(path: str | None) -> Topology:
    if not path:
        return default_topology()
    with open(path) as f:
        data: Mapping = yaml.safe_load(f)
    return Topology.from_dict(data)


def _cmd_up(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    workdir = Path(args.dir).resolve()
    try:
        topo = _load_topology(args.topology)
        with console.status("starting control plane") as status:
            cluster = LocalCluster(workdir, extender_url=args.extender_url, detach=True,
                                   keep_workdir=True, progress=status.update)
            t0 = time.monotonic()
            cluster.start()
            try:
                status.update(f"creating {len(topo)} kwok GPU nodes")
                names = create_gpu_nodes(cluster.kubeconfig, topo)
                wait_nodes_ready(cluster.kubeconfig, names)
            except BaseException:
                cluster.stop()
                raise
    except (ClusterError, ValueError, OSError) as exc:
        console.print(f"[red]cluster up failed:[/red] {exc}")
        return 1
    console.print(f"control plane up in {time.monotonic() - t0:.1f}s: {cluster.server}, "
                  f"{len(names)} GPU nodes, extender URL {cluster.extender_url}", soft_wrap=True)
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    workdir = Path(args.dir).resolve()
    try:
        cluster = LocalCluster.attach(workdir)
    except ClusterError as exc:
        print(f"cluster down: {exc}", file=sys.stderr)
        return 0 if args.missing_ok else 1
    cluster.stop()
    print(f"stopped the cluster in {workdir}", file=sys.stderr)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    workdir = Path(args.dir).resolve()
    try:
        cluster = LocalCluster.attach(workdir)
    except ClusterError as exc:
        print(f"{exc}", file=sys.stderr)
        return 1
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                 "rlsched-scheduler", "kwok"):
        proc = cluster.processes.get(name)
        print(f"{name:24} {'running pid ' + str(proc.pid) if proc else 'not running'}")
    print(f"kubeconfig {cluster.kubeconfig}\nextender URL {cluster.extender_url}")
    return 0 if len(cluster.processes) == 6 else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``rlsched cluster up|down|status``."""
    parser = subparsers.add_parser("cluster", help="local Kubernetes control plane (dev/test)")
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    up = sub.add_parser("up", help="start etcd, API server, schedulers, kwok; create GPU nodes")
    up.add_argument("--dir", default=".kube", help="working directory (default .kube)")
    up.add_argument("--extender-url", default=None,
                    help="URL the rlsched scheduler profile calls (default: a free local port)")
    up.add_argument("--topology", default=None,
                    help="cluster description YAML/JSON (core Topology.from_dict); "
                         "default 4 nodes x 8 GPUs in 2 racks")
    up.set_defaults(func=_cmd_up)
    down = sub.add_parser("down", help="stop the cluster started by `up`")
    down.add_argument("--dir", default=".kube")
    down.add_argument("--missing-ok", action="store_true", help="no error when none is running")
    down.set_defaults(func=_cmd_down)
    status = sub.add_parser("status", help="show the components of the cluster in --dir")
    status.add_argument("--dir", default=".kube")
    status.set_defaults(func=_cmd_status)
