"""What the adapters ask of a policy is declared by the protocols and answered by every
registered policy (the extender and the operator call it without hasattr)."""

import numpy as np
import pytest

from rlsched.core import (ORDERINGS, PLACEMENTS, SCALINGS, ClusterState, JobView, Topology, make_ordering,
                          make_placement, make_scaling)
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


@pytest.mark.parametrize("name", sorted(ORDERINGS))
def test_every_ordering_answers_the_protocol(name):
    """Admission and the gang allocator ask every ordering whom a job outranks and when a
    running job is demoted, without hasattr (admission reads ``preemptive`` to decide
    whether to ask): ``outranked`` answers as ``preempts`` does pairwise, and only an
    ordering with thresholds demotes, later than now."""
    policy = make_ordering(name, rng=np.random.default_rng(0))
    state = ClusterState(Topology.uniform(2, 4))
    new = JobView("new", 10.0, remaining=10.0, est_runtime=10.0)
    old = JobView("old", 0.0, remaining=1e6, est_runtime=1e6, attained_service=1e6, start_time=0.0, placement=[0])
    outranked = policy.outranked(new, [old], state)
    assert outranked == [old] * policy.preempts(new, old, state)
    assert isinstance(policy.preemptive, bool)
    assert isinstance(policy.thresholds, tuple)
    t = policy.demotes_at(JobView("run", 0.0, placement=[0]), 100.0)
    assert (t is not None) == bool(policy.thresholds) and (t is None or t > 100.0)


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
