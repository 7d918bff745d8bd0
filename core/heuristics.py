"""The built-in heuristic policies, registered by name.

Importing this module registers every ordering (``fifo sjf srtf drf tetris tiresias
random``), placement (``firstfit bestfit loadbalance random topology fgd``) and scaling
(``none fs fcfs optimus beta``); :func:`rlsched.core.make_ordering` and friends import
it on first use.
"""

from __future__ import annotations

from .ordering import DRF, FIFO, SJF, SRTF, RandomOrdering, Tetris, Tiresias
from .placement import FGD, BestFit, FirstFit, LoadBalance, RandomPlacement, TopologyPacking
from .scaling import BetaThreshold, FairShare, FCFSScaling, NoScaling, Optimus

__all__ = [
    "FIFO", "SJF", "SRTF", "DRF", "Tetris", "Tiresias", "RandomOrdering",
    "FirstFit", "BestFit", "LoadBalance", "RandomPlacement", "TopologyPacking", "FGD",
    "NoScaling", "FairShare", "FCFSScaling", "Optimus", "BetaThreshold",
]
