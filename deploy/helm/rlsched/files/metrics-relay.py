"""Metrics relay of the rlsched scheduler pod (standard library only, one thread).

The extender listens on 127.0.0.1 so that only the kube-scheduler in the same pod can
call /filter and /prioritize. This relay republishes the read-only endpoints (GET or
HEAD /metrics, /healthz, /readyz, /version) on all interfaces, for Prometheus; any
other path is answered 404, any other method 405, and neither reaches the extender.
(The kubelet probes the extender directly, with an exec probe in its own container.)

    python metrics-relay.py --listen 0.0.0.0:8889 --upstream http://127.0.0.1:8888

One asyncio event loop serves every connection, one request per connection (answers
carry ``Connection: close``), and each client costs a bounded amount of memory:

- at most --max-connections open client connections; at the cap the connection that
  has waited longest without sending a whole request is closed to make room, so a
  flood of idle or half-open connections cannot lock Prometheus out;
- the request head must arrive within --header-timeout seconds and be at most
  --max-header-bytes long (else 408 or 431); no progress for --idle-timeout seconds,
  while reading the head or writing the answer, closes the connection;
- the answer is streamed from the extender in 64 KiB chunks, never buffered whole; the
  extender gets --timeout seconds to answer (else 504; 502 when unreachable).

Logs (stderr): the settings at start, one line per answer that is not 2xx and per
extender failure, and once a minute, when anything was closed early, how many
connections the timeouts and the cap closed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import re
import signal
import sys
import urllib.parse

ALLOWED = frozenset({"/metrics", "/healthz", "/readyz", "/version"})
METHODS = frozenset({"GET", "HEAD"})
CHUNK = 64 * 1024
MAX_ACCEPT_BYTES = 512
SUMMARY_EVERY_S = 60.0
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_REASONS = {400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
            431: "Request Header Fields Too Large", 502: "Bad Gateway", 503: "Service Unavailable",
            504: "Gateway Timeout"}

log = logging.getLogger("metrics-relay")


class HeadError(Exception):
    """The client's request head cannot be served; ``status`` is the HTTP answer."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


class Relay:
    """The relay's state: the open client connections and what happened to them."""

    def __init__(self, upstream: str, *, max_connections: int, header_timeout: float, idle_timeout: float,
                 upstream_timeout: float, max_header_bytes: int) -> None:
        self.up_host, self.up_port, self.up_hostport = parse_upstream(upstream)
        self.max_connections = max_connections
        self.header_timeout, self.idle_timeout = header_timeout, idle_timeout
        self.upstream_timeout, self.max_header_bytes = upstream_timeout, max_header_bytes
        #: every open client connection
        self.clients: set[asyncio.StreamWriter] = set()
        #: connections still waiting for their request head, oldest first
        self.waiting: dict[asyncio.StreamWriter, None] = {}
        self.counts: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------ connections
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients.add(writer)
        done = False
        try:
            if len(self.clients) > self.max_connections and not self._make_room():
                self.counts["refused at the cap"] += 1
                await self._answer(writer, 503, "connection limit reached\n")
                return
            self.waiting[writer] = None
            try:
                method, target, accept = await self._read_head(reader)
            except HeadError as exc:
                if writer in self.waiting:  # not closed by _make_room (counted there)
                    self.counts[str(exc)] += 1
                    if exc.status:
                        await self._answer(writer, exc.status, f"{exc}\n", level=logging.INFO)
                        done = True
                return
            finally:
                self.waiting.pop(writer, None)
            path = target.split("?", 1)[0]
            if method not in METHODS:
                self.counts["refused: method"] += 1
                await self._answer(writer, 405, "only GET and HEAD are relayed\n", method, target,
                                   extra=b"Allow: GET, HEAD\r\n", level=logging.INFO)
            elif path not in ALLOWED:
                self.counts["refused: path"] += 1
                await self._answer(writer, 404, "not relayed\n", method, target, level=logging.INFO)
            else:
                await self._relay(writer, method, target, accept)
            done = True
        except (ConnectionError, TimeoutError) as exc:
            self.counts["client gone or stalled while answered"] += 1
            log.debug("client %s: %r", _peer(writer), exc)
        finally:
            try:
                await self._close(writer, done)
            finally:
                self.clients.discard(writer)

    async def _close(self, writer: asyncio.StreamWriter, graceful: bool) -> None:
        """Close after the answer is flushed (at most --idle-timeout), else at once."""
        if graceful:
            writer.close()
            try:
                async with asyncio.timeout(self.idle_timeout):
                    await writer.wait_closed()
                return
            except (ConnectionError, TimeoutError) as exc:
                log.debug("client %s: %r on close", _peer(writer), exc)
        writer.transport.abort()

    def _make_room(self) -> bool:
        """Close the connection that has waited longest for its request head."""
        if not self.waiting:
            return False
        oldest = next(iter(self.waiting))
        del self.waiting[oldest]
        oldest.transport.abort()
        self.counts["closed idle at the cap"] += 1
        return True

    async def _read_head(self, reader: asyncio.StreamReader) -> tuple[str, str, str | None]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.header_timeout
        buf = bytearray()
        while True:
            m = _HEAD_END.search(buf)
            if m:
                break
            if len(buf) > self.max_header_bytes:
                raise HeadError(431, "request head too large")
            left = deadline - loop.time()
            try:
                async with asyncio.timeout(min(self.idle_timeout, max(left, 0.0))):
                    chunk = await reader.read(4096)
            except TimeoutError:
                if loop.time() >= deadline:
                    raise HeadError(408 if buf else 0, "closed by the header timeout") from None
                raise HeadError(408 if buf else 0, "closed by the idle timeout") from None
            except ConnectionError:
                raise HeadError(0, "client gone before its request") from None
            if not chunk:
                raise HeadError(0, "client gone before its request")
            buf += chunk
        if m.start() > self.max_header_bytes:
            raise HeadError(431, "request head too large")
        lines = bytes(buf[:m.start()]).decode("latin-1").splitlines()
        parts = lines[0].split(" ") if lines else []
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/") \
                or not (parts[1].isascii() and parts[1].isprintable()):
            raise HeadError(400, "malformed request line")
        accept = None
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep and name.strip().lower() == "accept":
                value = value.strip()
                if len(value) <= MAX_ACCEPT_BYTES and value.isascii() and value.isprintable():
                    accept = value
        return parts[0], parts[1], accept

    # ------------------------------------------------------------------ answers
    async def _relay(self, writer: asyncio.StreamWriter, method: str, target: str, accept: str | None) -> None:
        up_writer = None
        try:
            try:
                async with asyncio.timeout(self.upstream_timeout):
                    up_reader, up_writer = await asyncio.open_connection(self.up_host, self.up_port, limit=CHUNK)
                    head = f"{method} {target} HTTP/1.1\r\nHost: {self.up_hostport}\r\nConnection: close\r\n"
                    if accept:
                        head += f"Accept: {accept}\r\n"
                    up_writer.write((head + "\r\n").encode("latin-1"))
                    await up_writer.drain()
                    chunk = await up_reader.read(CHUNK)
            except TimeoutError:
                self.counts["extender timed out"] += 1
                await self._answer(writer, 504, "the extender did not answer in time\n", method, target)
                return
            except OSError as exc:
                self.counts["extender unreachable"] += 1
                await self._answer(writer, 502, f"extender unreachable: {exc}\n", method, target)
                return
            if not chunk:
                self.counts["extender closed without answering"] += 1
                await self._answer(writer, 502, "the extender closed the connection without an answer\n",
                                   method, target)
                return
            status = chunk.split(b"\r\n", 1)[0].decode("latin-1", "replace")
            if not re.match(r"HTTP/1\.[01] 2\d\d", status):
                log.warning("%s %s %s: extender answered %r", _peer(writer), method, target, status[:80])
            while chunk:
                writer.write(chunk)
                async with asyncio.timeout(self.idle_timeout):  # a stalled client: TimeoutError
                    await writer.drain()
                try:
                    async with asyncio.timeout(self.upstream_timeout):
                        chunk = await up_reader.read(CHUNK)
                except (OSError, TimeoutError) as exc:
                    self.counts["extender failed mid-answer"] += 1
                    log.warning("%s %s %s: extender failed mid-answer: %r", _peer(writer), method, target, exc)
                    return
            self.counts["relayed"] += 1
        finally:
            if up_writer is not None:
                up_writer.transport.abort()

    async def _answer(self, writer: asyncio.StreamWriter, status: int, body: str, method: str = "-",
                      target: str = "-", extra: bytes = b"", level: int = logging.WARNING) -> None:
        data = body.encode()
        log.log(level, "%s %s %.200s: %d %s", _peer(writer), method, target, status, body.strip())
        writer.write(f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\n".encode() +
                     b"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n" + extra +
                     f"Content-Length: {len(data)}\r\n\r\n".encode() + (b"" if method == "HEAD" else data))
        async with asyncio.timeout(self.idle_timeout):
            await writer.drain()

    async def finish_answers(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until every open connection is one still
        waiting for its request head: answers under way end and are counted."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(self.clients) > len(self.waiting) and loop.time() < deadline:
            await asyncio.sleep(0.05)

    async def close_all(self, timeout_s: float = 5.0) -> None:
        """Drop every client connection and wait (at most ``timeout_s``) for their
        handlers to end."""
        for w in list(self.clients):
            w.transport.abort()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.clients and loop.time() < deadline:
            await asyncio.sleep(0.05)

    async def report(self, every_s: float = SUMMARY_EVERY_S) -> None:
        """Every ``every_s``: :meth:`summary`."""
        while True:
            await asyncio.sleep(every_s)
            self.summary(f"last {every_s:g}s")

    def summary(self, when: str) -> None:
        """Log what closed connections early and what was refused since the last
        summary (nothing when all went well), and restart the counts."""
        early = {k: v for k, v in self.counts.items() if k != "relayed"}
        if early:
            log.warning("%s: %d relayed; %s; %d connections open", when, self.counts["relayed"],
                        ", ".join(f"{v} {k}" for k, v in sorted(early.items())), len(self.clients))
        self.counts.clear()


def parse_upstream(upstream: str) -> tuple[str, int, str]:
    """``(host, port, "host:port")`` of an ``http://host:port`` URL; ValueError otherwise."""
    url = urllib.parse.urlsplit(upstream)
    if url.scheme != "http" or not url.hostname or url.path not in ("", "/") or url.query:
        raise ValueError(f"--upstream must be http://host:port, got {upstream!r}")
    return url.hostname, url.port or 80, url.netloc


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else "?"


def _raise_nofile(want: int) -> int:
    """Raise the soft limit of open files toward ``want`` (within the hard limit); the
    soft limit now in force."""
    try:
        import resource
    except ImportError:  # not POSIX
        return want
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, target, exc)
    return want if soft == resource.RLIM_INFINITY else soft


async def serve(args: argparse.Namespace) -> int:
    host, _, port = args.listen.rpartition(":")
    reserve = 64  # listening socket, upstream connections, stdio
    nofile = _raise_nofile(args.max_connections + reserve)
    max_conn = args.max_connections
    if nofile - reserve < max_conn:
        max_conn = max(1, nofile - reserve)
        log.warning("open-files limit %d: at most %d connections (asked for %d)", nofile, max_conn,
                    args.max_connections)
    relay = Relay(args.upstream, max_connections=max_conn, header_timeout=args.header_timeout,
                  idle_timeout=args.idle_timeout, upstream_timeout=args.timeout,
                  max_header_bytes=args.max_header_bytes)
    server = await asyncio.start_server(relay.handle, host or "0.0.0.0", int(port), limit=args.max_header_bytes,
                                        backlog=1024)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reporter = asyncio.create_task(relay.report())
    bound = ", ".join("%s:%d" % sock.getsockname()[:2] for sock in server.sockets)
    log.warning("listening on %s for %s (GET/HEAD %s); at most %d connections, header timeout %gs, idle "
                "timeout %gs, extender timeout %gs, request head <= %d bytes", bound, args.upstream,
                " ".join(sorted(ALLOWED)), max_conn, args.header_timeout, args.idle_timeout, args.timeout,
                args.max_header_bytes)
    async with server:
        await stop.wait()
        server.close()
        reporter.cancel()
        await relay.finish_answers(args.timeout + args.idle_timeout)
        relay.summary("at stop")
        await relay.close_all()
    log.warning("stopped")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="0.0.0.0:8889", help="host:port to serve on")
    p.add_argument("--upstream", default="http://127.0.0.1:8888", help="the extender's base URL")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds the extender gets to answer (default 5)")
    p.add_argument("--max-connections", type=int, default=2048,
                   help="open client connections at most (default 2048; about 13 MiB more when all are idle)")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds a client gets to send its request head (default 10)")
    p.add_argument("--idle-timeout", type=float, default=10.0,
                   help="seconds without progress before a connection is closed (default 10)")
    p.add_argument("--max-header-bytes", type=int, default=8192, help="longest request head (default 8192)")
    p.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING (default), ERROR")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not port.isdigit():
        p.error(f"--listen must be host:port, got {args.listen!r}")
    for name in ("timeout", "header_timeout", "idle_timeout"):
        if not getattr(args, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0")
    if args.max_connections < 1 or args.max_header_bytes < 256:
        p.error("--max-connections must be >= 1 and --max-header-bytes >= 256")
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="%(asctime)s metrics-relay %(levelname)s %(message)s")
    try:
        parse_upstream(args.upstream)
    except ValueError as exc:
        p.error(str(exc))
    try:
        return asyncio.run(serve(args))
    except OSError as exc:
        log.error("cannot serve on %s: %s", args.listen, exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
