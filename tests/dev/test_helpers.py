"""The dev tooling's one helper each: processes (groups, waiting, log tail), the HTTP
probe, and where programs and the chart are found. No cluster needed."""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlsched_dev.demo import find_chart
from rlsched_dev.probe import http_ok
from rlsched_dev.proc import ClusterError, Process, alive, free_ports, tail, wait_for
from rlsched_dev.tools import REQUIRED_TOOLS, find_program, find_tools

ROOT = Path(__file__).resolve().parents[2]


def _group_members(pgid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                out.append(int(entry))
    return out


def test_process_leads_its_group_and_stop_ends_the_whole_group(tmp_path):
    proc = Process("sleeper", ["sh", "-c", "sleep 60 & echo started; wait"], tmp_path / "logs" / "sleeper.log")
    proc.start(tmp_path)
    assert proc.pid is not None and os.getpgid(proc.pid) == proc.pid
    wait_for(lambda: len(_group_members(proc.pid)) >= 2, 10, "the background sleep", proc)
    members = _group_members(proc.pid)
    proc.stop(grace=2)
    assert proc.exited() is not None
    assert [p for p in members if alive(p)] == []
    assert "started" in tail(proc.log)


def test_wait_for_reports_an_exited_process_with_its_log(tmp_path):
    proc = Process("broken", [sys.executable, "-c", "import sys; print('E0101 bad flag --nope', file=sys.stderr); sys.exit(3)"],
                   tmp_path / "broken.log")
    proc.start(tmp_path)
    with pytest.raises(ClusterError) as err:
        wait_for(lambda: False, 30, "broken /healthz", proc)
    msg = str(err.value)
    assert "broken" in msg and "exited with status 3" in msg and "bad flag --nope" in msg


def test_wait_for_times_out_naming_what_it_waited_for():
    with pytest.raises(ClusterError, match="timed out after 0s waiting for the moon"):
        wait_for(lambda: False, 0.2, "the moon")
    calls = []
    wait_for(lambda: calls.append(1) or len(calls) >= 3, 5, "three calls", every=0.01)
    assert len(calls) == 3


def test_tail_gives_the_last_lines(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    assert tail(log).splitlines() == [f"line {i}" for i in range(20, 50)]
    assert tail(log, 2) == "line 48\nline 49"
    assert tail(tmp_path / "missing.log") == "(no log)"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        status = 200 if self.path == "/healthz" else 503
        body = b"ok" if status == 200 else b"not ready"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_http_probe():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert http_ok(f"{base}/healthz")
        assert http_ok(f"{base}/healthz", expect="ok")
        assert not http_ok(f"{base}/healthz", expect='"health":"true"')
        assert not http_ok(f"{base}/readyz")  # 503
    finally:
        server.shutdown()
        server.server_close()
    (port,) = free_ports(1)
    t0 = time.monotonic()
    assert not http_ok(f"http://127.0.0.1:{port}/healthz")  # nobody listens
    assert time.monotonic() - t0 < 5
    assert not http_ok("not a url")


def test_find_program_on_path_or_explicit(tmp_path):
    assert find_program("sh", "the shell") == shutil.which("sh")
    assert find_program("prometheus", "the shell", shutil.which("sh")) == shutil.which("sh")
    with pytest.raises(ClusterError, match="rlsched-no-such-program on PATH not found: install it"):
        find_program("rlsched-no-such-program", "install it")
    with pytest.raises(ClusterError, match="install it"):
        find_program("prometheus", "install it", tmp_path / "nothing")


def _fake_tools(where: Path) -> Path:
    where.mkdir(parents=True)
    for tool in REQUIRED_TOOLS:
        (where / tool).write_text("#!/bin/sh\n")
        (where / tool).chmod(0o755)
    return where


def test_find_tools_order_and_error(tmp_path, monkeypatch):
    explicit, env, on_path = (_fake_tools(tmp_path / d) for d in ("explicit", "env", "on-path"))
    monkeypatch.chdir(tmp_path)  # no tools/build.sh here
    monkeypatch.setenv("RLSCHED_TOOLS_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("RLSCHED_TOOLS_BIN", str(env))
    assert find_tools(explicit) == explicit
    assert find_tools() == env
    monkeypatch.delenv("RLSCHED_TOOLS_BIN")
    monkeypatch.setenv("PATH", f"{on_path}{os.pathsep}{os.environ['PATH']}")
    assert find_tools() == on_path
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ClusterError, match="make tools"):
        find_tools()


def test_chart_is_found_from_the_current_directory_or_named(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert find_chart() == ROOT / "deploy" / "helm" / "rlsched"
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ClusterError, match="--chart"):
        find_chart()
    assert find_chart(ROOT / "deploy" / "helm" / "rlsched") == ROOT / "deploy" / "helm" / "rlsched"
