"""Allocation policies by name, for the interval engine (:mod:`.interval`) and the CLI.

The peers (``tiresias-2q``; ``optimus-oracle``, a clairvoyant reference; the released
``pollux`` through a bridge process), rlsched's ``goodput`` allocator and its learned
weights (``goodput-learned``, ``goodput-rlpto``: the served one), ``rlsched``, and any
``<ordering>/<placement>[/<scaling>]`` as a gang allocator. The list: docs/design-notes.md.
"""

from __future__ import annotations

from typing import Callable

from rlsched.core.allocation import Allocator

__all__ = ["ALLOCATORS", "make_allocator", "is_allocator"]


def _tiresias(**opts) -> Allocator:
    from rlsched.sim.peers import TiresiasAllocator

    return TiresiasAllocator(**opts)


def _optimus(**opts) -> Allocator:
    from rlsched.sim.peers import OptimusOracle

    return OptimusOracle(**opts)


def _pollux_paper(**opts) -> Allocator:
    from rlsched.sim.peers import PolluxPaperAllocator

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
    # PolluxSched as the paper describes it (sim/peers/pollux_paper.py), beside the
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
