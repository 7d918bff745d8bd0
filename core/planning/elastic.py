"""Elastic planning: RLPTO scaling and completion of running jobs, as pure decisions.

:class:`ScalingPlanner` turns a scaling policy's answers into ``+1``/``-1``/``0``
workers per job and says which jobs are finished, enforcing what must hold whatever the
policy says: one change per evaluation, ``[minWorkers, maxWorkers]``, GPUs reserved for
the blocked head, and RLPTO's β rule (Lu et al., TPDS 34(12), 2023) judged on the mean
gain over a window of evaluations. The invariants and why: docs/design-notes.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from ..cluster import ClusterState, JobView, Progress
from ..policy import Scaling

__all__ = [
    "CONVERGENCE_WINDOW", "ElasticState", "ScalingPlan", "ScalingPlanner", "best_fit_node",
    "convergence_gain", "convergence_gains", "measured_view", "reserved_gpus", "scaling_steps", "training_end",
]

#: evaluations over which the convergence gain is averaged (:func:`convergence_gain`)
CONVERGENCE_WINDOW = 5


def training_end(epochs_done: float, max_epochs: float, streak: int, patience: int | None) -> str | None:
    """A job's own end, RLPTO's rule: ``"MaxEpochs"`` once ``epochs_done`` reaches
    ``max_epochs``, ``"Converged"`` once ``patience`` evaluations in a row gained less
    than β (``streak``: :attr:`ElasticState.streak`; ``patience`` None: no β stop),
    else None. The one rule the scaling planner and the allocation plan apply."""
    if epochs_done >= max_epochs:
        return "MaxEpochs"
    if patience is not None and streak >= patience:
        return "Converged"
    return None


def convergence_gain(history: Sequence[float], window: int = CONVERGENCE_WINDOW) -> float:
    """The accuracy gain per evaluation that RLPTO's β rule compares with β: the mean
    over the last ``window`` evaluations, ``(h[-1] - h[-1-k]) / k`` with
    ``k = min(window, len(h) - 1)``; ``inf`` before two evaluations.

    With ``window = 1`` it is the last evaluation's gain (:attr:`Progress.gain`)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    k = min(int(window), len(history) - 1)
    if k < 1:
        return float("inf")
    return (float(history[-1]) - float(history[-1 - k])) / k


def convergence_gains(accs: np.ndarray, window: int = CONVERGENCE_WINDOW) -> np.ndarray:
    """:func:`convergence_gain` after every evaluation of ``accs`` (last axis: the
    accuracies after each evaluation, oldest first), vectorised with the same
    arithmetic: ``out[..., i] == convergence_gain(accs[..., : i + 1], window)``."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    a = np.asarray(accs, dtype=float)
    out = np.full(a.shape, np.inf)
    n = a.shape[-1]
    if n > 1:
        i = np.arange(1, n)
        k = np.minimum(i, int(window))
        out[..., 1:] = (a[..., i] - a[..., i - k]) / k
    return out


def reserved_gpus(blocked: JobView | None) -> int:
    """GPUs scale-ups must leave free: the gang of the blocked head of the waiting
    queue (its live view: the workers it starts with), 0 when no waiting job is
    blocked, as core's :class:`~rlsched.core.planning.Admission` left it waiting."""
    return 0 if blocked is None else int(blocked.gpus)


def scaling_steps(decisions: Mapping[str, int]) -> list[tuple[str, int]]:
    """A policy's (integer) decisions as one step each (``-1``/``+1``, zeros dropped), removals
    first so that additions can use the freed GPUs, then by job id."""
    steps = [(k, 1 if int(d) > 0 else -1) for k, d in decisions.items() if int(d)]
    return sorted(steps, key=lambda kd: (kd[1] > 0, kd[0]))


@dataclass(slots=True)
class ElasticState:
    """What the planner remembers of one job between cycles.

    ``data_size`` training samples (0 if unknown), ``epoch`` evaluations seen,
    ``loss_norm`` loss over the largest loss seen (1 at the start, towards 0 as it
    converges), ``workers``, ``accuracy``, ``gain`` the accuracy gain per evaluation
    over the last evaluations (:func:`convergence_gain`: the convergence signal compared
    with β), ``trained_s`` seconds the job has trained. ``streak`` counts consecutive
    evaluations with ``gain < beta`` (a job with ``streak > 0`` is converging);
    ``decided_epoch`` is the epoch of the last scaling decision.
    """

    data_size: int = 0
    epoch: int = 0
    loss_norm: float = 1.0
    workers: int = 0
    accuracy: float = 0.0
    gain: float = float("inf")
    trained_s: float = 0.0
    streak: int = 0
    decided_epoch: int = 0

    def observe(self, progress: Progress, workers: int, trained_s: float, beta: float, data_size: int,
                *, window: int = CONVERGENCE_WINDOW) -> None:
        """Fold a progress report in; the streak counts each new evaluation once.

        Every evaluation since the last report counts, not only the latest (the trainer
        may evaluate several times between two operator cycles): each one whose
        convergence gain (:func:`convergence_gain` over the ``window`` evaluations up
        to it) is below ``beta`` adds one, any other resets it. The gains are read from
        ``progress.history`` (accuracy after each evaluation, oldest first, possibly
        truncated to the newest ones); an evaluation the history no longer holds breaks
        the streak (it cannot be shown small), as does the first evaluation of all (no
        gain yet). So the streak after epoch ``e`` is the same whether the reports came
        once per epoch or once per several, and the β stop fires at the epoch
        :func:`rlsched.sim.convergence.stop_epoch` computes.
        """
        new = progress.epoch - self.epoch
        self.data_size = data_size
        self.workers = workers
        self.trained_s = trained_s
        if new <= 0:
            return
        self.epoch = progress.epoch
        self.accuracy = progress.accuracy
        ml = progress.max_loss
        ok = ml and math.isfinite(ml) and ml > 0 and math.isfinite(progress.loss)
        self.loss_norm = progress.loss / ml if ok else 1.0
        hist = progress.history
        if not hist:  # no history reported: the latest gain is all there is
            self.gain = progress.gain
            self.streak = self.streak + 1 if self.gain < beta else 0
            return
        held = min(new, len(hist))
        streak = self.streak if held == new else 0
        for end in range(len(hist) - held + 1, len(hist) + 1):
            streak = streak + 1 if convergence_gain(hist[:end], window) < beta else 0
        self.streak = streak
        self.gain = convergence_gain(hist, window)

    def to_status(self) -> dict:
        """The ``status.rlpto`` object (camelCase; an infinite gain is ``null``)."""
        return {
            "dataSize": self.data_size, "epoch": self.epoch, "lossNorm": self.loss_norm,
            "workers": self.workers, "accuracy": self.accuracy,
            "gain": self.gain if math.isfinite(self.gain) else None,
            "trainedSeconds": self.trained_s, "streak": self.streak, "decidedEpoch": self.decided_epoch,
        }

    @classmethod
    def from_status(cls, d: Mapping | None) -> "ElasticState":
        d = d or {}
        gain = d.get("gain")
        return cls(
            data_size=int(d.get("dataSize", 0)),
            epoch=int(d.get("epoch", 0)),
            loss_norm=float(d.get("lossNorm", 1.0)),
            workers=int(d.get("workers", 0)),
            accuracy=float(d.get("accuracy", 0.0)),
            gain=float("inf") if gain is None else float(gain),
            trained_s=float(d.get("trainedSeconds", 0.0)),
            streak=int(d.get("streak", 0)),
            decided_epoch=int(d.get("decidedEpoch", 0)),
        )


def measured_view(job: JobView, state: ClusterState) -> JobView:
    """``job`` (changed in place and returned) with what one more worker is worth to it
    filled in from its own reports (``speedup``, ``stat_efficiency``:
    :meth:`~rlsched.core.goodput.JobObservations.marginal` at the tightest placement on
    ``state``'s nodes, at its ``batch_size`` or reported ``local_batch``); left as they
    are without observations. What every policy the planner asks reads, in the operator,
    the engine and RLPTO's environment."""
    if job.observations is not None and state.max_gpus > 0:
        job.speedup, job.stat_efficiency = job.observations.marginal(
            max(job.workers, 1), job.gpus_per_worker, state.max_gpus,
            batch=job.batch_size, local_batch=job.local_batch)
    return job


@dataclass(slots=True)
class ScalingPlan:
    """Per-job worker change (only non-zero entries) and finished jobs with the reason."""

    deltas: dict[str, int] = field(default_factory=dict)
    finished: dict[str, str] = field(default_factory=dict)
    #: what the policy asked before bounds and capacity (for events/metrics)
    asked: dict[str, int] = field(default_factory=dict)
    #: jobs the policy was asked about this cycle (a new evaluation since their last decision)
    decided: list[str] = field(default_factory=list)
    #: for each scale-up, the node the ``place`` hook found for the new worker
    nodes: dict[str, int] = field(default_factory=dict)


class ScalingPlanner:
    """Applies a core scaling policy to running jobs under the operator's invariants."""

    def __init__(self, policy: Scaling, *, patience: int = 5) -> None:
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.policy = policy
        self.patience = patience

    @staticmethod
    def converging(job: JobView) -> bool:
        """Whether the job's last evaluation gained less than β (``streak > 0``): it
        gives a worker back, whatever the policy asked."""
        return job.record.streak > 0

    def finished(self, job: JobView) -> str | None:
        """``"Converged"``, ``"MaxEpochs"`` or ``None`` (:func:`training_end`)."""
        return training_end(job.progress.epochs_done, job.max_epochs, job.record.streak,
                            self.patience if job.patience is None else job.patience)

    def decides(self, job: JobView) -> bool:
        """Whether this cycle asks the policy about ``job``: it is not finished, not
        pinned, and has an evaluation newer than the last decision."""
        return (job.pinned_workers is None and job.progress.epoch > job.record.decided_epoch
                and self.finished(job) is None)

    def plan(
        self,
        running: Sequence[JobView],
        state: ClusterState,
        reserved_gpus: int = 0,
        place: Callable[[JobView, ClusterState], int | None] | None = None,
    ) -> ScalingPlan:
        """Decide this cycle's changes for the running jobs' views, each with the record
        the planner keeps of it (``record``). ``reserved_gpus``: what the blocked head of the
        waiting queue needs (:func:`reserved_gpus`); scale-ups never eat into it. A
        converging job (not pinned) gets ``-1`` whatever the policy asked. Marks each job
        the policy decided on (``record.decided_epoch``) so the same evaluation is not
        acted on twice.

        ``place(job, state)`` finds a node for one more worker of ``job`` on ``state``
        (None: no room); default :func:`best_fit_node`. Each scale-up granted is
        allocated on ``state`` so the next one sees it; all are released before
        returning."""
        place = place or _best_fit
        out = ScalingPlan()
        live: list[JobView] = []
        for job in running:
            why = self.finished(job)
            if why:
                out.finished[job.id] = why
            else:
                live.append(job)

        asked: dict[str, int] = {}
        auto = [j for j in live if self.decides(j)]
        if auto:
            steps = dict(scaling_steps(self.policy.decide([measured_view(j, state) for j in auto], state)))
            for j in auto:
                asked[j.id] = -1 if self.converging(j) else steps.get(j.id, 0)
                j.record.decided_epoch = j.progress.epoch
        out.decided = [j.id for j in auto]
        for j in live:
            if j.pinned_workers is not None:
                asked[j.id] = int(np.sign(j.pinned_workers - j.workers))
        out.asked = {k: v for k, v in asked.items() if v}

        spare = int(np.maximum(state.free, 0).sum()) - reserved_gpus
        ups: list[JobView] = []
        for j in live:
            d = asked.get(j.id, 0)
            if d < 0 and j.workers > j.min_workers:
                out.deltas[j.id] = -1
            elif d > 0 and j.workers < j.max_workers:
                ups.append(j)
        # jobs that still gain most get the spare GPUs first
        ups.sort(key=lambda j: (-(j.progress.gain if math.isfinite(j.progress.gain) else 1e9), j.start_time, j.id))
        taken: list[tuple[int, int, int, int]] = []
        try:
            for j in ups:
                g = j.gpus_per_worker
                if spare < g:
                    continue
                node = place(j, state)
                if node is None:
                    continue
                state.allocate(node, g, j.cpu_milli, j.memory_mib)
                taken.append((node, g, j.cpu_milli, j.memory_mib))
                spare -= g
                out.deltas[j.id] = 1
                out.nodes[j.id] = int(node)
        finally:
            for node, g, cpu, mem in reversed(taken):
                state.release(node, g, cpu, mem)
        return out


def best_fit_node(free: np.ndarray, gpus: int) -> int | None:
    """The node with the fewest free GPUs that still has ``gpus`` free (lowest index
    on ties), or None: the planner's default room check."""
    ok = np.flatnonzero(free >= gpus)
    if not ok.size:
        return None
    return int(ok[np.argmin(free[ok])])


def _best_fit(job: JobView, state: ClusterState) -> int | None:
    return best_fit_node(state.free, job.gpus_per_worker)
