"""Bad input: a request that is not an ExtenderArgs gets 400/408/413 with a clear message;
a pod the extender cannot read is unschedulable (never an error, which kube-scheduler
would skip: issue 12 item 2); no client error is ever a 500 or a logged traceback
(item 7); and the server keeps serving."""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib

import orjson
import pytest

from rlsched.core.contract import gpu_count
from rlsched.extender.app import make_app
from rlsched.extender.service import MAX_REASON


async def still_serving(client, make_pod, args_for) -> None:
    r = await client.post("/prioritize", data=orjson.dumps(args_for(make_pod(), ["node-00"])))
    assert r.status == 200 and orjson.loads(await r.read()) == [{"Host": "node-00", "Score": 10}]


async def metrics_text(client) -> str:
    return (await (await client.get("/metrics")).read()).decode()


def no_tracebacks(caplog) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, [r.getMessage() for r in bad]


# ----------------------------------------------------------------- not an ExtenderArgs: 400
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
        # node names no Node can carry (DNS-1123 subdomains, at most 253 characters)
        (b'{"Pod": {}, "NodeNames": ["node-00", "Node_1"]}', "NodeNames[1]: 'Node_1' is not a valid DNS-1123 subdomain"),
        (b'{"Pod": {}, "NodeNames": ["' + b"n" * 254 + b'"]}', "more than 253"),
        (b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "a..b"}}]}}', "not a valid DNS-1123 subdomain"),
        # whatever the pod: the request itself is bad
        (b'{"Pod": {"metadata": "x"}, "NodeNames": ["-x"]}', "NodeNames[0]"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_malformed_requests_get_400(client, make_pod, args_for, verb, body, message):
    r = await client.post(f"/{verb}", data=body, headers={"Content-Type": "application/json"})
    assert r.status == 400
    doc = orjson.loads(await r.read())
    assert message in doc["Error"] and doc["Error"].startswith(verb)
    assert len(doc["Error"]) <= MAX_REASON
    await still_serving(client, make_pod, args_for)


# ----------------------------------------------------------------- a bad pod: unschedulable
def _containers(q) -> dict:
    return {"containers": [{"resources": {"limits": {"nvidia.com/gpu": q}}}]}


BAD_PODS = [
    # (metadata changes, spec changes, words of the reason)
    ({"annotations": {"rlsched.dev/required-topology": "galaxy"}}, {}, "'galaxy' is not one of nvlink, node, rack, block"),
    ({"annotations": {"rlsched.dev/gang-size": "many"}}, {}, "gang-size"),
    ({}, _containers("1.5"), "not a whole number of GPUs"),
    ({}, _containers("500m"), "not a whole number of GPUs"),
    ({}, _containers(-1), "out of range"),
    ({}, _containers("1e7"), "out of range"),
    ({}, _containers(True), "boolean"),
    ({}, {"containers": "x"}, "Pod.spec.containers"),
    ({}, {"initContainers": [{"resources": {"requests": {"nvidia.com/gpu": "x"}}}]}, "initContainers[0]"),
    ({"labels": {"a": 1}}, {}, "labels['a']"),
    ({"annotations": {"rlsched.dev/gpu-models": 7}}, {}, "annotations"),
    ({}, {"nodeSelector": "A100"}, "nodeSelector"),
    ({}, {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [{}]}]}]}}}}, "values"),
    ({}, {"nodeName": 5}, "nodeName"),
    # names no API object can carry (and that must not be kept: issue 12 item 7)
    ({"name": "W_0"}, {}, "Pod.metadata.name: 'W_0' is not a valid DNS-1123 subdomain"),
    ({"name": "w" * 254}, {}, "more than 253"),
    ({"name": ""}, {}, "Pod.metadata.name"),
    ({"namespace": "a.b"}, {}, "Pod.metadata.namespace: 'a.b' is not a valid DNS-1123 label"),
    ({"namespace": "n" * 64}, {}, "more than 63"),
    ({"labels": {"rlsched.dev/job": "j" * 64}}, {}, "more than 63 (label value)"),
    ({"labels": {"rlsched.dev/job": "-j"}}, {}, "not a valid label value"),
]


def bad_pod(make_pod, meta: dict, spec: dict) -> dict:
    pod = make_pod()
    for k, v in meta.items():
        if isinstance(v, dict):
            pod["metadata"].setdefault(k, {}).update(v)
        else:
            pod["metadata"][k] = v
    pod["spec"].update(spec)
    return pod


@pytest.mark.parametrize("meta, spec, words", BAD_PODS)
async def test_unreadable_pod_is_unschedulable_on_every_node(client, make_pod, args_for, meta, spec, words):
    names = ["node-00", "node-01", "ghost"]
    body = orjson.dumps(args_for(bad_pod(make_pod, meta, spec), names))
    r = await client.post("/filter", data=body)
    assert r.status == 200
    res = orjson.loads(await r.read())
    assert res["NodeNames"] == [] and res["FailedNodes"] == {} and res["Error"] == ""
    assert sorted(res["FailedAndUnresolvableNodes"]) == sorted(names)
    for reason in res["FailedAndUnresolvableNodes"].values():
        assert reason.startswith("rlsched cannot schedule this pod: ") and words in reason, reason
        assert len(reason) <= MAX_REASON
    r = await client.post("/prioritize", data=body)
    assert r.status == 200
    assert orjson.loads(await r.read()) == [{"Host": n, "Score": 0} for n in names]
    text = await metrics_text(client)
    assert 'rlsched_extender_filtered_nodes_total{reason="invalid_pod"} 3.0' in text
    assert 'rlsched_extender_invalid_pods_total{verb="filter"} 1.0' in text
    assert 'rlsched_extender_invalid_pods_total{verb="prioritize"} 1.0' in text
    assert "rlsched_extender_errors_total" not in text.replace("# HELP rlsched_extender_errors_total", "").replace(
        "# TYPE rlsched_extender_errors_total", "")
    await still_serving(client, make_pod, args_for)


async def test_unreadable_pod_in_nodes_mode_answers_no_nodes(client, make_pod):
    pod = bad_pod(make_pod, {"annotations": {"rlsched.dev/required-topology": "galaxy"}}, {})
    items = [{"metadata": {"name": "node-00"}}, {"metadata": {"name": "node-01"}}]
    r = await client.post("/filter", data=orjson.dumps({"Pod": pod, "Nodes": {"items": items}, "NodeNames": None}))
    res = orjson.loads(await r.read())
    assert r.status == 200 and res["Nodes"]["items"] == [] and set(res["FailedAndUnresolvableNodes"]) == {"node-00", "node-01"}


async def test_a_reason_is_bounded_however_long_the_value(client, make_pod, args_for):
    pod = bad_pod(make_pod, {"annotations": {"rlsched.dev/required-topology": "x" * 1_000_000}}, {})
    r = await client.post("/filter", data=orjson.dumps(args_for(pod, ["node-00"])))
    reason = orjson.loads(await r.read())["FailedAndUnresolvableNodes"]["node-00"]
    assert r.status == 200 and "required-topology" in reason and len(reason) <= MAX_REASON
    # and a model constraint quoted in a capacity/model reason
    pod = make_pod(annotations={"rlsched.dev/gpu-models": "Z" * 1_000_000})
    r = await client.post("/filter", data=orjson.dumps(args_for(pod, ["node-00"])))
    reason = orjson.loads(await r.read())["FailedAndUnresolvableNodes"]["node-00"]
    assert "does not match" in reason and len(reason) <= MAX_REASON


async def test_thousand_gpus_written_1e3_are_unresolvable_by_capacity(client, make_pod, args_for):
    """issue 12 item 2: ``nvidia.com/gpu: "1e3"`` is 1,000 GPUs (a valid quantity); no
    8-GPU node can ever hold the pod, and the reason says so."""
    assert gpu_count("1e3") == 1000
    r = await client.post("/filter", data=orjson.dumps(args_for(make_pod(gpus="1e3"), ["node-00", "node-01"])))
    res = orjson.loads(await r.read())
    assert r.status == 200 and res["NodeNames"] == [] and res["FailedNodes"] == {}
    for reason in res["FailedAndUnresolvableNodes"].values():
        assert reason.startswith("insufficient nvidia.com/gpu: pod requests 1000, node has 8 free of 8"), reason


async def test_bind_never_answers_500(client, extender):
    """Bind answers an ExtenderBindingResult with the error: bad names, a failing API
    server, a bug. Only a body that is not an ExtenderBindingArgs is a 400."""
    calls = []

    async def binder(args):
        calls.append(args)
        if args.node == "node-02":
            raise RuntimeError("apiserver says no " + "x" * 5000)
        if args.node == "node-03":
            raise KeyError("bug")

    extender.binder = binder

    async def bind(**kw):
        doc = {"PodName": "w-0", "PodNamespace": "team-a", "PodUID": "u", "Node": "node-00", **kw}
        r = await client.post("/bind", data=orjson.dumps(doc))
        return r.status, orjson.loads(await r.read())["Error"]

    assert await bind() == (200, "")
    for kw, words in [({"PodName": "W" * 300}, "PodName"), ({"PodNamespace": "a.b"}, "PodNamespace"),
                      ({"Node": "Node_1"}, "Node")]:
        status, err = await bind(**kw)
        assert status == 200 and err.startswith("cannot bind: ExtenderBindingArgs." + words) and len(err) <= MAX_REASON
    status, err = await bind(PodName="w-2", Node="node-02")
    assert status == 200 and "apiserver says no" in err and len(err) <= MAX_REASON
    status, err = await bind(PodName="w-3", Node="node-03")
    assert status == 200 and "failed: 'bug'" in err

    def broken(key):
        raise RuntimeError("a bug in the cache")

    extender.cache.forget = broken
    status, err = await bind(PodName="w-4", Node="node-00")
    assert status == 200 and err == "binding team-a/w-4 to node-00 failed: internal error: RuntimeError: a bug in the cache"
    assert len(calls) == 3  # the bad names never reached the API server
    r = await client.post("/bind", data=b'{"PodName": 1}')
    assert r.status == 400
    text = await metrics_text(client)
    assert 'rlsched_extender_invalid_pods_total{verb="bind"} 3.0' in text
    assert 'code="500"' not in text


# ----------------------------------------------------------------- bodies that cannot be read
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
    text = await metrics_text(client)
    assert 'rlsched_extender_errors_total{code="413",verb="prioritize"} 1.0' in text


def _deflate(data: bytes) -> bytes:
    c = zlib.compressobj()
    return c.compress(data) + c.flush()


@pytest.mark.parametrize(
    "encoding, body",
    [
        ("deflate", b"\x00garbage, not deflate"),
        ("deflate", _deflate(b'{"Pod": {}, "NodeNames": []}')[:-6] + b"\xff" * 6),  # corrupt tail
        ("gzip", b"\x1f\x8b\x08\x00garbage"),
        ("gzip", b"not gzip at all"),
        ("gzip", gzip.compress(b'{"Pod": {}, "NodeNames": []}')[:12]),  # truncated
        ("br", b"\x00\x01\x02"),  # no brotli decoder installed, or garbage for one
        ("zstd", b"\x00\x01\x02"),
    ],
)
async def test_a_body_that_does_not_decode_is_a_400(served_client, make_pod, args_for, caplog, encoding, body):
    """issue 12 item 7: a malformed deflate body was a 500 and a logged traceback. (Some
    are refused by aiohttp's parser before the app sees them: still 400, one log line.)"""
    client = served_client
    with caplog.at_level(logging.DEBUG):
        r = await client.post("/filter", data=body, headers={"Content-Encoding": encoding,
                                                              "Content-Type": "application/json"})
        assert r.status == 400, await r.text()
        await r.read()
        await still_serving(client, make_pod, args_for)
    assert 'code="500"' not in await metrics_text(client)
    no_tracebacks(caplog)


async def test_compressed_bodies_are_read_and_bombs_refused(client, make_pod, args_for):
    body = orjson.dumps(args_for(make_pod(), ["node-00"]))
    for enc, data in (("gzip", gzip.compress(body)), ("deflate", _deflate(body))):
        r = await client.post("/prioritize", data=data, headers={"Content-Encoding": enc})
        assert r.status == 200 and orjson.loads(await r.read()) == [{"Host": "node-00", "Score": 10}]
    bomb = gzip.compress(b" " * (64 * 1024 * 1024))  # 64 MiB of blanks in ~64 KiB
    r = await client.post("/prioritize", data=bomb, headers={"Content-Encoding": "gzip"})
    assert r.status == 413
    await still_serving(client, make_pod, args_for)


@pytest.mark.parametrize("framing", ["content-length", "chunked", "gzip"])
async def test_client_hanging_up_mid_body_is_no_error(served, served_client, make_pod, args_for, caplog, framing):
    """issue 12 item 7: a client that hung up mid-body gave a 500 and a traceback. Now: one
    debug line, counted as 499 (nobody is left to answer)."""
    client = served_client
    head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if framing == "content-length":
        raw = head + b"Content-Length: 1000\r\n\r\n{\"Pod\": "
    elif framing == "chunked":
        raw = head + b"Transfer-Encoding: chunked\r\n\r\n8\r\n{\"Pod\": \r\n"
    else:
        part = gzip.compress(b'{"Pod": {}, "NodeNames": []}' * 100)[:40]
        raw = head + b"Content-Encoding: gzip\r\nContent-Length: 5000\r\n\r\n" + part
    with caplog.at_level(logging.DEBUG):
        for close in ("close", "abort"):
            reader, writer = await asyncio.open_connection(served.host, served.port)
            writer.write(raw)
            await writer.drain()
            await asyncio.sleep(0.05)  # let the handler start reading the body
            if close == "close":
                writer.close()
            else:
                writer.transport.abort()
        for _ in range(100):  # until both handlers have seen the hang-up
            text = await metrics_text(client)
            if 'rlsched_extender_errors_total{code="499",verb="filter"} 2.0' in text:
                break
            await asyncio.sleep(0.02)
        assert 'rlsched_extender_errors_total{code="499",verb="filter"} 2.0' in text
        assert 'code="500"' not in text
        await still_serving(client, make_pod, args_for)
    no_tracebacks(caplog)
    assert any("client closed the connection before its request was read" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)


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
