"""Allocation policies by name, for the interval engine (:mod:`.interval`) and the CLI.

``tiresias-2q``
    Tiresias, two-queue discretized 2D-LAS with fixed GPUs and batch size
    (:mod:`rlsched.core.peers.tiresias`).
``optimus-oracle``
    Optimus with oracle knowledge of each job's remaining work and speed
    (:mod:`rlsched.core.peers.optimus`): a clairvoyant reference, never a baseline.
``pollux``
    the released Pollux policy (PyPI ``adaptdl-sched==0.2.11``) in its own environment,
    through a bridge process (:mod:`rlsched.sim.peers.pollux`; ``make pollux-env``).
``goodput``
    rlsched's goodput allocator (:mod:`rlsched.core.goodput_allocator`): fairness by
    attained service decides who runs, goodput per GPU who grows, the batch size with
    the allocation, the restart cost weighed in every change.
``goodput-learned``
    the goodput allocator with the learned growth weight
    (:mod:`rlsched.core.growth_weight`, ``rlsched train growth``) in place of the
    service weight.
``goodput-rlpto``
    the goodput allocator weighted by RLPTO's network retrained on it
    (:mod:`rlsched.core.rlpto_weight`, ``rlsched train growth --form rlpto``): the
    served allocator (:data:`rlsched.core.served.SERVED`), live and in the event engine
    too (:mod:`rlsched.core.live_allocation`).
``rlsched``
    the served learned combination (:data:`rlsched.core.served.SERVED`) as below.
``<ordering>/<placement>[/<scaling>][+backfill|+nobackfill]``
    any of our orderings and placements (``fifo/bestfit``, ``tiresias/topology``, ...)
    as a gang allocator with backfill unless ``+nobackfill`` (:class:`rlsched.core.gang_allocator.GangAllocator`):
    requested GPUs and batch size, no preemption; with a scaling policy (``beta``,
    ``fs``, ``optimus``, ``rlpto``, ...) core's elastic planner resizes running jobs on
    their reported learning curves.
"""

from __future__ import annotations

from typing import Callable

from rlsched.core.allocation import Allocator

__all__ = ["ALLOCATORS", "make_allocator", "is_allocator"]


def _tiresias(**opts) -> Allocator:
    from rlsched.core.peers import TiresiasAllocator

    return TiresiasAllocator(**opts)


def _optimus(**opts) -> Allocator:
    from rlsched.core.peers import OptimusOracle

    return OptimusOracle(**opts)


def _pollux_paper(**opts) -> Allocator:
    from rlsched.core.peers import PolluxPaperAllocator

    return PolluxPaperAllocator(**opts)


def _goodput(**opts) -> Allocator:
    from rlsched.core.goodput_allocator import GoodputAllocator

    return GoodputAllocator(**opts)


def _goodput_learned(growth_model=None, **opts) -> Allocator:
    from rlsched.core.growth_weight import learned_goodput

    return learned_goodput(growth_model, **opts)


def _goodput_rlpto(rlpto_model=None, **opts) -> Allocator:
    from rlsched.core.rlpto_weight import rlpto_goodput

    return rlpto_goodput(rlpto_model, **opts)


def _pollux(**opts) -> Allocator:
    from .peers.pollux import PolluxAllocator

    return PolluxAllocator(**opts)


#: name -> factory(**options)
ALLOCATORS: dict[str, Callable[..., Allocator]] = {
    "tiresias-2q": _tiresias,
    "optimus-oracle": _optimus,
    "pollux": _pollux,
    # PolluxSched as the paper describes it (core/peers/pollux_paper.py), beside the
    # released one ("pollux", its own environment)
    "pollux-paper": _pollux_paper,
    # rlsched's own goodput allocator (core/goodput_allocator.py)
    "goodput": _goodput,
    # the same with the learned growth weight (core/growth_weight.py; the promoted
    # core/weights/growth.safetensors, the service weight when it cannot be read)
    "goodput-learned": _goodput_learned,
    # RLPTO's network retrained on the goodput mechanism (core/rlpto_weight.py): served
    "goodput-rlpto": _goodput_rlpto,
}


def is_allocator(name: str) -> bool:
    return name in ALLOCATORS


def make_allocator(name: str, *, seed: int = 0, **opts) -> Allocator:
    """A fresh allocator (each run needs its own: allocators keep state). ``name`` is
    a policy name (:func:`rlsched.core.served.parse_policy_name`): an allocation policy,
    ``ordering/placement[/scaling]`` or ``rlsched`` (the served combination), the last
    two with an optional ``+backfill``/``+nobackfill`` (default: backfill)."""
    from rlsched.core.served import parse_policy_name

    pol = parse_policy_name(name)
    if not pol.allocator:
        import numpy as np

        from rlsched.core import make_ordering, make_placement, make_scaling
        from rlsched.core.gang_allocator import GangAllocator

        so, sp, ss = np.random.SeedSequence(seed).spawn(3)
        scaling = make_scaling(pol.scaling, rng=np.random.default_rng(ss)) if pol.scaling else None
        if pol.backfill is not None:
            opts = {**opts, "backfill": pol.backfill}
        return GangAllocator(make_ordering(pol.ordering, rng=np.random.default_rng(so)),
                             make_placement(pol.placement, rng=np.random.default_rng(sp)), scaling, name=pol.label, **opts)
    try:
        factory = ALLOCATORS[pol.allocator]
    except KeyError:
        raise ValueError(f"unknown allocation policy {name!r}; known: {', '.join(ALLOCATORS)}, "
                         "ordering/placement[/scaling] or rlsched") from None
    if pol.backfill is not None:
        raise ValueError(f"allocation policy {pol.allocator!r} has its own queue rules: no +backfill/+nobackfill")
    return factory(**opts)
