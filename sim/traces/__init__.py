"""Trace loaders: job specs (and a topology where the trace has one) from a SPEC string.

One module per source; :mod:`.common` holds what they share (:class:`Trace`,
:class:`TraceError`, number parsing, the bad-row policy), :mod:`.spec` the registry
of ``source:`` prefixes, the replay options and :func:`load_trace`.

SPEC forms (see docs/simulator.md for the formats):

``alibaba2023:<list>``
    Alibaba GPU cluster trace 2023 (openb): ``openb_pod_list_<list>.csv`` and
    ``openb_node_list_gpu_node.csv`` in ``<data-dir>/alibaba-gpu-2023``
    (:mod:`.alibaba2023`).
    The four real-trace forms accept ``,window=N``: N consecutive jobs from a start drawn
    from the seed, shifted to start at 0 (each seed a different stretch); ``,arrival_scale=X``: submit times × X (X < 1
    compresses arrivals to raise the load; durations are kept); ``,nodes=N``: replay on
    N of the trace's nodes (every k-th node in file order, so the GPU-model mix is
    kept; jobs that fit none of them are dropped and counted in
    ``skipped["unfit_subset"]``); ``,load=X``: the arrival scale that makes the offered
    load (GPU-seconds asked / (GPUs × submission span)) equal X on the (sub)cluster.
    ``load`` and ``arrival_scale`` exclude each other; ``,tail=Q`` (with ``load``) counts each
    duration at most at the Q-quantile of the durations when measuring the load. ``,estimates=F[,estimate_error=S]``:
    simulated users' run-time estimates for a share F of the jobs, log-normal error
    of shape S (default 0.5); none of these traces has a field with a user's
    estimate, so by default no job carries one (policies are non-clairvoyant).
``pai2020:<dir>``
    Alibaba PAI 2020 (header-less ``pai_job_table.csv``, ``pai_task_table.csv``,
    ``pai_machine_spec.csv``), ``<dir>`` absolute or under the data dir (:mod:`.pai2020`).
``philly:<file>``
    Microsoft Philly ``cluster_job_log`` (JSON list) (:mod:`.philly`).
``helios:<file>``
    SenseTime Helios ``cluster_log.csv`` (:mod:`.helios`).
``pollux:<folder>/<file>``
    a Pollux OSDI'21 workload CSV (``name,time,application,num_replicas,batch_size``)
    under ``<data-dir>/pollux-osdi21/``, e.g. ``pollux:workloads/workload-6``
    (``.csv`` optional); gives a :class:`~.pollux.MeasuredTrace` (measured jobs, their
    applications' profiles, the paper's 16 × 4 GPUs, 60 s interval, 30 s restart)
    for the interval engine (:mod:`.pollux`).
``pollux-gen:seed=N[,jobs=160,hours=8,load=1.0,start=2]``
    a new such workload sampled from ``pollux-osdi21/traces/philly.csv`` as the
    published ones were (a time-of-day window, the model by GPU-time bucket;
    ``load`` multiplies the jobs in the same window); never reads the published
    workloads (:func:`~.pollux.generate`).
``synthetic:<small|medium|large>[,key=value...]``
    the seeded generator of multi-worker training jobs (:func:`synthetic`); it too
    takes ``estimates=F,estimate_error=S`` (default: no estimates).
``<path>.yaml|.yml|.json``
    a job list: ``{"cluster": <Topology.from_dict>, "jobs": [JobSpec fields...]}``
    or a bare list of jobs (:mod:`.jobfile`); a job's ``estimated_runtime`` (seconds)
    or ``estimate_factor`` (× its true ideal run time) is its user's estimate.

The data folder is ``data_dir`` or the environment variable ``RLSCHED_DATA_DIR``. A
malformed row raises :class:`TraceError` naming file and line, or with
``skip_bad=True`` is skipped and counted in ``Trace.skipped["malformed"]``.
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
