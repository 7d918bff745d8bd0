"""The extender/v1 wire format, as kube-scheduler sends and reads it."""

from __future__ import annotations

import orjson

from rlsched.core.cluster import JobView
from rlsched.extender.config import node_list

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


async def test_filter_node_cache_capable(client, make_pod, args_for, topology):
    names = [n.name for n in topology.nodes]
    r = await client.post("/filter", data=orjson.dumps(args_for(make_pod(gpus=2), names)),
                          headers={"Content-Type": "application/json"})
    assert r.status == 200 and r.content_type == "application/json"
    body = orjson.loads(await r.read())
    assert set(body) == FILTER_KEYS
    assert body["Nodes"] is None and body["NodeNames"] == names
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {} and body["Error"] == ""


async def test_filter_with_full_node_objects_answers_with_nodes(client, make_pod, topology):
    items = node_list(topology)["items"][:3]
    args = {"Pod": make_pod(gpus=9), "Nodes": {"metadata": {}, "items": items}, "NodeNames": None}
    body = orjson.loads(await (await client.post("/filter", data=orjson.dumps(args))).read())
    # 9 GPUs never fit an 8-GPU node: unresolvable, and the NodeList comes back empty
    assert body["Nodes"] == {"metadata": {}, "items": []}
    assert set(body["FailedAndUnresolvableNodes"]) == {i["metadata"]["name"] for i in items}
    args["Pod"] = make_pod(gpus=8)
    body = orjson.loads(await (await client.post("/filter", data=orjson.dumps(args))).read())
    assert [i["metadata"]["name"] for i in body["Nodes"]["items"]] == [i["metadata"]["name"] for i in items]
    assert body["Nodes"]["items"][0] == items[0]


async def test_prioritize_host_priority_list_in_request_order(client, make_pod, args_for, topology):
    names = [n.name for n in reversed(topology.nodes)]
    r = await client.post("/prioritize", data=orjson.dumps(args_for(make_pod(gpus=1), names)))
    assert r.status == 200
    body = orjson.loads(await r.read())
    assert [h["Host"] for h in body] == names
    assert all(set(h) == {"Host", "Score"} and isinstance(h["Score"], int) and 0 <= h["Score"] <= 10 for h in body)


async def test_gang_worker_scores_follow_topology(client, make_pod, args_for, topology, extender):
    # worker 0 of job "tj" runs on node-05 (rack 1, block 0)
    extender.cache.upsert_pod(make_pod("w-0", gpus=2, job="tj", node="node-05"))
    names = [n.name for n in topology.nodes]
    body = orjson.loads(await (await client.post(
        "/prioritize", data=orjson.dumps(args_for(make_pod("w-1", gpus=2, job="tj"), names)))).read())
    score = {h["Host"]: h["Score"] for h in body}
    assert score["node-05"] == 10
    assert score["node-05"] > score["node-04"] > score["node-00"] > score["node-08"]
    assert score["node-08"] == 0
    # the decision is explained on the debug endpoint
    dbg = orjson.loads(await (await client.get("/debug/pods/team-a/w-1")).read())
    assert dbg["prioritize"]["placed_workers"] == ["node-05"]
    assert dbg["prioritize"]["assumed_node"] == "node-05"
    assert dbg["prioritize"]["top"][0]["node"] == "node-05"
    assert {"compact", "room", "perf", "pack", "raw", "score"} <= set(dbg["prioritize"]["top"][0])


async def test_unknown_nodes_fail_with_a_reason_not_an_error(client, make_pod, args_for):
    body = orjson.loads(await (await client.post(
        "/filter", data=orjson.dumps(args_for(make_pod(), ["node-00", "ghost"])))).read())
    assert body["NodeNames"] == ["node-00"]
    assert "unknown node" in body["FailedNodes"]["ghost"]
    assert body["Error"] == ""
    prio = orjson.loads(await (await client.post(
        "/prioritize", data=orjson.dumps(args_for(make_pod(), ["ghost", "node-00"])))).read())
    assert prio == [{"Host": "ghost", "Score": 0}, {"Host": "node-00", "Score": 10}]


async def test_get_endpoints(client, extender):
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    extender.cache.synced["pods"] = False
    r = await client.get("/readyz")
    assert r.status == 503 and "pods" in await r.text()
    v = orjson.loads(await (await client.get("/version")).read())
    assert v["policy"] == "das" and v["policy_fallback"] is None
    assert (await client.get("/debug/pods/team-a/never-seen")).status == 404


async def test_bind_without_api_access_reports_an_error(client):
    args = {"PodName": "w-0", "PodNamespace": "team-a", "PodUID": "u", "Node": "node-00"}
    r = await client.post("/bind", data=orjson.dumps(args))
    assert r.status == 200
    assert "not available" in orjson.loads(await r.read())["Error"]
    r = await client.post("/bind", data=orjson.dumps({"PodName": "w-0"}))
    assert r.status == 400


async def test_bind_counts_the_pod_on_its_node(client, extender, make_pod, args_for, topology):
    bound = []

    async def binder(args):
        bound.append((args.key, args.node))

    extender.binder = binder
    names = [n.name for n in topology.nodes]
    await client.post("/prioritize", data=orjson.dumps(args_for(make_pod("w-0", gpus=8, job="tj"), names)))
    r = await client.post("/bind", data=orjson.dumps(
        {"PodName": "w-0", "PodNamespace": "team-a", "PodUID": "u", "Node": "node-09"}))
    assert orjson.loads(await r.read()) == {"Error": ""}
    assert bound == [("team-a/w-0", "node-09")]
    body = orjson.loads(await (await client.post(
        "/filter", data=orjson.dumps(args_for(make_pod("w-1", gpus=1, job="tj"), names)))).read())
    assert "node-09" in body["FailedNodes"] and "node-00" not in body["FailedNodes"]


async def test_prioritize_a_tie_goes_to_the_node_the_policy_places_on(client, make_pod, args_for, topology, extender):
    """kube-scheduler picks at random among nodes of equal score, so on a tie the
    policy's own choice (lowest node index among the best, what ``Placement.place`` and
    so the simulator pick) must be alone at the top; found by the twin check, where a
    scale-up worker went to the other of two equal nodes live and a preemption later
    needed two victims instead of one."""
    names = [n.name for n in reversed(topology.nodes)]  # request order is not index order
    body = orjson.loads(await (await client.post(
        "/prioritize", data=orjson.dumps(args_for(make_pod("w-0", gpus=2, job="tie"), names)))).read())
    score = {h["Host"]: h["Score"] for h in body}
    st = extender.cache.state()
    view = JobView(id="tie", submit_time=0.0, gpus_per_worker=2, workers=1, max_workers=1)
    extender.cache.forget("team-a/w-0")
    (want,) = extender.policy.place(view, st, workers=1)
    raw = extender.policy.score(view, st.candidates(2, None), st)
    assert (raw == raw.max()).sum() > 1  # a tie indeed
    top = [n for n, s in score.items() if s == 10]
    assert top == [topology.nodes[want].name] == ["node-00"]
    assert all(s == 9 for n, s in score.items() if n != "node-00")
    dbg = orjson.loads(await (await client.get("/debug/pods/team-a/w-0")).read())
    assert dbg["prioritize"]["assumed_node"] == "node-00"
