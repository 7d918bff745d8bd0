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
``<ordering>/<placement>[/<scaling>]``
    any of our orderings and placements (``fifo/bestfit``, ``tiresias/topology``, ...)
    as a gang allocator with backfill (:class:`rlsched.core.gang_allocator.GangAllocator`):
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


def _pollux(**opts) -> Allocator:
    from .peers.pollux import PolluxAllocator

    return PolluxAllocator(**opts)


#: name -> factory(**options)
ALLOCATORS: dict[str, Callable[..., Allocator]] = {
    "tiresias-2q": _tiresias,
    "optimus-oracle": _optimus,
    "pollux": _pollux,
}


def is_allocator(name: str) -> bool:
    return name in ALLOCATORS


def make_allocator(name: str, *, seed: int = 0, **opts) -> Allocator:
    """A fresh allocator (each run needs its own: allocators keep state)."""
    if "/" in name:
        import numpy as np

        from rlsched.core import make_ordering, make_placement, make_scaling
        from rlsched.core.gang_allocator import GangAllocator

        parts = name.split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise ValueError(f"allocation policy {name!r}: expected a name or ordering/placement[/scaling]")
        so, sp, ss = np.random.SeedSequence(seed).spawn(3)
        scaling = None
        if len(parts) == 3 and parts[2] != "none":
            scaling = make_scaling(parts[2], rng=np.random.default_rng(ss))
        return GangAllocator(make_ordering(parts[0], rng=np.random.default_rng(so)),
                             make_placement(parts[1], rng=np.random.default_rng(sp)), scaling, name=name, **opts)
    try:
        factory = ALLOCATORS[name]
    except KeyError:
        raise ValueError(f"unknown allocation policy {name!r}; known: {', '.join(ALLOCATORS)}") from None
    return factory(**opts)
