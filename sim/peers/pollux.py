"""The released Pollux policy as an :class:`~rlsched.core.allocation.Allocator`, through
a bridge process.

Pollux (Qiao et al., OSDI 2021) runs as released on PyPI (``adaptdl-sched==0.2.11``) in
its own environment (``make pollux-env``), in a child process speaking JSON lines
(the script :data:`BRIDGE`); this module is the client. A missing environment raises
:class:`PeerUnavailable`, a failing bridge :class:`PeerError`. Details: docs/design-notes.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import selectors
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlsched.core.allocation import AllocJob, AllocNode, Allocation, check_allocations
from rlsched.core.contract import RESOURCE_GPU

__all__ = [
    "PeerUnavailable",
    "PeerError",
    "PolluxAllocator",
    "pollux_available",
    "default_python",
    "request_of",
    "allocations_of",
    "PAPER_PINNED",
    "RELEASE",
    "BRIDGE",
    "PYTHON_ENV",
    "CLUSTER_MODES",
]

log = logging.getLogger(__name__)

#: the released version the bridge must find in its environment
RELEASE = "0.2.11"
PROTOCOL = 1
#: environment variable naming the Pollux environment's python
PYTHON_ENV = "RLSCHED_POLLUX_PYTHON"
#: the repository this module belongs to (the bridge and the default environment live there)
REPO = Path(__file__).resolve().parents[2]
BRIDGE = REPO / "tools" / "pollux" / "pollux_bridge.py"
DEFAULT_VENV = ".venv-pollux"
#: applications the paper's setup pins: ncf trains on one GPU at batch size 32768
#: (Pollux artifact, simulator/simulator.py); name -> (max replicas, batch size)
PAPER_PINNED: Mapping[str, tuple[int, int]] = {"ncf": (1, 32768)}
_HINT = "run `make pollux-env`"
CLUSTER_MODES = ("fixed", "autoscale")


class PeerUnavailable(RuntimeError):
    """The peer's environment is missing or broken (the message says how to build it)."""


class PeerError(RuntimeError):
    """The bridge died, did not answer in time, or answered an error or a malformed reply
    (the message holds its stderr's tail where there is one)."""


def default_python() -> Path:
    """The Pollux environment's python: ``$RLSCHED_POLLUX_PYTHON``, else
    ``<repository>/.venv-pollux/bin/python``."""
    env = os.environ.get(PYTHON_ENV)
    return Path(env) if env else REPO / DEFAULT_VENV / "bin" / "python"


def _child_env() -> dict[str, str]:
    # rlsched's own search path (numpy 2, ...) must not leak into the bridge's interpreter
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}


def _missing(python: Path) -> str | None:
    if not BRIDGE.is_file():
        return f"the Pollux bridge {BRIDGE} is missing (it ships with the repository, not the wheel)"
    if not python.exists():
        return f"no Pollux environment: {python} does not exist; {_HINT} (or set {PYTHON_ENV})"
    if not os.access(python, os.X_OK):
        return f"{python} is not executable; {_HINT}"
    return None


def _tail(text: str, n: int = 2000) -> str:
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]


def pollux_available(python: str | os.PathLike | None = None) -> tuple[bool, str]:
    """Whether the Pollux environment at ``python`` (default :func:`default_python`)
    imports the released packages at version :data:`RELEASE`, and a sentence saying
    which versions it found or why not."""
    py = Path(python) if python is not None else default_python()
    why = _missing(py)
    if why:
        return False, why
    try:
        proc = subprocess.run([str(py), str(BRIDGE), "--check"], capture_output=True, text=True, timeout=300,
                              env=_child_env(), stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{py} cannot run the Pollux bridge ({e}); {_HINT}"
    if proc.returncode != 0:
        return False, f"{py}: the Pollux packages do not import: {_tail(proc.stderr, 600)}; {_HINT}"
    try:
        v = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False, f"{py}: the bridge's --check printed {proc.stdout!r}, not JSON"
    if v.get("adaptdl-sched") != RELEASE or v.get("adaptdl") != RELEASE:
        return False, (f"{py} has adaptdl-sched {v.get('adaptdl-sched')}, adaptdl {v.get('adaptdl')}; "
                       f"the peer is the released {RELEASE}: {_HINT}")
    return True, (f"adaptdl-sched {v['adaptdl-sched']}, adaptdl {v['adaptdl']}, pymoo {v.get('pymoo')}, "
                  f"numpy {v.get('numpy')}, python {v.get('python')} at {py}")


# ---------------------------------------------------------------------------- wire format
def _finite(job: str, name: str, x: float | None) -> float | None:
    if x is not None and not math.isfinite(x):
        raise ValueError(f"job {job}: {name} is {x}, not a finite number")
    return x


def _job(j: AllocJob, pinned: Mapping[str, tuple[int, int]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for f in dataclasses.fields(AllocJob):
        if f.name == "oracle":  # Pollux is not clairvoyant
            continue
        d[f.name] = getattr(j, f.name)
    for name in ("submit_time", "age", "attained_service", "progress", "grad_sqr", "grad_var"):
        _finite(j.id, name, d[name])
    d["allocation"] = list(j.allocation)
    b = d.pop("bounds")  # AdaptDL's names for the job's batch bounds
    d["limits"] = {"init_batch_size": int(b.init_batch), "max_batch_size": int(b.largest),
                   "min_local_bsz": int(b.min_local_batch), "max_local_bsz": int(b.largest_local)}
    d["profile"] = [[s.num_nodes, s.num_replicas, s.atomic_bsz, _finite(j.id, "step_time", s.step_time),
                     _finite(j.id, "sync_time", s.sync_time)] for s in j.profile]
    d["fixed_batch_size"] = None
    pin = pinned.get(j.application)
    if pin is not None:
        d["max_replicas"] = min(j.max_replicas, pin[0])
        d["fixed_batch_size"] = pin[1]
    return d


def request_of(jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float,
               pinned: Mapping[str, tuple[int, int]] = PAPER_PINNED) -> dict[str, Any]:
    """The bridge's request for one interval (see ``tools/pollux/pollux_bridge.py``): the nodes,
    and each job as an :class:`AllocJob` without its oracle, plus the paper's pins
    (``pinned``: application -> (max replicas, fixed batch size))."""
    if not math.isfinite(now):
        raise ValueError(f"now is {now}, not a finite number")
    return {
        "now": now,
        "resource": RESOURCE_GPU,
        "nodes": [{"index": n.index, "gpus": n.gpus} for n in nodes],
        "jobs": [_job(j, pinned) for j in jobs],
    }


def _int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def allocations_of(reply: Any) -> dict[str, Allocation]:
    """The allocations of a bridge reply; :class:`PeerError` for an error reply or a
    malformed one."""
    if not isinstance(reply, dict):
        raise PeerError(f"Pollux bridge replied {reply!r}, not an object")
    if "error" in reply:
        raise PeerError(f"Pollux bridge: {reply['error']}")
    allocs = reply.get("allocations")
    if not isinstance(allocs, dict):
        raise PeerError(f"Pollux bridge reply has no 'allocations' object: {_tail(repr(reply), 300)}")
    out: dict[str, Allocation] = {}
    for jid, a in allocs.items():
        ok = (isinstance(a, dict) and isinstance(a.get("nodes"), list) and all(_int(i) for i in a["nodes"])
              and _int(a.get("atomic_bsz")) and _int(a.get("accum_steps")))
        if not ok:
            raise PeerError(f"Pollux bridge: malformed allocation of job {jid}: {a!r}")
        out[jid] = Allocation(tuple(a["nodes"]), a["atomic_bsz"], a["accum_steps"])
    return out


# ---------------------------------------------------------------------------- the process
def _stop(proc: subprocess.Popen, err) -> None:
    """End the bridge (closing its stdin ends it; kill it if it does not)."""
    try:
        if proc.poll() is None:
            try:
                proc.stdin.close()
            except OSError as e:
                log.debug("closing the Pollux bridge's stdin: %s", e)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for f in (proc.stdin, proc.stdout):
            if f is not None and not f.closed:
                f.close()
    finally:
        err.close()


class PolluxAllocator:
    """The released Pollux policy (``adaptdl-sched`` :data:`RELEASE`) run in a bridge
    process; one policy instance (and its genetic algorithm's population) serves every
    interval, as in Pollux's scheduler.

    ``python``: the Pollux environment's interpreter (default :func:`default_python`).
    ``seed``: seeds the genetic algorithm. ``pinned``: applications the setup pins
    (:data:`PAPER_PINNED`). ``cluster``: ``"fixed"`` (default) keeps every node and adds
    none, as the paper's evaluation; ``"autoscale"`` calls the policy as the released
    allocator does, which may leave nodes empty to shrink the cluster (see the bridge). ``timeout``: seconds to wait for one reply (None: no limit).
    Close it (``close()``, a ``with`` block, or letting it be collected) to end the
    bridge. ``last_info``: the bridge's note on the last call (``desired_nodes``,
    ``seconds`` spent in the bridge, ``fits`` of throughput models);
    ``call_seconds``: wall time of every call."""

    name = "pollux"
    clairvoyant = False
    type_aware = False

    def __init__(self, python: str | os.PathLike | None = None, *, seed: int = 0,
                 pinned: Mapping[str, tuple[int, int]] = PAPER_PINNED, cluster: str = "fixed",
                 timeout: float | None = None, start_timeout: float = 300.0) -> None:
        if cluster not in CLUSTER_MODES:
            raise ValueError(f"cluster must be one of {CLUSTER_MODES}, got {cluster!r}")
        self.python = Path(python) if python is not None else default_python()
        self.cluster = cluster
        self.seed = int(seed)
        self.pinned = dict(pinned)
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.versions: dict[str, Any] = {}
        self.last_info: dict[str, Any] = {}
        self.call_seconds: list[float] = []
        self._proc: subprocess.Popen | None = None
        self._err = None
        self._buf = b""
        self._finalizer: weakref.finalize | None = None

    # -------------------------------------------------------------- lifecycle
    def _start(self) -> subprocess.Popen:
        if self._proc is not None:
            return self._proc
        why = _missing(self.python)
        if why:
            raise PeerUnavailable(why)
        err = tempfile.TemporaryFile(prefix="pollux-bridge-", suffix=".stderr")
        try:
            proc = subprocess.Popen([str(self.python), str(BRIDGE), "--seed", str(self.seed), "--cluster", self.cluster], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, env=_child_env(), bufsize=0)
        except OSError as e:
            err.close()
            raise PeerUnavailable(f"cannot start {self.python} ({e}); {_HINT}") from None
        self._proc, self._err, self._buf = proc, err, b""
        self._finalizer = weakref.finalize(self, _stop, proc, err)
        try:
            hello = self._recv(self.start_timeout)
        except PeerError as e:
            self.close()
            raise PeerUnavailable(f"the Pollux bridge did not start: {e}; {_HINT}") from None
        if "error" in hello:
            msg = f"the Pollux bridge did not start: {hello['error']}"
            self.close()
            raise PeerUnavailable(msg)
        if hello.get("protocol") != PROTOCOL or not hello.get("ready"):
            self.close()
            raise PeerError(f"the Pollux bridge speaks {hello!r}, expected protocol {PROTOCOL}")
        self.versions = dict(hello.get("versions") or {})
        log.info("Pollux bridge started: %s", self.versions)
        return proc

    def start(self) -> dict[str, Any]:
        """Start the bridge now (``allocate`` does on its first call); the versions it found."""
        self._start()
        return self.versions

    def close(self) -> None:
        """End the bridge process (idempotent)."""
        if self._finalizer is not None:
            self._finalizer()
        self._proc, self._err, self._finalizer = None, None, None

    def __enter__(self) -> "PolluxAllocator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -------------------------------------------------------------- I/O
    def _stderr_tail(self) -> str:
        if self._err is None:
            return ""
        try:
            self._err.flush()
            self._err.seek(0)
            return _tail(self._err.read().decode("utf-8", "replace"))
        except (OSError, ValueError) as e:
            return f"(stderr unreadable: {e})"

    def _died(self, what: str) -> PeerError:
        proc = self._proc
        code = proc.poll() if proc is not None else None
        if proc is not None and code is None:
            proc.kill()
            code = proc.wait()
        tail = self._stderr_tail()
        self.close()
        return PeerError(f"Pollux bridge {what} (exit code {code}); its stderr: {tail or '(empty)'}")

    def _recv(self, timeout: float | None) -> dict[str, Any]:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise self._died(f"gave no reply within {timeout} s")
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    raise self._died("exited")
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except ValueError:
            raise self._died(f"wrote a line that is not JSON: {_tail(line.decode('utf-8', 'replace'), 300)!r}") from None
        if not isinstance(reply, dict):
            raise self._died(f"wrote {reply!r}, not an object")
        return reply

    def request(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request (a JSON object) and return the bridge's reply as it is."""
        proc = self._start()
        data = (json.dumps(payload, allow_nan=False) + "\n").encode()
        try:
            proc.stdin.write(data)
        except (BrokenPipeError, OSError) as e:
            raise self._died(f"stopped reading ({e})") from None
        return self._recv(self.timeout)

    # -------------------------------------------------------------- Allocator
    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float) -> dict[str, Allocation]:
        t0 = time.perf_counter()
        payload = request_of(jobs, nodes, now, self.pinned)
        reply = self.request(payload)
        result = allocations_of(reply)
        check_allocations(jobs, nodes, result)
        self.last_info = dict(reply.get("info") or {})
        self.call_seconds.append(time.perf_counter() - t0)
        return result
