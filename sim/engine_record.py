"""What the event engine keeps of a run: one record per finished job, the utilization
and queue series, the decision log, and the :class:`SimResult` metrics read
(:mod:`.metrics`). A part of :class:`~rlsched.sim.engine.Simulator`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rlsched.core import ClusterState

from .engine_jobs import JobState


@dataclass(slots=True)
class JobRecord:
    """What happened to one job."""

    id: str
    submit: float
    start: float
    end: float
    workers: int  # initial worker count
    gpus: int  # initial GPUs
    ideal_runtime: float  # run time at initial workers, ideal placement
    fee: float
    accuracy: float  # final accuracy (nan for fixed-duration jobs)
    epochs: int
    level: int  # span level at start
    rescales: int
    preemptions: int = 0  # times it was suspended (checkpointed) and requeued
    #: seconds it held no GPUs between submission and completion (the interval engine
    #: counts it; nan where not counted)
    queued: float = math.nan

    @property
    def jct(self) -> float:
        return self.end - self.submit

    @property
    def wait(self) -> float:
        return self.start - self.submit


@dataclass
class SimResult:
    """Everything metrics need from a finished (or stopped) run."""

    records: list[JobRecord]
    unfittable: list[str]
    unfinished: list[str]
    total_gpus: int
    series_t: np.ndarray
    series_used: np.ndarray
    series_queue: np.ndarray
    events: int
    wall_s: float
    first_submit: float
    skipped: dict[str, int] = field(default_factory=dict)
    #: the policies saw true run times (SimConfig.clairvoyant): a reference run
    clairvoyant: bool = False
    #: the decision log (``SimConfig.record_decisions``), in the order decided:
    #: ``{"kind": "admit"|"preempt"|"scale"|"finish", "job", "t", ...}``; the admissions
    #: and resizes of a job with an adaptive batch (``JobSpec.batch_size``) also say the
    #: global ``batch`` it trains at from then on
    decisions: list[dict] = field(default_factory=list)


class Recorder:
    """The records, series and (``decisions``) decision log of one run on ``state``."""

    def __init__(self, state: ClusterState, series: bool, decisions: bool) -> None:
        self.state = state
        self.series = series
        self.records: list[JobRecord] = []
        self.unfittable: list[str] = []
        #: the decision log, or None when not kept
        self.decisions: list[dict] | None = [] if decisions else None
        self._total_gpus = state.total_gpus
        self._t: list[float] = []
        self._used: list[int] = []
        self._queue: list[int] = []

    def record(self, t: float) -> None:
        """The GPUs in use and the queue length at ``t`` (the last value at one time)."""
        if not self.series:
            return
        used = self._total_gpus - self.state.free_gpus
        q = len(self.state.pending)
        st = self._t
        if st and st[-1] == t:
            self._used[-1] = used
            self._queue[-1] = q
        else:
            st.append(t)
            self._used.append(used)
            self._queue.append(q)

    def finished(self, j: JobState, t: float) -> None:
        """``j`` finished at ``t``."""
        v = j.view
        if self.decisions is not None:
            self.decisions.append({"kind": "finish", "job": v.id, "t": t, "epoch": v.progress.epoch,
                                   "jct": t - v.submit_time})
        self.records.append(
            JobRecord(
                id=v.id,
                submit=v.submit_time,
                start=float(j.first_start),
                end=t,
                workers=j.w0,
                gpus=j.w0 * v.gpus_per_worker,
                ideal_runtime=j.ideal,
                fee=j.fee,
                accuracy=v.progress.accuracy if j.conv is not None else math.nan,
                epochs=v.progress.epoch,
                level=j.level0,
                rescales=j.rescales,
                preemptions=j.preemptions,
            )
        )

    def result(self, unfinished: list[str], events: int, wall: float, first_submit: float,
               clairvoyant: bool) -> SimResult:
        return SimResult(
            records=list(self.records),
            unfittable=list(self.unfittable),
            unfinished=unfinished,
            total_gpus=self.state.total_gpus,
            series_t=np.array(self._t, dtype=float),
            series_used=np.array(self._used, dtype=np.int64),
            series_queue=np.array(self._queue, dtype=np.int64),
            events=events,
            wall_s=wall,
            first_submit=float(first_submit),
            clairvoyant=clairvoyant,
            decisions=list(self.decisions or ()),
        )
