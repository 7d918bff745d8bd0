"""A test-only node agent: the kubelet of one or two Nodes of the local control plane.

kwok plays every other node (its pods only *look* Running); the agent's nodes run
their pods for real, as local processes, so a test can watch a training script go
through the operator, the scheduler and the worker contract end to end.

What it does, as a kubelet would:

- **Node**: registers its Nodes (labels as :mod:`rlsched_dev.nodes` gives kwok nodes:
  topology levels, GPU Feature Discovery labels, ``nvidia.com/gpu``, cpu, memory and
  pods capacity; plus ``rlsched.dev/node-agent=true`` and ``type=node-agent``), keeps
  them Ready (a node Lease in ``kube-node-lease`` renewed every 10 s, the Ready
  condition re-posted every minute), so the node lifecycle controller never taints
  them. They carry no ``kwok.x-k8s.io/node`` annotation: kwok manages only nodes
  annotated ``kwok.x-k8s.io/node=fake`` (``manageNodesWithAnnotationSelector`` in
  :func:`rlsched_dev.kwok.kwok_config`) and plays only pods bound to the nodes it
  manages, and the agent plays only pods bound to its own nodes (a field-selected
  watch per node) and refuses a node name kwok already manages.
- **Pods**: runs the first container's ``command`` + ``args`` (``$(VAR)`` expanded;
  ``python``/``python3`` is the agent's own ``sys.executable``, the venv's) in its
  own process group, cwd the container's ``workingDir`` when it exists, else the
  agent's workdir (the repository root by default); stdout/stderr to
  ``<log_dir>/pods/<namespace>_<name>_<uid8>.log``. The environment: the pod's ``env``
  resolved as a kubelet does (``value``, ``valueFrom.fieldRef`` — metadata.name,
  namespace, uid, labels['k'], annotations['k'], spec.nodeName,
  spec.serviceAccountName, status.podIP/hostIP = 127.0.0.1 —, ``resourceFieldRef``,
  ``configMapKeyRef``, ``secretKeyRef``), ``HOSTNAME``, over the agent's own
  ``PATH`` (the venv's bin first), ``PYTHONPATH``, ``HOME``, ``LANG``, ``TMPDIR``.
- **Credentials**: the pod's ServiceAccount gets a token bound to the pod through the
  TokenRequest API (24 h, not refreshed), written into a per-pod kubeconfig pointing at
  the API server the agent uses; ``KUBECONFIG`` names it (the in-cluster path
  ``/var/run/secrets/...`` does not exist here, and ``KUBERNETES_SERVICE_HOST`` is
  not set, so client libraries fall back to the kubeconfig).
- **Status** (the pod's status subresource, strategic merge with a uid
  precondition): Pending → Running with podIP/hostIP 127.0.0.1, startTime, the
  container running and ready, conditions PodScheduled, Initialized,
  PodReadyToStartContainers, ContainersReady, Ready; at exit Succeeded (0) or Failed,
  ``state.terminated`` {exitCode, reason Completed/Error, startedAt, finishedAt}, ready
  false. ``restartPolicy`` is treated as Never (the operator uses nothing else). A
  command that cannot start: Failed, exit code 128, reason StartError.
- **Deletion**: SIGTERM to the process group, SIGKILL after the pod's
  ``deletionGracePeriodSeconds`` (or ``spec.terminationGracePeriodSeconds``); exit code
  recorded (143 after SIGTERM), status reported, then the deletion is finalized as a
  kubelet does (delete with ``gracePeriodSeconds=0`` and a uid precondition) so the
  name can be reused. A pod force-deleted (gone at once) gets SIGTERM and SIGKILL 2 s
  later.
- **Resilience**: list + watch per node with resourceVersion, relist on 410 and on
  any connection error (an API server restart), every request retried with backoff;
  process states are kept in memory and re-reported when the API disagrees. A pod
  found Running that no process of this agent plays (a previous agent's) is reported
  Failed with reason ContainerStatusUnknown (exit code 137). On shutdown every pod
  process gets SIGTERM, SIGKILL after 5 s, and the pods are reported Failed.

**The one thing that differs from a kubelet — the network.** Pods here are plain
local processes sharing 127.0.0.1, with no pod network and no cluster DNS. So, in a
pod's environment:

- any value naming a pod's stable DNS name ``<hostname>.<subdomain>`` (also with
  ``.<namespace>``, ``.<namespace>.svc`` or ``.<namespace>.svc.cluster.local``) of a
  pod of the same namespace that the agent plays or may play (bound to one of its
  nodes, or not bound yet) is rewritten to ``127.0.0.1``;
- the rendezvous port (``MASTER_PORT``, ``PET_MASTER_PORT``, and the port of
  ``PET_RDZV_ENDPOINT``) is remapped to a free local port chosen once per (namespace,
  MASTER_ADDR value, MASTER_PORT value), the same for every worker of a job, so two
  jobs both using the default 29500 do not collide.

The pods' podIP is 127.0.0.1 (EndpointSlices refuse loopback addresses: the endpoint
controllers log that and leave these pods out). Only the first container runs; init
containers, probes, volumes and resource limits are ignored.

Use: ``rlsched node-agent --kubeconfig K --node NAME[:GPUS] [--node ...] --workdir DIR
--log-dir DIR``, or from a test :class:`NodeAgent` (a subprocess running that
command, tied to the test process)::

    with NodeAgent(kubeconfig, nodes=["agent-0:2"], log_dir=tmp_path) as agent:
        ...  # pods bound to agent-0 run; agent.pod_log(namespace, name)
"""

from __future__ import annotations

import argparse
import base64
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import ROUND_CEILING
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from rlsched.core.contract import ENV_MASTER_ADDR, ENV_MASTER_PORT
from rlsched.core.topology import NodeSpec

from .kwok import KWOK_NODE_ANNOTATION
from .nodes import kwok_node
from . import proc as _proc
from .proc import ClusterError, Process, free_ports, wait_for

__all__ = [
    "AGENT_LABEL",
    "Agent",
    "NodeAgent",
    "agent_node",
    "expand_vars",
    "parse_node",
    "register",
    "resolve_env",
    "rewrite_network",
]

log = logging.getLogger(__name__)

#: label of the agent's nodes (a test can select or avoid them with it)
AGENT_LABEL = "rlsched.dev/node-agent"
LOCAL_IP = "127.0.0.1"
NODE_LEASE_NAMESPACE = "kube-node-lease"
#: a kubelet's node lease: 40 s, renewed every quarter
LEASE_DURATION_S, LEASE_RENEW_S = 40, 10.0
#: the Ready condition is posted again this often (the lease carries liveness)
NODE_STATUS_EVERY_S = 60.0
DEFAULT_GRACE_S = 30
#: grace of a pod force-deleted (kubelet's minimum grace period)
FORCE_DELETE_GRACE_S = 2.0
SHUTDOWN_GRACE_S = 5.0
TOKEN_TTL_S = 24 * 3600
WATCH_TIMEOUT_S = 30
REQUEST_TIMEOUT_S = 10
CLUSTER_DOMAIN = "cluster.local"
_PASS_ENV = ("PATH", "PYTHONPATH", "HOME", "VIRTUAL_ENV", "LANG", "LC_ALL", "TMPDIR", "TZ")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _default_workdir() -> Path:
    """The repository root when this package runs from a source tree, else the cwd."""
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "dev" / "node_agent.py").is_file():
        return root
    return Path.cwd()


# --------------------------------------------------------------------------- nodes
def parse_node(text: str) -> NodeSpec:
    """``NAME[:GPUS[:RACK[:BLOCK]]]`` (GPUs default 8, rack-0, block-0) as a NodeSpec."""
    parts = text.split(":")
    if not parts[0] or len(parts) > 4:
        raise ValueError(f"node {text!r}: expected NAME[:GPUS[:RACK[:BLOCK]]]")
    try:
        gpus = int(parts[1]) if len(parts) > 1 and parts[1] else 8
    except ValueError:
        raise ValueError(f"node {text!r}: GPUS must be an integer") from None
    kw: dict[str, Any] = {}
    if len(parts) > 2 and parts[2]:
        kw["rack"] = parts[2]
    if len(parts) > 3 and parts[3]:
        kw["block"] = parts[3]
    return NodeSpec(parts[0], gpus, nvlink_domain_size=gpus, **kw)


def _node_arg(spec: NodeSpec) -> str:
    return f"{spec.name}:{spec.gpus}:{spec.rack}:{spec.block}"


def agent_node(spec: NodeSpec, *, pods: int = 110) -> dict[str, Any]:
    """The Node object the agent registers for ``spec`` (labels and resources as a kwok
    GPU node's, without the kwok annotation)."""
    node = kwok_node(spec, pods=pods)
    node["metadata"]["annotations"].pop(KWOK_NODE_ANNOTATION, None)
    node["metadata"]["labels"].update({"type": "node-agent", AGENT_LABEL: "true"})
    node["status"] = {**node["status"], **_node_status(spec.name, _now())}
    return node


def _node_status(name: str, now: str, since: str | None = None) -> dict[str, Any]:
    since = since or now

    def cond(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {"type": type_, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": since}

    return {
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "sufficient memory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", "sufficient PID available"),
            cond("Ready", "True", "KubeletReady", "rlsched node agent is posting ready status"),
        ],
        "addresses": [{"type": "InternalIP", "address": LOCAL_IP},
                      {"type": "Hostname", "address": name}],
        "nodeInfo": {
            "architecture": "amd64", "operatingSystem": "linux",
            "kubeletVersion": "v0.0.0-rlsched-node-agent", "kubeProxyVersion": "",
            "containerRuntimeVersion": "rlsched-node-agent://local-processes",
            "kernelVersion": os.uname().release, "osImage": "local processes",
            "machineID": "", "bootID": "", "systemUUID": "",
        },
    }


# --------------------------------------------------------------------------- environment
_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: a defined name is replaced by its value, an
    undefined reference is left as is, ``$$`` is a literal ``$``."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR_REF.sub(sub, text)


class _ConfigError(Exception):
    """The pod cannot be started as specified (kubelet: CreateContainerConfigError)."""


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\[['\"](.+)['\"]\]$")


def _field_ref(pod: Mapping, path: str) -> str:
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": LOCAL_IP, "status.podIPs": LOCAL_IP,
        "status.hostIP": LOCAL_IP, "status.hostIPs": LOCAL_IP,
    }
    if path in simple:
        return str(simple[path] or "")
    m = _SUBSCRIPT.match(path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        items = sorted((meta.get(path.split(".")[1]) or {}).items())
        return "\n".join(f'{k}="{v}"' for k, v in items)
    raise _ConfigError(f"unsupported fieldRef {path!r}")


def _resource_ref(container: Mapping, ref: Mapping, node_allocatable: Mapping[str, str]) -> str:
    from kubernetes.utils import parse_quantity

    res = ref.get("resource", "")
    kind, _, name = res.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise _ConfigError(f"unsupported resourceFieldRef {res!r}")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name)
    if value is None and kind == "requests":
        value = (resources.get("limits") or {}).get(name)
    if value is None:
        value = node_allocatable.get(name, "0") if kind == "limits" else "0"
    divisor = parse_quantity(ref.get("divisor") or "1")
    if divisor == 0:
        raise _ConfigError(f"resourceFieldRef {res!r}: divisor 0")
    return str(int((parse_quantity(value) / divisor).to_integral_value(ROUND_CEILING)))


def resolve_env(pod: Mapping, container: Mapping, *, lookup=None,
                node_allocatable: Mapping[str, str] | None = None) -> dict[str, str]:
    """The container's ``env`` as a kubelet resolves it (in order, ``$(VAR)`` in values
    expanded against the variables before it). ``lookup(kind, name, key)`` reads a
    ConfigMap/Secret key (``kind`` ``configMap``/``secret``; None when missing)."""
    env: dict[str, str] = {}
    for item in container.get("env") or ():
        name = item["name"]
        source = item.get("valueFrom")
        if not source:
            env[name] = expand_vars(item.get("value") or "", env)
            continue
        if "fieldRef" in source:
            env[name] = _field_ref(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            env[name] = _resource_ref(container, source["resourceFieldRef"], node_allocatable or {})
        elif "configMapKeyRef" in source or "secretKeyRef" in source:
            kind = "configMap" if "configMapKeyRef" in source else "secret"
            ref = source[kind + "KeyRef"]
            value = lookup(kind, ref.get("name", ""), ref["key"]) if lookup else None
            if value is None:
                if ref.get("optional"):
                    continue
                raise _ConfigError(f"{kind} {ref.get('name')!r} key {ref['key']!r} not found")
            env[name] = value
        else:
            raise _ConfigError(f"env {name}: unsupported valueFrom {sorted(source)}")
    return env


def _name_pattern(names: Iterable[str], namespace: str) -> re.Pattern | None:
    names = sorted(set(names), key=len, reverse=True)
    if not names:
        return None
    ns = re.escape(namespace)
    suffix = rf"(?:\.{ns}(?:\.svc(?:\.{re.escape(CLUSTER_DOMAIN)})?)?)?"
    alts = "|".join(re.escape(n) for n in names)
    return re.compile(rf"(?<![A-Za-z0-9_.-])(?P<name>{alts}){suffix}\.?(?![A-Za-z0-9_.-])")


def rewrite_network(env: Mapping[str, str], namespace: str, stable_names: Iterable[str],
                    port_for) -> dict[str, str]:
    """The environment with the agent's network mapping applied (see the module
    docstring): every stable DNS name in ``stable_names`` (``<hostname>.<subdomain>``)
    becomes 127.0.0.1, and ``MASTER_PORT``/``PET_MASTER_PORT``/the port of
    ``PET_RDZV_ENDPOINT`` become ``port_for(namespace, addr, port)``."""
    pattern = _name_pattern(stable_names, namespace)
    out = {k: pattern.sub(LOCAL_IP, v) if pattern else v for k, v in env.items()}

    def canonical(host: str) -> str:
        """``<hostname>.<subdomain>`` for any spelling of a stable name (the port key)."""
        m = pattern.fullmatch(host) if pattern else None
        return m.group("name") if m else host

    master = env.get(ENV_MASTER_ADDR, "")
    for addr_key, port_key in ((ENV_MASTER_ADDR, ENV_MASTER_PORT),
                               ("PET_MASTER_ADDR", "PET_MASTER_PORT")):
        port = env.get(port_key, "")
        if port.isdigit():
            out[port_key] = str(port_for(namespace, canonical(env.get(addr_key) or master), port))
    endpoint = env.get("PET_RDZV_ENDPOINT", "")
    host, sep, port = endpoint.rpartition(":")
    if sep and host and port.isdigit():
        local_host = pattern.sub(LOCAL_IP, host) if pattern else host
        out["PET_RDZV_ENDPOINT"] = f"{local_host}:{port_for(namespace, canonical(host), port)}"
    return out


# --------------------------------------------------------------------------- kube client
def _api_client(kubeconfig: str | os.PathLike):
    from kubernetes import client, config

    conf = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)
    conf.connection_pool_maxsize = 4
    return client.ApiClient(conf)


def _read_b64(path: str | None) -> str | None:
    if not path:
        return None
    return base64.b64encode(Path(path).read_bytes()).decode()


def _cluster_entry(conf) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": conf.host}
    ca = _read_b64(conf.ssl_ca_cert)
    if ca:
        cluster["certificate-authority-data"] = ca
    if not conf.verify_ssl:
        cluster["insecure-skip-tls-verify"] = True
    return cluster


def kubeconfig_from_client(api_client) -> dict[str, Any]:
    """A kubeconfig (dict) with the server, CA and credentials of ``api_client``."""
    conf = api_client.configuration
    user: dict[str, Any] = {}
    if conf.cert_file:
        user["client-certificate-data"] = _read_b64(conf.cert_file)
        user["client-key-data"] = _read_b64(conf.key_file)
    auth = (conf.api_key or {}).get("authorization") or (conf.api_key or {}).get("BearerToken")
    if auth:
        user["token"] = auth.split(" ", 1)[1] if auth.lower().startswith("bearer ") else auth
    return _kubeconfig(_cluster_entry(conf), "agent", user, None)


def _kubeconfig(cluster: dict, user_name: str, user: dict, namespace: str | None) -> dict:
    context: dict[str, Any] = {"cluster": "local", "user": user_name}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": user_name, "user": user}],
        "contexts": [{"name": "local", "context": context}],
        "current-context": "local",
    }


def _transient(exc: BaseException) -> bool:
    """An error worth retrying: no answer (connection), a server error, throttling,
    a conflict."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        return exc.status in (0, 409, 429) or exc.status >= 500
    return True


def _status_of(exc: BaseException) -> int | None:
    from kubernetes.client.exceptions import ApiException

    return exc.status if isinstance(exc, ApiException) else None


# --------------------------------------------------------------------------- pods
@dataclass
class _Pod:
    """What the agent knows of one pod (by uid) and its process."""

    uid: str
    namespace: str
    name: str
    node: str
    pod: dict
    state: str = "waiting"            # waiting | running | terminated
    popen: subprocess.Popen | None = None
    pid: int | None = None
    log_path: Path | None = None
    started_at: str | None = None     # the container's start (RFC 3339)
    start_time: str | None = None     # the pod's startTime
    finished_at: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    next_start: float = 0.0
    start_tries: int = 0
    deleting: bool = False
    kill_at: float | None = None
    gone: bool = False                # the API object is gone
    report: bool = False              # nothing to report (terminal before us)
    dirty: bool = False
    next_status: float = 0.0
    status_tries: int = 0
    patched_rv: int = 0
    finalized: bool = False
    next_finalize: float = 0.0

    @property
    def phase(self) -> str:
        if self.state == "running":
            return "Running"
        if self.state == "terminated":
            return "Succeeded" if self.exit_code == 0 else "Failed"
        return "Pending"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _rv(obj: Mapping) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def _exit_code(returncode: int) -> int:
    return returncode if returncode >= 0 else 128 - returncode


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _die_with_agent() -> None:
    """In a pod process before exec: SIGKILL when the agent's thread that started it
    dies (a SIGKILLed agent leaves nothing behind). prctl was looked up before fork."""
    assert _proc._PRCTL is not None
    _proc._PRCTL(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


class Agent:
    """The node agent itself (one thread runs :meth:`run`; :meth:`request_stop` from
    any other). ``kubeconfig``: the agent's credentials (it needs to write nodes,
    leases, pods/status, to delete pods and to request ServiceAccount tokens: the
    admin kubeconfig of the local cluster). ``nodes``: NodeSpecs or
    ``NAME[:GPUS[:RACK[:BLOCK]]]`` strings. ``delete_nodes``: delete the nodes on
    shutdown."""

    def __init__(self, kubeconfig: str | os.PathLike, nodes: Sequence[NodeSpec | str], *,
                 workdir: str | os.PathLike | None = None,
                 log_dir: str | os.PathLike | None = None,
                 delete_nodes: bool = False) -> None:
        if not nodes:
            raise ValueError("the node agent needs at least one node")
        self.kubeconfig = Path(kubeconfig)
        self.nodes = [n if isinstance(n, NodeSpec) else parse_node(n) for n in nodes]
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate node names: {names}")
        self.workdir = Path(workdir).resolve() if workdir else _default_workdir()
        self.log_dir = Path(log_dir).resolve() if log_dir else Path(
            tempfile.mkdtemp(prefix="rlsched-node-agent-"))
        self.delete_nodes = delete_nodes
        self._stop = threading.Event()
        self._events: queue.Queue = queue.Queue()
        self._local = threading.local()
        self._pods: dict[str, _Pod] = {}
        self._ports: dict[tuple[str, str, str], int] = {}
        self._node_uids: dict[str, str] = {}
        self._ready_since: dict[str, str] = {}
        self._threads: list[threading.Thread] = []
        self.ready = threading.Event()  # nodes registered

    # -- plumbing
    def _client(self):
        c = getattr(self._local, "client", None)
        if c is None:
            c = self._local.client = _api_client(self.kubeconfig)
        return c

    def _core(self):
        from kubernetes import client

        return client.CoreV1Api(self._client())

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    # -- main loop
    def run(self) -> None:
        """Register the nodes, then play their pods until :meth:`request_stop`; on the
        way out stop every pod process (and delete the nodes if asked)."""
        (self.log_dir / "pods").mkdir(parents=True, exist_ok=True)
        log.info("node agent for %s (workdir %s, logs %s)", self.node_names, self.workdir, self.log_dir)
        try:
            self._register_nodes()
            if self._stop.is_set():
                return
            self.ready.set()
            self._spawn_thread("heartbeat", self._heartbeat)
            for spec in self.nodes:
                self._spawn_thread(f"watch-{spec.name}", self._watch_pods, spec.name)
            while not self._stop.is_set():
                try:
                    event = self._events.get(timeout=0.1)
                    while True:
                        try:
                            self._handle(event)
                        except Exception:  # keep playing the other pods
                            log.exception("handling %s of %s", event[0], event[1])
                        event = self._events.get_nowait()
                except queue.Empty:
                    pass
                self._tick()
        finally:
            self._shutdown()

    def _spawn_thread(self, name: str, target, *args) -> None:
        th = threading.Thread(target=self._guard, args=(target, *args), name=f"agent-{name}",
                              daemon=True)
        th.start()
        self._threads.append(th)

    def _guard(self, target, *args) -> None:
        while not self._stop.is_set():
            try:
                target(*args)
                return
            except Exception:
                log.exception("%s failed; restarting it", threading.current_thread().name)
                self._stop.wait(1.0)

    # -- nodes
    def _register_nodes(self) -> None:
        delay = 0.5
        pending = list(self.nodes)
        while pending and not self._stop.is_set():
            try:
                while pending:
                    self._register(pending[0])
                    pending.pop(0)
            except ClusterError:
                raise
            except Exception as exc:
                log.warning("registering node %s: %s; retrying in %.1fs", pending[0].name, exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def _register(self, spec: NodeSpec) -> None:
        from kubernetes.client.exceptions import ApiException

        core = self._core()
        body = agent_node(spec)
        try:
            created = core.create_node(body, _request_timeout=REQUEST_TIMEOUT_S)
            uid = created.metadata.uid
            log.info("registered node %s", spec.name)
        except ApiException as exc:
            if exc.status != 409:
                raise
            old = core.read_node(spec.name, _request_timeout=REQUEST_TIMEOUT_S)
            if KWOK_NODE_ANNOTATION in (old.metadata.annotations or {}):
                raise ClusterError(f"node {spec.name} exists and kwok manages it "
                                   f"({KWOK_NODE_ANNOTATION} annotation); choose another name")
            uid = old.metadata.uid
            core.patch_node(spec.name, {"metadata": {"labels": body["metadata"]["labels"]}},
                            _request_timeout=REQUEST_TIMEOUT_S)
            log.info("took over existing node %s", spec.name)
        self._node_uids[spec.name] = uid
        self._post_node_status(spec, core)
        self._renew_lease(spec.name)

    def _post_node_status(self, spec: NodeSpec, core=None) -> None:
        core = core or self._core()
        resources = agent_node(spec)["status"]
        status = _node_status(spec.name, _now(), self._since(spec.name))
        status["capacity"], status["allocatable"] = resources["capacity"], resources["allocatable"]
        core.patch_node_status(spec.name, {"status": status}, _request_timeout=REQUEST_TIMEOUT_S)

    def _since(self, name: str) -> str:
        """When the node became Ready (the conditions' lastTransitionTime)."""
        return self._ready_since.setdefault(name, _now())

    def _renew_lease(self, name: str) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        coord = client.CoordinationV1Api(self._client())
        spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_S,
                "renewTime": _micro_now()}
        try:
            coord.patch_namespaced_lease(name, NODE_LEASE_NAMESPACE, {"spec": spec},
                                         _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as exc:
            if exc.status != 404:
                raise
            owner = [{"apiVersion": "v1", "kind": "Node", "name": name,
                      "uid": self._node_uids[name]}] if name in self._node_uids else []
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE,
                                 "ownerReferences": owner},
                    "spec": spec}
            coord.create_namespaced_lease(NODE_LEASE_NAMESPACE, body,
                                          _request_timeout=REQUEST_TIMEOUT_S)

    def _heartbeat(self) -> None:
        """Renew each node's Lease every 10 s and post its Ready status every minute;
        re-register a node that was deleted."""
        from kubernetes.client.exceptions import ApiException

        last_status = time.monotonic()
        while not self._stop.wait(LEASE_RENEW_S):
            status_due = time.monotonic() - last_status >= NODE_STATUS_EVERY_S
            ok = True
            for spec in self.nodes:
                try:
                    if status_due:
                        self._post_node_status(spec)
                    self._renew_lease(spec.name)
                except ApiException as exc:
                    ok = False
                    if exc.status == 404:
                        log.warning("node %s is gone; registering it again", spec.name)
                        try:
                            self._register(spec)
                        except Exception as exc2:
                            log.warning("re-registering %s: %s", spec.name, exc2)
                    else:
                        log.warning("heartbeat of %s: %s", spec.name, exc)
                except Exception as exc:
                    ok = False
                    log.warning("heartbeat of %s: %s", spec.name, exc)
            if status_due and ok:
                last_status = time.monotonic()

    # -- pod watch
    def _watch_pods(self, node: str) -> None:
        """List + watch the pods bound to ``node`` into the event queue; relist after
        410 Gone or any error (the API server restarted), with backoff."""
        import orjson

        from .nodes import watch_event_batches

        selector = f"spec.nodeName={node}"
        rv: str | None = None
        delay = 0.5
        while not self._stop.is_set():
            try:
                core = self._core()
                if rv is None:
                    resp = core.list_pod_for_all_namespaces(
                        field_selector=selector, _preload_content=False,
                        _request_timeout=REQUEST_TIMEOUT_S)
                    doc = orjson.loads(resp.data)
                    rv = doc["metadata"]["resourceVersion"]
                    self._events.put(("LIST", node, doc.get("items") or []))
                resp = core.list_pod_for_all_namespaces(
                    field_selector=selector, watch=True, resource_version=rv,
                    allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT_S,
                    _preload_content=False, _request_timeout=(REQUEST_TIMEOUT_S, WATCH_TIMEOUT_S + 15))
                try:
                    for events in watch_event_batches(resp):
                        for ev in events:
                            kind, obj = ev.get("type"), ev.get("object") or {}
                            if kind == "ERROR":
                                raise RuntimeError(f"watch error: {obj.get('message') or obj}")
                            rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                            if kind in ("ADDED", "MODIFIED", "DELETED"):
                                self._events.put((kind, node, obj))
                        if self._stop.is_set():
                            return
                finally:
                    resp.close()
                    resp.release_conn()
                delay = 0.5
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("pod watch of %s: %s; relisting in %.1fs", node, exc, delay)
                rv = None
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def _handle(self, event: tuple[str, str, Any]) -> None:
        kind, node, obj = event
        if kind == "LIST":
            seen = set()
            for item in obj:
                seen.add(item["metadata"]["uid"])
                self._observe(node, item)
            for run in self._pods.values():
                if run.node == node and run.uid not in seen:
                    self._lost(run)
        elif kind == "DELETED":
            run = self._pods.get(obj["metadata"]["uid"])
            if run is not None:
                self._lost(run)
        else:
            self._observe(node, obj)

    def _observe(self, node: str, obj: dict) -> None:
        meta, status = obj["metadata"], obj.get("status") or {}
        run = self._pods.get(meta["uid"])
        if run is None:
            run = _Pod(meta["uid"], meta["namespace"], meta["name"], node, obj)
            self._pods[run.uid] = run
            phase = status.get("phase")
            if phase in ("Succeeded", "Failed"):
                run.state, run.exit_code = "terminated", 0 if phase == "Succeeded" else 1
                run.report = False  # terminal before us: nothing to run or report
            elif phase == "Running" or status.get("containerStatuses"):
                # a previous agent ran it; its process went with that agent
                now = _now()
                run.state, run.exit_code, run.report, run.dirty = "terminated", 137, True, True
                run.reason = "ContainerStatusUnknown"
                run.message = "The container could not be located when the pod was terminated"
                run.started_at = run.start_time = status.get("startTime") or now
                run.finished_at = now
                log.warning("%s: found running without a process; reporting it Failed", run.key)
            elif meta.get("deletionTimestamp"):
                run.state, run.report = "terminated", False
            else:
                run.report = True
                log.info("%s: bound to %s; starting", run.key, node)
        else:
            run.pod = obj
            # re-report when the API, newer than our last write, disagrees (a lost write)
            if run.report and run.state != "waiting" and _rv(obj) > run.patched_rv \
                    and status.get("phase") != run.phase:
                run.dirty = True
        if meta.get("deletionTimestamp") and not run.deleting:
            run.deleting = True
            grace = meta.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
            log.info("%s: deleted (grace %ss)", run.key, grace)
            if run.state == "running":
                self._terminate(run, float(grace) if grace and grace > 0 else FORCE_DELETE_GRACE_S)
            elif run.state == "waiting":
                run.state, run.report = "terminated", False

    def _lost(self, run: _Pod) -> None:
        """The pod object is gone (deleted for good, or no longer bound here)."""
        if run.gone:
            return
        run.gone, run.dirty = True, False
        if run.state == "running" and run.kill_at is None:
            log.info("%s: gone from the API; stopping its process", run.key)
            self._terminate(run, FORCE_DELETE_GRACE_S)
        elif run.state == "waiting":
            run.state = "terminated"

    def _terminate(self, run: _Pod, grace: float) -> None:
        assert run.pid is not None
        _kill_group(run.pid, signal.SIGTERM)
        run.kill_at = time.monotonic() + grace

    # -- the periodic work
    def _tick(self) -> None:
        for run in list(self._pods.values()):
            try:
                self._tick_pod(run, time.monotonic())
            except Exception:  # keep playing the other pods
                log.exception("%s", run.key)

    def _tick_pod(self, run: _Pod, now: float) -> None:
        if run.state == "waiting" and now >= run.next_start:
            self._start(run)
        if run.state == "running":
            rc = run.popen.poll() if run.popen else None
            if rc is not None:
                self._exited(run, rc)
            elif run.kill_at is not None and now >= run.kill_at:
                log.warning("%s: still running after its grace period; SIGKILL", run.key)
                _kill_group(run.pid, signal.SIGKILL)
                run.kill_at = float("inf")
        if run.gone:
            if run.state != "running":
                self._pods.pop(run.uid, None)
            return
        if run.dirty and run.report and now >= run.next_status:
            self._report(run)
        if (run.deleting and run.state == "terminated" and not run.dirty
                and not run.finalized and now >= run.next_finalize):
            self._finalize(run)

    def _exited(self, run: _Pod, returncode: int) -> None:
        run.state, run.exit_code = "terminated", _exit_code(returncode)
        run.reason = "Completed" if run.exit_code == 0 else "Error"
        run.finished_at, run.dirty = _now(), True
        log.info("%s: exited with %s", run.key, run.exit_code)

    def _retry_at(self, tries: int) -> float:
        return time.monotonic() + min(0.25 * 2 ** tries, 5.0)

    # -- starting a pod
    def _start(self, run: _Pod) -> None:
        try:
            argv, env, cwd = self._prepare(run)
        except _ConfigError as exc:
            self._start_failed(run, "CreateContainerConfigError", str(exc))
            return
        except Exception as exc:
            # a refusal (4xx) may be a race (a ServiceAccount or ConfigMap not there
            # yet): tried a few times before the pod fails
            if not _transient(exc) and run.start_tries >= 8:
                self._start_failed(run, "CreateContainerConfigError", str(exc))
                return
            run.start_tries += 1
            run.next_start = self._retry_at(run.start_tries)
            log.warning("%s: cannot start yet (%s); retrying", run.key, exc)
            return
        run.log_path = self.pod_log_path(run.namespace, run.name, run.uid)
        run.start_time = run.start_time or _now()
        linux = sys.platform.startswith("linux")
        if linux:
            _proc._prctl()
        try:
            with open(run.log_path, "ab") as out:
                run.popen = subprocess.Popen(
                    argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=_die_with_agent if linux else None)
        except OSError as exc:
            self._start_failed(run, "StartError", f"{argv[0]}: {exc}")
            return
        run.pid, run.state, run.started_at, run.dirty = run.popen.pid, "running", _now(), True
        log.info("%s: started pid %s: %s", run.key, run.pid, argv)

    def _start_failed(self, run: _Pod, reason: str, message: str) -> None:
        log.warning("%s: %s: %s", run.key, reason, message)
        now = _now()
        run.state, run.exit_code, run.reason, run.message = "terminated", 128, reason, message
        run.start_time = run.start_time or now
        run.started_at, run.finished_at, run.dirty = now, now, True

    def _prepare(self, run: _Pod) -> tuple[list[str], dict[str, str], Path]:
        """argv, environment and cwd of the pod's process (may raise: transient API
        errors are retried by the caller)."""
        pod = run.pod
        spec = pod.get("spec") or {}
        containers = spec.get("containers") or []
        if not containers:
            raise _ConfigError("the pod has no containers")
        c = containers[0]
        allocatable = next((agent_node(n)["status"]["allocatable"] for n in self.nodes
                            if n.name == run.node), {})
        env = resolve_env(pod, c, lookup=lambda kind, name, key: self._lookup(run.namespace, kind, name, key),
                          node_allocatable=allocatable)
        env = rewrite_network(env, run.namespace, self._stable_names(run.namespace), self._port_for)
        argv = [expand_vars(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
        if not c.get("command"):
            raise _ConfigError("the container has no command: the node agent cannot run an "
                               "image's entrypoint")
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable
        base = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        bindir = str(Path(sys.executable).parent)
        base["PATH"] = bindir + (os.pathsep + base["PATH"] if base.get("PATH") else "")
        base["HOSTNAME"] = spec.get("hostname") or run.name
        kubeconfig = self._pod_kubeconfig(run)
        if kubeconfig is not None:
            base["KUBECONFIG"] = str(kubeconfig)
        wd = c.get("workingDir")
        cwd = Path(wd) if wd and Path(wd).is_dir() else self.workdir
        return argv, {**base, **env}, cwd

    def _lookup(self, namespace: str, kind: str, name: str, key: str) -> str | None:
        from kubernetes.client.exceptions import ApiException

        core = self._core()
        try:
            if kind == "configMap":
                obj = core.read_namespaced_config_map(name, namespace, _request_timeout=REQUEST_TIMEOUT_S)
                return (obj.data or {}).get(key)
            obj = core.read_namespaced_secret(name, namespace, _request_timeout=REQUEST_TIMEOUT_S)
            raw = (obj.data or {}).get(key)
            return base64.b64decode(raw).decode() if raw is not None else None
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _stable_names(self, namespace: str) -> set[str]:
        """``<hostname>.<subdomain>`` of the pods of ``namespace`` this agent plays or may
        play (bound to one of its nodes, or not bound yet)."""
        import orjson

        doc = orjson.loads(self._core().list_namespaced_pod(
            namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S).data)
        mine = set(self.node_names)
        names = set()
        for pod in doc.get("items") or ():
            spec = pod.get("spec") or {}
            if spec.get("hostname") and spec.get("subdomain") and spec.get("nodeName", "") in mine | {""}:
                names.add(f"{spec['hostname']}.{spec['subdomain']}")
        return names

    def _port_for(self, namespace: str, addr: str, port: str) -> int:
        key = (namespace, addr, str(port))
        if key not in self._ports:
            taken = set(self._ports.values())
            while True:
                (p,) = free_ports(1)
                if p not in taken:
                    break
            self._ports[key] = p
            log.info("rendezvous %s:%s in %s -> 127.0.0.1:%s", addr, port, namespace, p)
        return self._ports[key]

    def _pod_kubeconfig(self, run: _Pod) -> Path | None:
        """A kubeconfig with a token of the pod's ServiceAccount bound to the pod."""
        import orjson

        spec = run.pod.get("spec") or {}
        if spec.get("automountServiceAccountToken") is False:
            return None
        sa = spec.get("serviceAccountName") or "default"
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "spec": {"expirationSeconds": TOKEN_TTL_S,
                         "boundObjectRef": {"apiVersion": "v1", "kind": "Pod",
                                            "name": run.name, "uid": run.uid}}}
        resp = self._core().create_namespaced_service_account_token(
            sa, run.namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)
        token = orjson.loads(resp.data)["status"]["token"]
        conf = _kubeconfig(_cluster_entry(self._client().configuration), f"{run.namespace}:{sa}",
                           {"token": token}, run.namespace)
        path = self.log_dir / "pods" / f"{self._pod_stem(run.namespace, run.name, run.uid)}.kubeconfig"
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(yaml.safe_dump(conf, sort_keys=False))
        tmp.replace(path)
        return path

    # -- reporting
    def _status(self, run: _Pod) -> dict[str, Any]:
        spec = run.pod.get("spec") or {}
        c = (spec.get("containers") or [{}])[0]
        now = _now()
        running = run.state == "running"
        cid = f"rlsched-agent://{run.pid}" if run.pid else ""
        cs: dict[str, Any] = {"name": c.get("name", "main"), "image": c.get("image") or "local",
                              "imageID": "", "restartCount": 0, "ready": running,
                              "started": running}
        if cid:
            cs["containerID"] = cid
        if running:
            cs["state"] = {"running": {"startedAt": run.started_at}}
        else:
            term = {"exitCode": run.exit_code, "reason": run.reason or "Error",
                    "startedAt": run.started_at, "finishedAt": run.finished_at}
            if run.message:
                term["message"] = run.message
            if cid:
                term["containerID"] = cid
            cs["state"] = {"terminated": term}
        ready_since = run.started_at if running else (run.finished_at or now)
        scheduled = run.start_time or now

        def cond(type_: str, ok: bool, since: str, reason: str | None = None) -> dict:
            out = {"type": type_, "status": "True" if ok else "False", "lastProbeTime": None,
                   "lastTransitionTime": since}
            if reason:
                out["reason"] = reason
            return out

        not_ready = None if running else "PodCompleted"
        return {
            "phase": run.phase,
            "hostIP": LOCAL_IP, "hostIPs": [{"ip": LOCAL_IP}],
            "podIP": LOCAL_IP, "podIPs": [{"ip": LOCAL_IP}],
            "startTime": run.start_time or now,
            "conditions": [
                cond("PodReadyToStartContainers", running, scheduled),
                cond("Initialized", True, scheduled),
                cond("Ready", running, ready_since, not_ready),
                cond("ContainersReady", running, ready_since, not_ready),
                cond("PodScheduled", True, scheduled),
            ],
            "containerStatuses": [cs],
        }

    def _report(self, run: _Pod) -> None:
        body = {"metadata": {"uid": run.uid}, "status": self._status(run)}
        try:
            resp = self._core().patch_namespaced_pod_status(
                run.name, run.namespace, body, _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:
            status = _status_of(exc)
            if status == 404:
                self._lost(run)
                return
            if _transient(exc) and status != 409:
                run.status_tries += 1
                run.next_status = self._retry_at(run.status_tries)
                log.warning("%s: status not reported (%s); retrying", run.key, exc)
                return
            if status == 409:  # the uid precondition: a new pod under this name
                self._lost(run)
                return
            log.error("%s: status refused: %s", run.key, exc)
            run.dirty = False
            return
        import orjson

        run.patched_rv = _rv(orjson.loads(resp.data))
        run.dirty, run.status_tries = False, 0
        log.info("%s: reported %s", run.key, run.phase)

    def _finalize(self, run: _Pod) -> None:
        """Remove a deleted pod whose process is gone (delete, grace 0, uid precondition)."""
        from kubernetes import client

        body = client.V1DeleteOptions(grace_period_seconds=0,
                                      preconditions=client.V1Preconditions(uid=run.uid))
        try:
            self._core().delete_namespaced_pod(run.name, run.namespace, body=body,
                                               grace_period_seconds=0,
                                               _preload_content=False,
                                               _request_timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:
            if _status_of(exc) not in (404, 409) and _transient(exc):
                run.next_finalize = self._retry_at(run.status_tries + 1)
                run.status_tries += 1
                log.warning("%s: deletion not finalized (%s); retrying", run.key, exc)
                return
        run.finalized = True
        log.info("%s: deletion finalized", run.key)

    # -- shutdown
    def _shutdown(self) -> None:
        self._stop.set()
        running = [r for r in self._pods.values() if r.state == "running"]
        for run in running:
            _kill_group(run.pid, signal.SIGTERM)
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while any(r.popen.poll() is None for r in running) and time.monotonic() < deadline:
            time.sleep(0.05)
        for run in running:
            if run.popen.poll() is None:
                _kill_group(run.pid, signal.SIGKILL)
            self._exited(run, run.popen.wait())
            run.message = "stopped with the node agent"
        for run in self._pods.values():  # best effort: one try each
            if run.dirty and run.report and not run.gone:
                self._report(run)
        if self.delete_nodes:
            core = self._core()
            for name in self.node_names:
                try:
                    core.delete_node(name, _request_timeout=REQUEST_TIMEOUT_S)
                except Exception as exc:
                    log.warning("deleting node %s: %s", name, exc)
        log.info("node agent stopped")

    # -- logs
    @staticmethod
    def _pod_stem(namespace: str, name: str, uid: str) -> str:
        return f"{namespace}_{name}_{uid[:8]}"

    def pod_log_path(self, namespace: str, name: str, uid: str) -> Path:
        return self.log_dir / "pods" / f"{self._pod_stem(namespace, name, uid)}.log"


# --------------------------------------------------------------------------- test handle
class NodeAgent:
    """The node agent as a subprocess (``python -m rlsched_dev.node_agent``) for tests.

    ``kube``: a kubeconfig path, or a ``kubernetes`` ApiClient/CoreV1Api (its server
    and credentials are written into ``<log_dir>/agent.kubeconfig``). ``nodes``:
    NodeSpecs or ``NAME[:GPUS[:RACK[:BLOCK]]]``. ``workdir``: the pods' cwd (default
    the repository root); ``log_dir``: the agent's log (``node-agent.log``) and the
    pods' logs and kubeconfigs (``pods/``; default a temporary directory, removed by
    :meth:`stop`). :meth:`start` returns once every node is Ready and schedulable;
    :meth:`stop` stops the agent (its pods get SIGTERM) and deletes its nodes. The
    subprocess is tied to the thread that started it (it dies with the test run).
    A subprocess rather than a thread: a hung watch or a wedged client never blocks
    the test, and its pods' processes are its own children.
    """

    def __init__(self, kube: Any, nodes: Sequence[NodeSpec | str], *,
                 workdir: str | os.PathLike | None = None,
                 log_dir: str | os.PathLike | None = None,
                 ready_timeout: float = 60.0, log_level: str = "INFO") -> None:
        self._kube = kube
        self.nodes = [n if isinstance(n, NodeSpec) else parse_node(n) for n in nodes]
        self.workdir = Path(workdir).resolve() if workdir else None
        self._own_log_dir = log_dir is None
        self.log_dir = Path(log_dir).resolve() if log_dir else None
        self.ready_timeout = ready_timeout
        self.log_level = log_level
        self.process: Process | None = None
        self.kubeconfig: Path | None = None

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def log(self) -> Path:
        assert self.log_dir is not None
        return self.log_dir / "node-agent.log"

    def _write_kubeconfig(self) -> Path:
        from kubernetes import client

        kube = self._kube
        if isinstance(kube, (str, os.PathLike)):
            return Path(kube).resolve()
        api = kube.api_client if isinstance(kube, client.CoreV1Api) else kube
        assert self.log_dir is not None
        path = self.log_dir / "agent.kubeconfig"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(yaml.safe_dump(kubeconfig_from_client(api), sort_keys=False))
        return path

    def start(self) -> "NodeAgent":
        from .nodes import count_ready

        if self.log_dir is None:
            self.log_dir = Path(tempfile.mkdtemp(prefix="rlsched-node-agent-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = self._write_kubeconfig()
        argv = [sys.executable, "-m", "rlsched_dev.node_agent", "--kubeconfig", str(self.kubeconfig),
                "--log-dir", str(self.log_dir), "--delete-nodes", "--log-level", self.log_level]
        if self.workdir is not None:
            argv += ["--workdir", str(self.workdir)]
        for spec in self.nodes:
            argv += ["--node", _node_arg(spec)]
        self.process = Process("node-agent", argv, self.log)
        self.process.start(self.workdir or _default_workdir(),
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
        core = _api_client(self.kubeconfig)
        try:
            wait_for(lambda: count_ready(core, self.node_names) == len(self.nodes),
                     self.ready_timeout, f"node agent nodes {self.node_names} Ready",
                     self.process, every=0.25)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the agent (it stops its pods and deletes its nodes), SIGKILL after
        ``timeout`` s; then make sure the nodes are gone."""
        if self.process is not None and self.process.pid:
            self.process.stop(grace=timeout)
            self._delete_nodes()
        self.process = None
        if self._own_log_dir and self.log_dir is not None:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def _delete_nodes(self) -> None:
        from kubernetes import client

        if self.kubeconfig is None:
            return
        try:
            core = client.CoreV1Api(_api_client(self.kubeconfig))
            for name in self.node_names:
                try:
                    core.delete_node(name, _request_timeout=REQUEST_TIMEOUT_S)
                except client.exceptions.ApiException as exc:
                    if exc.status != 404:
                        raise
        except Exception as exc:  # best effort
            log.warning("deleting the node agent's nodes: %s", exc)

    def alive(self) -> bool:
        return self.process is not None and self.process.exited() is None

    def pod_logs(self, namespace: str, name: str) -> list[Path]:
        """The log files of the pods ``namespace/name`` played so far (oldest first)."""
        assert self.log_dir is not None
        return sorted((self.log_dir / "pods").glob(f"{namespace}_{name}_*.log"),
                      key=lambda p: p.stat().st_mtime)

    def pod_log(self, namespace: str, name: str) -> str:
        """The output of the newest pod ``namespace/name`` ('' before it started)."""
        paths = self.pod_logs(namespace, name)
        return paths[-1].read_text(errors="replace") if paths else ""

    def __enter__(self) -> "NodeAgent":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- CLI
def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", required=True, help="the agent's credentials (admin)")
    p.add_argument("--node", action="append", required=True, metavar="NAME[:GPUS[:RACK[:BLOCK]]]",
                   help="a node to play (repeat for more); GPUs default 8")
    p.add_argument("--workdir", default=None,
                   help="cwd of the pods' processes (default: the repository root)")
    p.add_argument("--log-dir", default=None,
                   help="agent and pod logs, per-pod kubeconfigs (default: a temporary directory)")
    p.add_argument("--delete-nodes", action="store_true", help="delete the nodes on exit")
    p.add_argument("--log-level", default="INFO")


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(threadName)s %(message)s")
    # the client's per-request retries: our own warning says it once
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    try:
        agent = Agent(args.kubeconfig, args.node, workdir=args.workdir, log_dir=args.log_dir,
                      delete_nodes=args.delete_nodes)
    except ValueError as exc:
        print(f"node-agent: {exc}", file=sys.stderr)
        return 2

    def on_signal(signum, frame) -> None:
        log.info("signal %s: stopping", signum)
        agent.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.run()
    except ClusterError as exc:
        log.error("%s", exc)
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``rlsched node-agent``."""
    p = subparsers.add_parser("node-agent", help="run bound pods of a few nodes as local "
                                                 "processes (test-only kubelet, dev)")
    _add_arguments(p)
    p.set_defaults(func=_run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlsched_dev.node_agent",
                                     description=__doc__.splitlines()[0])
    _add_arguments(parser)
    return _run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
