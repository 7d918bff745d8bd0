"""Memory kept across requests is bounded by bytes, not by the number of entries
(issue 12 item 7: 60 requests with 8 MB pod names took the extender from 129 to 596 MB
of RSS, because what it kept for /debug, bind and its caches held names of any size)."""

from __future__ import annotations

import gc
import tracemalloc

import aiohttp
import numpy as np
import orjson
import pytest

from rlsched.core import Topology
from rlsched.extender.app import make_app
from rlsched.extender.config import build_extender, node_list
from rlsched.extender.memory import ByteLRU
from rlsched.extender.server import serve_app
from rlsched.extender.wire import NodeTable, encode_priorities

MiB = 1024 * 1024
BUDGET = 2 * MiB


def byte_heavy_requests(make_pod, args_for, names: list[str]):
    """60 requests of about 4-8 MB each (under the 10 MiB body limit), each with new
    content: oversized names, labels, annotations, model constraints, candidate lists."""
    big = 8 * MiB

    def pod(name, **kw):
        p = make_pod(name, **kw)
        p["metadata"]["uid"] = "u"  # make_pod derives it from the name
        return p

    for i in range(10):
        tag = f"{i:02d}"
        # a pod name of 8 MB (not a valid name: refused, unschedulable)
        yield "filter", args_for(pod(tag + "n" * big), names)
        # a valid pod whose model-constraint annotation is 8 MB (quoted in failure reasons)
        yield "filter", args_for(pod(f"m-{tag}", annotations={"rlsched.dev/gpu-models": tag + "Z" * big}), names)
        # a valid pod with an 8 MB label and an 8 MB annotation the extender does not read
        p = pod(f"l-{tag}", job=f"job-{tag}", annotations={"example.com/blob": tag + "b" * (big // 2)})
        p["metadata"]["labels"]["example.com/blob"] = tag + "l" * (big // 2)
        yield "prioritize", args_for(p, names)
        # 20,000 new, valid, unknown node names of 200 characters (4 MB): candidate-list
        # cache, score-entry cache and /debug all see them
        many = [f"{tag}-{k:06d}-" + "x" * 190 for k in range(20_000)]
        yield "filter", args_for(pod(f"u-{tag}", gpus=1), names[:2] + many)
        yield "prioritize", args_for(pod(f"u-{tag}", gpus=1), names[:2] + many)
        # an 8 MB job label value (invalid: more than 63 characters)
        yield "prioritize", args_for(pod(f"j-{tag}", job=tag + "j" * big), names)


@pytest.fixture
async def small_budget_client():
    """An extender with 2 MiB budgets, served on loopback, and a plain client session
    (aiohttp's test client keeps every response it got)."""
    topo = Topology.uniform(16, gpus_per_node=8, racks=4, blocks=2)
    ext = build_extender("das", debug_bytes=BUDGET, index_cache_bytes=BUDGET)
    ext.cache.replace_nodes(node_list(topo)["items"])
    ext.cache.replace_pods([])
    served = await serve_app(make_app(ext, max_body=10 * MiB), "127.0.0.1", 0)
    async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{served.port}") as session:
        yield ext, session, [n.name for n in topo.nodes]
    await served.close()


async def test_byte_heavy_requests_leave_retained_memory_bounded(small_budget_client, make_pod, args_for):
    ext, client, names = small_budget_client
    for verb in ("filter", "prioritize"):  # warm up: imports, first allocations
        r = await client.post(f"/{verb}", data=orjson.dumps(args_for(make_pod("warm"), names)))
        assert r.status == 200
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        sent = 0
        for verb, doc in byte_heavy_requests(make_pod, args_for, names):
            body = orjson.dumps(doc)
            assert len(body) < 10 * MiB
            sent += len(body)
            del doc
            async with client.post(f"/{verb}", data=body) as r:
                assert r.status == 200, await r.text()
                await r.read()
            del body, r
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert sent > 300 * MiB  # what was sent: 60 byte-heavy requests
    # what is kept: within the three budgets (/debug, candidate lists, score entries)
    # plus bind's small per-pod table and slack for the allocator and the test client
    assert ext.retained_bytes() <= 3 * BUDGET + 64 * 1024
    print(f"retained {grown / MiB:.1f} MiB (tracemalloc), {ext.retained_bytes() / MiB:.1f} MiB (accounted) after sending {sent / MiB:.0f} MiB")
    assert grown < 3 * BUDGET + 16 * MiB, f"{grown / MiB:.1f} MiB retained after sending {sent / MiB:.0f} MiB"
    text = (await (await client.get("/metrics")).read()).decode()
    assert 'rlsched_extender_invalid_pods_total{verb="filter"} 10.0' in text
    assert 'rlsched_extender_invalid_pods_total{verb="prioritize"} 10.0' in text
    # valid pods are still explained (the budget keeps the newest)
    doc = await (await client.get("/debug/pods/team-a/u-09")).json()
    assert doc["prioritize"]["candidates"] == 20_002


def test_byte_lru_holds_bytes_not_entries():
    lru: ByteLRU[str, bytes] = ByteLRU(max_bytes=10_000, max_entries=100)
    for i in range(50):
        assert lru.put(f"k{i}", b"x" * 1000, 1000)
    assert lru.bytes <= 10_000 and 5 <= len(lru) < 10
    assert "k49" in lru and "k0" not in lru  # oldest dropped first
    assert lru.get("k45") is not None  # touched: now the newest
    assert not lru.put("huge", b"", 20_000) and "huge" not in lru and lru.refused == 1
    assert lru.pop("k45") == b"x" * 1000 and "k45" not in lru
    before = lru.bytes
    lru.put("k48", b"y", 10)  # replacing an entry releases its old size
    assert lru.bytes < before
    with pytest.raises(ValueError):
        ByteLRU(0, 1)



def test_node_table_keeps_whole_entries_only_within_its_budget():
    """The per-topology table keeps every node's 11 score entries only when they fit
    ``max_bytes``; else heads only, with the same bytes on the wire."""
    names = [f"n{k}-" + "n" * 200 for k in range(5000)]  # 1 MB of names
    scores = np.array([k % 11 for k in range(len(names))])
    small = NodeTable(names, max_bytes=1 * MiB)
    assert small._entries is None and small.bytes < 3 * MiB
    large = NodeTable(names, max_bytes=64 * MiB)
    assert large._entries is not None and large.bytes > 11 * MiB
    plain = encode_priorities(names, scores.tolist())
    for table in (small, large):
        assert table.encode_priorities(names, table.lookup(names), scores) == plain
    # remembered candidate lists are pointers to the table's strings, a few at most
    for k in range(10):
        small.lookup(names[k:])
    assert len(small._recent) == NodeTable.RECENT
    assert small.retained_bytes() - small.bytes <= NodeTable.RECENT * (16 * len(names) + 120)
