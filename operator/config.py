"""What the operator can be told (:class:`OperatorConfig`, filled by the CLI) and the
core policies it names, built as the extender and the simulator build them."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rlsched.core import make_ordering, make_scaling
from rlsched.core.contract import DEFAULT_SCHEDULER_NAME, DEFAULT_TOPOLOGY_LEVELS, POD_SECURITY_BASELINE
from rlsched.core.das import resolve_placement_model, serving_placement
from rlsched.core.policy import ORDERINGS, SCALINGS
from rlsched.core.served import SERVED

log = logging.getLogger(__name__)


@dataclass
class OperatorConfig:
    """Everything the operator can be told; the CLI fills it from flags."""

    kubeconfig: str | None = None
    namespace: str | None = None
    cycle_s: float = 5.0
    start_timeout_s: float = 120.0
    grace_period_s: int = 30
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    ordering: str = "fifo"
    ordering_model: str | None = None
    #: the extender's placement policy (and its weights): admission checks room by
    #: placing each gang as the extender will (``Admission.plan``'s ``place``)
    placement: str = "das"
    placement_model: str | None = None
    #: node-label keys of the topology, coarse to fine (the extender's ``--topology-levels``)
    topology_levels: tuple[str, ...] = DEFAULT_TOPOLOGY_LEVELS
    #: the allocation policy deciding every job's workers and batch at once (any name of
    #: core/live_allocation.py's ``make_live_allocator``; default: the served one,
    #: core/served.py); None: admission + scaling
    allocator: str | None = SERVED.allocator
    #: when the allocation policy decides (core/decision_clock.py, as both simulator
    #: engines): on a change of the jobs it decides for, at least ``decision_gap_s``
    #: after its last decision, else every ``decision_interval_s``; None: every cycle
    decision_gap_s: float = 0.0
    decision_interval_s: float | None = None
    #: "auto": the learned RLPTO policy when ``scaling_model`` is set, else "beta"
    scaling: str = "auto"
    scaling_model: str | None = None
    patience: int = 5
    mu: float = 0.1
    promote_at: float = 1.0
    demote_at: float = -1.0
    backfill: bool = False
    preemption: bool = True
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


def _model_kwargs(factory, model: str | None) -> dict:
    """Pass a weights file under the name the policy factory takes (``path``/``model``)."""
    if not model:
        return {}
    import inspect

    params = inspect.signature(factory).parameters
    for key in ("path", "model"):
        if key in params:
            return {key: model}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return {"model": model}
    raise ValueError(f"policy {factory!r} takes no weights file")


def build_scaling(name: str, model: str | None):
    """The core scaling policy (``rlpto`` with its weights file, ``beta``, ...)."""
    if name == "auto":
        name = "rlpto" if model else "beta"
    make_scaling("none")  # loads the builtin policy modules
    factory = SCALINGS.get(name.lower())
    policy = make_scaling(name, **(_model_kwargs(factory, model) if factory else {}))
    if policy.fallback_reason:
        log.warning("scaling %s: %s", name, policy.fallback_reason)
    return policy


def build_placement(name: str, model: str | None):
    """The extender's placement policy as the extender builds it
    (:func:`rlsched.core.das.serving_placement`, the committed DAS weights by default),
    for admission's room check."""
    policy = serving_placement(name, resolve_placement_model(name, model))
    if policy.fallback_reason:
        log.warning("placement %s: %s", name, policy.fallback_reason)
    return policy


def build_ordering(name: str, model: str | None):
    """The core ordering policy (``fifo``, ``sjf``, ``das`` with its weights file, ...)."""
    make_ordering("fifo")  # loads the builtin policy modules
    factory = ORDERINGS.get(name.lower())
    return make_ordering(name, **(_model_kwargs(factory, model) if factory else {}))
