"""Watch event handling (the stream itself is exercised against the real control plane
in test_e2e_k8s.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlsched.core import Topology
from rlsched.extender.cache import ClusterCache
from rlsched.extender.config import node_list
from rlsched.extender.watch import EventLines, Watcher, _Gone


def test_events_update_the_cache_and_resource_version(make_pod):
    cache = ClusterCache()
    w = Watcher(cache, api=None, rng=np.random.default_rng(0))
    node = node_list(Topology.uniform(1))["items"][0]
    node["metadata"]["resourceVersion"] = "10"
    assert w._event("nodes", {"type": "ADDED", "object": node}, "9") == "10"
    assert list(cache.nodes) == ["node-0"]
    pod = make_pod("p", gpus=3, node="node-0")
    pod["metadata"]["resourceVersion"] = "11"
    assert w._event("pods", {"type": "MODIFIED", "object": pod}, "10") == "11"
    assert cache.state().free.tolist() == [5]
    assert w._event("pods", {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}}, "11") == "12"
    assert w._event("pods", {"type": "DELETED", "object": pod}, "12") == "11"
    assert cache.state().free.tolist() == [8]
    # a malformed object is skipped, not fatal
    assert w._event("nodes", {"type": "ADDED", "object": {"metadata": {"name": 3}}}, "12") == "12"
    with pytest.raises(_Gone):
        w._event("pods", {"type": "ERROR", "object": {"kind": "Status", "code": 410}}, "12")
    with pytest.raises(RuntimeError, match="forbidden"):
        w._event("pods", {"type": "ERROR", "object": {"code": 403, "message": "forbidden"}}, "12")


def test_backoff_grows_caps_and_jitters():
    w = Watcher(ClusterCache(), api=None, rng=np.random.default_rng(1), backoff_base=0.5, backoff_cap=8.0)
    delays = [w._delay(k) for k in range(8)]
    assert all(0.25 <= d <= 0.5 for d in delays[:1])
    assert all(d <= 8.0 for d in delays) and delays[-1] >= 4.0
    assert len(set(delays)) == len(delays)


@given(st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=30),
       st.lists(st.integers(0, 60), max_size=20))
def test_a_watch_stream_is_cut_into_the_same_events_whatever_its_chunks(events, cuts):
    stream = b"".join(e + b"\n" for e in events)
    chunks, at = [], 0
    for c in cuts:
        chunks.append(stream[at:at + c])
        at += c
    chunks.append(stream[at:])
    lines = EventLines()
    got = [line for chunk in chunks for line in lines.feed(chunk)]
    assert got == [e for e in events if e.strip()]
