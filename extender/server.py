"""Serving the extender's aiohttp app on TCP, with the limits aiohttp lacks.

As Go's ``net/http`` server does: a deadline for request headers (``header_timeout``,
against slowloris), an idle timeout longer than kube-scheduler's client's own
(``idle_timeout``) and a cap on connections (``max_connections``), kept by a small
:class:`asyncio.Protocol` in front of aiohttp's handler. Details: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .metrics import ExtenderMetrics

__all__ = ["ServeLimits", "Served", "serve_app"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServeLimits:
    """Connection limits of the served app (see the module's description)."""

    header_timeout: float = 10.0
    idle_timeout: float = 120.0
    max_connections: int = 1024
    #: how long stopping waits for requests under way
    shutdown_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.header_timeout <= 0 or self.idle_timeout <= 0 or self.shutdown_timeout < 0:
            raise ValueError("header_timeout and idle_timeout must be positive, shutdown_timeout not negative")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")


class _ServerLog(logging.LoggerAdapter):
    """aiohttp's server logger, except that malformed HTTP from a client (which aiohttp
    answers with 400 itself) is logged as one line at info level."""

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else sys.exc_info()[1]
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 400) < 500:
            self.logger.info(f"{msg}: %s", *args, " ".join(str(exc).split())[:300])
        else:
            self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)


_HEADERS, _BUSY, _IDLE = "headers", "busy", "idle"


class _Pool:
    """The open connections of one served app."""

    def __init__(self, server: web.Server, limits: ServeLimits, metrics: ExtenderMetrics | None) -> None:
        self.server = server
        self.limits = limits
        self.metrics = metrics
        self.open: dict[Any, _Guard] = {}  # aiohttp RequestHandler -> its guard
        self.refused = 0
        self.header_timeouts = 0
        self._full = False

    def count(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.connections_closed.labels(reason=reason).inc()


class _Guard(asyncio.Protocol):
    """In front of one aiohttp request handler: forwards every call, keeps the header
    deadline, and refuses the connection when the pool is full."""

    __slots__ = ("_pool", "_inner", "_transport", "_timer", "_state", "_peer")

    def __init__(self, pool: _Pool) -> None:
        self._pool = pool
        self._inner: Any = None
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._state = _HEADERS
        self._peer: Any = None

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        pool = self._pool
        self._transport = transport  # type: ignore[assignment]
        self._peer = transport.get_extra_info("peername")
        if len(pool.open) >= pool.limits.max_connections:
            pool.refused += 1
            pool.count("limit")
            if not pool._full:
                log.warning("%d connections open, the limit: refusing new ones until some close",
                            pool.limits.max_connections)
                pool._full = True
            else:
                log.debug("refused connection from %s: %d connections open", self._peer, len(pool.open))
            transport.abort()
            return
        self._inner = pool.server()
        pool.open[self._inner] = self
        self._arm()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is None:
            return
        if self._state is _IDLE:  # the first bytes of the next request
            self._state = _HEADERS
            self._arm()
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        inner, self._inner = self._inner, None
        if inner is None:
            return
        pool = self._pool
        pool.open.pop(inner, None)
        if pool._full and len(pool.open) < pool.limits.max_connections:
            pool._full = False
        inner.connection_lost(exc)

    # ---------------------------------------------------------------- requests
    def request_started(self) -> None:
        self._state = _BUSY
        self._disarm()

    def request_done(self) -> None:
        self._state = _IDLE  # aiohttp's keep-alive timer closes it if nothing follows

    # ---------------------------------------------------------------- header deadline
    def _arm(self) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._pool.limits.header_timeout, self._expire)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self._state is not _HEADERS or self._transport is None:
            return
        self._pool.header_timeouts += 1
        self._pool.count("header_timeout")
        log.debug("closing connection from %s: no complete request headers within %gs",
                  self._peer, self._pool.limits.header_timeout)
        self._transport.abort()


@dataclass(slots=True)
class Served:
    """A running server: its address, and :meth:`close` to stop it."""

    host: str
    port: int
    runner: web.AppRunner
    server: asyncio.AbstractServer
    pool: _Pool

    @property
    def connections(self) -> int:
        return len(self.pool.open)

    async def close(self) -> None:
        self.server.close()
        await self.runner.cleanup()


async def serve_app(
    app: web.Application,
    host: str,
    port: int,
    limits: ServeLimits | None = None,
    metrics: ExtenderMetrics | None = None,
) -> Served:
    """Serve ``app`` on ``host:port`` (port 0: a free one) with ``limits``; connection
    counts go to ``metrics`` when given."""
    limits = limits or ServeLimits()
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=limits.idle_timeout,
        shutdown_timeout=limits.shutdown_timeout,
        logger=_ServerLog(logging.getLogger("aiohttp.server"), {}),
    )
    await runner.setup()
    server = runner.server
    assert server is not None
    pool = _Pool(server, limits, metrics)
    handle = server.request_handler

    async def guarded(request: web.BaseRequest) -> web.StreamResponse:
        guard = pool.open.get(request.protocol)
        if guard is not None:
            guard.request_started()
        try:
            return await handle(request)
        finally:
            if guard is not None:
                guard.request_done()

    server.request_handler = guarded  # read by each connection's handler when it is made
    if metrics is not None:
        metrics.connections.set_function(lambda: len(pool.open))
    loop = asyncio.get_running_loop()
    try:
        aserver = await loop.create_server(lambda: _Guard(pool), host, port)
    except BaseException:
        await runner.cleanup()
        raise
    bound = aserver.sockets[0].getsockname()[1] if aserver.sockets else port
    return Served(host=host, port=bound, runner=runner, server=aserver, pool=pool)
