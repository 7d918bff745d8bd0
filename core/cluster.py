"""The cluster as policies see it: jobs, nodes and free capacity.

:class:`ClusterState` is the snapshot every policy reads. The simulator keeps one and
mutates it as events happen; the extender and the operator build one from their
Kubernetes caches. It indexes free GPUs per (GPU model, free count) so that
first/best/worst-fit queries cost O(buckets · log nodes) instead of a scan of every
node — the simulator makes one such query per placement decision.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import numpy as np

from .topology import Level, Topology

if TYPE_CHECKING:
    from .allocation import ProfileSample
    from .batch import BatchBounds
    from .goodput import JobObservations

__all__ = ["Progress", "progress_from_report", "JobView", "ClusterState", "FitIndex", "QUEUES", "PlacementError"]

#: Queues in the order they are served (RLPTO §V: interrupted jobs resume first).
QUEUES = ("interrupt", "urgent", "normal")


class PlacementError(ValueError):
    """A placement plan does not fit the cluster (double allocation, unknown node)."""


@dataclass(slots=True)
class Progress:
    """Training progress of a job as its chief reports it (RLPTO's e, l, a, ...)."""

    epoch: int = 0
    loss: float = float("nan")
    max_loss: float = float("nan")
    accuracy: float = 0.0
    #: accuracy after each evaluation, oldest first
    history: list[float] = field(default_factory=list)
    #: progress in base-batch epochs when the trainer counts it scale-invariantly
    #: (``status.progress.scaleInvariantEpochs``, AdaScale); None: not reported
    scale_invariant_epochs: float | None = None

    @property
    def epochs_done(self) -> float:
        """The epochs of work done that the ``maxEpochs`` cap and the remaining-time
        estimate judge: the scale-invariant epochs when reported (a larger batch with
        a smaller gain needs more passes over the data for the same progress), else
        the completed epochs."""
        return float(self.epoch) if self.scale_invariant_epochs is None else self.scale_invariant_epochs

    @property
    def gain(self) -> float:
        """Accuracy gained by the last evaluation (RLPTO's v_a); inf before two."""
        if len(self.history) < 2:
            return float("inf")
        return self.history[-1] - self.history[-2]


def _finite(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def progress_from_report(p: Mapping[str, Any]) -> Progress:
    """A :class:`Progress` from a ``status.progress`` object as the trainer writes it
    (absent fields: their defaults; a loss not reported: NaN; a scale-invariant figure
    that is not a finite number >= 0: not reported)."""
    loss, max_loss = p.get("loss"), p.get("maxLoss")
    sie = _finite(p.get("scaleInvariantEpochs"))
    return Progress(
        epoch=int(p.get("epoch", 0) or 0),
        loss=float("nan") if loss is None else float(loss),
        max_loss=float("nan") if max_loss is None else float(max_loss),
        accuracy=float(p.get("accuracy", 0.0) or 0.0),
        history=[float(x) for x in p.get("history") or []],
        scale_invariant_epochs=sie if sie is not None and sie >= 0 else None,
    )


@dataclass(slots=True, eq=False)
class JobView:
    """A training job in the terms policies use.

    ``workers`` is the current worker count of a running job or the count it asks to
    start with when pending. ``placement`` holds the node index of every worker.
    Durations are seconds. ``est_runtime`` is the user's run-time estimate from the job
    spec (0: none given; what SJF sorts on) and ``remaining`` core's estimate of the time
    left (:func:`rlsched.core.estimate.estimate_remaining`); neither is ever the true run
    time, except in the simulator's labelled clairvoyant reference runs.
    """

    id: str
    submit_time: float
    gpus_per_worker: int = 1
    workers: int = 1
    min_workers: int = 1
    max_workers: int = 1
    gpu_models: frozenset[str] | None = None
    priority: float = 0.0
    queue: str = "normal"
    cpu_milli: int = 0
    memory_mib: int = 0
    est_runtime: float = 0.0
    remaining: float = 0.0
    attained_service: float = 0.0
    start_time: float | None = None
    placement: list[int] = field(default_factory=list)
    progress: Progress = field(default_factory=Progress)
    beta: float = 0.001
    #: samples per second one worker processes at ideal placement (for Optimus-style
    #: marginal-gain estimates); 0 when unknown
    throughput: float = 0.0
    #: measured marginal speed-up: throughput with one more worker over throughput now
    #: (as a profiler measures it, e.g. Pollux's fitted throughput model); 0 when unknown
    speedup: float = 0.0
    #: measured statistical efficiency of one more worker: efficiency of a sample at
    #: ``workers + 1`` over that at ``workers`` (as a gradient-noise-scale monitor
    #: measures it); 0 when unknown
    stat_efficiency: float = 0.0
    #: its service class (a TrainingJob's ``spec.priority.class``): a ``highest`` job may
    #: preempt jobs of lower classes
    priority_class: str = "normal"
    # What an allocation policy reads besides (core's ``LiveAllocation`` turns the view
    # into the allocator's terms); a running job's workers are its ``placement``.
    #: the workers it asks to start with (``spec.workers``; None: its minimum) and the
    #: count it is pinned to (``spec.workers`` of a job without a range; None: none)
    asked_workers: int | None = None
    pinned_workers: int | None = None
    #: its generation's global batch (None: the spec's, or none) and the batch sizes the
    #: scheduler may choose from (None: a fixed per-GPU batch)
    batch_size: int | None = None
    bounds: BatchBounds | None = None
    #: the step times and gradient statistics it reported (None: nothing measured)
    observations: JobObservations | None = None
    #: its generations restarted so far (resizes and preemptions)
    restarts: int = 0
    #: the team queue it is charged to (:mod:`rlsched.core.queues`; None: none)
    team: str | None = None
    #: what the scaling planner keeps of a running job between decisions (an
    #: :class:`~rlsched.core.planning.ElasticState`, ``status.rlpto``: evaluations in a
    #: row gaining less than β, the evaluation it last decided on); None: none kept
    record: Any = None
    #: samples per GPU of its fixed per-worker batch, as it reported them (a job without
    #: ``spec.batchSize``); None: unknown
    local_batch: float | None = None
    #: what its own end is judged on besides its progress and ``record``
    #: (:func:`~rlsched.core.planning.training_end`): ``spec.maxEpochs`` and the β stop's
    #: patience (None: the caller's default)
    max_epochs: float = math.inf
    patience: int | None = None
    #: False for a running job whose generation is still starting: it keeps its GPUs and
    #: only its end is judged
    movable: bool = True
    #: the one-GPU step times it declared per GPU type (``spec.seedProfile``)
    seed_profile: tuple[ProfileSample, ...] = ()
    #: seconds its last new allocation stalled it, to its first report after it
    #: (``status.restartStall``; None: not measured yet)
    restart_s: float | None = None

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    @property
    def streak(self) -> int:
        """Evaluations in a row that gained less than β (its ``record``'s; 0 without)."""
        return self.record.streak if self.record is not None else 0

    @property
    def worker_range(self) -> tuple[int, int]:
        """The worker counts it may run at: ``pinned_workers`` when pinned, else
        ``[min_workers, max_workers]``."""
        if self.pinned_workers:
            return self.pinned_workers, self.pinned_workers
        return self.min_workers, self.max_workers

    def __post_init__(self) -> None:
        if self.gpus_per_worker < 1:
            raise ValueError(f"job {self.id}: gpus_per_worker must be >= 1")
        if not (1 <= self.min_workers <= self.max_workers):
            raise ValueError(
                f"job {self.id}: need 1 <= min_workers ({self.min_workers}) "
                f"<= max_workers ({self.max_workers})"
            )
        if self.queue not in QUEUES:
            raise ValueError(f"job {self.id}: unknown queue {self.queue!r}")


class ClusterState:
    """Free and used GPUs per node, running and pending jobs, at one time.

    Mutated only through :meth:`allocate` / :meth:`release` (and the job lists), so
    the free-capacity index stays exact.
    """

    def __init__(self, topology: Topology, time: float = 0.0) -> None:
        self.topology = topology
        self.time = time
        n = len(topology)
        self.total = np.array([s.gpus for s in topology.nodes], dtype=np.int64)
        self.free = self.total.copy()
        self.cpu_total = np.array([s.cpu_milli for s in topology.nodes], dtype=np.int64)
        self.mem_total = np.array([s.memory_mib for s in topology.nodes], dtype=np.int64)
        self.cpu_free = self.cpu_total.copy()
        self.mem_free = self.mem_total.copy()
        self.running: dict[str, JobView] = {}
        self.pending: list[JobView] = []
        self.max_gpus = int(self.total.max()) if n else 0
        self.models = sorted({s.gpu_model for s in topology.nodes})
        self._model_id = {m: i for i, m in enumerate(self.models)}
        self._node_model = np.array(
            [self._model_id[s.gpu_model] for s in topology.nodes], dtype=np.int64
        )
        # _heaps[model][c]: node indices whose free count was c when pushed (lazy)
        self._heaps = [[[] for _ in range(self.max_gpus + 1)] for _ in self.models]
        self._in_heap = np.zeros((len(self.models), self.max_gpus + 1, n), dtype=bool)
        for i in range(n):
            self._push(i)
        self._free_total = int(self.free.sum())
        self._rack_id = {r: k for k, r in enumerate(topology.racks)}
        self.rack_of = np.array([self._rack_id[r] for r in topology.rack_of], dtype=np.int64)
        self.rack_free = np.bincount(self.rack_of, weights=self.free, minlength=len(topology.racks)).astype(np.int64)
        # nodes changed by allocate/release, in order (read by FitIndex); entries before
        # _touched_base were dropped to bound the log
        self._touched: list[int] = []
        self._touched_base = 0
        self._fit_index: FitIndex | None = None

    # ------------------------------------------------------------------ index
    def _push(self, i: int) -> None:
        m, c = self._node_model[i], self.free[i]
        if not self._in_heap[m, c, i]:
            self._in_heap[m, c, i] = True
            heapq.heappush(self._heaps[m][c], i)

    def _top(self, m: int, c: int) -> int | None:
        h = self._heaps[m][c]
        while h:
            i = h[0]
            if self.free[i] == c:
                return i
            heapq.heappop(h)
            self._in_heap[m, c, i] = False
        return None

    def _touch(self, i: int) -> None:
        log = self._touched
        log.append(i)
        if len(log) > 4096 + 8 * len(self.free):
            self._touched_base += len(log)
            log.clear()

    @property
    def mutations(self) -> int:
        """How many allocate/release calls changed this state so far (a version)."""
        return self._touched_base + len(self._touched)

    def touched_since(self, mark: int) -> list[int] | None:
        """Node indices changed since :attr:`mutations` was ``mark`` (repeats possible);
        ``None`` when that part of the log was dropped (the reader refreshes fully)."""
        if mark < self._touched_base:
            return None
        return self._touched[mark - self._touched_base :]

    def fit_index(self) -> FitIndex:
        """The :class:`FitIndex` of this state (made on first use, kept up to date)."""
        if self._fit_index is None:
            self._fit_index = FitIndex(self)
        return self._fit_index

    def _model_ids(self, models: frozenset[str] | None) -> list[int]:
        if models is None:
            return list(range(len(self.models)))
        return [self._model_id[m] for m in models if m in self._model_id]

    # ------------------------------------------------------------------ queries
    @property
    def free_gpus(self) -> int:
        return self._free_total

    @property
    def total_gpus(self) -> int:
        return int(self.total.sum())

    def fits(self, i: int, gpus: int, models: frozenset[str] | None = None) -> bool:
        if models is not None and self.topology.nodes[i].gpu_model not in models:
            return False
        return bool(self.free[i] >= gpus)

    def first_fit(self, gpus: int, models: frozenset[str] | None = None) -> int | None:
        """Lowest-index node with at least ``gpus`` free GPUs of an allowed model."""
        best = None
        for m in self._model_ids(models):
            for c in range(max(gpus, 0), self.max_gpus + 1):
                i = self._top(m, c)
                if i is not None and (best is None or i < best):
                    best = i
        return best

    def best_fit(self, gpus: int, models: frozenset[str] | None = None) -> int | None:
        """Node left with the fewest free GPUs after taking ``gpus`` (ties: lowest index)."""
        for c in range(max(gpus, 0), self.max_gpus + 1):
            cands = [i for m in self._model_ids(models) if (i := self._top(m, c)) is not None]
            if cands:
                return min(cands)
        return None

    def worst_fit(self, gpus: int, models: frozenset[str] | None = None) -> int | None:
        """Node with the most free GPUs (load balancing; ties: lowest index)."""
        for c in range(self.max_gpus, max(gpus, 0) - 1, -1):
            cands = [i for m in self._model_ids(models) if (i := self._top(m, c)) is not None]
            if cands:
                return min(cands)
        return None

    def candidates(self, gpus: int, models: frozenset[str] | None = None) -> np.ndarray:
        """All node indices that can host one worker of ``gpus`` GPUs (vectorised)."""
        ok = self.free >= gpus
        if models is not None:
            allowed = np.zeros(len(self.models), dtype=bool)
            allowed[self._model_ids(models)] = True
            ok &= allowed[self._node_model]
        return np.flatnonzero(ok)

    def could_ever_fit(self, job: JobView) -> bool:
        """Whether the job's minimum gang fits the empty cluster at all."""
        allowed = self.candidates_total(job.gpus_per_worker, job.gpu_models)
        slots = int((self.total[allowed] // job.gpus_per_worker).sum())
        return slots >= job.min_workers

    def candidates_total(self, gpus: int, models: frozenset[str] | None = None) -> np.ndarray:
        ok = self.total >= gpus
        if models is not None:
            allowed = np.zeros(len(self.models), dtype=bool)
            allowed[self._model_ids(models)] = True
            ok &= allowed[self._node_model]
        return np.flatnonzero(ok)

    def span_level(self, placement: Sequence[int], gpus_per_worker: int) -> Level:
        counts: dict[int, int] = {}
        for i in placement:
            counts[i] = counts.get(i, 0) + gpus_per_worker
        return self.topology.span_level(counts)

    # ------------------------------------------------------------------ mutation
    def allocate(self, i: int, gpus: int, cpu_milli: int = 0, memory_mib: int = 0) -> None:
        if gpus < 0 or self.free[i] < gpus:
            raise PlacementError(
                f"node {self.topology.nodes[i].name}: asked {gpus} GPUs, {self.free[i]} free"
            )
        self.free[i] -= gpus
        self.cpu_free[i] -= cpu_milli
        self.mem_free[i] -= memory_mib
        self._free_total -= gpus
        self.rack_free[self.rack_of[i]] -= gpus
        self._push(i)
        self._touch(i)

    def release(self, i: int, gpus: int, cpu_milli: int = 0, memory_mib: int = 0) -> None:
        if gpus < 0 or self.free[i] + gpus > self.total[i]:
            raise PlacementError(
                f"node {self.topology.nodes[i].name}: releasing {gpus} GPUs would exceed capacity"
            )
        self.free[i] += gpus
        self.cpu_free[i] += cpu_milli
        self.mem_free[i] += memory_mib
        self._free_total += gpus
        self.rack_free[self.rack_of[i]] += gpus
        self._push(i)
        self._touch(i)

    def allocate_job(self, job: JobView, placement: Sequence[int]) -> None:
        """Allocate every worker of ``placement`` or nothing (raises PlacementError)."""
        done: list[int] = []
        try:
            for i in placement:
                self.allocate(i, job.gpus_per_worker, job.cpu_milli, job.memory_mib)
                done.append(i)
        except PlacementError:
            for i in done:
                self.release(i, job.gpus_per_worker, job.cpu_milli, job.memory_mib)
            raise

    def release_job(self, job: JobView, placement: Iterable[int]) -> None:
        for i in placement:
            self.release(i, job.gpus_per_worker, job.cpu_milli, job.memory_mib)

    def iter_running(self) -> Iterator[JobView]:
        return iter(self.running.values())

    def utilization(self) -> float:
        total = self.total_gpus
        return 0.0 if total == 0 else 1.0 - self._free_total / total


class FitIndex:
    """How many workers of each job shape every node could host now, kept incrementally.

    A shape is ``(gpus_per_worker, gpu_models, cpu_milli, memory_mib)``; its row holds
    :func:`rlsched.core.placement.worker_slots` of a job of that shape (GPUs of an allowed
    model, CPU and memory when asked) and their sum. A row is brought up to date when it
    is read, from the nodes :meth:`ClusterState.allocate`/``release`` touched since it
    was last read, so "does a gang of ``w`` workers fit now" costs O(nodes changed)
    instead of a pass over every node per job. A state whose ``free``/``cpu_free``/
    ``mem_free`` arrays are written directly (not through allocate/release) must call
    :meth:`refresh`.
    """

    #: more changed nodes than this are recomputed with numpy, not one by one
    _SMALL = 24

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        # key -> [g, cpu, mem, allowed (bool array), slots (int64 array), total, mark]
        self._rows: dict[tuple, list] = {}

    @staticmethod
    def key(job: JobView) -> tuple:
        return (job.gpus_per_worker, job.gpu_models, job.cpu_milli, job.memory_mib)

    def _compute(self, row: list, cols) -> np.ndarray:
        """Worker slots of the shape ``row`` on nodes ``cols`` (index array or slice)."""
        st = self.state
        g, c, m, allowed = row[0], row[1], row[2], row[3]
        out = st.free[cols] // g
        if c > 0:
            out = np.minimum(out, np.maximum(st.cpu_free[cols], 0) // c)
        if m > 0:
            out = np.minimum(out, np.maximum(st.mem_free[cols], 0) // m)
        return np.where(allowed[cols], out, 0).astype(np.int64)

    def _row(self, job: JobView) -> list:
        k = (job.gpus_per_worker, job.gpu_models, job.cpu_milli, job.memory_mib)
        row = self._rows.get(k)
        st = self.state
        if row is None:
            allowed = np.zeros(len(st.free), dtype=bool)
            allowed[st.candidates_total(job.gpus_per_worker, job.gpu_models)] = True
            row = [job.gpus_per_worker, job.cpu_milli, job.memory_mib, allowed, None, 0, -1]
            self._rows[k] = row
            self._full(row)
            return row
        mark = st._touched_base + len(st._touched)
        if row[6] == mark:
            return row
        changed = st.touched_since(row[6])
        if changed is None or len(changed) > len(st.free) // 4:
            self._full(row)
            return row
        slots = row[4]
        if len(changed) <= self._SMALL:
            g, c, m, allowed = row[0], row[1], row[2], row[3]
            free, cpu, mem = st.free, st.cpu_free, st.mem_free
            total = row[5]
            for i in set(changed):
                if allowed[i]:
                    v = int(free[i]) // g
                    if c > 0:
                        v = min(v, max(int(cpu[i]), 0) // c)
                    if m > 0:
                        v = min(v, max(int(mem[i]), 0) // m)
                else:
                    v = 0
                total += v - int(slots[i])
                slots[i] = v
            row[5] = total
        else:
            cols = np.unique(np.asarray(changed, dtype=np.int64))
            new = self._compute(row, cols)
            row[5] += int((new - slots[cols]).sum())
            slots[cols] = new
        row[6] = mark
        return row

    def _full(self, row: list) -> None:
        row[4] = self._compute(row, slice(None))
        row[5] = int(row[4].sum())
        row[6] = self.state.mutations

    def refresh(self) -> None:
        """Recompute every shape from the state's arrays."""
        for row in self._rows.values():
            self._full(row)

    def total(self, job: JobView) -> int:
        """Workers of ``job``'s shape the cluster could host now (sum of :meth:`slots`)."""
        return self._row(job)[5]

    def fits(self, job: JobView) -> bool:
        """Whether ``job.workers`` workers fit the free capacity now."""
        return self._row(job)[5] >= job.workers

    def slots(self, job: JobView) -> np.ndarray:
        """Per node, how many more workers of ``job`` it could host now (a copy; equal
        to :func:`rlsched.core.placement.worker_slots`)."""
        return self._row(job)[4].copy()

    def slots_if_fit(self, job: JobView, workers: int) -> np.ndarray | None:
        """:meth:`slots` when ``workers`` workers of ``job`` fit now, else ``None``."""
        row = self._row(job)
        return row[4].copy() if row[5] >= workers else None
