"""pollux-paper's rules taken from the paper's artifact (sim/peers/pollux_paper.py,
rules A1-A4): each test fails with its rule off (``artifact_rules=False``, the earlier
choices, for A1, A2, A4; ``split_fit=False`` for A3)."""

import pytest

from rlsched.core.allocation import AllocJob, ProfileSample
from rlsched.core.batch import BatchBounds
from rlsched.sim.peers import PolluxPaperAllocator
from rlsched.sim.peers.pollux_paper import fair_share_goodput

LIMITS = BatchBounds(128, 2048, 16, 256)


def step_time(k, n, m):
    """20 ms + 0.5 ms per sample of compute; 10 ms all-reduce in a node, 80 ms across."""
    sync = 0.0 if k == 1 else (0.010 if n == 1 else 0.080)
    return 0.020 + 0.0005 * m + sync


def samples(*shapes):
    return tuple(ProfileSample(num_nodes=n, num_replicas=k, atomic_bsz=m, step_time=step_time(k, n, m),
                               sync_time=step_time(k, n, m) - step_time(1, 1, m)) for k, n, m in shapes)


def job(jid, profile, max_replicas=16):
    return AllocJob(
        id=jid, submit_time=0.0, application="app", age=3600.0, attained_service=0.0, num_restarts=0,
        allocation=(), target_replicas=1, target_batch_size=128, min_replicas=1, max_replicas=max_replicas,
        bounds=LIMITS, grad_sqr=1.0, grad_var=4.0, profile=profile,
    )


# ---------------------------------------------------------------- A1
def test_unseen_cross_node_sync_is_at_least_1_1x_the_observed_local_sync():
    """Seen on 2 and 4 GPUs of one node only: α_node ≥ 1.1·α_local, β_node ≥ 1.1·β_local
    (artifact goodput.py ~201-204); without the rule cross-node sync stays free."""
    j = job("a", samples((1, 1, 128), (2, 1, 64), (4, 1, 32), (4, 1, 128)))
    p = PolluxPaperAllocator().model(j).throughput.params
    assert p.alpha_local > 1e-3  # the 10 ms all-reduce was seen
    assert p.alpha_node >= 1.1 * p.alpha_local * (1 - 1e-12)
    assert p.beta_node >= 1.1 * p.beta_local * (1 - 1e-12)
    old = PolluxPaperAllocator(artifact_rules=False).model(j).throughput.params
    assert old.alpha_node < 0.1 * old.alpha_local


def test_observed_cross_node_sync_is_fitted_not_floored():
    j = job("a", samples((1, 1, 128), (2, 1, 64), (4, 1, 32), (8, 2, 32)))
    new = PolluxPaperAllocator(split_fit=False).model(j).throughput.params  # A3 off: the same fit
    old = PolluxPaperAllocator(artifact_rules=False).model(j).throughput.params
    assert new.alpha_node == pytest.approx(old.alpha_node, rel=1e-9)
    assert new.beta_node == pytest.approx(old.beta_node, rel=1e-9)


# ---------------------------------------------------------------- A2
@pytest.mark.parametrize("m", [128, 64])
def test_one_batch_size_observed_makes_half_the_compute_fixed(m):
    """One per-GPU batch m observed: α_grad = T_grad(m)/2 (artifact goodput.py
    ~173-180); without the rule a fifth of it at the reference batch."""
    j = job("a", samples((1, 1, m), (2, 1, m)))
    tm = PolluxPaperAllocator().model(j).throughput
    assert tm.params.alpha_grad == pytest.approx(tm.grad_time(m) / 2, rel=0.05)
    old = PolluxPaperAllocator(artifact_rules=False).model(j).throughput
    assert old.params.alpha_grad < 0.4 * old.grad_time(m)


def test_two_batch_sizes_leave_the_overhead_to_the_data():
    j = job("a", samples((1, 1, 128), (1, 1, 256), (2, 1, 64)))
    tm = PolluxPaperAllocator().model(j).throughput
    assert tm.params.alpha_grad == pytest.approx(0.020, rel=0.1)  # the true 20 ms, not T_grad/2
    assert tm.params.beta_grad == pytest.approx(0.0005, rel=0.1)


# ---------------------------------------------------------------- A4
def test_fair_share_baseline_is_ceil_g_over_j_gpus_on_one_node_uncapped():
    """4 jobs on 64 GPUs: the baseline is 16 GPUs modelled on one node, even for a job
    capped at 2 replicas (artifact pollux.py ~246-256); without the rule it was the
    capped 2 GPUs."""
    pol = PolluxPaperAllocator()
    j = job("a", samples((1, 1, 128), (2, 1, 64), (4, 1, 32), (8, 2, 32)), max_replicas=2)
    table, gm = pol.speedup_table(j, n_jobs=4, total_gpus=64, node_gpus=4, width=17)
    base = gm.optimize_batch(16, 1).goodput
    assert base > 0
    assert table[1, 0] == pytest.approx(gm.optimize_batch(1, 1).goodput / base, rel=1e-12)
    assert table[2, 0] == pytest.approx(gm.optimize_batch(2, 1).goodput / base, rel=1e-12)
    old, _ = PolluxPaperAllocator(artifact_rules=False).speedup_table(j, 4, 64, 4, 17)
    assert old[2, 0] == pytest.approx(1.0)
    assert table[2, 0] < 0.5


def test_fair_share_baseline_exists_beyond_the_largest_batch():
    """160 GPUs × 16 per GPU exceed the 2048 largest batch: the baseline still exists,
    at batch 2560 (the artifact's batch range starts at K·min_local)."""
    gm = PolluxPaperAllocator().model(job("a", samples((1, 1, 128), (2, 1, 64))))
    assert gm.optimize_batch(160, 1).goodput == 0.0
    g = fair_share_goodput(gm, 160)
    assert g > 0
    from dataclasses import replace

    from rlsched.core.goodput import GoodputModel

    stretched = GoodputModel(gm.throughput, gm.efficiency, replace(gm.bounds, max_batch=2560))
    assert g == pytest.approx(stretched.goodput(160, 1, 2560), rel=1e-12)


# ---------------------------------------------------------------- A3
def test_split_fit_measures_compute_instead_of_inferring_it():
    """Seen only on 2 GPUs of one node: from step times alone the fixed compute and
    the all-reduce are confounded (both constant per step); with the compute times
    (step − sync, artifact simulator.py ~91-98) α_grad is the true 20 ms."""
    j = job("a", samples((2, 1, 64), (2, 1, 128)))
    new = PolluxPaperAllocator(split_fit=True).model(j).throughput.params
    assert new.alpha_grad == pytest.approx(0.020, rel=0.05)
    assert new.beta_grad == pytest.approx(0.0005, rel=0.05)
    old = PolluxPaperAllocator(split_fit=False).model(j).throughput.params
    assert abs(old.alpha_grad / 0.020 - 1) > 0.1


def test_split_fit_still_explains_the_step_times():
    from rlsched.sim.peers.pollux_paper import compute_observations

    prof = samples((1, 1, 128), (2, 1, 64), (4, 1, 32), (4, 1, 128), (8, 2, 32))
    j = job("a", prof)
    got = compute_observations(j)
    assert [m for m, _ in got] == [32.0, 64.0, 128.0]
    assert [c for _, c in got] == pytest.approx([0.020 + 0.0005 * m for m in (32, 64, 128)], rel=1e-9)
    tm = PolluxPaperAllocator(split_fit=True).model(j).throughput
    for s in prof:
        assert tm.iteration_time(s.num_replicas, s.num_nodes, s.atomic_bsz) == pytest.approx(s.step_time, rel=0.05)
