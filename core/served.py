"""The served combination and the grammar of policy names.

``rlsched`` is the one name of the policy we serve: an allocation policy with the
placement of its new workers (now), or an ordering, a placement and a scaling policy.
Which is recorded here and nowhere else (:data:`SERVED`); the operator's defaults, the
simulator's ``--policies``, the interval engine's allocator names and the evaluation
protocol resolve ``rlsched`` through :func:`parse_policy_name`.

A policy name is one of

``rlsched``
    the served combination (:data:`SERVED`);
``<ordering>/<placement>[/<scaling>]``
    registered policies by name (:mod:`rlsched.core.policy`); scaling ``none`` is no
    scaling;
``<allocator>/<placement>``
    an allocation policy of :data:`LIVE_ALLOCATOR_NAMES` (options as ``goodput@p=0.5``)
    deciding every job's workers, new workers placed by ``placement`` (the event
    engine's ``Simulator(allocation=...)``, the operator's ``--allocator``); on measured
    workloads the allocator alone (it places its own workers);
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

__all__ = ["ServedPolicy", "SERVED", "SERVED_NAME", "LIVE_ALLOCATOR_NAMES", "PolicyName", "parse_policy_name", "BACKFILL_SUFFIXES"]

#: the CLI name of the served combination
SERVED_NAME = "rlsched"

#: allocation policies that also decide in the event engine and the operator
#: (``<allocator>/<placement>``; core/live_allocation.py makes them)
LIVE_ALLOCATOR_NAMES = ("goodput", "goodput-learned", "goodput-rlpto")

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
#: (``rlsched eval protocol``), and say why in ``reason``.
SERVED = ServedPolicy(
    ordering="",
    placement="das",
    scaling="",
    allocator="goodput-rlpto",
    reason=(
        "rlsched's goodput allocator with RLPTO's network as its growth weight (core/goodput_allocator.py, "
        "core/rlpto_weight.py, core/weights/rlpto-goodput.safetensors on top of core/weights/growth.safetensors; "
        "live: core/live_allocation.py with the extender's DAS placement for new workers). The network was "
        "trained by evolution strategies on train seeds and chosen on validation seeds over the learned growth "
        "weight served before it (-1.4% [-2.2, -0.3] mean JCT, docs/results/goodput_select_rlpto.json). On the "
        "protocol's pollux suite (the 8 published workloads, paired bootstrap 95% intervals) its mean JCT is "
        "31.4% [28.7, 33.6] / 34.9% [29.3, 39.0] / 44.9% [41.4, 47.8] below tiresias-2q at 0.5x / 1.0x / 1.5x "
        "load, 2,610 s at 1.0x against the published Pollux's 2,751 s, and against the growth weight alone "
        "-1.5% [-2.9, -0.0] / -0.8% [-2.1, +0.6] / -2.3% [-3.3, -1.3] (docs/results/protocol_rlpto_goodput_1x.md, "
        "protocol_rlpto_goodput_05_15x.md, docs/benchmark.md). On the event-engine suites it is below the "
        "strongest heuristics on synthetic at loads 0.5 and 1 (-8.7% / -5.5%) and above them at 1.5 and 2 "
        "(+7.6% / +13.8%), level with the growth weight alone at all four (docs/results/"
        "protocol_synthetic_served.md, synthetic_served_pairs.json), and on Alibaba, where no job can grow "
        "and no growth weight acts, above them at every load, equal per seed to the goodput allocator "
        "(docs/results/protocol_alibaba_served.md)"
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
    if len(parts) == 2 and parts[0].strip().partition("@")[0] in LIVE_ALLOCATOR_NAMES and parts[1].strip():
        return PolicyName(base, placement=parts[1].strip(), allocator=parts[0].strip(), backfill=backfill)
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
        raise ValueError(f"policy {item!r}: expected ordering/placement[/scaling][+backfill|+nobackfill], "
                         f"{SERVED_NAME!r} or an allocation policy")
    parts = [p.strip() for p in parts]
    scaling = parts[2] if len(parts) == 3 and parts[2] != "none" else None
    return PolicyName(base, parts[0], parts[1], scaling, backfill=backfill)
