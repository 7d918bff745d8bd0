"""Trace loaders: job specs (and a topology where the trace has one) from a SPEC string.

One module per source (``alibaba2023:``, ``pai2020:``, ``philly:``, ``helios:``, ``sia:``,
``pollux:``, ``pollux-gen:``, ``synthetic:``, job files); :mod:`.common` holds what they
share, :mod:`.spec` the registry and :func:`load_trace`. A malformed row raises
:class:`TraceError` naming file and line, or is skipped and counted with ``skip_bad``.
SPEC forms and options: docs/simulator.md, docs/design-notes.md.
"""

from .alibaba2023 import TIMELESS_DURATION
from .common import ENV_DATA_DIR, NODES_PER_RACK, Trace, TraceError, data_dir, default_topology
from .pai2020 import PAI_JOB_COLUMNS, PAI_MACHINE_COLUMNS, PAI_TASK_COLUMNS
from .pollux import MeasuredTrace
from .spec import SOURCES, load_trace
from .synthetic import MODEL_ZOO, SYNTHETIC_PRESETS, synthetic  # the function; its module is .synthetic

__all__ = [
    "Trace",
    "MeasuredTrace",
    "TraceError",
    "load_trace",
    "synthetic",
    "data_dir",
    "default_topology",
    "SYNTHETIC_PRESETS",
    "MODEL_ZOO",
    "SOURCES",
    "ENV_DATA_DIR",
    "NODES_PER_RACK",
    "TIMELESS_DURATION",
    "PAI_JOB_COLUMNS",
    "PAI_TASK_COLUMNS",
    "PAI_MACHINE_COLUMNS",
]
