"""The global batch over the workers: shares, gradient accumulation, loss weighting."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlsched.trainer import BatchSizeError, global_batch_size, loss_scale, plan_batch, split_evenly


@pytest.mark.parametrize(
    "global_batch, world, limit, shares, steps",
    [
        (32, 2, None, (16, 16), 1),
        (10, 3, None, (4, 3, 3), 1),
        (256, 3, 40, (86, 85, 85), 3),  # ceil(86 / 40)
        (256, 4, 64, (64, 64, 64, 64), 1),
        (256, 4, 63, (64, 64, 64, 64), 2),
        (7, 7, None, (1,) * 7, 1),
        (1, 1, 1, (1,), 1),
    ],
)
def test_plans(global_batch, world, limit, shares, steps):
    plan = plan_batch(global_batch, world, limit)
    assert plan.shares == shares and plan.accumulation_steps == steps
    assert plan.per_worker == max(shares) and plan.even == (len(set(shares)) == 1)


@given(st.integers(1, 5000), st.integers(1, 64), st.none() | st.integers(1, 300))
def test_plan_arithmetic(global_batch, world, limit):
    if global_batch < world:
        with pytest.raises(BatchSizeError):
            plan_batch(global_batch, world, limit)
        return
    plan = plan_batch(global_batch, world, limit)
    assert sum(plan.shares) == global_batch
    assert max(plan.shares) - min(plan.shares) <= 1
    assert list(plan.shares) == sorted(plan.shares, reverse=True)  # the extra samples go to the first ranks
    for rank in range(world):
        micro = plan.micro_batches(rank)
        assert sum(micro) == plan.share(rank) and len(micro) == plan.accumulation_steps
        if limit is not None:
            assert max(micro) <= limit
    if limit is None:
        assert plan.accumulation_steps == 1
    else:  # the fewest micro-batches that respect the limit
        assert plan.accumulation_steps == math.ceil(plan.per_worker / limit)


@given(st.integers(0, 1000), st.integers(1, 50))
def test_split_evenly(total, parts):
    s = split_evenly(total, parts)
    assert sum(s) == total and len(s) == parts and max(s) - min(s) <= 1


@pytest.mark.parametrize("args", [(0, 1), (3, 4), (True, 1), (4, 0), (2.0, 1), (4, 2, 0)])
def test_bad_plans(args):
    with pytest.raises(BatchSizeError):
        plan_batch(*args)


def test_loss_scale_makes_the_ddp_average_the_global_mean():
    """DDP averages gradients over W ranks; with each rank's summed loss scaled by W/B
    the result is the mean over the B samples, for uneven shares too (10 over 3)."""
    import torch

    torch.manual_seed(0)
    x, y = torch.randn(10, 5), torch.randn(10)
    w = torch.randn(5, requires_grad=True)

    def grad(loss):
        (g,) = torch.autograd.grad(loss, w)
        return g

    full = grad(((x @ w - y) ** 2).mean())
    plan = plan_batch(10, 3)
    at, per_rank = 0, []
    for rank in range(3):
        n = plan.share(rank)
        xs, ys = x[at : at + n], y[at : at + n]
        at += n
        per_rank.append(grad(((xs @ w - ys) ** 2).sum() * loss_scale(10, 3)))
    ddp_average = sum(per_rank) / 3
    assert torch.allclose(ddp_average, full, atol=1e-6)


def test_loss_scale_errors():
    assert loss_scale(32, 4) == 4 / 32
    with pytest.raises(BatchSizeError):
        loss_scale(0, 2)


def test_global_batch_size_from_the_scheduler_else_the_default():
    assert global_batch_size(64, {}) == 64
    assert global_batch_size(64, {"RLSCHED_GLOBAL_BATCH_SIZE": ""}) == 64
    assert global_batch_size(64, {"RLSCHED_GLOBAL_BATCH_SIZE": " 512 "}) == 512
    for bad in ("x", "0", "-3"):
        with pytest.raises(BatchSizeError, match="RLSCHED_GLOBAL_BATCH_SIZE"):
            global_batch_size(64, {"RLSCHED_GLOBAL_BATCH_SIZE": bad})


def test_the_micro_batch_limit_comes_from_the_contract_unless_the_script_gives_one():
    from rlsched.trainer.batching import micro_batch_limit

    env = {"RLSCHED_MICRO_BATCH_LIMIT": "2"}
    assert plan_batch(10, 3, environ=env).accumulation_steps == 2  # shares 4, 3, 3
    assert plan_batch(10, 3, micro_batch_limit=4, environ=env).accumulation_steps == 1
    assert plan_batch(10, 3, environ={}).accumulation_steps == 1
    assert (micro_batch_limit(8, env), micro_batch_limit(8, {}), micro_batch_limit(environ={})) == (2, 8, None)
    with pytest.raises(BatchSizeError, match="RLSCHED_MICRO_BATCH_LIMIT=0 < 1"):
        plan_batch(10, 3, environ={"RLSCHED_MICRO_BATCH_LIMIT": "0"})
