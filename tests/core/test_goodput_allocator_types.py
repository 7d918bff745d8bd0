"""The goodput allocator on nodes of several GPU types (core/goodput_allocator.py): type,
count and batch in one decision — a job that scales goes to the fast type, one that gains
little to the slow type when the fast one is contended, never across types, a move
between types charged as a restart — and on one type exactly the single-type decision."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from rlsched.core.allocation import AllocJob, AllocNode, ProfileSample, check_allocations
from rlsched.core.batch import BatchBounds
from rlsched.core.goodput_allocator import GoodputAllocator
from rlsched.sim.allocators import make_allocator

#: a fixed per-GPU batch: goodput is throughput alone
FIXED = BatchBounds(64, 64 * 64, 64, 64)
SHAPES = ((1, 1), (2, 1), (4, 1), (8, 2))


def _reports(gpu_type: str, speed: float, sync: float) -> tuple[ProfileSample, ...]:
    """Step times on ``gpu_type``: compute ``0.074 / speed`` s, plus ``sync`` s per step
    on 2+ GPUs (``sync = 0``: perfect scaling)."""
    out = []
    for k, n in SHAPES:
        t = 0.074 / speed + (sync * (1 + 0.2 * (n - 1)) if k > 1 else 0.0)
        out.append(ProfileSample(n, k, 64, t, t - 0.074 / speed, 0, gpu_type))
    return tuple(out)


def _job(jid: str, types: dict[str, tuple[float, float]], *, max_replicas: int = 8, alloc=(), age: float = 1e5,
         restarts: int = 0, submit: float = 0.0) -> AllocJob:
    """A job that reported on each of ``types`` (``type: (speed, sync)``)."""
    profile = tuple(s for t, (speed, sync) in types.items() for s in _reports(t, speed, sync))
    return AllocJob(id=jid, submit_time=submit, application="app", age=age, attained_service=0.0,
                    num_restarts=restarts, allocation=tuple(alloc), target_replicas=1, target_batch_size=64,
                    min_replicas=1, max_replicas=max_replicas, bounds=FIXED, grad_sqr=1.0, grad_var=1.0,
                    profile=profile)


def _nodes(*spec: tuple[str, int]) -> list[AllocNode]:
    return [AllocNode(i, g, f"n{i}", gpu_model=t, gpu_type=t) for i, (t, g) in enumerate(spec)]


def _decide(jobs, nodes, allocator=None, now=0.0):
    out = (allocator or GoodputAllocator()).allocate(jobs, nodes, now)
    check_allocations(jobs, nodes, out)
    type_of = {n.index: n.gpu_type for n in nodes}
    for jid, a in out.items():
        assert len({type_of[i] for i in a.nodes}) <= 1, (jid, a.nodes)  # never across types
    return out, {jid: (type_of[a.nodes[0]], a.replicas) if a.nodes else None for jid, a in out.items()}


#: a job that scales perfectly and runs 3x faster on "fast"; one whose 2+ GPUs are
#: slower than one and that gains 10% on "fast"
BIG = {"fast": (3.0, 0.0), "slow": (1.0, 0.0)}
SMALL = {"fast": (1.1, 0.5), "slow": (1.0, 0.5)}


@pytest.mark.parametrize("policy", ["goodput", "goodput-rlpto"])
def test_the_allocator_chooses_types_itself(policy):
    assert make_allocator(policy).type_aware is True


def test_a_job_that_scales_takes_the_fast_type_and_one_that_gains_little_the_slow_one():
    """4 fast and 4 slow GPUs: the scaling job holds all 4 fast GPUs, the small one (first
    in the fairness order) one slow GPU; alone, the small one takes the fast GPU."""
    nodes = _nodes(("slow", 4), ("fast", 4))
    small, big = _job("small", SMALL, submit=0.0), _job("big", BIG, submit=1.0)
    _, where = _decide([small, big], nodes)
    assert where == {"small": ("slow", 1), "big": ("fast", 4)}
    _, alone = _decide([small], nodes)
    assert alone == {"small": ("fast", 1)}


def test_a_job_is_not_split_across_types_even_where_only_a_split_would_hold_its_count():
    """3 fast + 3 slow GPUs, one perfectly scaling job: it takes the 3 fast GPUs, never 6
    across types; random cases hold one type per job and the cluster's limits."""
    _, where = _decide([_job("big", BIG)], _nodes(("fast", 3), ("slow", 3)))
    assert where == {"big": ("fast", 3)}
    rng = random.Random(7)
    for case in range(12):
        nodes = _nodes(*[(rng.choice(["a", "b", "c"]), rng.choice([2, 4, 8])) for _ in range(rng.randint(2, 5))])
        jobs = []
        for i in range(rng.randint(1, 9)):
            types = {t: (rng.uniform(0.5, 3.0), rng.choice([0.0, 0.01, 0.3])) for t in ("a", "b", "c")}
            held = [n.index for n in nodes if n.gpu_type == "a"][:1] if i == 0 else []
            jobs.append(_job(f"j{i}", types, max_replicas=rng.randint(1, 12), alloc=held, submit=float(i)))
        _decide(jobs, nodes)  # checks every allocation and one type per job


def test_a_move_between_types_is_charged_as_a_restart():
    """A one-GPU job on a slow GPU, a fast one 20% faster free: young (the restart
    factor 100/160 takes more than the 20%) it stays; old, it moves."""
    nodes = _nodes(("slow", 4), ("fast", 4))
    gain = {"fast": (1.2, 0.0), "slow": (1.0, 0.0)}
    _, young = _decide([_job("j", gain, max_replicas=1, alloc=(0,), age=100.0)], nodes)
    assert young == {"j": ("slow", 1)}
    _, old = _decide([_job("j", gain, max_replicas=1, alloc=(0,), age=1e5)], nodes)
    assert old == {"j": ("fast", 1)}
    # the same move with 3 restarts behind it (factor 0 at age 100): it stays
    _, worn = _decide([_job("j", gain, max_replicas=1, alloc=(0,), age=100.0, restarts=3)], nodes)
    assert worn == {"j": ("slow", 1)}


def test_one_type_is_the_single_type_decision_labelled_or_not():
    """On nodes of one type the decisions, over several calls, are the same whether nodes
    and reports carry the type's name or none (the single-type path)."""
    rng = random.Random(3)
    jobs = [_job(f"j{i}", {"x": (rng.uniform(0.5, 2.0), rng.choice([0.0, 0.02, 0.3]))},
                 max_replicas=rng.randint(1, 16), submit=float(i), age=rng.uniform(10, 1e4)) for i in range(10)]
    bare = [dataclasses.replace(j, profile=tuple(dataclasses.replace(s, gpu_type="") for s in j.profile))
            for j in jobs]
    named, blank = GoodputAllocator(), GoodputAllocator()
    n_named, n_blank = _nodes(*[("x", 4)] * 4), [AllocNode(i, 4, f"n{i}") for i in range(4)]
    for step in range(3):
        a, _ = _decide(jobs, n_named, named, now=60.0 * step)
        b, _ = _decide(bare, n_blank, blank, now=60.0 * step)
        assert a == b
        jobs = [dataclasses.replace(j, allocation=a[j.id].nodes) for j in jobs]
        bare = [dataclasses.replace(j, allocation=b[j.id].nodes) for j in bare]


@pytest.mark.parametrize("why", ["gpu_models", "protected"])
def test_a_job_whose_gang_fits_one_type_only_keeps_it_from_a_job_that_could_run_elsewhere(why):
    """``hold`` runs on all 8 ``fast`` GPUs and fits nowhere else (its GPU models, or
    its minimum run time keeps it at home); ``new`` gains more there per GPU but can run
    on ``slow``: it lands on ``slow`` and ``hold`` keeps its GPUs."""
    nodes = _nodes(("fast", 8), ("slow", 8))
    hold = dataclasses.replace(_job("hold", BIG, alloc=(0,) * 8), min_replicas=8,
                               **({"gpu_models": frozenset({"fast"})} if why == "gpu_models" else {"protected": True}))
    new = dataclasses.replace(_job("new", BIG, max_replicas=4, submit=1.0), min_replicas=2)
    _, got = _decide([hold, new], nodes)
    assert got == {"hold": ("fast", 8), "new": ("slow", 4)}, got


def test_a_gpu_of_a_type_costs_the_mean_speed_of_the_jobs_there_over_their_slowest_type():
    """Prices: one job 3x on "fast", one 1.1x: a fast GPU costs (3 + 1.1)/2 = 2.05 slow
    ones; ``type_price = 0``: every type 1; ``a = 2``: the mean squared."""
    cols = [{"fast": np.array([0.0, 3.0, 6.0]), "slow": np.array([0.0, 1.0, 2.0])},
            {"fast": np.array([0.0, 2.2, 4.0]), "slow": np.array([0.0, 2.0, 3.0])}]
    assert GoodputAllocator().prices(cols) == pytest.approx({"fast": 2.05, "slow": 1.0}, rel=1e-12)
    assert GoodputAllocator(type_price=0.0).prices(cols) == {"fast": 1.0, "slow": 1.0}
    assert GoodputAllocator(type_price=2.0).prices(cols) == pytest.approx({"fast": 2.05 ** 2, "slow": 1.0}, rel=1e-12)
    with pytest.raises(ValueError, match="type_price"):
        GoodputAllocator(type_price=-1.0)


def test_the_fast_type_goes_to_the_job_it_speeds_up_more_than_the_others():
    """4 slow + 4 fast GPUs; "a" scales perfectly and gains 20% on fast, "b" runs on one
    GPU and gains 4x. In the growth heap (``typed="heap"``), unpriced, "a" takes 3 fast
    GPUs (speed 3.6) and the slow ones stay idle; priced (its default), "a" takes the 4
    slow ones (speed 4) and "b" a fast one."""
    nodes = _nodes(("slow", 4), ("fast", 4))
    jobs = [_job("a", {"fast": (1.2, 0.0), "slow": (1.0, 0.0)}, submit=0.0),
            _job("b", {"fast": (4.0, 0.02), "slow": (1.0, 0.02)}, submit=1.0)]
    _, priced = _decide(jobs, nodes, GoodputAllocator(typed="heap"))
    assert priced == {"a": ("slow", 4), "b": ("fast", 1)}
    _, unpriced = _decide(jobs, nodes, GoodputAllocator(type_price=0.0, typed="heap"))
    assert unpriced == {"a": ("fast", 3), "b": ("fast", 1)}


def test_the_restart_factor_charges_the_stall_the_job_measured():
    """``measured_restart``: ``δ`` is the job's own measured stall (``restart_s``) once it
    has one, ``restart_delay`` before; a one-GPU job 20% faster on a free fast GPU moves
    at δ = 60 s (factor 1000/1060) and stays at its measured 250 s (1000/1250)."""
    a, m = GoodputAllocator(measured_restart=False), GoodputAllocator()
    j = _job("j", {"fast": (1.2, 0.0), "slow": (1.0, 0.0)}, max_replicas=1, alloc=(0,), age=1000.0)
    slow = dataclasses.replace(j, restart_s=250.0)
    assert m.factor(j, measured=True) == pytest.approx(1000 / 1060, rel=1e-12)  # unmeasured: restart_delay
    assert m.factor(slow, measured=True) == pytest.approx(1000 / 1250, rel=1e-12)
    assert a.factor(slow) == m.factor(slow) == pytest.approx(1000 / 1060, rel=1e-12)
    twice = dataclasses.replace(slow, num_restarts=2)
    assert m.factor(twice, measured=True) == pytest.approx(500 / 1250, rel=1e-12)
    nodes = _nodes(("slow", 4), ("fast", 4))
    assert _decide([j], nodes, m)[1] == {"j": ("fast", 1)}
    assert _decide([slow], nodes, a)[1] == {"j": ("fast", 1)}
    assert _decide([slow], nodes, m)[1] == {"j": ("slow", 1)}


def test_a_running_jobs_gpus_go_to_a_job_that_would_wait_or_to_one_that_pays_its_restart():
    """In the growth heap (``typed="heap"``): a long-running job holds the 4 fast GPUs; a
    new job limited to them arrives. Uncharged, the new one takes 3 of them; ``displace="waiting"``: only its gang of 1.
    ``take_charge``: it pays the old job's weight × 4 GPUs × its 250 s, and takes 3 only
    while that is small."""
    nodes = _nodes(("slow", 4), ("fast", 4))
    old = dataclasses.replace(_job("old", BIG, alloc=(1,) * 4, restarts=1), attained_service=1e6, restart_s=250.0)
    new = dataclasses.replace(_job("new", BIG, submit=1.0, age=600.0), gpu_models=frozenset({"fast"}))
    grab, keep = {"old": ("fast", 1), "new": ("fast", 3)}, {"old": ("fast", 3), "new": ("fast", 1)}
    assert _decide([old, new], nodes, GoodputAllocator(take_charge=0.0, typed="heap"))[1] == grab
    assert _decide([old, new], nodes, GoodputAllocator(take_charge=0.0, displace="waiting", typed="heap"))[1] == keep
    assert _decide([old, new], nodes, GoodputAllocator(take_charge=1e-3, typed="heap"))[1] == grab
    assert _decide([old, new], nodes, GoodputAllocator(take_charge=0.01, typed="heap"))[1] == keep
    assert _decide([old, new], nodes, GoodputAllocator(typed="heap"))[1] == keep  # take_charge = 1
    for bad in ({"displace": "never"}, {"take_charge": -1.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            GoodputAllocator(**bad)


def test_the_restart_options_leave_the_single_type_decision_as_it_is():
    rng = random.Random(5)
    nodes = [AllocNode(i, 4, f"n{i}") for i in range(4)]
    jobs = [dataclasses.replace(
        _job(f"j{i}", {"": (rng.uniform(0.5, 2.0), rng.choice([0.0, 0.02, 0.3]))}, max_replicas=rng.randint(1, 16),
             submit=float(i), age=rng.uniform(10, 1e4), alloc=(i % 4,) * (i % 3), restarts=i % 2),
        restart_s=rng.choice([None, 250.0])) for i in range(10)]
    opts = GoodputAllocator(measured_restart=True, displace="waiting", take_charge=1.0)
    off = GoodputAllocator(measured_restart=False, take_charge=0.0)
    assert _decide(jobs, nodes, opts)[0] == _decide(jobs, nodes, off)[0] == _decide(jobs, nodes)[0]


class _Favour:
    """A growth weight that favours one job a hundredfold."""

    def __init__(self, favoured: str) -> None:
        self.favoured, self.prepared = favoured, 0

    def prepare(self, jobs, nodes) -> None:
        self.prepared += 1

    def weight(self, job: AllocJob) -> float:
        return 100.0 if job.id == self.favoured else 0.01


def test_on_several_types_the_learned_weight_gives_way_to_the_service_weight_when_asked():
    """In the growth heap (``typed="heap"``), ``typed_growth=False``: on several GPU types
    the decision is the one without a learned weight, which is not even prepared; on one type the learned weight stays."""
    rng = random.Random(7)
    nodes = _nodes(("slow", 4), ("slow", 4), ("fast", 4))
    jobs = [dataclasses.replace(
        _job(f"j{i}", {"fast": (rng.uniform(1.0, 4.0), rng.choice([0.0, 0.02])), "slow": (1.0, 0.02)},
             max_replicas=rng.randint(1, 8), submit=float(i), age=rng.uniform(100, 1e4),
             alloc=(i % 3,) * (i % 2), restarts=i % 2),
        attained_service=rng.uniform(0, 1e5)) for i in range(9)]
    plain = _decide(jobs, nodes, GoodputAllocator(typed="heap"))[0]
    off = GoodputAllocator(typed_growth=False, typed="heap")
    off.growth = _Favour("j8")
    assert _decide(jobs, nodes, off)[0] == plain and off.growth.prepared == 0
    assert off.typed_weight(jobs[8]) == GoodputAllocator(typed="heap").weight(jobs[8]) != off.weight(jobs[8])
    on = GoodputAllocator(typed="heap")
    on.growth = _Favour("j8")
    assert on.typed_weight(jobs[8]) == 100.0
    favoured = _decide(jobs, nodes, on)[1]
    assert favoured != _decide(jobs, nodes, GoodputAllocator(typed="heap"))[1] and on.growth.prepared == 1
    one = [AllocNode(i, 4, f"n{i}") for i in range(3)]
    flat = [dataclasses.replace(j, profile=tuple(dataclasses.replace(s, gpu_type="") for s in j.profile
                                                 if s.gpu_type == "slow")) for j in jobs]
    single = GoodputAllocator(typed_growth=False, typed="heap")
    single.growth = _Favour("j8")
    assert single.allocate(flat, one, 0.0) == on.allocate(flat, one, 1.0)
