"""The lean request path (issue 15 item 2): replies byte-equal to orjson's encoding of
the wire shapes, bodies split as kube-scheduler writes them and parsed to the same
result, rejected nodes grouped under one shared reason per class, unknown names still
validated, remembered lists and pods never stand in for different bytes, and
concurrent decisions never share free GPUs."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest

from rlsched.core import Topology
from rlsched.extender.config import build_extender, node_list
from rlsched.extender.service import UNKNOWN_NODE
from rlsched.extender.wire import NodeTable, WireError, decode_args, encode_filter, encode_priorities


def body_of(pod: dict, names: list[str]) -> bytes:
    """An ExtenderArgs as kube-scheduler's Go encoding/json writes it (NodeNames last)."""
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


@pytest.fixture
def big():
    """128 nodes x 8 GPUs (4 racks, 2 blocks): above the remembered-list minimum."""
    topo = Topology.uniform(128, gpus_per_node=8, racks=4, blocks=2)
    ext = build_extender("das")
    ext.cache.replace_nodes(node_list(topo)["items"])
    ext.cache.replace_pods([])
    return ext, [n.name for n in topo.nodes]


# --------------------------------------------------------------------------- bytes on the wire
def test_prioritize_reply_is_orjsons_encoding_of_the_plain_shape(big, make_pod):
    ext, names = big
    cand = names[::3] + ["ghost-node"]  # one unknown: scored 0, encoded from its name
    scored = ext.score_now(decode_args(body_of(make_pod(gpus=2), cand)))
    plain = orjson.dumps([{"Host": h, "Score": int(s)} for h, s in zip(cand, scored.scores)])
    assert scored.encode() == plain == encode_priorities(cand, scored.scores)
    assert orjson.loads(plain)[-1] == {"Host": "ghost-node", "Score": 0}


def test_filter_reply_is_orjsons_encoding_of_the_plain_shape(big, make_pod):
    ext, names = big
    for i in range(0, 128, 2):
        ext.cache.upsert_pod(make_pod(f"full-{i}", gpus=8, node=names[i]))
    args = decode_args(body_of(make_pod(gpus=4), names + ["ghost-node"]))
    out = ext.filter_now(args)
    sent = []
    got = encode_filter(args, out.passed, out.failed, out.unresolvable, sent=sent.append)
    plain = orjson.dumps({"Nodes": None, "NodeNames": [names[i] for i in out.passed], "FailedNodes": out.failed,
                          "FailedAndUnresolvableNodes": out.unresolvable, "Error": ""})
    assert got == plain
    assert sent == [orjson.dumps(names[1::2])]


# --------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("body", [
    b'{"Pod":{"metadata":{"name":"p"}},"Nodes":null,"NodeNames":["a","b"]}',
    b'{"Pod":{"metadata":{"name":"p"}},"Nodes":null,"NodeNames":["a","b"]}\n',
    b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": null, "NodeNames": ["a", "b"]}',  # spaces: whole parse
    b'{"NodeNames":["a"],"Pod":{"metadata":{"name":"p"}}}',  # NodeNames first: whole parse
    # a nested "NodeNames" key after the real one: the split must not be taken there
    b'{"NodeNames":["a"],"Pod":{"z":1,"NodeNames":["evil"]}}',
    b'{"Pod":{"metadata":{"annotations":{"x":",\\"NodeNames\\":[\\"evil\\"]}"}}},"NodeNames":["a"]}',
    b'{"Pod":{},"Nodes":null,"NodeNames":null}',
])
def test_split_decoding_equals_the_whole_parse(body):
    doc = orjson.loads(body)
    try:
        args = decode_args(body)
    except WireError:
        assert doc.get("NodeNames") is None and doc.get("Nodes") is None
        return
    assert args.pod == doc["Pod"] and args.names == doc["NodeNames"]


@pytest.mark.parametrize("body", [
    b'{"Pod":{},"Nodes":null,"NodeNames":["a",]}',  # bad JSON in the names
    b'{"Pod":{},"Nodes":null,"NodeNames":["a",1]}',
    b'{"Pod":{},"Nodes":null,"NodeNames":{"a":1}}',
    b'{"Pod":{,"Nodes":null,"NodeNames":["a"]}',  # bad JSON in the pod
])
def test_split_decoding_refuses_what_the_whole_parse_refuses(body):
    with pytest.raises(WireError):
        decode_args(body)


def test_known_names_answer_only_their_own_text():
    names = [f"n{i}" for i in range(70)]
    raw = orjson.dumps(names)
    seen = []

    def known(text):
        seen.append(text)
        return names if text == raw else None

    args = decode_args(b'{"Pod":{},"Nodes":null,"NodeNames":' + raw + b"}", known)
    assert args.names is names and seen == [raw]
    other = names[:-1] + ["x"]
    args = decode_args(b'{"Pod":{},"Nodes":null,"NodeNames":' + orjson.dumps(other) + b"}", known)
    assert args.names == other


# --------------------------------------------------------------------------- grouped reasons
def test_rejected_nodes_share_one_reason_per_class(big, make_pod, client=None):
    ext, names = big
    for i, name in enumerate(names):  # a full cluster, two kinds of full nodes
        ext.cache.upsert_pod(make_pod(f"full-{i}", gpus=8 if i % 2 else 7, node=name))
    out = ext.filter_now(decode_args(body_of(make_pod(gpus=2), names + ["ghost-node"])))
    assert out.passed == []
    reasons = {}
    for name, why in out.failed.items():
        reasons.setdefault(id(why), why)
    # unknown, "0 free of 8", "1 free of 8": three str objects for 129 nodes
    assert len(reasons) == 3, sorted(reasons.values())
    assert out.failed["ghost-node"] == UNKNOWN_NODE
    assert out.failed[names[0]] is out.failed[names[2]]
    assert "node has 1 free of 8 (7 used" in out.failed[names[0]]
    assert "node has 0 free of 8 (8 used" in out.failed[names[1]]
    classes = {c["reason"]: c["nodes"] for c in out.classes()}
    assert classes == {UNKNOWN_NODE: 1, out.failed[names[0]]: 64, out.failed[names[1]]: 64}


def test_grouped_topology_reasons_keep_each_domains_numbers(extender, make_pod, topology):
    # racks of 4 nodes x 8 GPUs; a gang of 4 whole-node workers needs a whole rack
    for i in range(4):  # rack 0 nearly full
        extender.cache.upsert_pod(make_pod(f"o-{i}", gpus=8 if i else 6, node=f"node-0{i}"))
    extender.cache.upsert_pod(make_pod("o-4", gpus=1, node="node-04"))  # rack 1: 31 free
    extender.cache.upsert_pod(make_pod("o-8", gpus=1, node="node-08"))  # rack 2: 31 free
    ann = {"rlsched.dev/required-topology": "rack", "rlsched.dev/gang-size": "4"}
    names = [n.name for n in topology.nodes]
    out = extender.filter_now(decode_args(body_of(make_pod("w-0", gpus=8, job="tj", annotations=ann), names)))
    assert [names[i] for i in out.passed] == ["node-12", "node-13", "node-14", "node-15"]
    cap = {n for n in names if "insufficient" in out.failed.get(n, "")}
    assert cap == {"node-00", "node-01", "node-02", "node-03", "node-04", "node-08"}
    # racks 1 and 2 have the same room: one reason, one str object, six nodes
    why = out.failed["node-05"]
    assert "needs 32 GPUs in one rack, this rack has 31 free" in why
    assert all(out.failed[n] is why for n in ("node-06", "node-07", "node-09", "node-10", "node-11"))
    topo = [c for c in out.classes() if c["kind"] == "topology"]
    assert topo == [{"kind": "topology", "reason": why, "nodes": 6, "unresolvable": False}]


async def test_debug_and_metrics_keep_the_counts_per_class(client, extender, make_pod, topology):
    names = [n.name for n in topology.nodes]
    for i, name in enumerate(names[:10]):
        extender.cache.upsert_pod(make_pod(f"full-{i}", gpus=8, node=name))
    r = await client.post("/filter", data=body_of(make_pod("p", gpus=8), names + ["ghost-node"]))
    doc = orjson.loads(await r.read())
    assert doc["NodeNames"] == names[10:]
    dbg = orjson.loads(await (await client.get("/debug/pods/team-a/p")).read())
    classes = {c["kind"]: c["nodes"] for c in dbg["filter"]["classes"]}
    assert classes == {"capacity": 10, "unknown_node": 1}
    assert len(dbg["filter"]["failed"]) == 11
    text = (await (await client.get("/metrics")).read()).decode()
    assert 'rlsched_extender_filtered_nodes_total{reason="capacity"} 10.0' in text
    assert 'rlsched_extender_filtered_nodes_total{reason="unknown_node"} 1.0' in text


# --------------------------------------------------------------------------- validation, caches
def test_unknown_names_are_still_validated_after_a_list_was_remembered(big, make_pod):
    ext, names = big
    pod = make_pod(gpus=1)
    ext.filter_now(ext.decode(body_of(pod, names)))  # remembered: all known
    with pytest.raises(WireError, match="NodeNames\\[128\\]"):
        ext.filter_now(ext.decode(body_of(pod, names + ["Not_A_Name"])))
    with pytest.raises(WireError, match="NodeNames\\[0\\]"):
        ext.score_now(ext.decode(body_of(pod, ["-bad"] + names)))


def test_prioritize_reuses_the_list_filter_sent_back(big, make_pod):
    ext, names = big
    for i in range(0, 128, 4):
        ext.cache.upsert_pod(make_pod(f"full-{i}", gpus=8, node=names[i]))
    pod = make_pod("p", gpus=4)
    args = ext.decode(body_of(pod, names))
    out = ext.filter_now(args)
    reply = orjson.loads(encode_filter(args, out.passed, out.failed, out.unresolvable, sent=out.sent))
    back = ext.decode(body_of(pod, reply["NodeNames"]))
    # the list is the table's remembered one (not parsed again), the pod read once
    assert back.names is ext._snap.table.names_for(orjson.dumps(reply["NodeNames"]))
    assert ext._pod(back) is ext._pod(args)
    fresh = build_extender("das")
    fresh.cache.replace_nodes(node_list(Topology.uniform(128, gpus_per_node=8, racks=4, blocks=2))["items"])
    fresh.cache.replace_pods([])
    for i in range(0, 128, 4):
        fresh.cache.upsert_pod(make_pod(f"full-{i}", gpus=8, node=names[i]))
    fresh.filter_now(decode_args(body_of(pod, names)))
    assert ext.score_now(back).encode() == fresh.score_now(decode_args(body_of(pod, reply["NodeNames"]))).encode()


def test_a_pod_is_kept_under_its_exact_bytes(big, make_pod):
    ext, names = big
    a, b = make_pod("same", gpus=1), make_pod("same", gpus=2)  # same name and uid, other content
    pa = ext._pod(ext.decode(body_of(a, names)))
    pb = ext._pod(ext.decode(body_of(b, names)))
    assert (pa.gpus, pb.gpus) == (1, 2)
    assert ext._pod(ext.decode(body_of(a, names[:5]))) is pa


def test_node_table_lookup_answers_equal_lists_from_memory():
    names = [f"node-{i:04d}" for i in range(200)]
    table = NodeTable(names)
    req = orjson.loads(orjson.dumps(names[10:110]))  # fresh str objects, as a request has
    first = table.lookup(req)
    again = table.lookup(orjson.loads(orjson.dumps(names[10:110])))
    assert again is first and first.tolist() == list(range(10, 110))
    changed = names[10:109] + ["node-0000"]
    assert table.lookup(changed).tolist() == list(range(10, 109)) + [0]
    with pytest.raises(ValueError):
        first[0] = 5  # shared: read-only


# --------------------------------------------------------------------------- concurrency
async def test_concurrent_prioritize_never_assumes_the_same_free_gpus(client, extender, make_pod, topology):
    """16 whole-node pods scored at once (decisions under the lock, replies encoded
    after it): each is assumed on a node of its own."""
    names = [n.name for n in topology.nodes]

    async def score(i):
        r = await client.post("/prioritize", data=body_of(make_pod(f"p{i}", gpus=8), names))
        return orjson.loads(await r.read())

    replies = await asyncio.gather(*(score(i) for i in range(16)))
    assumed = [extender.cache.assumed[f"team-a/p{i}"][0] for i in range(16)]
    assert sorted(assumed) == sorted(names)
    for i, reply in enumerate(replies):  # each reply's sole top is the node it was assumed on
        best = max(reply, key=lambda h: h["Score"])
        assert best["Host"] == assumed[i]
        assert [h["Score"] for h in reply].count(best["Score"]) == 1
    assert (extender.cache.state().free == 0).all()
    assert np.all(np.array([len(r) for r in replies]) == 16)


# --------------------------------------------------------------------------- guesses
def test_filter_capacity_ignores_guesses_exactly_as_the_per_node_rule(big, make_pod):
    """Free GPUs without the guesses, computed for all guessed nodes at once, equal the
    per-node rule ``max(0, total - (used - guess))``, over-committed nodes included."""
    ext, names = big
    rng = np.random.default_rng(11)
    cache = ext.cache
    for i in range(40):  # bound pods, some nodes over-committed (e.g. a capacity change)
        cache.upsert_pod(make_pod(f"b-{i}", gpus=int(rng.integers(1, 9)), node=names[int(rng.integers(12))]))
    for i in range(60):  # guesses: scored pods not yet seen bound, many on the same nodes
        cache.assume(f"team-a/g-{i}", names[int(rng.integers(16))], int(rng.integers(0, 5)), None)
    assert cache.overcommit() and len(cache.guessed()) > 5
    st = cache.state()
    for q in (1, 2, 4, 8):
        out = ext.filter_now(decode_args(body_of(make_pod(f"q-{q}", gpus=q), names)))
        want = [i for i, n in enumerate(names)
                if max(0, int(st.total[i]) - (cache.used.get(n, 0) - cache.guessed().get(n, 0))) >= q]
        assert out.passed == want, q
