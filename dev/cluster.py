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
:func:`rlsched_dev.nodes.create_gpu_nodes`; kwok Stages (:mod:`rlsched_dev.kwok`) make
bound pods Running and, when they carry the ``rlsched.dev/duration-seconds``
annotation, Succeeded after that many seconds.

Supervision: while the handle that started it lives, a supervisor thread restarts
kube-controller-manager, the schedulers and kwok when they exit unexpectedly, as a
kubelet restarts a static pod (backoff 0.5 s doubling to 30 s, reset after 60 s up;
the schedulers and kwok only once the API server answers, so that their predecessors'
leases can be released);
each restart is logged (``logs/supervisor.log``, the component's log, the
``rlsched_dev.cluster`` logger) and counted in :attr:`LocalCluster.restarts`.
kube-scheduler exits on purpose when its cache is corrupted (a pod re-created under a
reused name, kubernetes#50916); without a restart nothing would be scheduled again.
Deliberate stops (``stop_scheduler``, ``restart_apiserver``, ``stop``) are left
alone.

Command line: ``rlsched cluster up|down|status [--dir D]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import ssl
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from rlsched.core.contract import DEFAULT_SCHEDULER_NAME, RESOURCE_GPU
from rlsched.core.topology import Topology

from .kwok import NODE_MONITOR_GRACE_S, KwokController
from .nodes import create_gpu_nodes, default_topology, delete_gpu_nodes, load_topology, wait_nodes_ready
from .pki import admin_kubeconfig, make_pki
from .probe import http_ok
from .proc import ClusterError, Process, free_ports, started_in, wait_for
from .tools import find_tools

__all__ = [
    "LocalCluster",
    "SchedulerTuning",
    "KubeEnv",
    "kube_env",
    "register",
]

log = logging.getLogger(__name__)

SCHEDULER_NAME = DEFAULT_SCHEDULER_NAME
#: the components the supervisor restarts when they exit unexpectedly (etcd and
#: kube-apiserver hold the state; a test that stops them means it, see
#: :meth:`LocalCluster.restart_apiserver`)
SUPERVISED = ("kube-controller-manager", "kube-scheduler", "rlsched-scheduler", "kwok")
#: the supervised components whose leases are released before a restart (through the
#: API server): restarted only once it answers
NEED_API = ("kube-scheduler", "rlsched-scheduler", "kwok")
#: restart backoff: first delay, cap (doubling in between, as kubelet's CrashLoopBackOff),
#: and how long a component must have run for its backoff to start over
RESTART_BACKOFF_S, RESTART_BACKOFF_MAX_S, RESTART_RESET_S = 0.5, 30.0, 60.0
#: kube-controller-manager's client limit (requests/s, burst) on the local cluster
KCM_QPS, KCM_BURST = 500, 1000
_STATE_FILE = "state.json"

ProgressFn = Callable[[str], None]


@dataclass(frozen=True)
class SchedulerTuning:
    """The throughput knobs of one kube-scheduler process; ``None`` leaves
    kube-scheduler's own default.

    ``qps``/``burst``: its client limit to the API server (``clientConnection``;
    default 50/100). Every bind is one request, so the limit caps the pods bound per
    second. ``percentage_of_nodes_to_score``: the share of feasible nodes it looks for
    before scoring (default adaptive: ``max(5, 50 - nodes/125)`` %, at least 100
    nodes; 42 % at 1,000 nodes); with an extender it is also how many node names each
    ``/filter`` and ``/prioritize`` request carries.
    """

    qps: float | None = None
    burst: int | None = None
    percentage_of_nodes_to_score: int | None = None

    def __post_init__(self) -> None:
        if self.qps is not None and not self.qps > 0:
            raise ValueError(f"scheduler qps must be > 0, got {self.qps}")
        if self.burst is not None and self.burst < 1:
            raise ValueError(f"scheduler burst must be >= 1, got {self.burst}")
        if self.qps is not None and self.burst is not None and self.burst < self.qps:
            raise ValueError(f"scheduler burst ({self.burst}) below its qps ({self.qps})")
        pct = self.percentage_of_nodes_to_score
        if pct is not None and not 0 <= pct <= 100:
            raise ValueError(f"percentageOfNodesToScore must be within 0..100, got {pct}")

    def apply(self, conf: dict[str, Any]) -> dict[str, Any]:
        """Write these settings into a KubeSchedulerConfiguration dict (in place)."""
        client = conf.setdefault("clientConnection", {})
        if self.qps is not None:
            client["qps"] = self.qps
        if self.burst is not None:
            client["burst"] = self.burst
        if self.percentage_of_nodes_to_score is not None:
            conf["percentageOfNodesToScore"] = self.percentage_of_nodes_to_score
        return conf

    def describe(self) -> dict[str, Any]:
        """The effective settings (kube-scheduler's defaults filled in), for reports."""
        return {"qps": self.qps if self.qps is not None else 50.0,
                "burst": self.burst if self.burst is not None else 100,
                "percentageOfNodesToScore": self.percentage_of_nodes_to_score
                if self.percentage_of_nodes_to_score is not None else "adaptive"}



# --------------------------------------------------------------------------- cluster
class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager + 2 kube-schedulers + kwok.

    ``kwok=False`` leaves out the kwok controller (for a second, external one).
    ``supervise`` (default): restart kube-controller-manager, the schedulers and kwok
    when they exit unexpectedly, while this handle lives (:attr:`restarts` counts).
    The components die with this process unless ``detach`` (then stop them with
    :meth:`attach` + :meth:`stop`, as ``rlsched cluster down`` does).
    ``workdir`` holds certificates, configs, etcd data, logs (``logs/<name>.log``) and
    ``kubeconfig``; by default a fresh temporary directory removed by :meth:`stop`.
    ``extender_url`` is where the ``rlsched`` scheduler profile calls the extender;
    by default ``http://127.0.0.1:<free port>``, a port the test can then serve on.
    kube-scheduler counts ``nvidia.com/gpu`` itself (``ignoredByScheduler: false``,
    the configuration the docs recommend): the extender narrows and scores but is never
    the only one counting GPUs, so neither a tie kube-scheduler breaks elsewhere nor a
    dead or hung extender can bind more GPUs than a node has.
    ``gpu_ignored_by_scheduler=True`` is the unsafe setting, kept to reproduce that
    over-commit in the fault benchmark (``bench/faults.py``).
    ``scheduler_tuning``/``rlsched_tuning``: client limit and
    ``percentageOfNodesToScore`` of the stock and the ``rlsched`` kube-scheduler
    (:class:`SchedulerTuning`; default: kube-scheduler's own); change them on a
    running cluster with :meth:`restart_scheduler`.

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
        gpu_ignored_by_scheduler: bool = False,
        scheduler_tuning: SchedulerTuning | None = None,
        rlsched_tuning: SchedulerTuning | None = None,
        start_timeout_s: float = 90.0,
        kwok: bool = True,
        supervise: bool = True,
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
        self.tuning = {"kube-scheduler": scheduler_tuning or SchedulerTuning(),
                       "rlsched-scheduler": rlsched_tuning or SchedulerTuning()}
        self.start_timeout_s = start_timeout_s
        self.with_kwok = kwok
        self.detach = detach
        self._progress = progress or (lambda msg: None)
        self.ports: dict[str, int] = {}
        self.processes: dict[str, Process] = {}
        self._kwok: KwokController | None = None
        self.started = False
        self.supervise = supervise
        self._init_supervision()

    def _init_supervision(self) -> None:
        #: restarts of each component by the supervisor (unexpected exits only)
        self.restarts: dict[str, int] = {}
        self._lock = threading.RLock()  # processes, spawning, the supervisor's view
        self._held: set[str] = set()    # stopped on purpose: not restarted
        self._paused = 0                # > 0 while restart_apiserver runs
        self._supervisor: threading.Thread | None = None
        self._supervisor_stop = threading.Event()

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
                if self.supervise:
                    self._start_supervisor()
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
        self.ports = dict(zip(names, free_ports(len(names))))
        self._progress("creating certificates")
        pki = d / "pki"
        make_pki(pki)
        self.kubeconfig.write_text(yaml.safe_dump(admin_kubeconfig(self.server, pki), sort_keys=False))
        self.kubeconfig.chmod(0o600)
        self._write_state()

        self._progress(f"starting etcd on 127.0.0.1:{self.ports['etcd']}")
        etcd = self._spawn("etcd", self._etcd_argv())
        wait_for(lambda: http_ok(f"http://127.0.0.1:{self.ports['etcd']}/health", expect='"health":"true"'),
                 self.start_timeout_s, "etcd /health", etcd)

        self._progress(f"starting kube-apiserver on {self.server}")
        api = self._spawn("kube-apiserver", self._apiserver_argv(pki))
        ctx = self._ssl_context()
        wait_for(lambda: http_ok(f"{self.server}/readyz", ctx, expect="ok"), self.start_timeout_s,
                 "kube-apiserver /readyz", api, [etcd])

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
            wait_for(lambda u=url, c=c: http_ok(u, c, expect="ok"), self.start_timeout_s,
                     f"{proc.name} {url}", proc, [api, etcd])
        # Pods need the default ServiceAccount, which the controller manager creates.
        sa = f"{self.server}/api/v1/namespaces/default/serviceaccounts/default"
        wait_for(lambda: http_ok(sa, ctx), self.start_timeout_s, "the default ServiceAccount", kcm, [api])
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
        with self._lock:
            self._paused += 1  # the components that exit meanwhile are restarted below
        try:
            self._restart_apiserver(old, grace)
        finally:
            with self._lock:
                self._paused -= 1

    def _restart_apiserver(self, old: Process, grace: float) -> None:
        self._progress("restarting kube-apiserver")
        old.stop(grace)
        api = self._spawn("kube-apiserver", self._apiserver_argv(self._dir / "pki"))
        ctx = self._ssl_context()
        wait_for(lambda: http_ok(f"{self.server}/readyz", ctx, expect="ok"), self.start_timeout_s,
                 "kube-apiserver /readyz", api, [self.processes["etcd"]])
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
            self._log_supervision(name, f"{name} (pid {proc.pid}) exited with status "
                                        f"{proc.exited()} during the API server restart; "
                                        "started again by restart_apiserver")
            proc = self._respawn(name, proc, counted=False)
            url = f"https://127.0.0.1:{self.ports[port]}/healthz"
            wait_for(lambda u=url: http_ok(u, insecure, expect="ok"), self.start_timeout_s,
                     f"{name} {url}", proc, [api])

    #: process name -> (port name, has the extender)
    _SCHEDULERS = {"kube-scheduler": ("scheduler", False),
                   "rlsched-scheduler": ("rlsched-scheduler", True)}

    def stop_scheduler(self, name: str, grace: float = 10.0) -> None:
        """Stop the stock (``kube-scheduler``) or the ``rlsched-scheduler`` process
        (SIGTERM: it releases its leader lease, so a new one leads at once). Pods of its
        profile then wait in the API server until :meth:`start_scheduler`."""
        if name not in self._SCHEDULERS:
            raise ValueError(f"no scheduler {name!r}; one of {sorted(self._SCHEDULERS)}")
        with self._lock:
            self._held.add(name)  # the supervisor leaves it stopped
            proc = self.processes.get(name)
        if proc is not None:
            proc.stop(grace)

    def start_scheduler(self, name: str, tuning: SchedulerTuning | None = None,
                        *, wait: bool = True) -> Process:
        """Start the scheduler process ``name`` (stopped by :meth:`stop_scheduler`) with
        ``tuning`` (default: its current one); return once /healthz answers unless
        ``wait`` is false. Call it from the thread that started the cluster."""
        if name not in self._SCHEDULERS:
            raise ValueError(f"no scheduler {name!r}; one of {sorted(self._SCHEDULERS)}")
        old = self.processes.get(name)
        if old is not None and old.exited() is None:
            raise ClusterError(f"{name} is running (pid {old.pid}); stop it first")
        if tuning is not None:
            self.tuning[name] = tuning
        port, extender = self._SCHEDULERS[name]
        with self._lock:
            proc = self._spawn(name, self._scheduler_argv(port, extender=extender))
            self._held.discard(name)
        if wait:
            insecure = ssl.create_default_context()
            insecure.check_hostname = False
            insecure.verify_mode = ssl.CERT_NONE
            url = f"https://127.0.0.1:{self.ports[port]}/healthz"
            wait_for(lambda: http_ok(url, insecure, expect="ok"), self.start_timeout_s,
                     f"{name} {url}", proc, [self.processes["kube-apiserver"]])
        return proc

    def restart_scheduler(self, name: str, tuning: SchedulerTuning | None = None) -> Process:
        """:meth:`stop_scheduler` then :meth:`start_scheduler` (e.g. with new tuning)."""
        self.stop_scheduler(name)
        return self.start_scheduler(name, tuning)

    def _tool(self, name: str) -> str:
        if self.tools_bin is None:
            raise ClusterError("cluster not started")
        return str(self.tools_bin / name)

    def _spawn(self, name: str, argv: list[str], restart: bool = False) -> Process:
        with self._lock:
            proc = Process(name, argv, self.log_path(name), detach=self.detach)
            proc.start(self._dir)
            if restart:  # counted before the new pid is seen: a reader never sees one without the other
                self.restarts[name] = self.restarts.get(name, 0) + 1
            self.processes[name] = proc
            self._write_state()
            return proc

    def _respawn(self, name: str, old: Process, counted: bool = True) -> Process:
        """Start ``old`` (exited) again with the same command line; ``counted``: a
        supervisor's restart of an unexpected exit (:attr:`restarts`)."""
        with self._lock:
            if name == "kwok":
                self._release_leases("kube-node-lease", None, name, "node leases", delete=True)
            elif name in self._SCHEDULERS:  # its leader lease has the process's name
                self._release_leases("kube-system", name, name, "leader lease")
            proc = self._spawn(name, old.argv, restart=counted)
            if name == "kwok" and self._kwok is not None:
                self._kwok.process = proc
            return proc

    def _release_leases(self, namespace: str, lease_name: str | None, component: str,
                        what: str, *, delete: bool = False) -> None:
        """Release (or ``delete``) the leases (all of ``namespace``, or the one named
        ``lease_name``) that an exited ``component`` held, before it is started again.
        Both kwok and kube-scheduler name themselves ``<hostname>_<uuid>``, new at every
        start. A restarted kube-scheduler would wait out its dead predecessor's leader
        lease (15 s); released, it leads at its next try (2 s). A restarted kwok manages
        only nodes whose lease names it and, when it meets a lease its informer has not
        seen yet, tries again only a renewal period (30 s) later, or after the lease
        expired (120 s): deleted, the leases are simply created anew at its start. The
        holder is dead (its exit was seen), so this is safe. Best effort: with the API
        server away the leases expire on their own."""
        import socket

        from kubernetes import client, config

        prefix = f"{socket.gethostname()}_"
        try:
            coord = client.CoordinationV1Api(
                config.new_client_from_config(config_file=str(self.kubeconfig)))
            leases = coord.list_namespaced_lease(namespace, _request_timeout=5).items
            released = 0
            for lease in leases:
                if lease_name is not None and lease.metadata.name != lease_name:
                    continue
                if not (lease.spec.holder_identity or "").startswith(prefix):
                    continue
                if delete:
                    coord.delete_namespaced_lease(lease.metadata.name, namespace,
                                                  _request_timeout=5)
                else:
                    coord.patch_namespaced_lease(lease.metadata.name, namespace,
                                                 {"spec": {"holderIdentity": None}},
                                                 _request_timeout=5)
                released += 1
            if released:
                self._log_supervision(component, f"{'deleted' if delete else 'released'} "
                                                 f"{released} {what} of the exited {component}")
        except Exception as exc:
            self._log_supervision(component, f"could not release the exited {component}'s "
                                             f"{what}: {exc}")

    # -- supervision (a kubelet's restart of static pods)
    def _start_supervisor(self) -> None:
        self._supervisor_stop.clear()
        # Components restarted from this thread are tied to it (PR_SET_PDEATHSIG acts
        # on the spawning thread): it lives until stop().
        self._supervisor = threading.Thread(target=self._supervise, name="rlsched-supervisor",
                                            daemon=True)
        self._supervisor.start()

    def _stop_supervisor(self) -> None:
        th, self._supervisor = self._supervisor, None
        self._supervisor_stop.set()
        if th is not None and th is not threading.current_thread():
            th.join(30)

    def _log_supervision(self, name: str, message: str) -> None:
        """One line in ``logs/supervisor.log``, the component's own log and the logger."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        log.warning("%s", message)
        for path in (self._dir / "logs" / "supervisor.log", self.log_path(name)):
            try:
                with open(path, "a") as f:
                    f.write(f"{stamp} rlsched supervisor: {message}\n")
            except OSError:
                pass

    def _api_answers(self) -> bool:
        """Whether kube-apiserver answers ``/readyz`` now."""
        return http_ok(f"{self.server}/readyz", self._ssl_context(), expect="ok", timeout=1.0)

    def _supervise(self, every: float = 0.2) -> None:
        """Restart the :data:`SUPERVISED` components that exit unexpectedly, with a
        per-component exponential backoff (:data:`RESTART_BACKOFF_S` doubling to
        :data:`RESTART_BACKOFF_MAX_S`, reset after :data:`RESTART_RESET_S` up). Those
        of :data:`NEED_API` are restarted only once the API server answers: started
        while it is away, a scheduler cannot release its predecessor's leader lease and
        waits it out once the API server is back (new pods wait with it)."""
        backoff: dict[str, float] = {}
        up_since: dict[str, tuple[Process, float]] = {}
        due: dict[str, tuple[Process, float, int | None]] = {}  # name -> (exited, when, rc)
        waiting_api: set[str] = set()
        while not self._supervisor_stop.wait(every):
            answers: list[bool] = []

            def api_up() -> bool:  # asked once per round, only when a restart needs it
                if not answers:
                    answers.append(self._api_answers())
                return answers[0]

            try:
                with self._lock:
                    if self._paused or not self.started:
                        due.clear()
                        continue
                    now = time.monotonic()
                    for name in SUPERVISED:
                        proc = self.processes.get(name)
                        if name in self._held or proc is None or proc.popen is None:
                            due.pop(name, None)
                            continue
                        rc = proc.exited()
                        if rc is None:
                            since = up_since.setdefault(name, (proc, now))
                            if since[0] is not proc:
                                up_since[name] = since = (proc, now)
                            if now - since[1] >= RESTART_RESET_S:
                                backoff.pop(name, None)
                            due.pop(name, None)
                            continue
                        pending = due.get(name)
                        if pending is None or pending[0] is not proc:
                            delay = backoff.get(name, RESTART_BACKOFF_S)
                            due[name] = (proc, now + delay, rc)
                            self._log_supervision(name, f"{name} (pid {proc.pid}) exited "
                                                        f"unexpectedly with status {rc}; "
                                                        f"restarting in {delay:g}s")
                            continue
                        if now < pending[1]:
                            continue
                        if name in NEED_API and not api_up():
                            if name not in waiting_api:  # logged once per outage
                                waiting_api.add(name)
                                self._log_supervision(name, f"{name}: the API server does not answer; "
                                                            "restarted once it does")
                            continue
                        waiting_api.discard(name)
                        backoff[name] = min(backoff.get(name, RESTART_BACKOFF_S) * 2,
                                            RESTART_BACKOFF_MAX_S)
                        try:
                            new = self._respawn(name, proc)
                        except OSError as exc:
                            due[name] = (proc, now + backoff[name], rc)
                            self._log_supervision(name, f"{name}: restart failed ({exc}); "
                                                        f"next try in {backoff[name]:g}s")
                            continue
                        due.pop(name, None)
                        self._log_supervision(name, f"{name} restarted (pid {new.pid}; "
                                                    f"restart #{self.restarts[name]})")
            except Exception:  # never let the supervisor die: its children die with it
                log.exception("supervisor")

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
            # kwok's node lease is the heartbeat (renewed every quarter lease)
            f"--node-monitor-grace-period={NODE_MONITOR_GRACE_S}s",
            # The node lifecycle controller lifts each new node's not-ready taint with
            # its own requests: at the default client limit (20/s, burst 30) 1,000 new
            # nodes take minutes to become schedulable (measured: 229 s).
            f"--kube-api-qps={KCM_QPS}", f"--kube-api-burst={KCM_BURST}",
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
        return self.tuning["rlsched-scheduler" if extender else "kube-scheduler"].apply(conf)

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
        for proc in reversed(list(self.processes.values())):
            proc.stop(grace)

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
            if started_in(int(pid), d):
                self.processes[name] = Process(name, [], d / "logs" / f"{name}.log", pid=int(pid))
        self._kwok = None
        self.supervise = False
        self._init_supervision()
        self.started = True
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Stop all components (SIGTERM to each process group, SIGKILL after
        ``grace`` seconds), newest first, and remove a temporary workdir."""
        if not self.started:
            return
        self._stop_supervisor()
        with self._lock:
            self._held.update(self.processes)
        self._stop_processes(grace)
        self.started = False
        if self.workdir is None:
            return
        if self.keep_workdir:
            state = self.workdir / _STATE_FILE
            state.unlink(missing_ok=True)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)



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

def _cmd_up(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(stderr=True)
    workdir = Path(args.dir).resolve()
    try:
        topo = load_topology(args.topology)
        with console.status("starting control plane") as status:
            tuning = SchedulerTuning(args.scheduler_qps, args.scheduler_burst,
                                     args.percentage_of_nodes_to_score)
            cluster = LocalCluster(workdir, extender_url=args.extender_url, detach=True,
                                   keep_workdir=True, progress=status.update,
                                   rlsched_tuning=tuning)
            t0 = time.monotonic()
            cluster.start()
            try:
                status.update(f"creating {len(topo)} kwok GPU nodes")
                names = create_gpu_nodes(cluster.kubeconfig, topo)
                wait_nodes_ready(cluster.kubeconfig, names, timeout=60 + 0.1 * len(names))
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
                    help="cluster description YAML/JSON (core Topology.from_dict), or 'mixed': two GPU "
                         "types (2 x 4 Tesla-T4, 2 x 8 A100; operator --gpu-types as dev.nodes.MIXED_GPU_TYPES); "
                         "default 4 nodes x 8 GPUs in 2 racks")
    up.add_argument("--scheduler-qps", type=float, default=None,
                    help="client requests/s of the rlsched kube-scheduler (default: "
                         "kube-scheduler's 50; the chart recommends more, see values.yaml)")
    up.add_argument("--scheduler-burst", type=int, default=None,
                    help="client burst of the rlsched kube-scheduler (default 100)")
    up.add_argument("--percentage-of-nodes-to-score", type=int, default=None,
                    help="percentageOfNodesToScore of the rlsched kube-scheduler "
                         "(default adaptive: 42%% at 1,000 nodes)")
    up.set_defaults(func=_cmd_up)
    down = sub.add_parser("down", help="stop the cluster started by `up`")
    down.add_argument("--dir", default=".kube")
    down.add_argument("--missing-ok", action="store_true", help="no error when none is running")
    down.set_defaults(func=_cmd_down)
    status = sub.add_parser("status", help="show the components of the cluster in --dir")
    status.add_argument("--dir", default=".kube")
    status.set_defaults(func=_cmd_status)
