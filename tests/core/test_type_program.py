"""Sia's binary program over configurations (core/type_program.py), and the served
allocator's typed decision by it (``GoodputAllocator(typed="program")``): exact answers
on problems small enough to solve by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlsched.core.allocation import AllocNode
from rlsched.core.goodput_allocator import GoodputAllocator
from rlsched.core.type_program import Config, ProgramError, configurations, cost, solve

from .test_goodput_allocator_types import BIG, SMALL, _decide, _job, _nodes

A1, A2, A4 = Config("a", 1, 1), Config("a", 1, 2), Config("a", 1, 4)
B1 = Config("b", 1, 1)


def test_the_configurations_are_powers_of_two_in_a_node_then_whole_nodes_per_type():
    nodes = [AllocNode(0, 4, gpu_type="a"), AllocNode(1, 4, gpu_type="a"), AllocNode(2, 8, gpu_type="b")]
    assert configurations(nodes) == [Config("a", 1, 1), Config("a", 1, 2), Config("a", 1, 4), Config("a", 2, 8),
                                     Config("b", 1, 1), Config("b", 1, 2), Config("b", 1, 4), Config("b", 1, 8)]


def test_the_cost_is_the_damped_speedup_to_the_power_p_less_lambda():
    assert cost(np.array([1.0, 4.0])) == pytest.approx([1.0 - 1.1, 0.5 - 1.1])


def test_the_program_takes_the_cheapest_assignment_within_each_types_gpus():
    """Two jobs, 4 GPUs of ``a`` and 1 of ``b``: job 0 alone is best on 4 ``a`` (-1.0),
    but job 0 on 2 and job 1 on 2 (-0.6 - 0.6) beats job 0 on 4 and job 1 on ``b`` (-1.0
    - 0.1); the capacity of ``a`` forbids both on 4."""
    configs = [A1, A2, A4, B1]
    rows, cols, vals = [0, 0, 0, 1, 1, 1, 1], [0, 1, 2, 0, 1, 2, 3], [-0.2, -0.6, -1.0, -0.2, -0.6, -1.0, -0.1]
    chosen, _ = solve(2, configs, {"a": 4, "b": 1}, rows, cols, vals)
    assert chosen == {0: 1, 1: 1}
    # job 1 may not run on ``a``: job 0 takes all of it, job 1 the ``b`` GPU
    chosen, _ = solve(2, configs, {"a": 4, "b": 1}, [0, 0, 0, 1], [0, 1, 2, 3], [-0.2, -0.6, -1.0, -0.1])
    assert chosen == {0: 2, 1: 3}


def test_forced_pairs_groups_and_must_bind_and_an_impossible_one_is_an_error():
    configs = [A1, A2, A4]
    rows, cols, vals = [0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2], [-0.2, -0.3, -0.4, -0.1, -0.6, -1.0]
    assert solve(2, configs, {"a": 4}, rows, cols, vals)[0] == {1: 2}
    # job 0 kept on 1 GPU: job 1 gets the 2 left of 3 (4 is too many)
    assert solve(2, configs, {"a": 4}, rows, cols, vals, forced=[(0, 0)])[0] == {0: 0, 1: 1}
    # both must run: 2 + 2 beats 1 + 2 (one GPU idle) by job 0's gain
    assert solve(2, configs, {"a": 4}, rows, cols, vals, must=[0, 1])[0] == {0: 1, 1: 1}
    # a team of both jobs capped at 2 GPUs
    assert solve(2, configs, {"a": 4}, rows, cols, vals, groups=[([0, 1], 2)])[0] == {1: 1}
    with pytest.raises(ProgramError):
        solve(2, configs, {"a": 4}, rows, cols, vals, forced=[(0, 2), (1, 2)])


def _program(**kw) -> GoodputAllocator:
    return GoodputAllocator(typed="program", **kw)


def test_the_served_allocator_chooses_types_by_the_program_by_default():
    assert GoodputAllocator().typed == "program"
    with pytest.raises(ValueError, match="typed"):
        GoodputAllocator(typed="solver")


def test_a_job_that_scales_takes_the_fast_type_and_one_that_gains_little_the_slow_one():
    """Sia's costs by hand: big on 4 fast (12× its 1 slow GPU: -0.81) and small on 1
    slow (-0.1) beat big on 4 slow (-0.6) and small on 1 fast (-0.15)."""
    nodes = _nodes(("slow", 4), ("fast", 4))
    small, big = _job("small", SMALL, submit=0.0), _job("big", BIG, submit=1.0)
    _, where = _decide([small, big], nodes, _program())
    assert where == {"small": ("slow", 1), "big": ("fast", 4)}
    _, alone = _decide([big], nodes, _program())
    assert alone == {"big": ("fast", 4)}


def test_every_job_that_runs_gets_a_configuration_and_a_pinned_one_keeps_its_type():
    """``hold`` runs on all 8 ``fast`` GPUs and may run nowhere else; ``new`` gains more
    on ``fast`` alone, but both run: ``new`` goes to ``slow``."""
    nodes = _nodes(("fast", 8), ("slow", 8))
    hold = dataclasses.replace(_job("hold", BIG, alloc=(0,) * 8), min_replicas=8, gpu_models=frozenset({"fast"}))
    new = dataclasses.replace(_job("new", BIG, max_replicas=4, submit=1.0), min_replicas=2)
    _, got = _decide([hold, new], nodes, _program())
    assert got == {"hold": ("fast", 8), "new": ("slow", 4)}


def test_a_job_keeps_its_configuration_while_it_restarts():
    """``big`` starts on 4 fast GPUs at t = 0; at t = 30 s, inside its measured 100 s
    restart, a job 30x faster on ``fast`` arrives and ``big`` keeps all 4 (the rival goes
    to ``slow``); at t = 300 s the fast GPUs are shared, 2 each: the rival's 60x its slow
    GPU and ``big``'s 6x (damped by 0.998) cost 0.129 + 0.409, less than the rival on 4
    (0.091) and ``big`` on 4 slow (0.501)."""
    nodes = _nodes(("slow", 4), ("fast", 4))
    alloc = _program()
    big = _job("big", BIG, age=1e5)
    out, where = _decide([big], nodes, alloc, now=0.0)
    assert where == {"big": ("fast", 4)}
    held = dataclasses.replace(big, allocation=out["big"].nodes, restart_s=100.0, num_restarts=1)
    rival = _job("rival", {"fast": (30.0, 0.0), "slow": (1.0, 0.0)}, submit=2.0)
    _, kept = _decide([held, rival], nodes, alloc, now=30.0)
    assert kept == {"big": ("fast", 4), "rival": ("slow", 4)}
    _, later = _decide([held, rival], nodes, alloc, now=300.0)
    assert later == {"big": ("fast", 2), "rival": ("fast", 2)}


def test_a_teams_jobs_stay_within_its_cap_on_several_types():
    """Team ``a`` may hold 4 GPUs (2 nominal + 2 borrowed) of 16: its two jobs, each able
    to use 8, hold 4 together, and both run; without queues they hold more."""
    from rlsched.core.queues import QueueBook, QueueSpec

    nodes = _nodes(("slow", 8), ("fast", 8))
    jobs = [dataclasses.replace(_job("a1", BIG, submit=0.0), queue="a"),
            dataclasses.replace(_job("a2", BIG, submit=1.0), queue="a"),
            dataclasses.replace(_job("b1", BIG, submit=2.0), queue="b")]
    book = QueueBook([QueueSpec("a", 2, borrowing_limit=2), QueueSpec("b", 8)])

    def held(queues):
        out = _program().allocate(jobs, nodes, 0.0, queues=queues)
        return {jid: len(a.nodes) for jid, a in out.items()}

    capped, free = held(book), held(None)
    assert capped["a1"] + capped["a2"] == 4 and min(capped.values()) > 0
    assert free["a1"] + free["a2"] > 4
