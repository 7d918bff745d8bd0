"""Admission: which waiting jobs start, in which order, and whom a job preempts.

Queues ``interrupt > urgent > normal`` with RLPTO's dynamic priority (Lu et al., TPDS
2023, §V), the ordering policy inside a queue, head-of-line blocking unless backfill,
preemption by service class and under a preemptive ordering; a gang that could never
fit never blocks the queue. Pure logic over core snapshots. Rules: docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from ..cluster import ClusterState, JobView
from ..contract import class_rank
from ..policy import Ordering
from .spec import TrainingSpec

__all__ = [
    "DynamicPriority", "AdmissionPlan", "Admission", "HIGHEST_BONUS",
    "WaitReason", "waiting_reasons", "admit_in_order", "gang_fits", "gang_unfittable", "take_gang", "unfittable_reason",
]

#: added to a ``highest`` job's priority so that it ranks before every urgent job
#: (spec values are bounded to [-1000, 1000] by the CRD schema)
HIGHEST_BONUS = 1.0e6


@dataclass(frozen=True, slots=True)
class DynamicPriority:
    """RLPTO's request-driven priority and the normal/urgent promotion thresholds."""

    mu: float = 0.1
    promote_at: float = 1.0
    demote_at: float = -1.0

    def __post_init__(self) -> None:
        if self.mu < 0:
            raise ValueError(f"mu must be >= 0, got {self.mu}")
        if self.demote_at >= self.promote_at:
            raise ValueError(f"need demote_at ({self.demote_at}) < promote_at ({self.promote_at})")

    def update(self, pr: float, requests_total: int, requests_seen: int) -> tuple[float, int]:
        """``(pr_t, seen)`` after the user's request counter moved to ``requests_total``.

        ``N = requests_total - requests_seen`` may be negative (a withdrawn request).
        """
        n = int(requests_total) - int(requests_seen)
        return pr + self.mu * n, int(requests_total)

    def expected(self, value: float, requests_total: int) -> float:
        """The priority :meth:`update` reaches from the spec's ``value`` after
        ``requests_total`` requests: ``value + mu * requests_total``. The operator
        derives a job's priority from this (spec and annotation), never from a status
        field someone else could have written."""
        return float(value) + self.mu * int(requests_total)

    def queue(self, klass: str, pr: float, interrupted: bool = False) -> str:
        """The queue a job of service class ``klass`` and priority ``pr`` waits in."""
        if interrupted:
            return "interrupt"
        if klass == "highest":
            return "urgent"
        if klass == "urgent":
            return "normal" if pr <= self.demote_at else "urgent"
        if klass == "normal":
            return "urgent" if pr >= self.promote_at else "normal"
        raise ValueError(f"unknown priority class {klass!r}")


@dataclass(slots=True)
class AdmissionPlan:
    """What one cycle does: start ``admit`` (in order), preempt ``preempt``; ``blocked``
    is the first job that had to wait (head-of-line), ``waiting_gpus`` what it needs."""

    admit: list[str] = field(default_factory=list)
    preempt: list[str] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    blocked: str | None = None
    waiting_gpus: int = 0
    #: waiting jobs whose gang cannot fit the whole cluster (key -> why, with the
    #: numbers); they are skipped, never blocking the queue nor preempting
    unfittable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WaitReason:
    """Why a job waits, as its status says it (``status.waiting``) and ``rlsched why``
    prints it: its place in the service order (1: next), a reason code and the numbers."""

    position: int
    reason: str
    message: str

    def to_status(self) -> dict:
        return {"position": self.position, "reason": self.reason, "message": self.message}


def waiting_reasons(plan: AdmissionPlan, waiting: Sequence[JobView], *, backfill: bool,
                    free_gpus: int) -> dict[str, WaitReason]:
    """Why each job of ``waiting`` still waits after ``plan`` (the admitted ones are
    left out), from the plan's own decisions: ``Unfittable`` (its gang cannot fit the
    cluster), ``Preempting`` (the head of line, waiting for the GPUs of the jobs it
    preempted), ``NoRoom`` (its gang does not fit the free GPUs now: the head of line, or
    any job with backfill), ``BehindHead`` (without backfill, behind a head of line
    that does not fit). Positions count the jobs still waiting, in service order."""
    by_key = {v.id: v for v in waiting}
    admitted = set(plan.admit)
    out: dict[str, WaitReason] = {}
    pos = 0
    for key in plan.order:
        v = by_key.get(key)
        if v is None or key in admitted:
            continue
        gang = f"{v.workers} x {v.gpus_per_worker} GPUs"
        if key in plan.unfittable:  # no place in the queue until nodes make it fit
            out[key] = WaitReason(0, "Unfittable", f"its gang of {gang} cannot fit this cluster: {plan.unfittable[key]}")
            continue
        pos += 1
        if key == plan.blocked and plan.preempt:
            out[key] = WaitReason(pos, "Preempting", f"head of the queue; waiting for the GPUs of {len(plan.preempt)} "
                                                     f"preempted job(s) to be released for its gang of {gang}")
        elif key == plan.blocked or backfill or plan.blocked is None:
            out[key] = WaitReason(pos, "NoRoom", f"its gang of {gang} does not fit the {free_gpus} free GPUs "
                                                 f"(placed as the extender will place it)")
        else:
            out[key] = WaitReason(pos, "BehindHead", f"behind {plan.blocked}, the head of the queue, whose gang does "
                                                     f"not fit yet (no backfill)")
    return out


def admit_in_order(
    candidates: Iterable[JobView],
    try_start: Callable[[JobView], bool],
    *,
    backfill: bool,
) -> tuple[list, object | None]:
    """Walk ``candidates`` in service order, starting each with ``try_start`` (True when
    it started). The first that does not start blocks everything behind it
    (head-of-line), unless ``backfill`` lets later jobs start past it.

    Returns ``(started, blocked)``: the candidates that started, in order, and the
    first that could not (None when all did). ``candidates`` may be a generator that
    looks at what started so far (the simulator's incremental ranking does).
    """
    started: list = []
    blocked = None
    for c in candidates:
        if try_start(c):
            started.append(c)
            continue
        if blocked is None:
            blocked = c
        if not backfill:
            break
    return started, blocked


def gang_fits(free: np.ndarray, gpus_per_worker: int, workers: int) -> bool:
    """Whether ``workers`` workers of ``gpus_per_worker`` GPUs fit the per-node ``free``."""
    return int((np.maximum(free, 0) // gpus_per_worker).sum()) >= workers


def unfittable_reason(total: np.ndarray, gpus_per_worker: int, workers: int) -> str | None:
    """Why a gang of ``workers`` x ``gpus_per_worker`` GPUs can never fit nodes of
    ``total`` GPUs each (even with every GPU free), or None when it can."""
    total = np.maximum(np.asarray(total, dtype=np.int64), 0)
    g, n = int(gpus_per_worker), int(workers)
    largest = int(total.max()) if total.size else 0
    cluster = int(total.sum())
    if g > largest:
        return f"a worker needs {g} GPUs, the largest node has {largest}"
    if g * n > cluster:
        return f"the gang needs {n} x {g} = {g * n} GPUs, the cluster has {cluster}"
    if g > 0 and not gang_fits(total, g, n):
        slots = int((total // g).sum())
        return f"the gang needs {n} workers of {g} GPUs, the cluster's nodes can host {slots}"
    return None


def gang_unfittable(spec: TrainingSpec | JobView, state: ClusterState, workers: int | None = None) -> str | None:
    """Why a gang of ``workers`` of ``spec``'s workers (default its ``minWorkers``) can
    never fit the nodes of ``state`` even with every GPU free, counting only nodes of a
    GPU model its workers allow and the workers each node can host by CPU and memory;
    None when it can. ``spec`` may be a job's view (its GPUs, models, CPU and memory per
    worker). The same verdict for admission and for an allocator (the operator's
    ``Schedulable``)."""
    models, g = spec.gpu_models, max(1, spec.gpus_per_worker)
    workers = spec.min_workers if workers is None else workers
    total = state.total.astype(np.int64)
    cpu, mem = spec.cpu_milli, spec.memory_mib
    if cpu > 0:  # a node hosts no more workers than its CPU and memory hold
        total = np.minimum(total, state.cpu_total // cpu * g)
    if mem > 0:
        total = np.minimum(total, state.mem_total // mem * g)
    ok = None
    if models is not None:  # only the nodes of a model its workers may run on
        ok = state.candidates_total(0, models)
        only = np.zeros_like(total)
        only[ok] = total[ok]
        total = only
    why = ("no node of the cluster has a GPU model its worker template allows" if ok is not None and not ok.size
           else unfittable_reason(total, spec.gpus_per_worker, workers))
    if why is not None and ok is not None and ok.size:
        why += f" (on nodes of GPU model {', '.join(sorted(models))})"
    if why is not None and (cpu > 0 or mem > 0):
        why += f" (counting the {cpu}m CPU and {mem}Mi memory each worker asks for)"
    return why


def take_gang(free: np.ndarray, gpus_per_worker: int, workers: int) -> None:
    """Subtract a gang from ``free`` in place, fullest-fitting nodes first (best fit)."""
    left = workers
    for i in np.argsort(free, kind="stable"):
        if left == 0:
            break
        k = min(left, int(free[i]) // gpus_per_worker)
        if k > 0:
            free[i] -= k * gpus_per_worker
            left -= k
    if left:
        raise ValueError("gang does not fit")


class Admission:
    """Orders waiting jobs and decides admissions and preemptions for one cycle.

    ``ordering`` is a core ordering policy (``make_ordering("fifo")`` by default);
    ``backfill`` lets smaller jobs behind a blocked head start (off by default: strict
    priority order); ``preemption`` lets ``highest`` jobs evict lower-class ones, and
    the head of the queue evict jobs a preemptive ordering ranks after it;
    ``start_timeout_s`` is how long an admitted gang may take to run;
    ``min_run_s`` how long a job runs before it may be preempted (Kueue's and KAI's
    protection of a job that just started; 0: none), measured on ``state.time``.
    """

    def __init__(
        self, ordering: Ordering, *, backfill: bool = False, preemption: bool = True, start_timeout_s: float = 120.0,
        min_run_s: float = 0.0,
    ) -> None:
        if start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0, got {start_timeout_s}")
        if not (min_run_s >= 0 and min_run_s != float("inf")):
            raise ValueError(f"min_run_s must be a finite number >= 0, got {min_run_s}")
        self.ordering = ordering
        self.backfill = backfill
        self.preemption = preemption
        self.start_timeout_s = start_timeout_s
        self.min_run_s = float(min_run_s)
        self._verdicts_on: object = None  # the Topology the kept verdicts are of
        self._verdict: dict[tuple, str | None] = {}

    def _verdicts(self, state: ClusterState) -> dict:
        """:func:`gang_unfittable`'s verdict per gang shape on ``state``'s nodes, kept
        while they are the same :class:`Topology` (the verdict reads only capacities)."""
        if self._verdicts_on is not state.topology:
            self._verdicts_on, self._verdict = state.topology, {}
        return self._verdict

    def start_timed_out(self, admitted_at: float, now: float) -> bool:
        """An admitted gang whose workers are not all running ``start_timeout_s`` after
        admission goes back to its queue (its pods are deleted)."""
        return now - admitted_at > self.start_timeout_s

    def order(self, waiting: Sequence[JobView], state: ClusterState,
              nominated: frozenset[str] | set[str] = frozenset()) -> list[JobView]:
        """Service order: ``nominated`` preemptors, then interrupt, urgent, normal; inside
        a queue the ordering policy."""
        ranked = self.ordering.rank(list(waiting), state)
        return [v for v in ranked if v.id in nominated] + [v for v in ranked if v.id not in nominated]

    def plan(
        self,
        waiting: Sequence[JobView],
        running: Sequence[JobView],
        state: ClusterState,
        releasing: np.ndarray | None = None,
        place: Callable[[JobView, ClusterState], Sequence[int] | None] | None = None,
        nominated: frozenset[str] | set[str] = frozenset(),
    ) -> AdmissionPlan:
        """Admissions and preemptions given per-node free GPUs in ``state``. A waiting
        job is its live view; its gang is the workers it starts with (``workers``).
        ``nominated``: the waiting jobs served before every queue (a preemptor until it
        starts).

        ``releasing`` holds per-node GPUs of pods already being deleted: a blocked job
        that fits once they are gone waits for them instead of preempting again.

        ``place(job, state)`` is the room check: the nodes the placement that follows
        would give the gang (a :meth:`Placement.place`), or None when it does not fit.
        Each gang admitted is allocated on ``state`` so the next job is placed around
        it, as the placement will place them; all are released before returning. The
        default counts room on the nodes fullest-first (:func:`take_gang`), which can
        admit a second gang on nodes a topology-aware placement gives the first one.
        """
        free = state.free.astype(np.int64).copy()
        releasing = np.zeros_like(free) if releasing is None else np.asarray(releasing, dtype=np.int64)
        plan = AdmissionPlan()
        order = self.order(waiting, state, nominated)
        plan.order = [v.id for v in order]
        fitting = []
        verdicts = self._verdicts(state)
        for v in order:
            shape = (v.gpus_per_worker, v.workers, v.gpu_models, v.cpu_milli, v.memory_mib)
            if shape not in verdicts:
                verdicts[shape] = gang_unfittable(v, state, v.workers)
            why = verdicts[shape]
            if why is None:
                fitting.append(v)
            else:
                plan.unfittable[v.id] = why

        taken: list[tuple[int, int, int, int]] = []

        def fits(v: JobView) -> bool:
            g = v.gpus_per_worker
            if not gang_fits(free, g, v.workers):
                return False
            if place is None:
                take_gang(free, g, v.workers)
                return True
            nodes = place(v, state)
            if nodes is None:
                return False
            for i in nodes:
                state.allocate(int(i), g, v.cpu_milli, v.memory_mib)
                taken.append((int(i), g, v.cpu_milli, v.memory_mib))
                free[int(i)] -= g
            return True

        def try_start(v: JobView) -> bool:
            if fits(v):
                return True
            if plan.blocked is None:  # the head of line: it may preempt (GPUs as of now)
                plan.blocked = v.id
                plan.waiting_gpus = v.gpus
                if self.may_preempt(v) and not gang_fits(free + releasing, v.gpus_per_worker, v.workers):
                    plan.preempt.extend(self.choose_victims(v, running, free + releasing, state.total, state))
            return False

        try:
            started, _ = admit_in_order(fitting, try_start, backfill=self.backfill)
        finally:
            for i, g, cpu, mem in reversed(taken):
                state.release(i, g, cpu, mem)
        plan.admit = [v.id for v in started]
        return plan

    @property
    def preemptive_ordering(self) -> bool:
        """Whether the ordering itself preempts (SRTF, Tiresias)."""
        return bool(self.ordering.preemptive)

    def may_preempt(self, job: JobView) -> bool:
        """Whether blocked head-of-line ``job`` may evict anyone at all."""
        return self.preemption and (job.priority_class == "highest" or self.preemptive_ordering)

    def may_evict(self, job: JobView, victim: JobView, state: ClusterState | None) -> bool:
        """Whether waiting ``job`` may evict running ``victim``: a ``highest`` job any
        job of a lower class; under a preemptive ordering, any job of the same class or
        lower that the ordering ranks strictly after ``job`` (live views needed)."""
        if not self.preemption:
            return False
        jr, vr = class_rank(job.priority_class), class_rank(victim.priority_class)
        if job.priority_class == "highest" and vr < jr:
            return True
        if self.preemptive_ordering and vr <= jr and state is not None:
            return bool(self.ordering.preempts(job, victim, state))
        return False

    def protected(self, victim: JobView, now: float) -> bool:
        """Whether ``victim`` has run less than ``min_run_s`` by ``now`` (since its
        ``start_time``): not evictable yet."""
        return self.min_run_s > 0 and now - victim.start_time < self.min_run_s

    def _evictable(self, job: JobView, victim: JobView, state: ClusterState | None, outranked: set | None) -> bool:
        if state is not None and self.protected(victim, state.time):
            return False
        if outranked is None or job.priority_class == "highest":
            return self.may_evict(job, victim, state)
        return victim.id in outranked and class_rank(victim.priority_class) <= class_rank(job.priority_class)

    def choose_victims(
        self,
        job: JobView,
        running: Sequence[JobView],
        free: np.ndarray,
        total: np.ndarray,
        state: ClusterState | None = None,
    ) -> list[str]:
        """The fewest lowest-priority running jobs whose GPUs make ``job``'s gang fit.

        Candidates are the running jobs ``job`` may evict (:meth:`may_evict`), as live
        views holding GPUs (their ``placement``); the lowest class, then the lowest
        dynamic priority, then (preemptive orderings) the one the ordering ranks last,
        then the most recently started (``start_time``) goes first: it loses the least
        work. Returns ``[]`` if even evicting all of them would not help.
        """
        outranked = None
        if self.preemption and self.preemptive_ordering and state is not None:
            # one key computation for all, same answer as may_evict's pairwise one
            outranked = {v.id for v in self.ordering.outranked(job, list(running), state)}
        cands = [r for r in running if self._evictable(job, r, state, outranked)]
        last = {}
        if self.preemptive_ordering and state is not None:
            last = {v.id: -i for i, v in enumerate(self.ordering.rank(cands, state))}
        cands.sort(key=lambda r: (class_rank(r.priority_class), r.priority, last.get(r.id, 0), -r.start_time, r.id))
        room = _Room.of(job, free, total, state)
        chosen: list[str] = []
        for r in cands:
            room.release(r)
            chosen.append(r.id)
            if room.fits(job):
                return self._prune(chosen, cands, _Room.of(job, free, total, state), job)
        return []

    @staticmethod
    def _prune(chosen: list[str], cands: Sequence[JobView], start: "_Room", job: JobView) -> list[str]:
        """Drop victims (highest priority first) that are not needed after all."""
        by_key = {r.id: r for r in cands}
        keep = list(chosen)
        for key in reversed(chosen[:-1]):
            trial = [k for k in keep if k != key]
            room = start.copy()
            for k in trial:
                room.release(by_key[k])
            if room.fits(job):
                keep = trial
        return keep


@dataclass
class _Room:
    """Free GPUs per node (as the caller counts them) and, when the waiting job asks for
    CPU or memory and the cluster state is known, free CPU and memory per node: victims
    are chosen until the gang fits by every resource a worker needs, so nobody is evicted
    for a job whose workers would still not fit (e.g. a worker needing a large node's
    memory, where freeing GPUs on small nodes does not help)."""

    gpus: np.ndarray
    total: np.ndarray
    cpu: np.ndarray | None = None
    mem: np.ndarray | None = None
    cpu_total: np.ndarray | None = None
    mem_total: np.ndarray | None = None
    cpu_need: int = 0
    mem_need: int = 0

    @classmethod
    def of(cls, view: JobView, free: np.ndarray, total: np.ndarray, state: ClusterState | None) -> "_Room":
        room = cls(np.array(free, dtype=np.int64), np.asarray(total, dtype=np.int64))
        if state is None or not (view.cpu_milli > 0 or view.memory_mib > 0):
            return room
        room.cpu, room.mem = state.cpu_free.astype(np.int64), state.mem_free.astype(np.int64)
        room.cpu_total, room.mem_total = state.cpu_total, state.mem_total
        room.cpu_need, room.mem_need = int(view.cpu_milli), int(view.memory_mib)
        return room

    def copy(self) -> "_Room":
        return _Room(self.gpus.copy(), self.total, None if self.cpu is None else self.cpu.copy(),
                     None if self.mem is None else self.mem.copy(), self.cpu_total, self.mem_total,
                     self.cpu_need, self.mem_need)

    def release(self, r: JobView) -> None:
        g = r.gpus_per_worker
        for i in r.placement:
            self.gpus[i] = min(self.gpus[i] + g, self.total[i])
            if self.cpu is not None:
                self.cpu[i] = min(self.cpu[i] + r.cpu_milli, self.cpu_total[i])
                self.mem[i] = min(self.mem[i] + r.memory_mib, self.mem_total[i])

    def fits(self, job: JobView) -> bool:
        """Whether ``job``'s gang (its ``workers``) fits."""
        per = np.maximum(self.gpus, 0) // job.gpus_per_worker
        if self.cpu is not None:
            if self.cpu_need > 0:
                per = np.minimum(per, np.maximum(self.cpu, 0) // self.cpu_need)
            if self.mem_need > 0:
                per = np.minimum(per, np.maximum(self.mem, 0) // self.mem_need)
        return int(per.sum()) >= job.workers
