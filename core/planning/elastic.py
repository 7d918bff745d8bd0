"""Elastic planning: RLPTO scaling and completion of running jobs, as pure decisions.

Each cycle the operator hands :class:`ScalingPlanner` the running jobs (with the
progress their chiefs reported) and a cluster snapshot; it returns, per job, ``+1``,
``-1`` or ``0`` workers and which jobs are finished. The scaling *policy* comes from
core (``make_scaling("rlpto", model=...)`` for the learned PPO policy, ``"beta"`` for
the β-threshold rule); the planner enforces what must hold whatever the policy says:

* a job is decided on only after a new evaluation (one change per evaluation and
  per cycle);
* never below ``minWorkers`` nor above ``maxWorkers``;
* scale-ups only use GPUs that the head of the waiting queue does not need, highest
  accuracy gain first (freed GPUs go to waiting jobs, then to jobs that still gain);
* a pinned job (``spec.workers``) moves one worker per cycle towards the pin;
* RLPTO's β rule, for every policy: a job *converges* while its accuracy gain
  per evaluation is below ``beta``. A converging job gives one worker back at each
  new evaluation (towards ``minWorkers``) whatever the policy asked, and its GPUs go
  to waiting jobs first ("when a model tends to converge, the computing resources of
  the task are gradually reduced so that they can be allocated to other learning
  tasks", Lu et al., TPDS 34(12), 2023); after ``patience`` consecutive such
  evaluations it is finished (the β stop), as it is at ``maxEpochs``.

The gain compared with β is RLPTO's ``v_a``, the accuracy a job gains per
evaluation. A live operator sees it only through noisy evaluations: the difference of
two evaluations with noise σ each has noise σ√2, larger than β for every realistic
test set (σ ≈ 0.002-0.003 for accuracy near 0.9 on 10 000 samples, β = 0.001), so a
flat curve would pass the test only by chance (``patience`` times in a row: rarely)
and a rising one fail it by chance. The planner therefore judges convergence on the
mean gain per evaluation over the last ``window`` evaluations
(:func:`convergence_gain`: noise σ√2/``window``), an estimate of the same ``v_a``
(the simulator's RLPTO environment measures it on the noise-free curve).

What the planner remembers of a job between cycles is :class:`ElasticState` (kept
in the TrainingJob's ``status.rlpto``). The learned policy's observation is a
different thing, built from a snapshot by :func:`rlsched.core.learned.job_observation`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..cluster import ClusterState, JobView, Progress
from ..policy import Scaling
from .spec import TrainingSpec

__all__ = ["CONVERGENCE_WINDOW", "ElasticState", "RunningJob", "ScalingPlan", "ScalingPlanner", "convergence_gain",
           "scaling_steps"]

#: evaluations over which the convergence gain is averaged (:func:`convergence_gain`)
CONVERGENCE_WINDOW = 5


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
        """Fold a progress report in. The streak counts every evaluation since the last
        report (the trainer may evaluate several times between two operator cycles):
        each one whose convergence gain over the ``window`` evaluations up to it is
        below ``beta`` adds one, any other resets it (so does a report without a
        history: no gain is known)."""
        new = progress.epoch - self.epoch
        self.data_size = data_size
        self.workers = workers
        self.trained_s = trained_s
        if new <= 0:
            return
        self.epoch = progress.epoch
        self.accuracy = progress.accuracy
        hist = progress.history
        for end in range(max(len(hist) - new + 1, 1), len(hist) + 1) if hist else (0,):
            self.gain = convergence_gain(hist[:end], window)
            self.streak = self.streak + 1 if self.gain < beta else 0
        ml = progress.max_loss
        ok = ml and math.isfinite(ml) and ml > 0 and math.isfinite(progress.loss)
        self.loss_norm = progress.loss / ml if ok else 1.0

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


@dataclass(slots=True)
class RunningJob:
    """A running job as the planner sees it."""

    key: str
    spec: TrainingSpec
    workers: int
    progress: Progress
    state: ElasticState
    submit_time: float = 0.0
    start_time: float = 0.0
    placement: list[int] = field(default_factory=list)

    def view(self) -> JobView:
        return self.spec.view(self.key, submit_time=self.submit_time, workers=self.workers,
                              priority=self.spec.priority_value, start_time=self.start_time,
                              placement=list(self.placement), progress=self.progress)


@dataclass(slots=True)
class ScalingPlan:
    """Per-job worker change (only non-zero entries) and finished jobs with the reason."""

    deltas: dict[str, int] = field(default_factory=dict)
    finished: dict[str, str] = field(default_factory=dict)
    #: what the policy asked before bounds and capacity (for events/metrics)
    asked: dict[str, int] = field(default_factory=dict)


class ScalingPlanner:
    """Applies a core scaling policy to running jobs under the operator's invariants."""

    def __init__(self, policy: Scaling, *, patience: int = 5) -> None:
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.policy = policy
        self.patience = patience

    @staticmethod
    def converging(job: RunningJob) -> bool:
        """Whether the job's last evaluation gained less than β (``streak > 0``): it
        gives a worker back, whatever the policy asked."""
        return job.state.streak > 0

    def finished(self, job: RunningJob) -> str | None:
        """``"Converged"``, ``"MaxEpochs"`` or ``None``."""
        if job.progress.epoch >= job.spec.max_epochs:
            return "MaxEpochs"
        if job.state.streak >= self.patience:
            return "Converged"
        return None

    def plan(self, running: Sequence[RunningJob], state: ClusterState, reserved_gpus: int = 0) -> ScalingPlan:
        """Decide this cycle's changes. ``reserved_gpus``: what the blocked head of the
        waiting queue needs; scale-ups never eat into it. A converging job (not pinned)
        gets ``-1`` whatever the policy asked. Marks each job the policy decided on
        (``state.decided_epoch``) so the same evaluation is not acted on twice."""
        out = ScalingPlan()
        live: list[RunningJob] = []
        for job in running:
            why = self.finished(job)
            if why:
                out.finished[job.key] = why
            else:
                live.append(job)

        asked: dict[str, int] = {}
        auto = [j for j in live if j.spec.pinned_workers is None and j.progress.epoch > j.state.decided_epoch]
        if auto:
            steps = dict(scaling_steps(self.policy.decide([j.view() for j in auto], state)))
            for j in auto:
                asked[j.key] = -1 if self.converging(j) else steps.get(j.key, 0)
                j.state.decided_epoch = j.progress.epoch
        for j in live:
            if j.spec.pinned_workers is not None:
                asked[j.key] = int(np.sign(j.spec.pinned_workers - j.workers))
        out.asked = {k: v for k, v in asked.items() if v}

        free = state.free.astype(np.int64).copy()
        spare = int(np.maximum(free, 0).sum()) - reserved_gpus
        ups: list[RunningJob] = []
        for j in live:
            d = asked.get(j.key, 0)
            if d < 0 and j.workers > j.spec.min_workers:
                out.deltas[j.key] = -1
            elif d > 0 and j.workers < j.spec.max_workers:
                ups.append(j)
        # jobs that still gain most get the spare GPUs first
        ups.sort(key=lambda j: (-(j.progress.gain if math.isfinite(j.progress.gain) else 1e9), j.start_time, j.key))
        for j in ups:
            g = j.spec.gpus_per_worker
            if spare < g:
                continue
            node = _fit_node(free, g)
            if node is None:
                continue
            free[node] -= g
            spare -= g
            out.deltas[j.key] = 1
        return out


def _fit_node(free: np.ndarray, gpus: int) -> int | None:
    ok = np.flatnonzero(free >= gpus)
    if not ok.size:
        return None
    return int(ok[np.argmin(free[ok])])
