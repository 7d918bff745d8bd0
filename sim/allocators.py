"""Allocation policies by name, for the interval engine (:mod:`.interval`) and the CLI.

The peers (``tiresias-2q``; ``optimus-oracle``, a clairvoyant reference; the released
``pollux`` through a bridge process), rlsched's ``goodput`` allocator and its learned
weights (``goodput-learned``, ``goodput-rlpto``: the served one), ``rlsched``, and any
``<ordering>/<placement>[/<scaling>]`` as a gang allocator. The one registry of names is
core's (:func:`rlsched.core.policy.register_allocator`): importing this module registers
the peers into it. The list: docs/design-notes.md.
"""

from __future__ import annotations

from rlsched.core.allocation import Allocator
from rlsched.core.policy import allocator_names, make_allocator as make_registered, register_allocator

__all__ = ["make_allocator", "is_allocator"]


@register_allocator("tiresias-2q")
def _tiresias(**opts) -> Allocator:
    from .peers import TiresiasAllocator

    return TiresiasAllocator(**opts)


@register_allocator("optimus-oracle", clairvoyant=True)
def _optimus(**opts) -> Allocator:
    from .peers import OptimusOracle

    return OptimusOracle(**opts)


@register_allocator("pollux")
def _pollux(**opts) -> Allocator:
    from .peers.pollux import PolluxAllocator

    return PolluxAllocator(**opts)


# PolluxSched as the paper describes it (sim/peers/pollux_paper.py), beside the released
# one ("pollux", its own environment)
@register_allocator("pollux-paper")
def _pollux_paper(**opts) -> Allocator:
    from .peers import PolluxPaperAllocator

    return PolluxPaperAllocator(**opts)


# Sia (SOSP'23) as its paper describes it (sim/peers/sia.py): type-aware
@register_allocator("sia")
def _sia(**opts) -> Allocator:
    from .peers.sia import SiaAllocator

    return SiaAllocator(**opts)


# Gavel (OSDI'20), max-sum-throughput with its rounds (sim/peers/gavel.py): type-aware
@register_allocator("gavel")
def _gavel(**opts) -> Allocator:
    from .peers.gavel import GavelAllocator

    return GavelAllocator(**opts)


def is_allocator(name: str) -> bool:
    return name in allocator_names()


def make_allocator(name: str, *, seed: int = 0, **opts) -> Allocator:
    """A fresh allocator (each run needs its own: allocators keep state). ``name`` is
    a policy name (:func:`rlsched.core.served.parse_policy_name`): an allocation policy,
    ``ordering/placement[/scaling]`` or ``rlsched`` (the served combination), the last
    two with an optional ``+backfill``/``+nobackfill`` (default: backfill)."""
    from rlsched.core.served import parse_policy_name

    pol = parse_policy_name(name)
    if not pol.allocator:
        from rlsched.core.gang_allocator import GangAllocator

        return GangAllocator.named(name, seed=seed, **opts)
    from rlsched.core.live_allocation import parse_allocator_options

    base, options = parse_allocator_options(pol.allocator)  # name[@key=value,...], as the operator's --allocator
    if not is_allocator(base):
        raise ValueError(f"unknown allocation policy {name!r}; known: {', '.join(allocator_names())}, "
                         "ordering/placement[/scaling] or rlsched")
    if pol.backfill is not None:
        raise ValueError(f"allocation policy {pol.allocator!r} has its own queue rules: no +backfill/+nobackfill")
    return make_registered(base, **{**options, **opts})
