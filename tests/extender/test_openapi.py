"""Schemathesis against extender/openapi.yaml, on a loopback server of the real app."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from rlsched.core import Topology
from rlsched.extender.config import build_extender, node_list
from rlsched.extender.server import ServeLimits

SPEC = Path(__file__).resolve().parents[2] / "extender" / "openapi.yaml"
schema = schemathesis.openapi.from_path(SPEC)


@pytest.fixture(scope="module")
def server_url(serve_in_thread):
    """The extender app served on 127.0.0.1 as the CLI serves it, from its own thread."""
    ext = build_extender("das")
    ext.cache.replace_nodes(node_list(Topology.uniform(8, racks=2))["items"])
    ext.cache.replace_pods([])
    with serve_in_thread(ext, ServeLimits(), read_timeout=5.0) as (host, port):
        yield f"http://{host}:{port}"


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_openapi(case, server_url):
    case.call_and_validate(base_url=server_url)
