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


def test_the_cluster_is_frozen_out_of_garbage_collection_once_synced():
    """The server's gc task waits for the caches, then freezes what they hold and sets
    the young generation's threshold; nothing before the caches are synced."""
    import asyncio
    import gc

    from rlsched.extender.cache import ClusterCache
    from rlsched.extender.cli import _freeze_when_synced

    cache = ClusterCache()
    before = gc.get_threshold()

    async def run():
        task = asyncio.create_task(_freeze_when_synced(cache, 12_345))
        await asyncio.sleep(0.2)
        frozen_early = gc.get_freeze_count()
        cache.replace_nodes(node_list(Topology.uniform(4, racks=2))["items"])
        cache.replace_pods([])
        for _ in range(100):
            await asyncio.sleep(0.02)
            if gc.get_freeze_count() > frozen_early:
                break
        task.cancel()
        return frozen_early, gc.get_freeze_count(), gc.get_threshold()[0]

    try:
        frozen_early, frozen, gen0 = asyncio.run(run())
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
    assert frozen_early == 0 and frozen > 0 and gen0 == 12_345


def test_gc_gen0_must_be_positive():
    out = subprocess.run([sys.executable, "-m", "rlsched.cli", "extender", "serve", "--gc-gen0", "0"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "--gc-gen0: must be at least 1" in out.stderr
