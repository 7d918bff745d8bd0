"""The served combination and the grammar of policy names.

``rlsched`` is the one name of the learned policy we serve: an ordering, a placement and
a scaling policy. Which ones is recorded here and nowhere else (:data:`SERVED`); the
simulator's ``--policies``, the interval engine's allocator names and the evaluation
protocol resolve ``rlsched`` through :func:`parse_policy_name`.

A policy name is one of

``rlsched``
    the served combination (:data:`SERVED`);
``<ordering>/<placement>[/<scaling>]``
    registered policies by name (:mod:`rlsched.core.policy`); scaling ``none`` is no
    scaling;
``<name>``
    a single word: an allocation policy of the interval engine (``tiresias-2q``,
    ``optimus-oracle``, ``pollux``); the simulator checks that it knows it;

each optionally followed by ``+backfill`` or ``+nobackfill``: the policy's own backfill
(later jobs start when the head of the queue does not fit, or not), so that one
comparison holds both. Without the suffix the engine's default applies (the event
engine's ``--backfill`` flag, off by default; the interval engine's gang allocator backfills).
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
    """The learned ordering, placement and scaling served under :data:`SERVED_NAME`,
    and why these (the protocol's verdict, in words)."""

    ordering: str
    placement: str
    scaling: str
    reason: str

    @property
    def triple(self) -> str:
        return f"{self.ordering}/{self.placement}/{self.scaling}"


#: The served combination. Change it only on the evaluation protocol's test split
#: (``rlsched eval protocol``), and say why in ``reason``.
SERVED = ServedPolicy(
    ordering="das",
    placement="das-agent",
    scaling="rlpto",
    reason=(
        "ordering: DAS (layout 2, non-clairvoyant, attained-service queues) and placement: the trained "
        "DAS placement agent (das-agent), the committed validation-chosen models; scaling: the learned "
        "RLPTO policy, because on the protocol's 20 test seeds it has a 6.8% lower sum of JCTs than FS+beta "
        "(fs with the planner's beta stop) with the 95% interval entirely below zero "
        "(docs/results/rlpto_protocol.md); without its weights it decides as FS+beta"
    ),
)


@dataclass(frozen=True)
class PolicyName:
    """A parsed policy name. ``allocator`` is set (and ordering/placement empty) for a
    single-word allocation policy; ``backfill`` is ``None`` for the engine's default."""

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
            return self.allocator
        return f"{self.ordering}/{self.placement}" + (f"/{self.scaling}" if self.scaling else "")

    @property
    def served(self) -> bool:
        return self.text == SERVED_NAME


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
        return PolicyName(base, s.ordering, s.placement, s.scaling, backfill=backfill)
    parts = base.split("/")
    if len(parts) == 1:
        return PolicyName(base, allocator=base, backfill=backfill)
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
        raise ValueError(f"policy {item!r}: expected ordering/placement[/scaling][+backfill|+nobackfill], "
                         f"{SERVED_NAME!r} or an allocation policy")
    parts = [p.strip() for p in parts]
    scaling = parts[2] if len(parts) == 3 and parts[2] != "none" else None
    return PolicyName(base, parts[0], parts[1], scaling, backfill=backfill)
