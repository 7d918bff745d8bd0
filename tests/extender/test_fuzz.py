"""Hypothesis fuzzing of the request decoding and the decisions behind the handlers:
every input is either rejected with a ShapeError (HTTP 400; WireError is one) or answered
well-formed."""

from __future__ import annotations

import copy

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlsched.core import Topology
from rlsched.core.contract import LABEL_JOB, ShapeError
from rlsched.extender.config import build_extender, node_list
from rlsched.extender.wire import (
    PriorityEncoder,
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
    except ShapeError as exc:
        assert str(exc)
        return
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
@given(rows=st.lists(st.tuples(st.text(min_size=1, max_size=12), st.integers(0, 10)), max_size=30),
       cap=st.integers(1, 8))
def test_fast_priority_encoder_equals_the_plain_one(rows, cap):
    enc = PriorityEncoder(max_names=cap)
    names, scores = [r[0] for r in rows], [r[1] for r in rows]
    for _ in range(2):  # cold and warm
        assert orjson.loads(enc(names, scores)) == orjson.loads(encode_priorities(names, scores))
