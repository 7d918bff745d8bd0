"""Bad requests get 400/408/413 with a clear message, and the server keeps serving."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from rlsched.extender.app import make_app


async def still_serving(client, make_pod, args_for) -> None:
    r = await client.post("/prioritize", data=orjson.dumps(args_for(make_pod(), ["node-00"])))
    assert r.status == 200 and orjson.loads(await r.read()) == [{"Host": "node-00", "Score": 10}]


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b"{}", "Pod is required"),
        (b'{"Pod": {}}', "both are null"),
        (b'{"Pod": {}, "Nodes": null, "NodeNames": null}', "both are null"),
        (b'{"Pod": [], "NodeNames": []}', "Pod must be an object"),
        (b'{"Pod": {}, "NodeNames": "node-00"}', "NodeNames must be an array"),
        (b'{"Pod": {}, "NodeNames": [1]}', "NodeNames[0]"),
        (b'{"Pod": {}, "NodeNames": [""]}', "NodeNames[0]"),
        (b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}', "Nodes.items[0].metadata.name"),
        (b'{"Pod": {}, "Nodes": {"items": 3}}', "Nodes.items must be an array"),
        (b'{"Pod": {"spec": {"containers": "x"}}, "NodeNames": []}', "Pod.spec.containers"),
        (b'{"Pod": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1.5"}}}]}}, "NodeNames": []}',
         "not a whole number of GPUs"),
        (b'{"Pod": {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": -1}}}]}}, "NodeNames": []}',
         "out of range"),
        (b'{"Pod": {"metadata": {"labels": {"a": 1}}}, "NodeNames": []}', "labels['a']"),
        (b'{"Pod": {"metadata": "x"}, "NodeNames": []}', "Pod.metadata"),
        (b'{"Pod": {"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": '
         b'{"nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", '
         b'"values": [{}]}]}]}}}}}, "NodeNames": []}', "values"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_malformed_requests_get_400(client, make_pod, args_for, verb, body, message):
    r = await client.post(f"/{verb}", data=body, headers={"Content-Type": "application/json"})
    assert r.status == 400
    doc = orjson.loads(await r.read())
    assert message in doc["Error"] and doc["Error"].startswith(verb)
    await still_serving(client, make_pod, args_for)


async def test_fifty_megabyte_body_gets_413(client, make_pod, args_for, extender):
    big = b'{"Pod": {}, "NodeNames": ["' + b"x" * (50 * 1024 * 1024) + b'"]}'
    r = await client.post("/prioritize", data=big)
    assert r.status == 413
    assert "larger than" in orjson.loads(await r.read())["Error"]

    async def chunks():  # no Content-Length: refused while reading
        for _ in range(50):
            yield b"x" * (1024 * 1024)

    r = await client.post("/filter", data=chunks())
    assert r.status == 413
    await still_serving(client, make_pod, args_for)
    text = (await (await client.get("/metrics")).read()).decode()
    assert 'rlsched_extender_errors_total{code="413",verb="prioritize"} 1.0' in text


async def test_slow_client_times_out_while_others_are_served(aiohttp_client, extender, make_pod, args_for):
    client = await aiohttp_client(make_app(extender, read_timeout=0.5))
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"Pod\": ")
    await writer.drain()
    # meanwhile the server answers everyone else
    for _ in range(3):
        await still_serving(client, make_pod, args_for)
    head = await asyncio.wait_for(reader.read(4096), 5.0)
    assert head.startswith(b"HTTP/1.1 408")
    assert b"not received within 0.5s" in head
    writer.close()
    await still_serving(client, make_pod, args_for)


async def test_unknown_paths_and_methods(client):
    assert (await client.get("/filter")).status == 405
    assert (await client.post("/nope", data=b"{}")).status == 404
