"""The extender serves every placement it lists, the trained DAS placement agent
(``das-agent``) included: its model resolved as the operator resolves it, its version
and any fallback reported like DAS's."""

from __future__ import annotations

import json
import logging

import orjson
import pytest

from rlsched.core import Topology
from rlsched.core.das import resolve_placement_model
from rlsched.core.das_agent import DASAgentPlacement
from rlsched.extender.app import make_app
from rlsched.extender.cli import SERVED_POLICIES
from rlsched.extender.config import POLICIES, build_extender, node_list


def test_the_command_line_offers_every_served_policy():
    assert SERVED_POLICIES == POLICIES and "das-agent" in POLICIES


@pytest.mark.parametrize("policy", POLICIES)
def test_every_listed_policy_is_served(policy, make_pod, args_for):
    ext = build_extender(policy, resolve_placement_model(policy, None))
    assert ext.policy.name == policy and ext.policy_fallback is None
    ext.cache.replace_nodes(node_list(Topology.uniform(8, racks=2))["items"])
    ext.cache.replace_pods([])
    scores = ext.prioritize_now(ext.decode(orjson.dumps(args_for(make_pod(gpus=2), [f"node-{i}" for i in range(8)]))))
    assert len(scores) == 8 and max(scores) > 0


async def test_das_agent_reports_its_model_version(aiohttp_client):
    model = resolve_placement_model("das-agent", None)
    assert model is not None and model.endswith("das.safetensors")
    ext = build_extender("das-agent", model)
    want = json.loads(open(model.replace(".safetensors", ".json")).read())["version"]
    assert isinstance(ext.policy, DASAgentPlacement) and ext.model_version == want
    client = await aiohttp_client(make_app(ext))
    v = orjson.loads(await (await client.get("/version")).read())
    assert v["policy"] == "das-agent" and v["model_version"] == want and v["policy_fallback"] is None


def test_a_corrupt_das_agent_model_falls_back_to_first_fit_logged(tmp_path, caplog):
    bad = tmp_path / "das.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")
    with caplog.at_level(logging.WARNING):
        ext = build_extender("das-agent", str(bad))
    assert ext.policy_fallback
    assert any("das-agent model not used, falling back to first fit" in r.getMessage() for r in caplog.records)


def test_the_chart_accepts_exactly_the_served_policies():
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parents[2] / "deploy/helm/rlsched/values.schema.json").read_text())
    policy = schema["properties"]["scheduler"]["properties"]["extender"]["properties"]["policy"]
    assert tuple(policy["enum"]) == POLICIES
