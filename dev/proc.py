"""Local processes of the dev tooling: start one in its own process group, wait for it,
stop its whole group, read the tail of its log.

Every component the local control plane and the demo run (etcd, kube-apiserver, the
schedulers, kwok, the extender, the operator, Prometheus, ...) is a :class:`Process`:
a child leading its own process group, its output in a log file. :func:`wait_for`
polls a readiness check while watching that the processes it depends on are still
alive; :func:`stop_process_group` ends a group (SIGTERM, then SIGKILL). Errors carry
the last lines of the failing component's log (:func:`tail`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

__all__ = [
    "ClusterError",
    "Process",
    "alive",
    "free_ports",
    "port_free",
    "started_in",
    "stop_process_group",
    "tail",
    "wait_for",
]


class ClusterError(RuntimeError):
    """The local cluster failed: a component (a control-plane process, or one the demo
    runs on it) did not start, exited, or did not become ready; or a tool it needs is
    missing."""


# --------------------------------------------------------------------------- ports
def free_ports(n: int) -> list[int]:
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


def port_free(port: int) -> bool:
    """True when ``port`` can be bound on 127.0.0.1 right now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# --------------------------------------------------------------------------- logs
def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of the log file ``path`` (``(no log)`` when unreadable)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


# --------------------------------------------------------------------------- processes
_PRCTL = None


def _prctl():
    """libc's ``prctl``, looked up in the parent: a child forked from a process with
    several threads (the cluster's supervisor thread restarts components) must not
    dlopen anything before exec (another thread may have held the loader's lock)."""
    global _PRCTL
    if _PRCTL is None:
        import ctypes

        _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
    return _PRCTL


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the parent dies (Linux prctl)."""
    PR_SET_PDEATHSIG = 1
    assert _PRCTL is not None
    _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


@dataclass
class Process:
    """One component: a child in its own process group, output appended to ``log``.

    Unless ``detach``, the child is tied to this process (it gets SIGTERM when the
    thread that started it dies, e.g. a test run killed mid-way); detached ones outlive
    us (``rlsched cluster up``, ``rlsched demo up --keep``). A handle made from a
    recorded ``pid`` alone (``popen`` None) can still be checked and stopped.
    """

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen | None = None
    pid: int | None = None
    detach: bool = False

    def start(self, cwd: Path, env: Mapping[str, str] | None = None) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        tie = None if self.detach or not sys.platform.startswith("linux") else _die_with_parent
        if tie is not None:
            _prctl()
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=tie, env=dict(env) if env is not None else None,
            )
        self.pid = self.popen.pid

    def exited(self) -> int | None:
        """Exit status once the process is gone (-1 when not ours to reap), else None."""
        if self.popen is not None:
            return self.popen.poll()
        return None if self.pid and alive(self.pid) else -1

    def error(self, what: str) -> ClusterError:
        rc = self.exited()
        state = f"exited with status {rc}" if rc is not None else "still running"
        return ClusterError(f"{self.name}: {what} ({state}); last lines of {self.log}:\n{tail(self.log)}")

    def check(self) -> None:
        """Raise :class:`ClusterError` with the log's tail if the process has exited."""
        if self.exited() is not None:
            raise self.error("exited")

    def stop(self, grace: float = 5.0) -> None:
        """Stop the process group (see :func:`stop_process_group`)."""
        if self.pid:
            stop_process_group(self.pid, self.popen, grace)


def wait_for(check: Callable[[], object], timeout: float, what: str,
             proc: Process | None = None, others: Iterable[Process] = (), every: float = 0.1) -> None:
    """Poll ``check()`` every ``every`` s until it is truthy.

    Raises :class:`ClusterError` as soon as ``proc`` or one of ``others`` exits, and
    after ``timeout`` s (with ``proc``'s log when one is given).
    """
    watched = [p for p in (proc, *others) if p is not None]
    deadline = time.monotonic() + timeout
    while True:
        for p in watched:
            if p.exited() is not None:
                raise p.error(f"exited while waiting for {what}")
        if check():
            return
        if time.monotonic() > deadline:
            if proc is None:
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
            raise proc.error(f"not ready after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
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


def started_in(pid: int, workdir: Path) -> bool:
    """True when ``pid`` is alive and was started with ``workdir`` as its cwd (so a
    recorded pid is ours, not a recycled one)."""
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd")).resolve() == Path(workdir).resolve()
    except OSError:
        return False
