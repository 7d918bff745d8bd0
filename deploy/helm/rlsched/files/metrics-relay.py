"""Metrics relay of the rlsched scheduler pod (standard library only).

The extender listens on 127.0.0.1 so that only the kube-scheduler in the same pod can
call /filter and /prioritize. This relay republishes the read-only endpoints
(GET /metrics, /healthz, /readyz, /version) on all interfaces, for Prometheus and the
kubelet's probes; any other path is answered 404 and never reaches the extender.

    python metrics-relay.py --listen 0.0.0.0:8889 --upstream http://127.0.0.1:8888
"""

import argparse
import http.server
import sys
import urllib.error
import urllib.request

ALLOWED = frozenset({"/metrics", "/healthz", "/readyz", "/version"})


def make_handler(upstream: str, timeout: float):
    class Relay(http.server.BaseHTTPRequestHandler):
        server_version = "rlsched-metrics-relay"

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            path = self.path.split("?", 1)[0]
            if path not in ALLOWED:
                self._send(404, b"not relayed\n", "text/plain; charset=utf-8")
                return
            try:
                with urllib.request.urlopen(upstream + self.path, timeout=timeout) as r:
                    self._send(r.status, r.read(), r.headers.get("Content-Type", "text/plain"))
            except urllib.error.HTTPError as exc:
                self._send(exc.code, exc.read(), exc.headers.get("Content-Type", "text/plain"))
            except OSError as exc:
                self._send(502, f"extender unreachable: {exc}\n".encode(), "text/plain; charset=utf-8")

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args) -> None:
            if not str(args[1] if len(args) > 1 else "").startswith("2"):
                sys.stderr.write("relay: " + (fmt % args) + "\n")

    return Relay


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="0.0.0.0:8889", help="host:port to serve on")
    p.add_argument("--upstream", default="http://127.0.0.1:8888", help="the extender's base URL")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the extender")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        p.error(f"--listen must be host:port, got {args.listen!r}")
    server = http.server.ThreadingHTTPServer((host or "0.0.0.0", int(port)), make_handler(args.upstream.rstrip("/"), args.timeout))
    server.daemon_threads = True
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
