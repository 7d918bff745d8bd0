"""The planning layer: policies turned into decisions, the same in every adapter.

A policy (:mod:`rlsched.core.policy`) answers one question — which job first, which
nodes, grow or shrink. Planning wraps the rules that must hold whatever the policy
says, and is what the operator, the extender and the simulator call:

* :mod:`.admission` — queues ``interrupt > urgent > normal``, RLPTO's dynamic
  priority, gang fit, head-of-line blocking or backfill, the preemption choice and
  resume-first;
* :mod:`.elastic` — elastic scaling under the invariants: clamps to
  ``[minWorkers, maxWorkers]``, one step per evaluation, the β stop, GPUs reserved
  for the blocked head of the queue;
* :mod:`.topology` — the ``rlsched.dev/required-topology`` feasibility rule;
* :mod:`.spec` — :class:`TrainingSpec`, the parts of a TrainingJob spec they decide on.

Everything here is pure: numpy and the core cluster model, no Kubernetes objects.
"""

from .admission import (
    CLASS_RANK,
    HIGHEST_BONUS,
    Admission,
    AdmissionPlan,
    DynamicPriority,
    QueueEntry,
    RunningEntry,
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
    RunningJob,
    ScalingPlan,
    ScalingPlanner,
    best_fit_node,
    convergence_gain,
    convergence_gains,
    reserved_gpus,
    scaling_steps,
)
from .spec import PRIORITY_CLASSES, TrainingSpec
from .topology import TopologyRule, required_topology

__all__ = [
    "CLASS_RANK",
    "HIGHEST_BONUS",
    "Admission",
    "AdmissionPlan",
    "DynamicPriority",
    "QueueEntry",
    "RunningEntry",
    "WaitReason",
    "waiting_reasons",
    "admit_in_order",
    "gang_fits",
    "gang_unfittable",
    "take_gang",
    "unfittable_reason",
    "CONVERGENCE_WINDOW",
    "ElasticState",
    "RunningJob",
    "ScalingPlan",
    "ScalingPlanner",
    "scaling_steps",
    "reserved_gpus",
    "best_fit_node",
    "convergence_gain",
    "convergence_gains",
    "PRIORITY_CLASSES",
    "TrainingSpec",
    "TopologyRule",
    "required_topology",
]
