"""Schemathesis against extender/openapi.yaml, on a loopback server of the real app."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings

from rlsched.core import Topology
from rlsched.extender.app import make_app
from rlsched.extender.config import build_extender, node_list

SPEC = Path(__file__).resolve().parents[2] / "extender" / "openapi.yaml"
schema = schemathesis.openapi.from_path(SPEC)


@pytest.fixture(scope="module")
def server_url():
    """The extender app served on 127.0.0.1 from its own thread and event loop."""
    ext = build_extender("das")
    ext.cache.replace_nodes(node_list(Topology.uniform(8, racks=2))["items"])
    ext.cache.replace_pods([])
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict = {}

    async def start():
        runner = web.AppRunner(make_app(ext, read_timeout=5.0), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["runner"] = runner
        box["port"] = site._server.sockets[0].getsockname()[1]
        ready.set()

    def run():
        loop.run_until_complete(start())
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10), "loopback server did not start"
    yield f"http://127.0.0.1:{box['port']}"
    asyncio.run_coroutine_threadsafe(box["runner"].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    t.join(10)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_openapi(case, server_url):
    case.call_and_validate(base_url=server_url)
