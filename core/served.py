"""The served combination and the grammar of policy names.

:data:`SERVED` records, here and nowhere else, what ``rlsched`` names; the operator, the
simulator, the interval engine and the protocol resolve names with
:func:`parse_policy_name`. A name is ``rlsched``, ``<ordering>/<placement>[/<scaling>]``,
``<allocator>/<placement>`` (a live allocation policy of core's registry,
:func:`rlsched.core.policy.allocator_names`) or one word (an
interval-engine allocator), each optionally followed by ``+backfill`` or ``+nobackfill``.
The grammar in full: docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ServedPolicy", "SERVED", "SERVED_NAME", "PolicyName", "parse_policy_name", "BACKFILL_SUFFIXES"]

#: the CLI name of the served combination
SERVED_NAME = "rlsched"

#: suffix -> backfill
BACKFILL_SUFFIXES = {"+backfill": True, "+nobackfill": False}


@dataclass(frozen=True)
class ServedPolicy:
    """What is served under :data:`SERVED_NAME`, and why (the protocol's verdict, in
    words): an allocation policy with the placement that puts its new workers on nodes
    (``allocator`` set), or an ordering, a placement and a scaling policy."""

    ordering: str
    placement: str
    scaling: str
    reason: str
    allocator: str = ""

    @property
    def triple(self) -> str:
        if self.allocator:
            return f"{self.allocator}/{self.placement}"
        return f"{self.ordering}/{self.placement}/{self.scaling}"


#: The served policy. Change it only on the evaluation protocol's test split
#: (``rlsched eval protocol``), say why in ``reason`` and put the figures in
#: docs/results/served.md.
SERVED = ServedPolicy(
    ordering="",
    placement="das",
    scaling="",
    allocator="goodput-rlpto@adaptive=0.8,room_rounds=30",
    reason=(
        "rlsched's goodput allocator with RLPTO's network as its growth weight, a demotion "
        "threshold learnt from the service of the jobs that left and thirty rounds for GPUs "
        "no node can hold a job's workers on, new workers placed by DAS; the protocol's "
        "figures that chose it: docs/results/served.md"
    ),
)


@dataclass(frozen=True)
class PolicyName:
    """A parsed policy name. ``allocator`` is set (and ordering empty) for an allocation
    policy: a single word (the interval engine's), or ``<allocator>/<placement>`` (the
    event engine's and the operator's, new workers placed by ``placement``);
    ``backfill`` is ``None`` for the engine's default."""

    text: str  # as written, without the backfill suffix (``rlsched`` stays ``rlsched``)
    ordering: str = ""
    placement: str = ""
    scaling: str | None = None
    allocator: str = ""
    backfill: bool | None = None

    @property
    def label(self) -> str:
        """The name as printed: the text plus its backfill suffix, if any."""
        if self.backfill is None:
            return self.text
        return self.text + ("+backfill" if self.backfill else "+nobackfill")

    @property
    def triple(self) -> str:
        """``ordering/placement[/scaling]`` (or the allocator's name), resolved."""
        if self.allocator:
            return f"{self.allocator}/{self.placement}" if self.placement else self.allocator
        return f"{self.ordering}/{self.placement}" + (f"/{self.scaling}" if self.scaling else "")

    @property
    def served(self) -> bool:
        return self.text == SERVED_NAME


def _live_allocators() -> tuple[str, ...]:
    """The allocation policies that also decide in the event engine and the operator
    (``<allocator>/<placement>``): core's registry."""
    from .policy import allocator_names

    return allocator_names(live=True)


def parse_policy_name(text: str) -> PolicyName:
    """Parse one policy name (grammar in the module docstring); ``ValueError`` with the
    reason for a malformed one. Does not check that the policies are registered."""
    item = text.strip()
    backfill: bool | None = None
    base, plus, suffix = item.partition("+")
    if plus:
        key = "+" + suffix
        if key not in BACKFILL_SUFFIXES:
            raise ValueError(f"policy {item!r}: unknown suffix {key!r}; known: {', '.join(BACKFILL_SUFFIXES)}")
        backfill = BACKFILL_SUFFIXES[key]
    base = base.strip()
    if not base:
        raise ValueError(f"policy {item!r}: empty name")
    if base == SERVED_NAME:
        s = SERVED
        return PolicyName(base, s.ordering, s.placement, s.scaling or None, allocator=s.allocator, backfill=backfill)
    parts = base.split("/")
    if len(parts) == 1:
        return PolicyName(base, allocator=base, backfill=backfill)
    if len(parts) == 2 and parts[0].strip().partition("@")[0] in _live_allocators() and parts[1].strip():
        return PolicyName(base, placement=parts[1].strip(), allocator=parts[0].strip(), backfill=backfill)
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
        raise ValueError(f"policy {item!r}: expected ordering/placement[/scaling][+backfill|+nobackfill], "
                         f"{SERVED_NAME!r} or an allocation policy")
    parts = [p.strip() for p in parts]
    scaling = parts[2] if len(parts) == 3 and parts[2] != "none" else None
    return PolicyName(base, parts[0], parts[1], scaling, backfill=backfill)
