"""Extender latency benchmark: filter and prioritize at 100 / 1,000 / 5,000 nodes.

The extender runs in its own process (``rlsched extender serve --static-nodes``,
NodeNames mode, pinned to one CPU when the machine has two or more), the load comes
from this process over one keep-alive HTTP connection, one request at a time, as
kube-scheduler sends them. Every policy named is measured in the same run: DAS,
the FirstFit baseline, and ``stdlib-constant``, a plain standard-library HTTP server
answering constant scores, as the floor of what Python HTTP costs on this machine. Writes JSON: p50/p99/mean latency in milliseconds and
requests per second per (policy, nodes, verb).

    python bench/extender_bench.py --out bench/results/extender.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
from tqdm import tqdm

from rlsched.core import Topology
from rlsched.core.contract import LABEL_INDEX, LABEL_JOB, RESOURCE_GPU
from rlsched.extender.config import node_list


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_file(nodes: int, directory: Path) -> tuple[Path, list[str]]:
    """A NodeList of ``nodes`` 8-GPU nodes (32 per rack, 8 racks per block) plus two
    running workers of job ``bench`` and a third of another job, as a YAML-free JSON."""
    racks = max(1, nodes // 32)
    topo = Topology.uniform(nodes, gpus_per_node=8, racks=racks, blocks=max(1, racks // 8))
    items = node_list(topo)["items"]
    pods = []
    for k, (job, i) in enumerate([("bench", 3), ("bench", 4), ("other", nodes // 2)]):
        pods.append({"kind": "Pod", "metadata": {"name": f"run-{k}", "namespace": "bench", "labels": {LABEL_JOB: job}},
                     "spec": {"nodeName": topo.nodes[i].name,
                              "containers": [{"name": "c", "resources": {"requests": {RESOURCE_GPU: "2"}}}]},
                     "status": {"phase": "Running"}})
    path = directory / f"nodes-{nodes}.json"
    path.write_bytes(orjson.dumps({"kind": "List", "items": items + pods}))
    return path, [n.name for n in topo.nodes]


def request_body(names: list[str]) -> bytes:
    pod = {
        "metadata": {"name": "bench-w2", "namespace": "bench", "uid": "u-bench",
                     "labels": {LABEL_JOB: "bench", LABEL_INDEX: "2"}},
        "spec": {"schedulerName": "rlsched",
                 "containers": [{"name": "trainer", "image": "x",
                                 "resources": {"requests": {RESOURCE_GPU: "2", "cpu": "4"},
                                               "limits": {RESOURCE_GPU: "2"}}}]},
        "status": {"phase": "Pending"},
    }
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


def serve_baseline(port: int) -> None:
    """Reference point: a standard-library HTTP/1.1 server that parses the request and
    answers constant scores (every node passes filter), no policy, no cache."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True
        wbufsize = -1  # one send per reply (no Nagle / delayed-ACK stall)

        def log_message(self, *args):
            pass

        def do_GET(self):
            self._reply(b"ok")

        def do_POST(self):
            args = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            names = args["NodeNames"]
            if self.path == "/filter":
                out = {"Nodes": None, "NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
            else:
                out = [{"Host": n, "Score": 5} for n in names]
            self._reply(json.dumps(out).encode())

        def _reply(self, body: bytes) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()


def start_server(policy: str, static: Path, port: int, cpu: int | None) -> subprocess.Popen:
    def pin():  # runs in the child before exec
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    if policy == "stdlib-constant":
        argv = [sys.executable, __file__, "--serve-baseline", str(port)]
    else:
        argv = [sys.executable, "-m", "rlsched.cli", "extender", "serve", "--port", str(port), "--static-nodes",
                str(static), "--policy", policy, "--log-level", "WARNING"]
    proc = subprocess.Popen(argv, preexec_fn=pin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"extender exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/readyz")
            if c.getresponse().status == 200:
                c.close()
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("extender not ready after 60s")


def measure(port: int, verb: str, body: bytes, requests: int, warmup: int) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json"}
    lat = np.empty(requests)
    for i in range(warmup + requests):
        t0 = time.perf_counter()
        conn.request("POST", f"/{verb}", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        dt = time.perf_counter() - t0
        if resp.status != 200:
            raise RuntimeError(f"{verb}: HTTP {resp.status}: {data[:300]!r}")
        if i >= warmup:
            lat[i - warmup] = dt
    conn.close()
    total = float(lat.sum())
    return {
        "requests": requests,
        "p50_ms": float(np.percentile(lat, 50) * 1e3),
        "p99_ms": float(np.percentile(lat, 99) * 1e3),
        "mean_ms": float(lat.mean() * 1e3),
        "max_ms": float(lat.max() * 1e3),
        "requests_per_s": requests / total,
        "response_bytes": len(data),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,5000")
    ap.add_argument("--policies", default="das,firstfit,stdlib-constant",
                    help="placement policies; stdlib-constant is the plain-HTTP reference server")
    ap.add_argument("--no-pin", action="store_true", help="do not pin server and client to one CPU each")
    ap.add_argument("--serve-baseline", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=2000, help="measured requests per (policy, size, verb)")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--out", default="bench/results/extender.json")
    args = ap.parse_args(argv)
    if args.serve_baseline:
        serve_baseline(args.serve_baseline)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    policies = [p.strip() for p in args.policies.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = (cpus[0], cpus[1]) if len(cpus) >= 2 and not args.no_pin else (None, None)
    if client_cpu is not None:
        os.sched_setaffinity(0, {client_cpu})
    results = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="rlsched-bench-") as tmp:
        bar = tqdm(total=len(sizes) * len(policies) * 2, desc="extender bench", unit="run")
        for nodes in sizes:
            static, names = cluster_file(nodes, Path(tmp))
            body = request_body(names)
            n_req = max(200, args.requests * 1000 // max(nodes, 1000))
            for policy in policies:
                port = free_port()
                proc = start_server(policy, static, port, server_cpu)
                try:
                    for verb in ("filter", "prioritize"):
                        r = measure(port, verb, body, n_req, args.warmup)
                        results.append({"policy": policy, "nodes": nodes, "verb": verb, **r})
                        bar.set_postfix(nodes=nodes, policy=policy, verb=verb, p99=f"{r['p99_ms']:.2f}ms")
                        bar.update()
                finally:
                    proc.terminate()
                    proc.wait(10)
        bar.close()
    doc = {
        "benchmark": "extender",
        "mode": "NodeNames (nodeCacheCapable), one keep-alive connection, sequential requests",
        "machine": {"cpus": os.cpu_count(), "server_cpu": server_cpu, "client_cpu": client_cpu,
                    "python": platform.python_version(), "loadavg_before": load_before,
                    "loadavg_after": os.getloadavg()},
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    width = max(len(p) for p in policies)
    for r in results:
        print(f"{r['policy']:<{width}} {r['nodes']:>5} nodes {r['verb']:<10} p50 {r['p50_ms']:6.2f} ms  "
              f"p99 {r['p99_ms']:6.2f} ms  {r['requests_per_s']:7.0f} req/s")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
