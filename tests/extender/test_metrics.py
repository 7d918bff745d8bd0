"""Metrics, and fallbacks that are logged and counted."""

from __future__ import annotations

import logging

import orjson

from rlsched.core import Topology
from rlsched.core.das import DASParams
from rlsched.extender.app import make_app
from rlsched.extender.config import build_extender, node_list


def metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no sample {line_start!r} in metrics")


async def test_request_metrics(client, make_pod, args_for, topology, extender):
    names = [n.name for n in topology.nodes]
    extender.cache.upsert_pod(make_pod("w-0", gpus=2, job="tj", node="node-00"))
    for verb in ("filter", "prioritize", "prioritize"):
        await client.post(f"/{verb}", data=orjson.dumps(args_for(make_pod("w-1", gpus=2, job="tj"), names)))
    await client.post("/filter", data=b"nope")
    r = await client.get("/metrics")
    assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
    text = (await r.read()).decode()
    assert metric(text, 'rlsched_extender_request_duration_seconds_count{verb="prioritize"}') == 2
    assert metric(text, 'rlsched_extender_request_duration_seconds_count{verb="filter"}') == 2
    assert metric(text, 'rlsched_extender_nodes_per_request_sum{verb="prioritize"}') == 32
    scores = sum(metric(text, f'rlsched_extender_scores_total{{score="{s}"}}')
                 for s in range(11) if f'score="{s}"' in text)
    assert scores == 32
    assert metric(text, 'rlsched_extender_errors_total{code="400",verb="filter"}') == 1
    assert metric(text, "rlsched_extender_assumed_pods") == 1
    assert 0 <= metric(text, "rlsched_extender_cache_age_seconds") < 60
    assert 'rlsched_extender_model_info{fallback="false",policy="das",version="default"} 1.0' in text


async def test_corrupt_model_falls_back_logged_and_counted(tmp_path, aiohttp_client, caplog, make_pod, args_for):
    bad = tmp_path / "das.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    with caplog.at_level(logging.WARNING, logger="rlsched.extender"):
        ext = build_extender("das", model=bad)
    assert any("falling back to default parameters" in r.getMessage() for r in caplog.records)
    assert ext.policy.params == DASParams()
    ext.cache.replace_nodes(node_list(Topology.uniform(4))["items"])
    ext.cache.replace_pods([])
    client = await aiohttp_client(make_app(ext))
    # it still schedules
    r = await client.post("/prioritize", data=orjson.dumps(args_for(make_pod(), ["node-0", "node-1"])))
    assert r.status == 200
    text = (await (await client.get("/metrics")).read()).decode()
    assert metric(text, 'rlsched_extender_policy_fallbacks_total{reason="model_load"}') == 1
    assert 'fallback="true"' in text
    v = orjson.loads(await (await client.get("/version")).read())
    assert "cannot read DAS model" in v["policy_fallback"]


async def test_missing_model_file_falls_back(tmp_path):
    ext = build_extender("das", model=tmp_path / "nowhere.safetensors")
    assert "does not exist" in ext.policy_fallback


async def test_policy_error_uses_the_fallback_heuristic(client, extender, make_pod, args_for, caplog):
    def broken(*a, **k):
        raise RuntimeError("boom")

    extender.policy.components = broken
    with caplog.at_level(logging.ERROR):
        r = await client.post("/prioritize", data=orjson.dumps(args_for(make_pod(gpus=2), ["node-00", "node-01"])))
    assert r.status == 200
    assert len(orjson.loads(await r.read())) == 2
    assert any("using fallback" in rec.getMessage() for rec in caplog.records)
    text = (await (await client.get("/metrics")).read()).decode()
    assert metric(text, 'rlsched_extender_policy_fallbacks_total{reason="policy_error"}') == 1
    dbg = orjson.loads(await (await client.get("/debug/pods/team-a/w-0")).read())
    assert dbg["prioritize"]["policy"] == extender.fallback.name != "das"
