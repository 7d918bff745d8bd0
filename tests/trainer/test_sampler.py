"""The elastic sampler: exact coverage of every epoch across rescales and preemptions."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlsched.trainer import BatchSizeError, ElasticSampler, epoch_order, plan_batch


def _generation(size, global_batch, world, epoch, consumed, steps, seed, limit=None):
    """Run ``steps`` steps of one generation on every rank from (epoch, consumed); return
    the indices each rank consumed and the new position (what the checkpoint records)."""
    plan = plan_batch(global_batch, world, limit)
    taken = []
    ends = set()
    for rank in range(world):
        got = list(ElasticSampler(size, plan, rank, seed=seed).steps(epoch, consumed))[:steps]
        taken.extend(i for s in got for i in s.indices)
        ends.add(got[-1].end if got else consumed)
        for s in got:  # every rank sees the same global batch boundaries
            assert s.end - s.start == min(global_batch, size - s.start)
            assert sum(len(m) for m in s.micro_batches) == len(s.indices)
            assert [i for m in s.micro_batches for i in m] == list(s.indices)
    assert len(ends) == 1, "ranks disagree on where the step ended"
    return taken, ends.pop()


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 200),
    seed=st.integers(0, 2**31),
    generations=st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 8), st.integers(0, 30), st.none() | st.integers(1, 9)),
        min_size=1, max_size=8,
    ),
)
def test_any_sequence_of_world_sizes_and_cuts_covers_each_index_once_per_epoch(size, seed, generations):
    """Each generation: its own global batch, world size, number of steps before the
    SIGTERM (a cut point anywhere, epoch boundaries included) and micro-batch limit."""
    epoch, consumed = 0, 0
    seen: dict[int, Counter] = {}
    for global_batch, world, steps, limit in generations:
        world = min(world, global_batch)
        remaining = steps
        while remaining > 0:  # a generation may run across epoch ends
            left = ElasticSampler(size, plan_batch(global_batch, world), 0).steps_left(consumed)
            n = min(remaining, left)
            taken, consumed = _generation(size, global_batch, world, epoch, consumed, n, seed, limit)
            seen.setdefault(epoch, Counter()).update(taken)
            remaining -= n
            if consumed == size:
                epoch, consumed = epoch + 1, 0
            if n == 0:
                break
    for e, counts in seen.items():
        assert max(counts.values()) == 1, f"epoch {e}: a sample consumed twice"
        if e < epoch:
            assert set(counts) == set(range(size)), f"epoch {e}: samples skipped"
        else:
            # the epoch in progress: exactly the first `consumed` positions of its order
            assert set(counts) == set(epoch_order(size, seed, e)[:consumed])


def test_rescale_mid_epoch_by_hand():
    """10 samples, global batch 4: 2 workers do one step, then 3 workers finish."""
    order = list(epoch_order(10, 7, 0))
    plan2, plan3 = plan_batch(4, 2), plan_batch(4, 3)
    s0 = next(ElasticSampler(10, plan2, 0, seed=7).steps(0, 0))
    s1 = next(ElasticSampler(10, plan2, 1, seed=7).steps(0, 0))
    assert (s0.indices, s1.indices) == (tuple(order[0:2]), tuple(order[2:4]))
    rest = [list(ElasticSampler(10, plan3, r, seed=7).steps(0, 4)) for r in range(3)]
    # positions 4..7: shares 2, 1, 1; positions 8..9 (the short last batch): 1, 1, 0
    assert [s.indices for s in rest[0]] == [tuple(order[4:6]), (order[8],)]
    assert [s.indices for s in rest[1]] == [(order[6],), (order[9],)]
    assert [s.indices for s in rest[2]] == [(order[7],), ()]
    assert [s.global_size for s in rest[2]] == [4, 2]
    assert rest[2][1].shares == (1, 1, 0)
    assert rest[0][1].loss_scale == pytest.approx(3 / 2)


def test_order_is_seeded_by_seed_plus_epoch_and_deterministic():
    assert list(epoch_order(50, 3, 2)) == list(epoch_order(50, 3, 2))
    assert list(epoch_order(50, 3, 2)) == list(epoch_order(50, 4, 1))  # seed + epoch
    assert list(epoch_order(50, 3, 2)) != list(epoch_order(50, 3, 3))
    assert sorted(epoch_order(50, 3, 2)) == list(range(50))
    assert list(epoch_order(5, 3, 2, shuffle=False)) == [0, 1, 2, 3, 4]


def test_drop_last_skips_the_short_batch_and_nothing_else():
    plan = plan_batch(4, 2)
    taken = [i for r in range(2) for s in ElasticSampler(10, plan, r, drop_last=True).steps(0) for i in s.indices]
    assert len(taken) == len(set(taken)) == 8
    assert ElasticSampler(10, plan, 0, drop_last=True).epoch_samples() == 8
    assert len(ElasticSampler(10, plan, 0, drop_last=True)) == 2
    assert len(ElasticSampler(10, plan, 0)) == 3


def test_steps_from_the_end_of_an_epoch_are_none():
    assert list(ElasticSampler(10, plan_batch(4, 2), 1).steps(0, 10)) == []


@pytest.mark.parametrize("kw", [dict(size=0, rank=0), dict(size=10, rank=2), dict(size=10, rank=-1)])
def test_bad_sampler_arguments(kw):
    with pytest.raises(BatchSizeError):
        ElasticSampler(kw["size"], plan_batch(4, 2), kw["rank"])


def test_position_outside_the_epoch_is_refused():
    with pytest.raises(BatchSizeError, match="position 11"):
        list(ElasticSampler(10, plan_batch(4, 2), 0).steps(0, 11))


def test_micro_batches_respect_the_limit():
    plan = plan_batch(10, 3, micro_batch_limit=2)  # shares 4, 3, 3 -> 2 micro-batches each
    steps = [list(ElasticSampler(25, plan, r).steps(0)) for r in range(3)]
    for rank_steps in steps:
        for s in rank_steps:
            assert len(s.micro_batches) == 2 and all(len(m) <= 2 for m in s.micro_batches)
