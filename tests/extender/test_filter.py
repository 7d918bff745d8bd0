"""Filter rules: GPU capacity, GPU model, required topology; reasons in FailedNodes."""

from __future__ import annotations

import pytest

from rlsched.core import NodeSpec, Topology
from rlsched.extender.config import build_extender, node_list
from rlsched.extender.wire import ExtenderArgs


def run_filter(ext, pod, names):
    return ext.filter_now(ExtenderArgs(pod=pod, names=list(names), node_objects=None))


def test_capacity_counts_bound_pods_and_says_why(extender, make_pod, topology):
    extender.cache.upsert_pod(make_pod("other", gpus=6, node="node-01"))
    extender.cache.upsert_pod(make_pod("done", gpus=8, node="node-02", phase="Succeeded"))
    out = run_filter(extender, make_pod(gpus=4), ["node-00", "node-01", "node-02"])
    names = ["node-00", "node-01", "node-02"]
    assert [names[i] for i in out.passed] == ["node-00", "node-02"]  # finished pods free their GPUs
    assert "requests 4" in out.failed["node-01"] and "2 free of 8" in out.failed["node-01"]
    # more GPUs than a node has: unresolvable (preemption cannot help)
    out = run_filter(extender, make_pod(gpus=16), names)
    assert out.passed == [] and set(out.unresolvable) == set(names)


@pytest.mark.parametrize(
    "spec, annotations, allowed",
    [
        ({"nodeSelector": {"nvidia.com/gpu.product": "H100"}}, {}, {"h0"}),
        ({}, {"rlsched.dev/gpu-models": "A100, V100"}, {"a0", "v0"}),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100", "H100"]}]}]}}}},
         {}, {"a0", "h0"}),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["A100"]}]},
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a0"]}]}]}}}},
         {}, {"a0", "h0", "v0"}),  # terms are ORed: the second term has no GPU-model rule
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "NotIn", "values": ["A100"]}]}]}}}},
         {}, {"h0", "v0"}),
    ],
)
def test_gpu_model_constraints(make_pod, spec, annotations, allowed):
    topo = Topology([NodeSpec("a0", 8, "A100"), NodeSpec("h0", 8, "H100"), NodeSpec("v0", 8, "V100")])
    ext = build_extender("das")
    ext.cache.replace_nodes(node_list(topo)["items"])
    out = run_filter(ext, make_pod(gpus=1, spec=spec, annotations=annotations), ["a0", "h0", "v0"])
    assert {["a0", "h0", "v0"][i] for i in out.passed} == allowed
    for name in {"a0", "h0", "v0"} - allowed:
        assert "does not match" in out.unresolvable[name]


def test_required_topology_rack_follows_the_placed_workers(extender, make_pod, topology):
    ann = {"rlsched.dev/required-topology": "rack"}
    extender.cache.upsert_pod(make_pod("w-0", gpus=2, job="tj", node="node-06", annotations=ann))
    names = [n.name for n in topology.nodes]
    out = run_filter(extender, make_pod("w-1", gpus=2, job="tj", annotations=ann), names)
    assert {names[i] for i in out.passed} == {"node-04", "node-05", "node-06", "node-07"}
    assert "rack rack-1" in out.failed["node-00"]
    # block level admits the whole block 0 (racks 0 and 1)
    ann_b = {"rlsched.dev/required-topology": "block"}
    out = run_filter(extender, make_pod("w-1", gpus=2, job="tj", annotations=ann_b), names)
    assert {names[i] for i in out.passed} == {f"node-{i:02d}" for i in range(8)}
    # another job is not constrained by tj's workers
    out = run_filter(extender, make_pod("x-1", gpus=2, job="other", annotations=ann), names)
    assert len(out.passed) == 16


def test_required_topology_with_gang_size_needs_room_for_the_gang(extender, make_pod, topology):
    for i in range(4):  # rack 0 nearly full: 2 GPUs free
        extender.cache.upsert_pod(make_pod(f"o-{i}", gpus=8 if i else 6, node=f"node-0{i}"))
    ann = {"rlsched.dev/required-topology": "rack", "rlsched.dev/gang-size": "4"}
    names = [n.name for n in topology.nodes]
    out = run_filter(extender, make_pod("w-0", gpus=2, job="tj", annotations=ann), names)
    assert {names[i] for i in out.passed} == {f"node-{i:02d}" for i in range(4, 16)}
    assert "needs 8 GPUs in one rack" in out.failed["node-00"]


def test_bad_required_topology_makes_the_pod_unschedulable(extender, make_pod):
    # issue 12 item 2: once a 400, which kube-scheduler skips (ignorable) -> fail open
    names = ["node-00", "node-01"]
    out = run_filter(extender, make_pod(annotations={"rlsched.dev/required-topology": "galaxy"}), names)
    assert out.passed == [] and out.failed == {}
    assert set(out.unresolvable) == set(names)
    assert all("required-topology" in r and "'galaxy' is not one of" in r for r in out.unresolvable.values())


def test_capacity_reason_shows_a_true_overcommit(extender, make_pod):
    """issue 12 item 7: the used count came from the clamped ClusterState (free >= 0), so
    11 GPUs bound on an 8-GPU node read "8 used"; it is the cache's true count now."""
    for i, gpus in enumerate((4, 4, 3)):  # 11 on node-03 (8 GPUs), bound behind the extender's back
        extender.cache.upsert_pod(make_pod(f"b-{i}", gpus=gpus, node="node-03"))
    extender.cache.upsert_pod(make_pod("b-3", gpus=2, node="node-04"))
    before = run_filter(extender, make_pod(gpus=1), ["node-03", "node-04"])
    assert before.passed == [1]  # the decision is the same as before the fix: node-03 full, not unresolvable
    msg = before.failed["node-03"]
    assert "0 free of 8 (11 used by bound or assumed pods; over-committed by 3)" in msg, msg
    assert extender.cache.overcommit() == {"node-03": (11, 8)}
    assert extender.cache.overcommitted_gpus() == 3
    assert extender.overcommit() == [{"node": "node-03", "used": 11, "total": 8, "overcommitted": 3}]
    # a node at its capacity is not over-committed, and says so plainly
    extender.cache.upsert_pod(make_pod("b-4", gpus=6, node="node-04"))
    out = run_filter(extender, make_pod(gpus=1), ["node-04"])
    assert out.failed["node-04"].endswith("(8 used by bound or assumed pods)")


async def test_overcommit_is_exported(client, extender, make_pod):
    extender.cache.upsert_pod(make_pod("b-0", gpus=8, node="node-05"))
    extender.cache.upsert_pod(make_pod("b-1", gpus=2, node="node-05"))
    text = (await (await client.get("/metrics")).read()).decode()
    assert "rlsched_extender_overcommitted_gpus 2.0" in text
    doc = await (await client.get("/debug/overcommit")).json()
    assert doc == {"overcommitted_gpus": 2, "nodes": [{"node": "node-05", "used": 10, "total": 8, "overcommitted": 2}]}
    extender.cache.delete_pod("team-a/b-1")
    text = (await (await client.get("/metrics")).read()).decode()
    assert "rlsched_extender_overcommitted_gpus 0.0" in text
