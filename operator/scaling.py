"""Elastic scaling and completion of running jobs (RLPTO), as pure decisions.

Each cycle the control loop hands :class:`ScalingPlanner` the running jobs (with the
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
* completion: ``patience`` consecutive evaluations with gain below ``beta``
  (converged), or ``maxEpochs`` reached.

RLPTO's per-job state ``(m, e, l, n, a, c, w)`` is kept in :class:`RlptoState`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Mapping, Sequence

import numpy as np

from rlsched.core import ClusterState, JobView, Progress, Scaling

from .spec import JobSpec

__all__ = ["RlptoState", "RunningJob", "ScalingPlan", "ScalingPlanner", "BetaThreshold"]


@dataclass(slots=True)
class RlptoState:
    """RLPTO's observation of one job (Lu et al., IEEE TPDS 34(12), 2023, §V).

    ``m`` training data size (samples, 0 if unknown), ``e`` epochs done, ``l`` loss
    normalised by the largest loss seen (1 at the start, towards 0 as it converges),
    ``n`` workers, ``a`` accuracy, ``c`` accuracy change of the last evaluation (the
    convergence signal compared with β), ``w`` seconds the job has trained.
    ``streak`` counts consecutive evaluations with ``c < beta``; ``decided_epoch`` is
    the epoch of the last scaling decision.
    """

    m: int = 0
    e: int = 0
    l: float = 1.0  # noqa: E741  (the paper's name)
    n: int = 0
    a: float = 0.0
    c: float = float("inf")
    w: float = 0.0
    streak: int = 0
    decided_epoch: int = 0

    def observe(self, progress: Progress, workers: int, trained_s: float, beta: float, m: int) -> None:
        """Fold a progress report in; the streak grows once per new evaluation."""
        new_eval = progress.epoch > self.e
        self.m = m
        self.n = workers
        self.w = trained_s
        if not new_eval:
            return
        self.e = progress.epoch
        self.a = progress.accuracy
        gain = progress.gain
        self.c = gain
        ml = progress.max_loss
        self.l = progress.loss / ml if (ml and math.isfinite(ml) and ml > 0 and math.isfinite(progress.loss)) else 1.0
        self.streak = self.streak + 1 if gain < beta else 0

    def to_status(self) -> dict:
        d = asdict(self)
        if not math.isfinite(d["c"]):
            d["c"] = None
        return {"m": d["m"], "e": d["e"], "l": d["l"], "n": d["n"], "a": d["a"], "c": d["c"], "w": d["w"],
                "streak": d["streak"], "decidedEpoch": d["decided_epoch"]}

    @classmethod
    def from_status(cls, d: Mapping | None) -> "RlptoState":
        d = d or {}
        c = d.get("c")
        return cls(
            m=int(d.get("m", 0)),
            e=int(d.get("e", 0)),
            l=float(d.get("l", 1.0)),
            n=int(d.get("n", 0)),
            a=float(d.get("a", 0.0)),
            c=float("inf") if c is None else float(c),
            w=float(d.get("w", 0.0)),
            streak=int(d.get("streak", 0)),
            decided_epoch=int(d.get("decidedEpoch", 0)),
        )


@dataclass(slots=True)
class RunningJob:
    """A running job as the planner sees it."""

    key: str
    spec: JobSpec
    workers: int
    progress: Progress
    state: RlptoState
    submit_time: float = 0.0
    start_time: float = 0.0
    placement: list[int] = field(default_factory=list)

    def view(self) -> JobView:
        return JobView(
            id=self.key,
            submit_time=self.submit_time,
            gpus_per_worker=self.spec.gpus_per_worker,
            workers=self.workers,
            min_workers=self.spec.min_workers,
            max_workers=self.spec.max_workers,
            priority=self.spec.priority_value,
            est_runtime=self.spec.estimated_runtime,
            start_time=self.start_time,
            placement=list(self.placement),
            progress=self.progress,
            beta=self.spec.beta,
        )


@dataclass(slots=True)
class ScalingPlan:
    """Per-job worker change (only non-zero entries) and finished jobs with the reason."""

    deltas: dict[str, int] = field(default_factory=dict)
    finished: dict[str, str] = field(default_factory=dict)
    #: what the policy asked before bounds and capacity (for events/metrics)
    asked: dict[str, int] = field(default_factory=dict)


class BetaThreshold:
    """RLPTO's β-threshold rule: −1 when the last accuracy gain fell below β, else +1.

    Used by the operator only when core registers no ``beta`` scaling policy.
    """

    name = "beta"

    def decide(self, running: Sequence[JobView], state: ClusterState) -> dict[str, int]:
        return {j.id: (-1 if j.progress.gain < j.beta else 1) for j in running}


class ScalingPlanner:
    """Applies a core scaling policy to running jobs under the operator's invariants."""

    def __init__(self, policy: Scaling, *, patience: int = 5) -> None:
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.policy = policy
        self.patience = patience

    def finished(self, job: RunningJob) -> str | None:
        """``"Converged"``, ``"MaxEpochs"`` or ``None``."""
        if job.progress.epoch >= job.spec.max_epochs:
            return "MaxEpochs"
        if job.state.streak >= self.patience:
            return "Converged"
        return None

    def plan(self, running: Sequence[RunningJob], state: ClusterState, reserved_gpus: int = 0) -> ScalingPlan:
        """Decide this cycle's changes. ``reserved_gpus``: what the blocked head of the
        waiting queue needs; scale-ups never eat into it. Marks each job the policy
        decided on (``state.decided_epoch``) so the same evaluation is not acted on twice."""
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
            decided = self.policy.decide([j.view() for j in auto], state)
            for j in auto:
                asked[j.key] = int(np.sign(decided.get(j.key, 0)))
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
