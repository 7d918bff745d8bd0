"""The cluster cache: incremental accounting, assumptions, static files."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
import yaml

from rlsched.core import Topology
from rlsched.extender.cache import ClusterCache
from rlsched.extender.config import build_extender, load_static, node_list


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def fresh_free(cache: ClusterCache) -> np.ndarray:
    """Free GPUs recomputed from scratch from the cache's nodes, pods and assumptions."""
    names = sorted(cache.nodes)
    used = {n: 0 for n in names}
    for key, pod in cache.pods.items():
        if pod.holds_gpus and pod.node in used:
            used[pod.node] += pod.gpus
    for key, (node, gpus, _, _) in cache.assumed.items():
        pod = cache.pods.get(key)
        if (pod is None or not pod.holds_gpus) and node in used:
            used[node] += gpus
    return np.array([max(0, cache.nodes[n].gpus - used[n]) for n in names])


def test_incremental_state_matches_a_rebuild(make_pod):
    rng = np.random.default_rng(7)
    topo = Topology.uniform(12, racks=3)
    nodes = node_list(topo)["items"]
    clock = Clock()
    cache = ClusterCache(clock=clock, assume_ttl=5.0)
    cache.replace_nodes(nodes)
    for step in range(400):
        clock.t += float(rng.random())
        op = rng.integers(6)
        name = f"p{rng.integers(30)}"
        node = f"node-{rng.integers(12):02d}"
        if op == 0:
            cache.upsert_pod(make_pod(name, gpus=int(rng.integers(0, 5)), node=node))
        elif op == 1:
            cache.upsert_pod(make_pod(name, gpus=int(rng.integers(1, 5)), job=f"j{rng.integers(3)}"))
        elif op == 2:
            cache.assume(f"team-a/{name}", node, int(rng.integers(0, 5)), "team-a/j0", firm=bool(rng.integers(2)))
            if rng.integers(4) == 0:
                cache.forget(f"team-a/{rng.choice(['p1', 'p2', name])}")
        elif op == 3:
            cache.delete_pod(f"team-a/{name}")
        elif op == 4:
            cache.expire()
        else:  # a node changes labels or capacity: the topology is rebuilt lazily
            i = int(rng.integers(len(nodes)))
            nodes[i]["status"]["allocatable"]["nvidia.com/gpu"] = str(int(rng.integers(4, 9)))
            cache.upsert_node(nodes[i])
        if step % 3 == 0:
            st = cache.state()
            np.testing.assert_array_equal(st.free, fresh_free(cache), err_msg=f"step {step}")
        assert {n: g for n, g in cache.guessed().items() if g} == fresh_guesses(cache), f"step {step}"
    assert cache.rebuilds > 1


def fresh_guesses(cache: ClusterCache) -> dict[str, int]:
    """GPUs per node held by guesses, recounted from the assumptions."""
    out: dict[str, int] = {}
    for key, (node, gpus, _, _) in cache.assumed.items():
        if key not in cache._firm and gpus:
            out[node] = out.get(node, 0) + gpus
    return out


def test_assumptions_expire_and_yield_to_bindings(make_pod):
    clock = Clock()
    cache = ClusterCache(clock=clock, assume_ttl=10.0)
    cache.replace_nodes(node_list(Topology.uniform(2))["items"])
    cache.assume("team-a/w-0", "node-0", 8, "team-a/tj")
    assert cache.state().free.tolist() == [0, 8]
    assert cache.job_placement("team-a/tj") == ["node-0"]
    # kube-scheduler put it elsewhere: the binding replaces our guess
    cache.upsert_pod(make_pod("w-0", gpus=8, job="tj", node="node-1"))
    assert cache.state().free.tolist() == [8, 0] and not cache.assumed
    assert cache.job_placement("team-a/tj") == ["node-1"]
    assert cache.job_placement("team-a/tj", exclude="team-a/w-0") == []
    cache.delete_pod("team-a/w-0")
    assert cache.state().free.tolist() == [8, 8]
    cache.assume("team-a/w-1", "node-1", 3, None)
    clock.t = 9.9
    assert cache.expire() == 0
    clock.t = 10.0
    assert cache.expire() == 1 and cache.state().free.tolist() == [8, 8]


def test_static_file_yaml_and_json(tmp_path, make_pod):
    topo = Topology.uniform(4, racks=2)
    f = tmp_path / "cluster.yaml"
    pods = {"apiVersion": "v1", "kind": "PodList", "items": [make_pod("a", gpus=3, node="node-1")]}
    f.write_text(yaml.safe_dump_all([node_list(topo), pods]))
    cache = ClusterCache()
    assert load_static(f, cache) == (4, 1)
    assert cache.ready and cache.state().free.tolist() == [8, 5, 8, 8]
    assert cache.state().topology.node("node-3").rack == "rack-1"
    g = tmp_path / "cluster.json"
    doc = {"kind": "List", "items": node_list(topo)["items"] + [{**make_pod("b", gpus=8, node="node-0"), "kind": "Pod"}]}
    g.write_bytes(orjson.dumps(doc))
    cache = ClusterCache()
    assert load_static(g, cache) == (4, 1)
    assert cache.state().free.tolist() == [0, 8, 8, 8]
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ConfigMap\n")
    with pytest.raises(ValueError, match="ConfigMap"):
        load_static(bad, ClusterCache())


def test_observed_speed_annotations_feed_the_gp(make_pod):
    ext = build_extender("das")
    ext.cache.replace_nodes(node_list(Topology.uniform(8, racks=2))["items"])
    ext.cache.upsert_pod(make_pod("w", gpus=1, node="node-6", annotations={"rlsched.dev/observed-speed": "0.5"}))
    assert ext.policy.observations == [("node-6", 0.5)]
    mu, _ = ext.policy.posterior(ext.cache.state().topology)
    assert mu[6] < mu[4] < mu[0] <= 1.0


def test_expire_drops_exactly_the_expired_assumptions_in_any_order_of_assuming():
    """expire() stops at the first live assumption: re-assuming a pod moves it to the
    end, so the order stays that of expiry."""

    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock = Clock()
    cache = ClusterCache(clock=clock, assume_ttl=10.0)
    cache.replace_nodes(node_list(Topology.uniform(4, gpus_per_node=8))["items"])
    for k, key in enumerate(["ns/a", "ns/b", "ns/c"]):
        clock.t = float(k)
        cache.assume(key, "node-00", 1, None)
    clock.t = 5.0
    cache.assume("ns/a", "node-01", 1, None)  # a again: now expires at 15
    clock.t = 11.5  # b (11) expired; a (15, moved to the end) and c (12) alive
    assert cache.expire() == 1 and set(cache.assumed) == {"ns/a", "ns/c"}
    clock.t = 14.9
    assert cache.expire() == 1 and set(cache.assumed) == {"ns/a"}
    clock.t = 15.0
    assert cache.expire() == 1 and not cache.assumed and not cache.used
