"""Hypothesis fuzzing of the request decoding and the decisions behind the handlers, and
of the served app over raw sockets: a request that is not an ExtenderArgs is rejected with
a WireError (HTTP 400), a pod that cannot be read is answered unschedulable, everything
else well-formed; and no client error of any kind (bad JSON, bad encodings, bad framing,
bad HTTP, hang-ups) is ever answered 500 or logged as an error."""

from __future__ import annotations

import copy
import gzip
import logging
import socket
import zlib

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsched.core import Topology
from rlsched.core.contract import LABEL_JOB, ShapeError
from rlsched.extender.config import build_extender, node_list
from rlsched.extender.objects import parse_pod
from rlsched.extender.server import ServeLimits
from rlsched.extender.wire import (
    NodeTable,
    WireError,
    decode_args,
    decode_binding,
    encode_filter,
    encode_priorities,
)

TOPO = Topology.uniform(8, racks=2)
NAMES = [n.name for n in TOPO.nodes]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)

BASE_POD = {
    "metadata": {"name": "w", "namespace": "ns", "labels": {LABEL_JOB: "j"},
                 "annotations": {"rlsched.dev/gang-size": "3"}},
    "spec": {
        "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "2"}}}],
        "nodeSelector": {"nvidia.com/gpu.product": "A100"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100"]}]}]}}},
    },
    "status": {"phase": "Pending"},
}
PATHS = [
    (), ("metadata",), ("metadata", "name"), ("metadata", "labels"), ("metadata", "labels", LABEL_JOB),
    ("metadata", "annotations"), ("metadata", "annotations", "rlsched.dev/gang-size"),
    ("metadata", "annotations", "rlsched.dev/required-topology"), ("spec",), ("spec", "containers"),
    ("spec", "containers", 0), ("spec", "containers", 0, "resources"),
    ("spec", "containers", 0, "resources", "requests"),
    ("spec", "containers", 0, "resources", "requests", "nvidia.com/gpu"), ("spec", "nodeSelector"),
    ("spec", "affinity"), ("spec", "affinity", "nodeAffinity"), ("spec", "initContainers"),
    ("spec", "nodeName"), ("status",), ("status", "phase"),
]


def mutated_pod(path, value):
    pod = copy.deepcopy(BASE_POD)
    if not path:
        return value
    cur = pod
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return pod


extender_args = st.fixed_dictionaries(
    {},
    optional={
        "Pod": st.builds(mutated_pod, st.sampled_from(PATHS), json_values | st.sampled_from(["rack", "7", "-1", "A100"])),
        "NodeNames": st.none() | st.lists(st.sampled_from(NAMES + ["ghost", ""]) | st.text(max_size=5), max_size=10) | json_values,
        "Nodes": st.none() | json_values,
    },
)


def make_ext():
    ext = build_extender("das")
    ext.cache.replace_nodes(node_list(TOPO)["items"])
    ext.cache.replace_pods([])
    return ext


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=extender_args)
def test_filter_and_prioritize_answer_or_reject(doc):
    ext = make_ext()
    body = orjson.dumps(doc)
    try:
        args = decode_args(body)
        out = ext.filter_now(args)
        scores = ext.prioritize_now(args)
    except WireError as exc:  # the request, never the pod
        assert str(exc)
        return
    try:
        parse_pod(args.pod)
        readable = True
    except ShapeError:
        readable = False
    if not readable:  # fail closed: unschedulable everywhere, scored 0
        assert out.passed == [] and out.failed == {} and set(out.unresolvable) == set(args.names)
        assert all(r.startswith("rlsched cannot schedule this pod: ") for r in out.unresolvable.values())
        assert scores == [0] * len(args.names)
    res = orjson.loads(encode_filter(args, out.passed, out.failed, out.unresolvable))
    if len(set(args.names)) == len(args.names):  # every candidate passed or failed, once
        answered = res["NodeNames"] + list(res["FailedNodes"]) + list(res["FailedAndUnresolvableNodes"])
        assert sorted(answered) == sorted(args.names)
    prio = orjson.loads(encode_priorities(args.names, scores))
    assert [h["Host"] for h in prio] == args.names
    assert all(type(h["Score"]) is int and 0 <= h["Score"] <= 10 for h in prio)


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=64) | json_values.map(orjson.dumps))
def test_arbitrary_bytes_never_crash_the_decoders(raw):
    for decode in (decode_args, decode_binding):
        try:
            decode(raw)
        except WireError:
            pass


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.text(min_size=1, max_size=12), st.integers(0, 10), st.booleans()), max_size=80),
       budget=st.sampled_from([1, 16 * 1024 * 1024]))
def test_node_table_encodes_the_bytes_of_the_plain_encoder(rows, budget):
    """The precomputed reply fragments give exactly orjson's bytes of the plain
    ``[{"Host", "Score"}]`` shape, for names the table knows and names it does not
    (any text: escapes, non-ASCII), with whole entries kept or (budget 1) heads only."""
    names, scores = [r[0] for r in rows], [r[1] for r in rows]
    table = NodeTable(sorted({n for n, _, known in rows if known}), max_bytes=budget)
    for _ in range(2):  # a list seen before is answered from the remembered ones
        idx = table.lookup(names)
        assert [table.names[i] if i >= 0 else None for i in idx] == [n if n in table.index else None for n in names]
        assert table.encode_priorities(names, idx, scores) == encode_priorities(names, scores)


# --------------------------------------------------------------------------- raw HTTP corpus
@pytest.fixture(scope="module")
def loopback(serve_in_thread):
    """The app served by :func:`serve_app` (as the CLI serves it) from its own thread and
    event loop; yields ``(host, port, extender)``."""
    ext = make_ext()
    limits = ServeLimits(header_timeout=0.25, idle_timeout=5.0, max_connections=256)
    with serve_in_thread(ext, limits, read_timeout=0.25, max_body=1024 * 1024) as (host, port):
        yield host, port, ext


def _deflate(data: bytes) -> bytes:
    c = zlib.compressobj()
    return c.compress(data) + c.flush()


_ENCODERS = {"identity": lambda b: b, "gzip": gzip.compress, "deflate": _deflate, "br": lambda b: b, "zstd": lambda b: b,
             "x-nonsense": lambda b: b}


@st.composite
def raw_requests(draw):
    """Bytes a client could send: a verb, a body (JSON or not), an encoding applied or
    not, corrupted or not, framed by Content-Length (true or a lie) or chunks (valid or
    not), sent whole or cut short (the client then hangs up)."""
    path = draw(st.sampled_from(["/filter", "/prioritize", "/bind", "/filter", "/prioritize"]))
    if draw(st.booleans()):
        doc = draw(extender_args) if path != "/bind" else draw(st.dictionaries(
            st.sampled_from(["PodName", "PodNamespace", "PodUID", "Node"]), json_values | st.text(max_size=300)))
        body = orjson.dumps(doc)
    else:
        body = draw(st.binary(max_size=200))
    headers = [b"POST " + path.encode() + b" HTTP/1.1", b"Host: x", b"Content-Type: application/json"]
    enc = draw(st.sampled_from(sorted(_ENCODERS)) | st.none())
    if enc is not None:
        if draw(st.booleans()):
            body = _ENCODERS[enc](body)
        if draw(st.booleans()) and body:  # corrupt a byte
            i = draw(st.integers(0, len(body) - 1))
            body = body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1:]
        headers.append(b"Content-Encoding: " + enc.encode())
    framing = draw(st.sampled_from(["length", "length-lie", "chunked", "chunked-bad", "none"]))
    if framing == "length":
        headers.append(b"Content-Length: %d" % len(body))
        payload = body
    elif framing == "length-lie":
        headers.append(b"Content-Length: %d" % (len(body) + draw(st.integers(1, 100))))
        payload = body
    elif framing == "chunked":
        headers.append(b"Transfer-Encoding: chunked")
        payload = (b"%x\r\n" % len(body) + body + b"\r\n" if body else b"") + b"0\r\n\r\n"
    elif framing == "chunked-bad":
        headers.append(b"Transfer-Encoding: chunked")
        payload = b"zz\r\n" + body + b"\r\n0\r\n\r\n"
    else:
        payload = body
    raw = b"\r\n".join(headers) + b"\r\n\r\n" + payload
    cut = draw(st.none() | st.integers(0, len(raw)))
    return raw if cut is None else raw[:cut], cut is not None


_BAD_HTTP = [
    b"GARBAGE\r\n\r\n",
    b"POST /filter HTTP/9.9\r\n\r\n",
    b"POST /filter HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 20_000 + b"\r\n\r\n",
    b"POST /filter HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(300)) + b"\r\n",
    b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    b"POST /" + b"f" * 10_000 + b" HTTP/1.1\r\n\r\n",
    b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
]


def _exchange(host: str, port: int, raw: bytes, hang_up: bool) -> int | None:
    """Send ``raw``; the status of the answer, or None when the server closed without one
    (or the client hung up)."""
    with socket.create_connection((host, port), timeout=10) as s:
        try:
            s.sendall(raw)
            if hang_up:
                return None
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, BrokenPipeError):
            return None
    if not data:
        return None
    assert data.startswith(b"HTTP/1."), data[:100]
    return int(data.split(b" ", 2)[1])


def _assert_no_server_errors(ext, caplog) -> None:
    text = ext.metrics.render().decode()
    assert 'code="5' not in text, [l for l in text.splitlines() if 'code="5' in l]
    bad = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not bad, [(r.name, r.getMessage()) for r in bad]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(req=raw_requests())
def test_no_client_error_is_a_500(loopback, caplog, req):
    host, port, ext = loopback
    raw, hang_up = req
    with caplog.at_level(logging.INFO):
        status = _exchange(host, port, raw, hang_up)
        assert status is None or status < 500, (status, raw[:300])
    _assert_no_server_errors(ext, caplog)


@pytest.mark.parametrize("raw", _BAD_HTTP, ids=range(len(_BAD_HTTP)))
def test_bad_http_is_a_400_not_a_traceback(loopback, caplog, raw):
    host, port, ext = loopback
    with caplog.at_level(logging.INFO):
        status = _exchange(host, port, raw, False)
    assert status is None or 400 <= status < 500, status
    _assert_no_server_errors(ext, caplog)
    assert _exchange(host, port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", False) == 200
