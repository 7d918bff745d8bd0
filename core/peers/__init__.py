"""The peers of the published benchmark, as allocators (:mod:`rlsched.core.allocation`).

Written from their papers, for the side-by-side runs of the Pollux OSDI'21 benchmark
(Qiao et al., OSDI 2021, §5):

* :class:`TiresiasAllocator` (``tiresias-2q``): Tiresias' discretized 2D-LAS with two
  queues, fixed GPUs and batch size (Gu et al., NSDI 2019);
* :class:`OptimusOracle` (``optimus-oracle``): Optimus' greedy marginal-gain
  allocation given each job's true remaining work (Peng et al., EuroSys 2018), a
  clairvoyant reference;
* :class:`PolluxPaperAllocator` (``pollux-paper``): PolluxSched as the Pollux paper
  describes it (§4.2): goodput models fitted from what each job reports, the power mean
  (p = -1) of fair-share speedups, its re-allocation penalty and a genetic search.

:data:`PEERS` maps each name to its class (built with its defaults: the papers'
settings).
"""

from .optimus import MissingOracleError, OptimusOracle
from .pollux_paper import PolluxPaperAllocator
from .tiresias import POLLUX_THRESHOLD, TiresiasAllocator

__all__ = ["PEERS", "MissingOracleError", "OptimusOracle", "PolluxPaperAllocator", "POLLUX_THRESHOLD", "TiresiasAllocator"]

#: allocator name -> class
PEERS = {
    TiresiasAllocator.name: TiresiasAllocator,
    OptimusOracle.name: OptimusOracle,
    PolluxPaperAllocator.name: PolluxPaperAllocator,
}
