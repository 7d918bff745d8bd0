"""The peers of the published benchmark (Pollux OSDI'21, §5), as allocators for the
interval engine: Tiresias 2-queue LAS, Optimus+Oracle (a clairvoyant reference) and
PolluxSched as its paper describes it, written from their papers; and the released
Pollux policy through a bridge process (:mod:`.pollux`). :data:`PEERS` maps each of
the first three names to its class (built with its defaults: the papers' settings).
The heterogeneity-aware peers, Sia (:mod:`.sia`) and Gavel (:mod:`.gavel`), register
as ``sia`` and ``gavel``."""

from .optimus import MissingOracleError, OptimusOracle
from .pollux_paper import PolluxPaperAllocator
from .tiresias import TiresiasAllocator

__all__ = ["PEERS", "MissingOracleError", "OptimusOracle", "PolluxPaperAllocator", "TiresiasAllocator"]

#: allocator name -> class
PEERS = {
    TiresiasAllocator.name: TiresiasAllocator,
    OptimusOracle.name: OptimusOracle,
    PolluxPaperAllocator.name: PolluxPaperAllocator,
}
