"""DAS placement: random-walk kernel, GP posterior, scoring and model loading."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from rlsched.core import ClusterState, JobView, NodeSpec, Topology, make_placement
from rlsched.core.nn import PolicyFileError
from rlsched.core.das import (
    PLACEMENT_FEATURES,
    DASParams,
    DASPlacement,
    TopologyKernel,
    gp_posterior,
    random_walk_kernel,
    symmetric_random_walk_kernel,
    topology_adjacency,
)


def series(adj: np.ndarray, lam: float, terms: int = 600) -> np.ndarray:
    """Brute force: sum_{l < terms} lam^l P^l."""
    p = adj / adj.sum(axis=1, keepdims=True)
    out = np.zeros_like(p)
    term = np.eye(len(p))
    for _ in range(terms):
        out += term
        term = lam * term @ p
    return out


def lumpy_topology() -> Topology:
    """Racks of different sizes, three blocks, a two-node NVLink clique."""
    racks = [("r0", "b0", 3), ("r1", "b0", 1), ("r2", "b1", 4), ("r3", "b2", 2)]
    nodes = []
    for rack, block, n in racks:
        for k in range(n):
            nodes.append(NodeSpec(name=f"{rack}-n{k}", gpus=8, rack=rack, block=block))
    nodes[4] = NodeSpec(name="r2-n0", gpus=8, rack="r2", block="b1", clique="c0")
    nodes[5] = NodeSpec(name="r2-n1", gpus=8, rack="r2", block="b1", clique="c0")
    return Topology(nodes)


# ------------------------------------------------------------------------- kernel
def test_kernel_on_a_three_vertex_path_by_hand():
    # a - b - c, lambda 1/2: K[a,a] = 7/6, K[a,c] = sum_k lam^2k / 2 = 1/6
    adj = np.array([[0, 1, 0], [1, 0, 1], [0, 1, 0]], dtype=float)
    k = random_walk_kernel(adj, 0.5)
    assert k[0, 0] == pytest.approx(7 / 6)
    assert k[0, 2] == pytest.approx(1 / 6)
    np.testing.assert_allclose(k, series(adj, 0.5), atol=1e-12)


@pytest.mark.parametrize("lam", [0.2, 0.5, 0.9])
def test_topology_kernel_equals_closed_form_and_series_on_the_full_tree(lam):
    topo = lumpy_topology()
    adj, n = topology_adjacency(topo)
    closed = random_walk_kernel(adj, lam)[:n, :n]
    brute = series(adj, lam, terms=int(np.log(1e-14) / np.log(lam)) + 1)[:n, :n]
    fast = TopologyKernel(topo, lam).matrix()
    np.testing.assert_allclose(closed, brute, atol=1e-12)
    np.testing.assert_allclose(fast, closed, atol=1e-12)


def test_kernel_among_nodes_is_symmetric_positive_definite():
    topo = lumpy_topology()
    adj, n = topology_adjacency(topo)
    sym = symmetric_random_walk_kernel(adj, 0.7)
    assert np.linalg.eigvalsh(sym).min() > 0
    # leaves have degree 1: the symmetric form equals (I - lam P)^-1 on them
    np.testing.assert_allclose(sym[:n, :n], random_walk_kernel(adj, 0.7)[:n, :n], atol=1e-12)
    k = TopologyKernel(topo, 0.7).matrix(normalised=True)
    np.testing.assert_allclose(k, k.T, atol=1e-15)
    np.testing.assert_allclose(np.diag(k), 1.0)
    assert np.linalg.eigvalsh(k).min() > 0


def test_kernel_rejects_bad_lambda_and_graphs():
    with pytest.raises(ValueError, match="lambda"):
        random_walk_kernel(np.ones((2, 2)), 1.0)
    with pytest.raises(ValueError, match="edge"):
        random_walk_kernel(np.zeros((2, 2)), 0.5)
    with pytest.raises(ValueError, match="lambda"):
        DASParams(lam=0.0)


def test_kernel_is_fast_on_five_thousand_nodes_via_the_quotient():
    topo = Topology.uniform(5000, racks=100, blocks=10)
    kern = TopologyKernel(topo, 0.9)
    # only class-sized matrices are held, never n x n
    assert kern.between.shape == (100, 100)
    c = kern.closeness([0], np.array([0, 1, 60, 4999]))
    assert c[0] == 1.0 and c[0] > c[1] > c[2] > c[3] >= 0.0


# ------------------------------------------------------------------------- GP
def test_gp_posterior_three_nodes_by_hand():
    k = np.array([[1.0, 0.5, 0.25], [0.5, 1.0, 0.5], [0.25, 0.5, 1.0]])
    o = [0]
    # one observation y=2 at node 0, noise 1, prior mean 0:
    # mu = k(.,0) * 2 / (1 + 1) = k(.,0); var = 1 - k(.,0)^2 / 2
    mu, cov = gp_posterior(k[np.ix_(o, o)], k[:, o], k, np.array([2.0]), noise=1.0, mean=0.0)
    np.testing.assert_allclose(mu, [1.0, 0.5, 0.25])
    np.testing.assert_allclose(np.diag(cov), [0.5, 0.875, 0.96875])
    assert cov[0, 1] == pytest.approx(0.5 - 1.0 * 0.5 / 2)
    # the diagonal-only form gives the same variances
    _, var = gp_posterior(k[np.ix_(o, o)], k[:, o], np.diag(k).copy(), np.array([2.0]), 1.0, 0.0)
    np.testing.assert_allclose(var, np.diag(cov))
    # with a prior mean m the posterior moves from m towards y
    mu_m, _ = gp_posterior(k[np.ix_(o, o)], k[:, o], k, np.array([2.0]), 1.0, mean=1.0)
    np.testing.assert_allclose(mu_m, [1.5, 1.25, 1.125])


def test_gp_posterior_without_observations_is_the_prior():
    k = np.eye(3)
    mu, cov = gp_posterior(np.zeros((0, 0)), np.zeros((3, 0)), k, np.zeros(0), 0.0, mean=0.3)
    np.testing.assert_allclose(mu, 0.3)
    np.testing.assert_allclose(cov, k)


# ------------------------------------------------------------------------- scoring
def scored(das: DASPlacement, state: ClusterState, placed: list[int], gpus: int = 1, workers: int = 4):
    job = JobView("j", 0.0, gpus_per_worker=gpus, workers=workers, max_workers=workers, placement=placed)
    return das.score(job, np.arange(len(state.topology)), state)


def test_closeness_orders_node_clique_rack_block_cluster():
    topo = lumpy_topology()
    st = ClusterState(topo)
    s = scored(DASPlacement(), st, placed=[topo.index["r2-n0"]])
    by = {n.name: s[i] for i, n in enumerate(topo.nodes)}
    assert by["r2-n0"] > by["r2-n1"]  # same node > same NVLink clique
    assert by["r2-n1"] > by["r2-n2"]  # clique > same rack
    assert by["r2-n2"] > by["r3-n0"] or topo.node("r3-n0").block != "b1"
    topo2 = Topology.uniform(16, racks=4, blocks=2)
    st2 = ClusterState(topo2)
    s2 = scored(DASPlacement(), st2, placed=[0])
    # node 0: rack 0 (nodes 0-3), block 0 (racks 0-1 = nodes 0-7)
    assert s2[0] > s2[1] > s2[4] > s2[8]
    assert len({s2[1], s2[2], s2[3]}) == 1 and len(set(s2[8:])) == 1


def test_closeness_beats_packing_across_levels():
    # a nearly full node in another block must not beat an empty rack-mate
    topo = Topology.uniform(16, racks=4, blocks=2)
    st = ClusterState(topo)
    st.allocate(12, 7)
    s = scored(DASPlacement(), st, placed=[0])
    assert s[1] > s[4] > s[12]


def test_infeasible_nodes_get_minus_inf():
    topo = Topology.uniform(4)
    st = ClusterState(topo)
    st.allocate(1, 8)
    s = scored(DASPlacement(), st, placed=[], gpus=2)
    assert s[1] == -np.inf and np.isfinite(s[[0, 2, 3]]).all()


def test_place_gang_all_in_one_rack_and_leaves_state_untouched():
    topo = Topology.uniform(16, racks=4, blocks=2)
    st = ClusterState(topo)
    st.allocate(0, 6)  # rack 0 has 26 free GPUs
    before = st.free.copy()
    job = JobView("g", 0.0, gpus_per_worker=4, workers=6, max_workers=6)
    plan = DASPlacement().place(job, st)
    assert plan is not None and len(plan) == 6
    racks = {topo.rack_of[i] for i in plan}
    assert len(racks) == 1
    np.testing.assert_array_equal(st.free, before)
    # too big: all or nothing
    assert DASPlacement().place(JobView("h", 0.0, gpus_per_worker=8, workers=17, max_workers=17), st) is None
    np.testing.assert_array_equal(st.free, before)


def test_observations_move_the_posterior_along_the_topology():
    topo = Topology.uniform(16, racks=4, blocks=2)
    st = ClusterState(topo)
    das = DASPlacement(DASParams(w_compact=0.0, w_room=0.0, w_pack=0.0))
    for _ in range(3):
        das.observe("node-05", 1.4)  # fast node in rack 1
    mu, var = das.posterior(topo)
    assert mu[5] > mu[4] > mu[0] > mu[12] - 1e-9
    assert mu[12] == pytest.approx(1.0, abs=0.01)
    assert var[5] < var[4] < var[12]
    s = scored(das, st, placed=[])
    assert int(np.argmax(s)) == 5
    with pytest.raises(ValueError):
        das.observe("node-00", float("nan"))


def test_registered_as_placement_das():
    p = make_placement("das")
    assert isinstance(p, DASPlacement) and p.name == "das" and p.fallback_reason is None


# ------------------------------------------------------------------------- model files
def test_model_json_is_read(tmp_path):
    f = tmp_path / "das.json"
    f.write_text(json.dumps({"policy": "das", "version": "7", "params": {"lam": 0.6, "w_pack": 2.0}}))
    das = DASPlacement(model=f)
    assert das.fallback_reason is None
    assert das.params.lam == 0.6 and das.params.w_pack == 2.0 and das.params.version == "7"


def test_model_safetensors_is_read(tmp_path):
    f = tmp_path / "das.safetensors"
    save_file({"lam": np.array([0.7], dtype=np.float32), "kappa": np.array(1.5, dtype=np.float32)},
              str(f), metadata={"policy": "das", "version": "v3"})
    das = DASPlacement(model=f)
    assert das.fallback_reason is None
    assert das.params.lam == pytest.approx(0.7) and das.params.kappa == 1.5 and das.params.version == "v3"


def test_trained_policy_file_with_learned_mean_is_read(tmp_path):
    f = tmp_path / "das.safetensors"
    w = np.array([[0.0, 0.0, 5.0, 0.0, 0.0, 0.0]], dtype=np.float32)  # learned: pack hard
    save_file({"placement.score.weight": w, "placement.score.bias": np.zeros(1, np.float32),
               "placement.log_std": np.array(-0.5, np.float32)}, str(f),
              metadata={"format": "rlsched-policy/1", "policy": "das", "version": "11"})
    meta = {"format": "rlsched-policy/1", "policy": "das", "version": "11",
            "observation": {"placement_features": list(PLACEMENT_FEATURES)},
            "architecture": {"lam": 0.8}, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    f.with_suffix(".json").write_text(json.dumps(meta))
    das = DASPlacement(model=f)
    assert das.fallback_reason is None, das.fallback_reason
    assert das.params.lam == 0.8 and das.params.version == "11"
    assert das.params.mean_weights == (0.0, 0.0, 5.0, 0.0, 0.0, 0.0)
    st = ClusterState(Topology.uniform(4))
    st.allocate(2, 6)
    s = scored(das, st, placed=[], gpus=1)
    assert int(np.argmax(s)) == 2  # the learned mean packs
    # a tampered weights file fails the recorded SHA-256: fallback, not a crash
    f.write_bytes(f.read_bytes()[:-1] + b" ")
    bad = DASPlacement(model=f)
    assert bad.fallback_reason is not None and "SHA-256" in bad.fallback_reason
    assert bad.params == DASParams()


@pytest.mark.parametrize(
    "content, why",
    [
        (None, "does not exist"),
        (b"\x00\x01garbage", "cannot read"),
        (b'{"policy": "das", "params": {"lam": 3}}', "lambda"),
        (b'{"policy": "das", "params": {"nope": 1}}', "unknown"),
        (b'{"policy": "other", "params": {}}', "not 'das'"),
        (b'{"policy": "das", "params": {"lam": "x"}}', "number"),
    ],
)
def test_missing_or_corrupt_model_falls_back_to_defaults(tmp_path, content, why):
    f = tmp_path / ("das.json" if content is None or content.startswith(b"{") else "das.safetensors")
    if content is not None:
        f.write_bytes(content)
    das = DASPlacement(model=f)
    assert das.fallback_reason is not None and why in das.fallback_reason
    assert das.params == DASParams()
    with pytest.raises(PolicyFileError):
        DASParams.load(f)


def test_best_candidate_reads_rounding_level_differences_as_ties():
    from rlsched.core.das import best_candidate

    assert best_candidate(np.array([1.0, 1.0 + 1e-15, 0.5])) == 0  # argmax would say 1
    assert best_candidate(np.array([-np.inf, 3.0 - 4e-15, 3.0])) == 1
    assert best_candidate(np.array([0.2, 0.2 + 1e-3])) == 1  # a real difference stands
    assert best_candidate(np.array([-np.inf, -np.inf])) == 0


def test_place_is_the_same_under_rounding_noise_in_the_scores(monkeypatch):
    """The kernel's and the GP's linear algebra round differently in their last bits on
    different numpy/BLAS builds; nodes whose scores are equal but for that rounding must
    go the same way everywhere (the lowest index), or every DAS-placed run differs from
    one machine to the next."""
    topo = Topology.uniform(16, racks=4, blocks=2)
    das = DASPlacement()
    state = ClusterState(topo)
    state.allocate(5, 3)
    jobs = [JobView(f"j{k}", 0.0, gpus_per_worker=g, workers=w, max_workers=w)
            for k, (g, w) in enumerate([(1, 1), (2, 3), (4, 2), (8, 5)])]
    clean = [das.place(job, state) for job in jobs]
    rng = np.random.default_rng(0)
    combine = DASPlacement.combine

    def noisy(self, comp):
        s = combine(self, comp)
        return s * (1.0 + rng.uniform(-4e-16, 4e-16, s.shape))

    monkeypatch.setattr(DASPlacement, "combine", noisy)
    for _ in range(10):
        assert [das.place(job, state) for job in jobs] == clean
