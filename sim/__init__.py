"""rlsched.sim: a deterministic discrete-event simulator of GPU clusters.

:class:`Simulator` replays a job trace (:mod:`.traces`) on a
:class:`~rlsched.core.Topology` under ordering / placement / scaling policies from
:mod:`rlsched.core`; :mod:`.metrics` turns the result into JCT, wait, slowdown, fee,
utilization and fragmentation figures. See docs/simulator.md.
"""

from .convergence import ConvergenceModel
from .engine import JobRecord, SimConfig, SimResult, Simulator
from .job import JobSpec
from .metrics import compute_metrics, write_metrics

__all__ = [
    "ConvergenceModel",
    "JobRecord",
    "JobSpec",
    "SimConfig",
    "SimResult",
    "Simulator",
    "compute_metrics",
    "write_metrics",
]
