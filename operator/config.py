"""What the operator can be told (:class:`OperatorConfig`, filled by the CLI)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsched.core.contract import DEFAULT_SCHEDULER_NAME, DEFAULT_TOPOLOGY_LEVELS, POD_SECURITY_BASELINE
from rlsched.core.served import SERVED


@dataclass
class OperatorConfig:
    """Everything the operator can be told; the CLI fills it from flags."""

    kubeconfig: str | None = None
    namespace: str | None = None
    cycle_s: float = 5.0
    start_timeout_s: float = 120.0
    grace_period_s: int = 30
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    #: node-label keys of the topology, coarse to fine (the extender's ``--topology-levels``)
    topology_levels: tuple[str, ...] = DEFAULT_TOPOLOGY_LEVELS
    #: the allocation policy deciding every job's workers and batch at once (any name of
    #: core/live_allocation.py's ``make_live_allocator``, a heuristic as
    #: ``ordering/placement[/scaling]``; default: the served one, core/served.py)
    allocator: str = SERVED.allocator
    #: when the allocation policy decides (core/decision_clock.py, as both simulator
    #: engines): on a change of the jobs it decides for, at least ``decision_gap_s``
    #: after its last decision, else every ``decision_interval_s``; None: every cycle
    decision_gap_s: float = 0.0
    decision_interval_s: float | None = None
    #: evaluations in a row gaining less than β that end a job (the plan's β stop)
    patience: int = 5
    mu: float = 0.1
    promote_at: float = 1.0
    demote_at: float = -1.0
    #: seconds a job runs before it may be preempted (0: none)
    min_run_s: float = 0.0
    metrics_port: int | None = 9090
    peering: str | None = None
    priority: int = 0
    forecast_interval_s: float = 3600.0
    forecast_configmap: str = "rlsched-forecast"
    forecast_namespace: str = "default"
    gru_model: str | None = None
    sweep_every: int = 10
    #: API calls for different jobs in flight at once within a cycle
    parallelism: int = 16
    #: Pod Security Standard of worker templates in namespaces without a
    #: pod-security.kubernetes.io/enforce label (operator/podsecurity.py)
    pod_security_level: str = POD_SECURITY_BASELINE
    #: let every namespace's templates read Secrets (else only namespaces labelled so)
    allow_secret_mounts: bool = False
    #: GPU Feature Discovery product strings -> GPU type keys (``--gpu-types``,
    #: core.contract.parse_gpu_types); an unmapped product is its own type
    gpu_types: dict[str, str] = field(default_factory=dict)
