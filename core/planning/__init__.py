"""The planning layer: policies turned into decisions, the same in every adapter.

A policy answers one question (which job, which nodes, grow or shrink); planning wraps
the rules that must hold whatever it says: :mod:`.admission` (queues, dynamic priority,
gang fit, backfill, preemption), :mod:`.elastic` (scaling under its invariants, the β
stop), :mod:`.topology` (required topology) and :mod:`.spec` (:class:`TrainingSpec`).
Pure: numpy and the core cluster model, no Kubernetes objects.
"""

from .admission import (
    HIGHEST_BONUS,
    Admission,
    AdmissionPlan,
    DynamicPriority,
    WaitReason,
    admit_in_order,
    gang_fits,
    gang_unfittable,
    take_gang,
    unfittable_reason,
    waiting_reasons,
)
from .elastic import (
    CONVERGENCE_WINDOW,
    ElasticState,
    ScalingPlan,
    ScalingPlanner,
    best_fit_node,
    convergence_gain,
    convergence_gains,
    measured_view,
    reserved_gpus,
    scaling_steps,
    training_end,
)
from .spec import TrainingSpec, gang_spec
from .topology import TopologyRule, required_topology

__all__ = [
    "HIGHEST_BONUS",
    "Admission",
    "AdmissionPlan",
    "DynamicPriority",
    "WaitReason",
    "waiting_reasons",
    "admit_in_order",
    "gang_fits",
    "gang_unfittable",
    "take_gang",
    "training_end",
    "unfittable_reason",
    "CONVERGENCE_WINDOW",
    "ElasticState",
    "ScalingPlan",
    "ScalingPlanner",
    "scaling_steps",
    "reserved_gpus",
    "best_fit_node",
    "convergence_gain",
    "convergence_gains",
    "measured_view",
    "TrainingSpec",
    "gang_spec",
    "TopologyRule",
    "required_topology",
]
