"""The peers of the published benchmark, as allocators (:mod:`rlsched.core.allocation`).

Written from their papers, for the side-by-side runs of the Pollux OSDI'21 benchmark
(Qiao et al., OSDI 2021, §5):

* :class:`TiresiasAllocator` (``tiresias-2q``): Tiresias' discretized 2D-LAS with two
  queues, fixed GPUs and batch size (Gu et al., NSDI 2019);
* :class:`OptimusOracle` (``optimus-oracle``): Optimus' greedy marginal-gain
  allocation given each job's true remaining work (Peng et al., EuroSys 2018), a
  clairvoyant reference.

:data:`PEERS` maps each name to its class (built with its defaults: the papers'
settings).
"""

from .optimus import MissingOracleError, OptimusOracle
from .tiresias import POLLUX_THRESHOLD, TiresiasAllocator

__all__ = ["PEERS", "MissingOracleError", "OptimusOracle", "POLLUX_THRESHOLD", "TiresiasAllocator"]

#: allocator name -> class
PEERS = {TiresiasAllocator.name: TiresiasAllocator, OptimusOracle.name: OptimusOracle}
