"""What the adapters ask of a policy is declared by the protocols and answered by every
registered policy (the extender and the operator call it without hasattr)."""

import numpy as np
import pytest

from rlsched.core import PLACEMENTS, SCALINGS, ClusterState, JobView, Topology, make_placement, make_scaling
from rlsched.core.policy import Placement, Scaling

make_placement("firstfit"), make_scaling("none")  # load the builtin policy modules


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_every_placement_answers_the_protocol(name):
    policy = make_placement(name, rng=np.random.default_rng(0))
    assert isinstance(policy, Placement)
    state = ClusterState(Topology.uniform(6, 4, racks=2))
    state.allocate(0, 3)
    job = JobView("j", 0.0, gpus_per_worker=2, workers=2, max_workers=2)
    cand = np.arange(6)
    raw, terms = policy.score_terms(job, cand, state)
    twin = make_placement(name, rng=np.random.default_rng(0))  # same draws for the random placement
    np.testing.assert_array_equal(raw, twin.score(job, cand, state))
    assert terms is None or all(len(v) == len(cand) for v in terms.values())
    assert policy.observe("node-00", 1.0) is None
    params = policy.parameters()
    assert params is None or isinstance(params, dict)


def test_das_shows_its_terms_and_parameters():
    das = make_placement("das")
    state = ClusterState(Topology.uniform(4, 4))
    raw, terms = das.score_terms(JobView("j", 0.0, workers=2, max_workers=2), [0, 1, 2, 3], state)
    assert {"feasible", "compact", "room", "perf", "pack"} <= set(terms)
    assert das.parameters()["lam"] == das.params.lam


def test_heuristics_have_no_terms_or_parameters():
    bestfit = make_placement("bestfit")
    state = ClusterState(Topology.uniform(2, 4))
    assert bestfit.score_terms(JobView("j", 0.0), [0, 1], state)[1] is None
    assert bestfit.parameters() is None


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_every_scaling_says_whether_it_fell_back(name):
    policy = make_scaling(name)
    assert isinstance(policy, Scaling)
    assert policy.fallback_reason is None or isinstance(policy.fallback_reason, str)


def test_a_scaling_without_its_weights_says_why(tmp_path):
    policy = make_scaling("rlpto", path=tmp_path / "missing.safetensors")
    assert "not found" in policy.fallback_reason
