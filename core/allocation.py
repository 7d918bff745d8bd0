"""The allocation-policy interface: one call decides every job's GPUs at once.

An allocator returns the whole cluster's allocation each interval, so it may start, stop,
migrate, shrink and grow any job and choose its batch size: how the published peers
decide (Tiresias, Optimus, Pollux; Qiao et al., OSDI'21 §5). It sees what a live
scheduler knows of each job (:class:`AllocJob`); only an allocator that declares itself
``clairvoyant`` (a labelled reference) also gets :class:`Oracle` facts.
Design notes: docs/design-notes.md.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence, runtime_checkable

from .batch import BatchBounds

__all__ = [
    "AllocationError",
    "ProfileSample",
    "Oracle",
    "AllocJob",
    "AllocNode",
    "Allocation",
    "Allocator",
    "check_allocations",
    "checked_call",
    "fixed_batch",
    "packed",
    "FreeNodes",
]


class AllocationError(ValueError):
    """An allocator returned an allocation the cluster cannot honour (unknown job or
    node, more GPUs than a node has, replicas or batch size out of the job's bounds)."""


@dataclass(frozen=True, slots=True)
class ProfileSample:
    """One throughput measurement a job made on a placement it ran on: seconds per
    step (``step_time``, of which ``sync_time`` is gradient synchronisation) with
    ``num_replicas`` GPUs over ``num_nodes`` nodes at ``atomic_bsz`` samples per GPU
    per micro-batch, ``accum_steps + 1`` micro-batches per step, on GPUs of type
    ``gpu_type`` (``""``: not said, one type of GPU)."""

    num_nodes: int
    num_replicas: int
    atomic_bsz: int
    step_time: float
    sync_time: float
    #: gradient-accumulation steps of the measured step (``step_time`` spans all of them)
    accum_steps: int = 0
    #: the GPU type it ran on (a key of the measured profiles, e.g. ``"aws"``; ``""``: not said)
    gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class Oracle:
    """Clairvoyant facts, given only to allocators with ``clairvoyant = True``.

    ``remaining_progress``: the efficiency-weighted progress the job still needs
    (the same unit as :attr:`AllocJob.progress`); ``progress_rate[k]``: progress per
    second on ``k`` GPUs packed on as few nodes as possible, at the job's batch size
    and its current statistical efficiency (k = 1 .. the job's max replicas)."""

    remaining_progress: float
    progress_rate: Mapping[int, float]


@dataclass(slots=True)
class AllocJob:
    """A submitted, unfinished job as an allocator sees it.

    ``allocation``: node index of each replica it holds now (empty: none).
    ``target_replicas`` / ``target_batch_size``: what the user asked for (a fixed-size
    job runs exactly that; an adaptive policy may ignore them). ``batch_size``,
    ``atomic_bsz``, ``accum_steps``: the job's current total batch size, per-GPU batch
    and gradient-accumulation steps (0 when it holds no GPUs). ``progress``: reported
    efficiency-weighted progress in steps at the initial batch size; ``epoch``: epochs
    completed; ``grad_sqr``/``grad_var``: the squared gradient norm and gradient
    variance the job measured most recently (the gradient noise scale's inputs;
    Pollux's statistical-efficiency model). ``profile``: throughput samples it measured.
    ``metrics``: the validation metric it reported after each completed epoch (its
    learning curve so far; ``higher_is_better`` tells the metric's direction: accuracy
    and F1 rise, word error rate and loss fall).
    """

    id: str
    submit_time: float
    application: str
    age: float
    attained_service: float  # GPU-seconds
    num_restarts: int
    allocation: tuple[int, ...]
    target_replicas: int | None
    target_batch_size: int | None
    min_replicas: int
    max_replicas: int
    #: its global batch bounds and per-GPU batch range
    bounds: BatchBounds
    batch_size: int = 0
    atomic_bsz: int = 0
    accum_steps: int = 0
    epoch: int = 0
    progress: float = 0.0
    grad_sqr: float | None = None
    grad_var: float | None = None
    profile: tuple[ProfileSample, ...] = ()
    metrics: tuple[float, ...] = ()
    higher_is_better: bool = True
    oracle: Oracle | None = None
    #: service class rank (a TrainingJob's ``spec.priority.class``: 2 highest, 1 urgent,
    #: 0 normal); an allocator serves higher classes first
    priority: int = 0
    #: the team queue the job is charged to (:mod:`rlsched.core.queues`; None: none)
    queue: str | None = None
    #: it may not lose any of the GPUs it holds this decision (its minimum run time)
    protected: bool = False
    #: the service queue it waits in (``interrupt``, ``urgent``, ``normal``: RLPTO's
    #: queues, :meth:`~rlsched.core.planning.DynamicPriority.queue`) and its dynamic
    #: priority; allocators that rank by the queues (the gang allocator's) read them
    service_queue: str = "normal"
    service_priority: float = 0.0
    #: the caller's live view of the running job with the record its scaling planner
    #: keeps across decisions (:attr:`~rlsched.core.cluster.JobView.record`, the
    #: operator's ``status.rlpto``; its reported progress and reports with it) and its own
    #: β; None: an allocator that scales keeps its own record from ``metrics``
    elastic: object | None = None
    beta: float | None = None
    #: when it last started from the queue (None: its submit time is used); of the
    #: victims of a preemption the most recently started goes first
    running_since: float | None = None
    #: the GPU models its replicas may run on (a TrainingJob's worker-template
    #: constraint, :func:`rlsched.core.contract.gpu_model_rule`); None: any
    gpu_models: frozenset[str] | None = None
    #: what each replica (GPU) needs besides: millicores of CPU and MiB of memory (a
    #: worker's request over its GPUs, rounded up; 0: nothing counted)
    cpu_milli: int = 0
    memory_mib: int = 0
    #: replicas that must share a node (a worker's GPUs, ``gpusPerWorker``): a node
    #: holds a multiple of it of the job's replicas
    replica_group: int = 1
    #: step times the job declared before running, per GPU type (``ProfileSample.gpu_type``):
    #: the one-GPU seed profile of the known model it names, as Sia bootstraps a new job's
    #: throughput on each type; () none
    seed_profile: tuple[ProfileSample, ...] = ()
    #: seconds its last new allocation stalled it, as the caller measured it: from the
    #: allocation to the first step it reported after it (None: not measured yet)
    restart_s: float | None = None
    #: the user's run-time estimate in seconds (``spec.estimatedRuntime``; 0: none) and
    #: the caller's estimate of the time it has left from it and its reported progress
    #: (:func:`rlsched.core.estimate.estimate_remaining`; 0: unknown): what SJF and SRTF
    #: sort on, never a true run time
    est_runtime: float = 0.0
    remaining: float = 0.0

    def runs_on(self, node: "AllocNode") -> bool:
        """Whether its replicas may run on ``node`` (its GPU model is allowed)."""
        return self.gpu_models is None or node.gpu_model in self.gpu_models

    def allowed_nodes(self, nodes: Sequence["AllocNode"]) -> frozenset[int] | None:
        """Indices of the ``nodes`` its replicas may run on; None when it may run on any."""
        return None if self.gpu_models is None else frozenset(n.index for n in nodes if self.runs_on(n))

    @property
    def shape(self) -> tuple:
        """What its room on a node depends on besides the node: GPU models, CPU and
        memory per replica, replicas per worker (jobs of one shape fit alike)."""
        return self.gpu_models, self.cpu_milli, self.memory_mib, self.replica_group

    @property
    def needs_offers(self) -> bool:
        """Whether its replicas ask for CPU or memory (placed where that is left)."""
        return self.cpu_milli > 0 or self.memory_mib > 0

    @property
    def node_by_node(self) -> bool:
        """Whether its replicas are placed node by node (not by the GPU count alone):
        they ask for CPU or memory, or come in groups of several GPUs."""
        return self.needs_offers or self.replica_group > 1

    def fits(self, node: "AllocNode", gpus: int, cpu: int | None, memory: int | None) -> int:
        """How many of its replicas a node of GPU model ``node.gpu_model`` can hold with
        ``gpus`` GPUs, ``cpu`` millicores and ``memory`` MiB left (None: not counted)."""
        if not self.runs_on(node):
            return 0
        n = max(gpus, 0)
        if self.cpu_milli > 0 and cpu is not None:
            n = min(n, max(cpu, 0) // self.cpu_milli)
        if self.memory_mib > 0 and memory is not None:
            n = min(n, max(memory, 0) // self.memory_mib)
        return n - n % max(self.replica_group, 1)

    def room_on(self, node: "AllocNode") -> int:
        """Its replicas ``node`` could hold were the node its alone (GPUs, GPU model, CPU
        and memory)."""
        return self.fits(node, node.gpus, node.cpu_milli, node.memory_mib)


@dataclass(frozen=True, slots=True)
class AllocNode:
    """A node: its index in the cluster, its GPUs and their model, and the CPU
    (millicores) and memory (MiB) it has for the jobs being allocated (None: not
    counted, as on the measured workloads). ``gpu_type``: the performance class of its
    GPUs, the key throughput is measured and reported under (:attr:`ProfileSample.gpu_type`;
    ``""``: one type in the cluster); a job runs on one type at a time."""

    index: int
    gpus: int
    name: str = ""
    gpu_model: str = ""
    cpu_milli: int | None = None
    memory_mib: int | None = None
    gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class Allocation:
    """One job's allocation: the node of each replica (``()``: no GPUs), and
    optionally its per-GPU batch and accumulation steps (``None``: the engine derives
    them from the job's target batch size, :func:`fixed_batch`)."""

    nodes: tuple[int, ...] = ()
    atomic_bsz: int | None = None
    accum_steps: int | None = None

    @property
    def replicas(self) -> int:
        return len(self.nodes)

    @property
    def batch_size(self) -> int | None:
        if self.atomic_bsz is None:
            return None
        return self.replicas * self.atomic_bsz * ((self.accum_steps or 0) + 1)


@runtime_checkable
class Allocator(Protocol):
    """Decides every job's GPUs each scheduling interval.

    ``name``: how results and tables name it. ``clairvoyant``: it reads
    :attr:`AllocJob.oracle` (a labelled reference run, never a baseline).
    ``type_aware``: on nodes of several GPU types (:attr:`AllocNode.gpu_type`) it
    chooses each job's type and keeps the job on one type at a time; for one that is
    not, the engine pins each job to one type (the simulator's ``one_type_per_job``) and
    the live adapter moves no job between types. ``allocate`` returns an
    :class:`Allocation` per job id; a job left out gets no GPUs. It may keep state
    between calls (it is called once per interval, in time order, by one engine)."""

    name: str
    clairvoyant: bool
    type_aware: bool

    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float) -> Mapping[str, Allocation]: ...


@runtime_checkable
class WakingAllocator(Allocator, Protocol):
    """An allocator whose answer can change with time alone (a preemptive ordering's
    queues follow attained service): after a decision it says when to ask again."""

    def next_decision(self, jobs: Sequence[AllocJob], allocations: Mapping[str, Allocation],
                      now: float) -> float | None:
        """When its answer may change though no job came or went, given the
        ``allocations`` it just made (after ``now``; None: never by itself)."""
        ...


def checked_call(name: str, last: float | None, now: float, jobs: Sequence[AllocJob]) -> float:
    """The checks a stateful allocator makes on every call: calls in time order (a
    :class:`ValueError`: one instance serves one run) and unique job ids (an
    :class:`AllocationError`). Returns ``now``, the allocator's new last call."""
    if last is not None and now < last:
        raise ValueError(f"{name}: called at {now} after {last}; one instance serves one run in time order")
    ids = [j.id for j in jobs]
    if len(set(ids)) != len(ids):
        raise AllocationError(f"{name}: duplicate job ids")
    return now


def fixed_batch(batch_size: int, replicas: int, bounds: BatchBounds) -> tuple[int, int]:
    """``(atomic_bsz, accum_steps)`` that train ``batch_size`` on ``replicas`` GPUs:
    the per-GPU share, split into accumulation steps when it exceeds the largest local
    batch that fits a GPU, and at least one accumulation step on a single GPU above
    the initial batch size (as the measured runs did, Pollux artifact). The per-GPU
    batch never drops below the application's smallest, and is cut (never below 1) so
    the total stays within the application's largest batch size."""
    if replicas < 1 or batch_size < 1:
        raise AllocationError(f"need replicas >= 1 and batch_size >= 1, got {replicas}, {batch_size}")
    local = -(-batch_size // replicas)
    accum = -(-local // bounds.largest_local) - 1
    if replicas == 1 and batch_size > bounds.init_batch:
        accum = max(accum, 1)
    atomic = max(-(-local // (accum + 1)), bounds.min_local_batch)
    return min(atomic, max(bounds.largest // (replicas * (accum + 1)), 1)), accum


def packed(replicas: int, free: Mapping[int, int]) -> tuple[int, ...] | None:
    """Node of each of ``replicas`` GPUs on as few nodes as possible: the nodes with
    the most free GPUs first (ties by index). None when they do not fit. ``free`` is
    not changed (:class:`FreeNodes` books a sequence of packings)."""
    return FreeNodes(free).take(replicas)


class FreeNodes:
    """Free GPUs per node (a copy of ``free``), bucketed by count, for many packings in
    a row: :meth:`take` puts ``count`` GPUs on as few nodes as possible — the nodes with
    the most free GPUs first, ties by index — and books them, without sorting every
    node for every job (a thousand jobs on a thousand nodes)."""

    def __init__(self, free: Mapping[int, int]) -> None:
        self.free = dict(free)
        self.total = sum(self.free.values())
        self.buckets: dict[int, list[int]] = {}
        for i, n in sorted(self.free.items()):
            if n > 0:
                self.buckets.setdefault(n, []).append(i)  # built in index order: already heaps

    def take(self, count: int) -> tuple[int, ...] | None:
        """``count`` GPUs on as few nodes as possible (None: not that many free)."""
        if count <= 0:
            return ()
        if self.total < count:
            return None
        out: list[int] = []
        for n in sorted(self.buckets, reverse=True):
            heap = self.buckets[n]
            while heap and len(out) < count:
                i = heapq.heappop(heap)
                if self.free[i] != n:  # stale: the node moved to another bucket
                    continue
                out.extend([i] * min(n, count - len(out)))
            if len(out) == count:
                break
        for i, k in Counter(out).items():
            self.free[i] -= k
            if self.free[i] > 0:
                heapq.heappush(self.buckets.setdefault(self.free[i], []), i)
        self.total -= count
        return tuple(out)

    def take_upto(self, count: int, caps: Mapping[int, int]) -> tuple[int, ...]:
        """Up to ``count`` GPUs, at most ``caps[i]`` on node ``i`` and only on the nodes
        ``caps`` names (what a job's CPU and memory leave room for), the nodes that can
        take the most first (ties by index); fewer when that is all they hold."""
        room = {i: min(self.free.get(i, 0), c) for i, c in caps.items()}
        order = sorted((i for i, c in room.items() if c > 0), key=lambda i: (-room[i], i))
        out: list[int] = []
        for i in order:
            if len(out) == count:
                break
            k = min(room[i], count - len(out))
            out.extend([i] * k)
            self.free[i] -= k
            if self.free[i] > 0:  # the old bucket's entry goes stale (take skips it)
                heapq.heappush(self.buckets.setdefault(self.free[i], []), i)
        self.total -= len(out)
        return tuple(out)


def check_allocations(
    jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], result: Mapping[str, Allocation]
) -> None:
    """Raise :class:`AllocationError` unless ``result`` is a valid allocation of
    ``jobs`` on ``nodes``: known jobs and nodes, no node over its GPUs (nor its CPU or
    memory, where they are counted), no replica on a
    GPU model its job does not allow, each job's replicas within ``[min_replicas,
    max_replicas]`` (or none), a positive per-GPU batch within the application's limits
    and a total batch within its maximum."""
    by_id = {j.id: j for j in jobs}
    gpus = {n.index: n.gpus for n in nodes}
    node_of = {n.index: n for n in nodes}
    used: Counter[int] = Counter()
    for jid, a in result.items():
        j = by_id.get(jid)
        if j is None:
            raise AllocationError(f"allocation for unknown job {jid!r}")
        if not isinstance(a, Allocation):
            raise AllocationError(f"job {jid}: expected an Allocation, got {type(a).__name__}")
        if not a.nodes:
            continue
        if not j.min_replicas <= a.replicas <= j.max_replicas and a.replicas > 0:
            raise AllocationError(f"job {jid}: {a.replicas} replicas outside [{j.min_replicas}, {j.max_replicas}]")
        for i in a.nodes:
            if i not in gpus:
                raise AllocationError(f"job {jid}: unknown node {i!r}")
            if not j.runs_on(node_of[i]):
                raise AllocationError(f"job {jid}: node {i} has GPU model {node_of[i].gpu_model!r}, the job allows "
                                      f"{', '.join(sorted(j.gpu_models or ()))}")
        used.update(a.nodes)
        if j.replica_group > 1:
            odd = {i: k for i, k in Counter(a.nodes).items() if k % j.replica_group}
            if odd:
                raise AllocationError(f"job {jid}: replicas per node {odd} are not whole workers of "
                                      f"{j.replica_group} GPUs")
        if a.atomic_bsz is not None:
            b = j.bounds
            if a.atomic_bsz < 1 or (a.accum_steps or 0) < 0:
                raise AllocationError(f"job {jid}: per-GPU batch {a.atomic_bsz} / accumulation {a.accum_steps} invalid")
            if a.atomic_bsz > b.largest_local:
                raise AllocationError(f"job {jid}: per-GPU batch {a.atomic_bsz} above the application's {b.largest_local}")
            if a.batch_size > b.largest:
                raise AllocationError(f"job {jid}: batch size {a.batch_size} above the application's {b.largest}")
    for i, n in used.items():
        if n > gpus[i]:
            raise AllocationError(f"node {i}: {n} GPUs allocated, it has {gpus[i]}")
    for res, attr in (("CPU (millicores)", "cpu_milli"), ("memory (MiB)", "memory_mib")):
        asked: Counter[int] = Counter()
        for jid, a in result.items():
            for i in a.nodes:
                asked[i] += getattr(by_id[jid], attr)
        for i, n in asked.items():
            have = getattr(node_of[i], attr)
            if have is not None and n > have:
                raise AllocationError(f"node {i}: {n} {res} allocated, it has {have}")

