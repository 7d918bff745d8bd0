"""`rlsched extender serve --static-nodes` as its own process."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import orjson

from rlsched.core import Topology
from rlsched.extender.config import node_list


def test_serve_static_nodes_answers_and_stops_on_sigterm(tmp_path, make_pod):
    nodes = tmp_path / "nodes.json"
    nodes.write_bytes(orjson.dumps(node_list(Topology.uniform(4, racks=2))))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "rlsched.cli", "extender", "serve", "--port", str(port),
                             "--static-nodes", str(nodes), "--policy", "firstfit", "--header-timeout", "0.5",
                             "--idle-timeout", "100", "--max-connections", "50", "--debug-mib", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/readyz", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
                time.sleep(0.1)
        body = json.dumps({"Pod": make_pod(gpus=1), "Nodes": None,
                           "NodeNames": ["node-3", "node-0", "node-1"]}).encode()
        req = urllib.request.Request(f"{url}/prioritize", data=body, headers={"Content-Type": "application/json"})
        scores = json.loads(urllib.request.urlopen(req, timeout=5).read())
        # FirstFit: the lowest node index scores highest
        assert [h["Host"] for h in scores] == ["node-3", "node-0", "node-1"]
        assert scores[1]["Score"] == 10 and scores[0]["Score"] == 0
        v = json.loads(urllib.request.urlopen(f"{url}/version", timeout=5).read())
        assert v["policy"] == "firstfit"
        # --header-timeout: half a header line, then nothing: the server closes the connection
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Le")
            try:
                assert s.recv(4096) == b""
            except ConnectionResetError:
                pass
        text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
        assert 'rlsched_extender_connections_closed_total{reason="header_timeout"} 1.0' in text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
