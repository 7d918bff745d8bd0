"""The served app's connection limits (issue 12 item 7: there was no header or idle
timeout, so a slowloris holding headers open or idle keep-alives could pin the server).
Raw sockets against a real server on a free loopback port; what is asserted is that a
connection is closed (or served), never how fast."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from rlsched.extender.app import make_app
from rlsched.extender.server import ServeLimits, serve_app

#: generous bound on waiting for the server to act; the assertions are about what it did
WAIT = 20.0
GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.fixture
async def serve(extender):
    started = []

    async def start(**limits):
        srv = await serve_app(make_app(extender, read_timeout=5.0), "127.0.0.1", 0, ServeLimits(**limits),
                              metrics=extender.metrics)
        started.append(srv)
        return srv

    yield start
    for srv in started:
        await srv.close()


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Read until the server closes the connection; True when it did (EOF or reset)."""
    try:
        while await asyncio.wait_for(reader.read(65536), WAIT):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    return True


async def answer(reader: asyncio.StreamReader) -> bytes:
    """One HTTP response (headers and a Content-Length body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return head + await asyncio.wait_for(reader.readexactly(length), WAIT)


def closed_count(extender, reason: str) -> float:
    return extender.metrics.connections_closed.labels(reason=reason)._value.get()


async def test_half_a_header_line_is_closed(serve, extender, caplog):
    srv = await serve(header_timeout=0.3, idle_timeout=60.0)
    with caplog.at_level(logging.DEBUG):
        reader, writer = await asyncio.open_connection(srv.host, srv.port)
        writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Ty")  # and then nothing
        await writer.drain()
        assert await closed_by_server(reader)
        writer.close()
    assert closed_count(extender, "header_timeout") == 1
    assert any("no complete request headers" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


async def test_a_connection_that_sends_nothing_is_closed(serve, extender):
    srv = await serve(header_timeout=0.3, idle_timeout=60.0)
    reader, writer = await asyncio.open_connection(srv.host, srv.port)
    assert await closed_by_server(reader)
    writer.close()
    assert closed_count(extender, "header_timeout") == 1


async def test_a_trickling_slowloris_is_closed(serve, extender):
    """Bytes that keep coming do not extend the deadline: it is for complete headers."""
    srv = await serve(header_timeout=0.5, idle_timeout=60.0)
    reader, writer = await asyncio.open_connection(srv.host, srv.port)
    writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()

    async def trickle():
        try:
            for _ in range(int(WAIT / 0.05)):
                writer.write(b"X-A: b\r\n")
                await writer.drain()
                await asyncio.sleep(0.05)
        except (ConnectionResetError, BrokenPipeError):
            pass

    task = asyncio.create_task(trickle())
    assert await closed_by_server(reader)
    task.cancel()
    writer.close()
    assert closed_count(extender, "header_timeout") == 1


async def test_kept_alive_connection_idles_past_the_header_timeout_then_closes(serve, extender, make_pod, args_for):
    """After a response, the connection is idle (idle timeout), not waiting for headers:
    kube-scheduler's keep-alive connections survive a pause longer than the header
    timeout; the next request's headers are then held to the header timeout again, and
    an idle connection is closed after the idle timeout."""
    srv = await serve(header_timeout=0.2, idle_timeout=60.0)
    reader, writer = await asyncio.open_connection(srv.host, srv.port)
    body = orjson.dumps(args_for(make_pod(), ["node-00"]))
    writer.write(b"POST /prioritize HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    assert b'"Score":10' in await answer(reader)
    await asyncio.sleep(0.6)  # three header timeouts of idleness
    writer.write(GET)
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    writer.write(b"GET /healthz HTTP/1.1\r\nHo")  # the next request, cut short
    assert await closed_by_server(reader)
    writer.close()
    assert closed_count(extender, "header_timeout") == 1

    srv = await serve(header_timeout=5.0, idle_timeout=0.3)
    reader, writer = await asyncio.open_connection(srv.host, srv.port)
    writer.write(GET)
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    assert await closed_by_server(reader)  # idle: closed by aiohttp's keep-alive timer
    writer.close()


async def test_connections_over_the_limit_are_refused_and_others_served(serve, extender, caplog):
    srv = await serve(header_timeout=30.0, idle_timeout=60.0, max_connections=3)
    conns = [await asyncio.open_connection(srv.host, srv.port) for _ in range(3)]
    for reader, writer in conns:  # established and served
        writer.write(GET)
        assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    assert srv.connections == 3
    with caplog.at_level(logging.DEBUG):
        reader, writer = await asyncio.open_connection(srv.host, srv.port)
        assert await closed_by_server(reader)  # the fourth
        writer.close()
    assert closed_count(extender, "limit") == 1
    assert any("refusing new ones" in r.getMessage() for r in caplog.records)
    reader, writer = conns[0]
    writer.write(GET)  # the others keep their connections
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    conns[1][1].close()  # one leaves: room for a new one
    for _ in range(int(WAIT / 0.01)):
        if srv.connections < 3:
            break
        await asyncio.sleep(0.01)
    reader, writer = await asyncio.open_connection(srv.host, srv.port)
    writer.write(GET)
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    text = extender.metrics.render().decode()
    assert "rlsched_extender_open_connections 3.0" in text
    writer.close()
    for _, w in conns:
        w.close()


def test_limits_are_checked():
    for bad in ({"header_timeout": 0}, {"idle_timeout": -1}, {"max_connections": 0}):
        with pytest.raises(ValueError):
            ServeLimits(**bad)
