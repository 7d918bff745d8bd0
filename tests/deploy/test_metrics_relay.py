"""The metrics relay of the scheduler pod (``deploy/helm/rlsched/files/metrics-relay.py``)
as a subprocess in front of a tiny upstream: it relays only the read-only endpoints,
holds 2,000 idle and half-open connections within its 64 Mi memory limit while still
answering, closes idle connections after its timeouts and makes room at its cap.

Issue 12, item 7: the thread-per-connection relay it replaced fell over at 2,000
half-open connections (77 MB)."""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

RELAY = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "rlsched" / "files" / "metrics-relay.py"
LIMIT_MIB = 64  # the chart's memory limit of the relay container
METRICS = b"# HELP rlsched_up test\n# TYPE rlsched_up gauge\nrlsched_up 1\n"


class _Upstream(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        self.seen: list[tuple[str, str, str | None]] = []  # (method, path, Accept)
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        self.server.seen.append((self.command, self.path, self.headers.get("Accept")))
        body = METRICS if self.path.startswith("/metrics") else b"ok\n"
        status = 503 if self.path == "/readyz" and getattr(self.server, "unready", False) else 200
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()
        time.sleep(getattr(self.server, "linger_s", 0.0))  # the answer sent, the connection kept a while

    do_HEAD = do_GET
    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    srv = _Upstream()
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def relay(tmp_path):
    """``relay(upstream_url, *args)`` starts the relay on 127.0.0.1 (a free port it
    reports); returns ``(base_url, process, log_path)``. Stopped with SIGTERM at the end."""
    procs = []

    def _start(upstream_url: str, *args: str):
        log = tmp_path / f"relay-{len(procs)}.log"
        fh = open(log, "w")
        proc = subprocess.Popen([sys.executable, str(RELAY), "--listen=127.0.0.1:0", f"--upstream={upstream_url}",
                                 "--log-level=INFO", *args], stderr=fh, stdout=fh)
        procs.append((proc, fh))
        deadline = time.monotonic() + 30
        while True:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", log.read_text())
            if m:
                return f"http://127.0.0.1:{m.group(1)}", proc, log
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "relay did not start:\n" + log.read_text()
            time.sleep(0.05)

    yield _start
    for proc, fh in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        fh.close()


def _url(srv: _Upstream) -> str:
    return "http://127.0.0.1:%d" % srv.server_address[1]


def _get(url: str, method: str = "GET", headers: dict | None = None, data: bytes | None = None):
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def _raw(base: str, payload: bytes) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(payload)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _sockets(pid: int) -> int:
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return n


def _wait(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (last := fn()):
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}; last {last!r}"
        time.sleep(0.1)
    return last


def _stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)


@pytest.fixture
def many_files():
    """Room for 2,000 client sockets here and 2,000 in the relay (which inherits it):
    the soft limit of open files raised within the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 8192 if hard == resource.RLIM_INFINITY else min(8192, hard)
    assert want >= 4200, f"the hard limit of open files ({hard}) cannot hold 2,000 connections on each side"
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# ----------------------------------------------------------------------------- tests
def test_relays_the_read_endpoints_and_nothing_else(upstream, relay):
    base, proc, log = relay(_url(upstream))
    status, body, headers = _get(f"{base}/metrics", headers={"Accept": "application/openmetrics-text"})
    assert (status, body) == (200, METRICS)
    assert headers["Content-Type"] == "text/plain; version=0.0.4"
    assert upstream.seen[-1] == ("GET", "/metrics", "application/openmetrics-text")  # content negotiation kept
    for path in ("/healthz", "/readyz", "/version", "/metrics?name[]=rlsched_up"):
        assert _get(base + path)[0] == 200, path
    assert _get(f"{base}/healthz", method="HEAD")[0] == 200
    upstream.unready = True
    assert _get(f"{base}/readyz")[0] == 503  # the extender's answer, relayed as is
    n = len(upstream.seen)
    # the extender's scheduling endpoints and anything else never reach it
    assert _get(f"{base}/filter", method="POST", data=b"{}")[0] == 405
    assert _get(f"{base}/filter")[0] == 404
    assert _get(f"{base}/prioritize")[0] == 404
    assert _get(f"{base}/metrics/../filter")[0] == 404
    assert _raw(base, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 10000 + b"\r\n\r\n").startswith(b"HTTP/1.1 431 ")
    assert _raw(base, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert _raw(base, b"GET http://evil/metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert len(upstream.seen) == n
    assert proc.poll() is None
    _stop(proc)
    text = log.read_text()
    assert "POST /filter: 405" in text and "GET /prioritize: 404" in text, text  # one line per refusal
    assert "at stop:" in text and "refused: path" in text, text  # and a summary


def test_a_stop_lets_an_answer_under_way_finish_and_counts_it(upstream, relay):
    base, proc, log = relay(_url(upstream))
    assert _get(f"{base}/filter")[0] == 404
    upstream.linger_s = 1.5  # the client has its answer; the relay still waits for the extender to close
    assert _get(f"{base}/metrics")[:2] == (200, METRICS)
    _stop(proc)
    assert re.search(r"at stop: 1 relayed; 1 refused: path; 0 connections open", log.read_text()), log.read_text()


def test_extender_unreachable_or_slow_is_a_gateway_error(relay):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    base, proc, log = relay(f"http://127.0.0.1:{closed}")
    status, body, _ = _get(f"{base}/healthz")
    assert status == 502 and b"extender unreachable" in body
    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        base2, _, _ = relay(f"http://127.0.0.1:{silent.getsockname()[1]}", "--timeout=1")
        assert _get(f"{base2}/metrics")[0] == 504
    assert "502 extender unreachable" in log.read_text()


def test_holds_2000_idle_and_half_open_connections_within_its_memory_limit(upstream, relay, many_files):
    base, proc, log = relay(_url(upstream), "--header-timeout=600", "--idle-timeout=600")
    host, port = base.removeprefix("http://").split(":")
    rest, own = _rss_mib(proc.pid), _sockets(proc.pid)  # listener, the event loop's self-pipe
    clients = []
    try:
        for i in range(2000):
            s = socket.create_connection((host, int(port)), timeout=10)
            if i % 2:  # half-open: a request head begun, never finished
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: relay\r\n")
            clients.append(s)
        _wait(lambda: _sockets(proc.pid) - own >= 2000, 60, "the relay to hold 2,000 connections")
        status, body, _ = _get(f"{base}/metrics")
        assert (status, body) == (200, METRICS)
        held, rss = _sockets(proc.pid) - own, _rss_mib(proc.pid)
        assert held >= 2000, held  # nobody was dropped to answer
        assert rss < LIMIT_MIB, f"relay RSS {rss:.1f} MiB with {held} sockets (at rest {rest:.1f} MiB)"
        print(f"relay RSS: {rest:.1f} MiB at rest, {rss:.1f} MiB holding {held} sockets")
        assert proc.poll() is None
    finally:
        for s in clients:
            s.close()


class _Ends:
    """What the relay sent on each socket before closing it (polled without blocking)."""

    def __init__(self, socks):
        self.socks, self.got, self.closed = socks, {s: b"" for s in socks}, set()
        for s in socks:
            s.setblocking(False)

    def poll(self) -> bool:
        """True once the relay closed every socket."""
        for s in self.socks:
            while s not in self.closed:
                try:
                    chunk = s.recv(4096)
                except BlockingIOError:
                    break
                except ConnectionError:
                    chunk = b""
                if chunk:
                    self.got[s] += chunk
                else:
                    self.closed.add(s)
        return len(self.closed) == len(self.socks)


def test_idle_and_slow_connections_are_closed_after_the_timeouts(upstream, relay):
    base, proc, log = relay(_url(upstream), "--header-timeout=3", "--idle-timeout=1")
    host, port = base.removeprefix("http://").split(":")
    silent = [socket.create_connection((host, int(port))) for _ in range(50)]
    partial = [socket.create_connection((host, int(port))) for _ in range(50)]
    for s in partial:
        s.sendall(b"GET /metrics HTTP/1.1\r\n")
    slow = socket.create_connection((host, int(port)))  # a byte every 0.3 s, never done
    try:
        ends = _Ends([slow])
        deadline = time.monotonic() + 60
        while not ends.poll():
            assert time.monotonic() < deadline, "a client trickling its head past the header timeout was kept"
            with contextlib.suppress(OSError):
                slow.send(b"X")
            time.sleep(0.3)
        assert ends.got[slow].startswith(b"HTTP/1.1 408 ")
        ends = _Ends(silent + partial)
        _wait(ends.poll, 60, "every idle connection closed")
        assert [ends.got[s] for s in silent] == [b""] * 50  # silent ones: closed without a word
        assert all(ends.got[s].startswith(b"HTTP/1.1 408 ") for s in partial), ends.got[partial[0]]  # begun: 408
        assert _get(f"{base}/metrics")[0] == 200  # and the relay still serves
    finally:
        for s in silent + partial + [slow]:
            s.close()
    _stop(proc)
    text = log.read_text()
    assert re.search(r"at stop: 1 relayed;.*\b\d+ closed by the idle timeout", text), text
    assert "1 closed by the header timeout" in text, text


def test_at_the_cap_the_longest_idle_connection_makes_room(upstream, relay):
    base, proc, log = relay(_url(upstream), "--max-connections=40", "--header-timeout=600", "--idle-timeout=600")
    host, port = base.removeprefix("http://").split(":")
    own = _sockets(proc.pid)
    idle = [socket.create_connection((host, int(port))) for _ in range(40)]
    try:
        _wait(lambda: _sockets(proc.pid) - own >= 40, 30, "40 connections held")
        assert _get(f"{base}/metrics")[0] == 200
        # the oldest made room, the newer ones are still open
        _wait(_Ends(idle[:1]).poll, 30, "the oldest connection closed")
        rest = _Ends(idle[10:])
        assert not rest.poll() and not rest.closed
        assert _sockets(proc.pid) - own <= 40 + 2  # the answered one and its upstream may be closing
    finally:
        for s in idle:
            s.close()
    _stop(proc)
    assert re.search(r"at stop: 1 relayed;.*\b1 closed idle at the cap", log.read_text()), log.read_text()
