"""rlsched's goodput allocator: GPUs and batch sizes follow what each GPU is worth to a job.

Each interval it decides every job's GPUs, nodes and batch at once from what a live
scheduler knows: fairness by attained service decides who runs (Tiresias' 2D-LAS, Gu et
al., NSDI'19), goodput per GPU who grows (Pollux, Qiao et al., OSDI'21), and Pollux's
re-allocation factor charges every change its restart. Never reads ``AllocJob.oracle``.
On nodes of several GPU types it also chooses each job's type: Sia's binary program
over configurations (type, GPUs), scored by the job's goodput model on each type
(Jayaram Subramanya et al., SOSP'23; core/type_program.py).
The steps and how the defaults were chosen: docs/design-notes.md.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from typing import Mapping, Protocol, Sequence

import numpy as np

from .allocation import AllocJob, Allocation, AllocNode, checked_call
from .demotion import ServiceThreshold
from .goodput import GoodputModel, ThroughputPrior, optimize_many
from .job_goodput import JobGoodput, split_batch
from .ordering import POLLUX_THRESHOLD
from .packing import keep_or_pack
from .queues import NO_QUEUE, QueueBook
from .type_goodput import TypeGoodput
from .type_program import Config, ProgramError, configurations, cost, solve

__all__ = ["GoodputAllocator", "GrowthWeight", "gpu_types"]


class GrowthWeight(Protocol):
    """How much a job's utility counts in who grows (a learned one:
    :class:`rlsched.core.growth_weight.LearnedGrowthWeight`,
    :class:`rlsched.core.rlpto_weight.RLPTOGrowthWeight`). ``prepare`` sees every job
    and node of a decision before any ``weight`` of it (features across jobs)."""

    def prepare(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode]) -> None: ...

    def weight(self, job: AllocJob) -> float: ...


class GoodputAllocator:
    """rlsched's goodput allocator (module docstring)."""

    name = "goodput"
    clairvoyant = False
    #: on nodes of several GPU types it chooses each job's type itself (:meth:`typed_counts`)
    type_aware = True

    def __init__(self, *, p: float = 0.5, restart_delay: float = 60.0, threshold: float = POLLUX_THRESHOLD,
                 prior: ThroughputPrior | None = None, refit_tolerance: float | None = None,
                 explore: float = 0.0, service_exponent: float = 1.0,
                 service_scale: float | None = None, growth: "GrowthWeight | None" = None,
                 idle_horizon: float = 0.0, adaptive: float = 0.0, adaptive_jobs: float = 20,
                 type_price: float = 1.0, measured_restart: bool = True, displace: str = "any",
                 take_charge: float = 1.0, typed_growth: bool = True, typed: str = "program",
                 room_rounds: int = 3) -> None:
        if not math.isfinite(p):
            raise ValueError(f"p must be finite, got {p}")
        if not (math.isfinite(restart_delay) and restart_delay >= 0):
            raise ValueError(f"restart_delay must be >= 0, got {restart_delay}")
        if not (math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"threshold must be > 0 GPU-seconds, got {threshold}")
        self.p, self.restart_delay, self.threshold = float(p), float(restart_delay), float(threshold)
        if not (math.isfinite(explore) and explore >= 0):
            raise ValueError(f"explore must be >= 0 (0: off), got {explore}")
        self.explore = float(explore)
        if not (math.isfinite(service_exponent) and service_exponent >= 0):
            raise ValueError(f"service_exponent must be >= 0 (0: off), got {service_exponent}")
        self.service_exponent = float(service_exponent)
        scale = self.threshold if service_scale is None else float(service_scale)
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"service_scale must be > 0 GPU-seconds, got {service_scale}")
        self.service_scale = scale
        if not (math.isfinite(idle_horizon) and idle_horizon >= 0):
            raise ValueError(f"idle_horizon must be >= 0 seconds (0: off), got {idle_horizon}")
        self.idle_horizon = float(idle_horizon)
        if not (math.isfinite(adaptive) and 0 <= adaptive <= 1):
            raise ValueError(f"adaptive must be a quantile in (0, 1] (0: off), got {adaptive}")
        #: with ``adaptive = q > 0``, the demotion threshold is the ``q``-quantile of the
        #: service of the jobs that left, ``threshold`` until ``adaptive_jobs`` have
        #: (:mod:`rlsched.core.demotion`); None: ``threshold`` always
        self.demotion = (ServiceThreshold(adaptive, self.threshold, min_jobs=int(adaptive_jobs))
                         if adaptive else None)
        if not (math.isfinite(type_price) and type_price >= 0):
            raise ValueError(f"type_price must be >= 0 (0: off), got {type_price}")
        #: on several GPU types: a GPU of a type costs ``price^type_price`` GPUs in who
        #: grows, its price the mean speed of the jobs there over their slowest type
        self.type_price = float(type_price)
        #: on several GPU types: the restart factor charges a job the stall it measured
        #: (``AllocJob.restart_s``) in place of ``restart_delay`` once it has one (on by
        #: default, chosen on validation seeds only: docs/results/sia_gap.md)
        self.measured_restart = bool(measured_restart)
        if displace not in ("any", "waiting"):
            raise ValueError(f"displace must be 'any' or 'waiting', got {displace!r}")
        if not (math.isfinite(take_charge) and take_charge >= 0):
            raise ValueError(f"take_charge must be >= 0 (0: off), got {take_charge}")
        #: on several GPU types, who may take the GPUs a running job holds (``"any"``, or
        #: ``"waiting"``: only a job that holds none, for its gang), and what a move that
        #: takes them pays: ``take_charge`` × the job's weight × its GPUs × its restart
        #: stall (:meth:`typed_counts`); 1 by default, the whole of the restart it causes,
        #: chosen on validation seeds only (docs/results/sia_gap.md)
        self.displace, self.take_charge = displace, float(take_charge)
        #: a learned weight in place of the service weight (:mod:`rlsched.core.growth_weight`)
        self.growth = growth
        #: on several GPU types: the learned weight too (``False``: the service weight
        #: there; the learned weights were trained on clusters of one type)
        self.typed_growth = bool(typed_growth)
        if typed not in ("program", "heap"):
            raise ValueError(f"typed must be 'program' or 'heap', got {typed!r}")
        #: on several GPU types, how type and count are chosen: ``"program"``, Sia's binary
        #: program over configurations (:meth:`program_counts`, chosen on validation seeds
        #: only: docs/results/sia_program.md); ``"heap"``, the growth heap (:meth:`typed_counts`)
        self.typed = typed
        if not (room_rounds >= 1 and float(room_rounds).is_integer()):
            raise ValueError(f"room_rounds must be a whole number >= 1, got {room_rounds}")
        #: decisions at most, when jobs limited to some GPU models, or by CPU and memory,
        #: or in whole workers of several GPUs, do not fit their nodes: each round gives
        #: the GPUs such a job could not be placed on to the others
        self.room_rounds = int(room_rounds)
        #: job id -> when its allocation last changed (the program keeps it while it restarts)
        self._changed: dict[str, float] = {}
        self.jobs = JobGoodput(prior, refit_tolerance=refit_tolerance)
        #: each job's model per GPU type, over ``jobs`` (its fits and caches)
        self.types = TypeGoodput(self.jobs)
        #: the last typed decision's: the type each job held, and its models per type
        self._home: dict[str, str | None] = {}
        self._typed_models: dict[str, dict[str, GoodputModel]] = {}
        self._now: float | None = None
        #: the nodes of the last decision and the room they give per job shape (within_room)
        self._rooms: tuple[tuple[AllocNode, ...], dict] = ((), {})

    def __repr__(self) -> str:
        return (f"GoodputAllocator(p={self.p}, restart_delay={self.restart_delay}, threshold={self.threshold}, "
                f"service_exponent={self.service_exponent}, service_scale={self.service_scale}, "
                f"growth={self.growth!r}, idle_horizon={self.idle_horizon}, type_price={self.type_price}, "
                f"measured_restart={self.measured_restart}, displace={self.displace!r}, take_charge={self.take_charge}, "
                f"typed_growth={self.typed_growth}, typed={self.typed!r}"
                + (f", adaptive={self.demotion.q}, adaptive_jobs={self.demotion.min_jobs})" if self.demotion else ")"))

    # ------------------------------------------------------------------ the pieces
    def order(self, jobs: Sequence[AllocJob]) -> list[AllocJob]:
        """Who runs first: higher service classes first (``AllocJob.priority``), then two
        queues by attained service (split at :attr:`queue_threshold`), FCFS within each."""
        th = self.queue_threshold
        return sorted(jobs, key=lambda j: (-j.priority, j.attained_service >= th, j.submit_time, j.id))

    @property
    def queue_threshold(self) -> float:
        """GPU-seconds after which a job is demoted to the second queue: ``threshold``,
        or the adaptive one as of the last decision (``adaptive``)."""
        return self.threshold if self.demotion is None else self.demotion.value

    def utility(self, speedup: np.ndarray) -> np.ndarray:
        """``u(s) = (s^p − 1)/p`` (``log s`` at ``p = 0``); ``−inf`` at ``s = 0``."""
        s = np.asarray(speedup, dtype=float)
        if self.p == 0:
            with np.errstate(divide="ignore"):
                return np.log(s)
        return np.where(s > 0, (np.power(np.where(s > 0, s, 1.0), self.p) - 1.0) / self.p, -np.inf)

    def stall(self, job: AllocJob, measured: bool = False) -> float:
        """The seconds a restart costs ``job``: with ``measured``, the stall it measured
        after its last new allocation (``AllocJob.restart_s``) once it has one, else
        ``restart_delay``."""
        if measured and job.restart_s is not None and self.restart_delay > 0:
            return max(float(job.restart_s), 0.0)
        return self.restart_delay

    def factor(self, job: AllocJob, idle: bool = False, measured: bool = False) -> float:
        """Pollux's re-allocation factor ``max(T − R·δ, 0)/(T + δ)`` (1 without a delay),
        ``δ`` = :meth:`stall`. ``idle``: the GPUs a change would add are otherwise idle
        (nobody waits): the horizon ``T`` is at least ``idle_horizon`` (see :meth:`counts`)."""
        d = self.stall(job, measured)
        if d <= 0:
            return 1.0
        age = max(job.age, self.idle_horizon if idle else 0.0, 0.0)
        return max(age - job.num_restarts * d, 0.0) / (age + d)

    def values(self, job: AllocJob, width: int, node_gpus: int, idle: bool = False) -> np.ndarray:
        """``u`` of the job's speedup on ``K = 0 .. width − 1`` GPUs (packed: one node
        while they fit one), the restart factor (``idle``: :meth:`factor`'s) applied at
        every count but the current one of a running job; ``−inf`` where it cannot
        train."""
        g, _ = self.jobs.packed(job, width, node_gpus)
        K = np.arange(width)
        base = next((x for x in g[1:] if x > 0), 0.0)
        speed = g / base if base > 0 else np.zeros(width)
        held = len(job.allocation)
        if held:
            f = self.factor(job, idle)
            speed = np.where(K == held, speed, speed * f)
        if job.replica_group > 1:  # whole workers only
            speed = np.where(K % job.replica_group == 0, speed, 0.0)
        return self.weight(job) * self.utility(speed)

    def typed_weight(self, job: AllocJob) -> float:
        """:meth:`weight` on several GPU types: the service weight unless ``typed_growth``."""
        if self.growth is not None and not self.typed_growth:
            return self.service_weight(job)
        return self.weight(job)

    def weight(self, job: AllocJob) -> float:
        """How much a job's utility counts in who grows: ``(1 + A/θ)^−a`` of its attained
        service ``A`` (GPU-seconds; ``θ`` = ``service_scale``, the queue threshold unless
        given; ``a`` = ``service_exponent``), so that of two jobs gaining alike the one
        that has had less service grows first — least attained service (Tiresias' idea,
        Gu et al. NSDI'19) carried into growth, as a continuous weight so that crossing
        the threshold moves no GPUs by itself; 1 for every job at ``a = 0``. ``a = 1`` by
        default (half the weight at 16 GPU-hours), chosen on validation seeds only
        (docs/design-notes.md). With ``growth`` (a learned weight, :mod:`rlsched.core.growth_weight`), its weight
        instead."""
        if self.growth is not None:
            return self.growth.weight(job)
        return self.service_weight(job)

    def service_weight(self, job: AllocJob) -> float:
        """``(1 + A/θ)^−a`` (:meth:`weight`); 1 at ``a = 0``."""
        if not self.service_exponent:
            return 1.0
        return (1.0 + max(job.attained_service, 0.0) / self.service_scale) ** -self.service_exponent

    def explored(self, jobs: Sequence[AllocJob]) -> list[AllocJob]:
        """With ``explore = x > 0``, a job may grow to at most ``x`` times the most GPUs
        it has reported a step time on (never below what it holds or its gang): its
        model is trusted one step past what it measured (Pollux's exploration, §4.1,
        doubles with ``x = 2``). Off (``x = 0``, the default): ``jobs`` unchanged; measured
        on validation seeds only and not taken (docs/design-notes.md)."""
        if not self.explore:
            return list(jobs)
        out = []
        for j in jobs:
            seen = max((s.num_replicas for s in j.profile), default=0)
            cap = max(int(self.explore * seen), len(j.allocation), j.min_replicas, 1)
            out.append(dataclasses.replace(j, max_replicas=cap) if cap < j.max_replicas else j)
        return out

    # ------------------------------------------------------------------ decision
    def _who_runs(self, jobs: Sequence[AllocJob], total: int, queues: QueueBook | None,
                  keep: frozenset[str] | set[str] = frozenset()):
        """Who runs: protected jobs (and those in ``keep``) keep what they hold, then the
        smallest gangs in the fairness order, under the teams' quotas when there are
        queues (core/queues.py). ``(order, book, service per queue, GPUs per job, GPUs
        per queue)``."""
        order = self.order(jobs)
        book = queues or QueueBook()
        service: dict[str, float] = {}
        if book.fair_share == "service":
            for j in jobs:
                service[j.queue or NO_QUEUE] = service.get(j.queue or NO_QUEUE, 0.0) + j.attained_service
        count, used = book.who_runs(
            order, total=total, queue=lambda j: j.queue, key=lambda j: j.id,
            gang=lambda j: max(j.min_replicas, 1) if max(j.min_replicas, 1) <= j.max_replicas else 0,
            kept={j.id: len(j.allocation) for j in jobs if (j.protected or j.id in keep) and j.allocation},
            service=service)
        return order, book, service, count, used

    def counts(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode],
               queues: QueueBook | None = None) -> dict[str, int]:
        """Each job's GPU count (steps 2–4 of the module docstring); 0: it waits."""
        total = sum(n.gpus for n in nodes)
        node_gpus = max((n.gpus for n in nodes), default=0)
        width = min(max((j.max_replicas for j in jobs), default=0), total) + 1
        order, book, service, count, used = self._who_runs(jobs, total, queues)
        free = total - sum(count.values())
        running = [r for r, j in enumerate(order) if count.get(j.id, 0) > 0]
        if free == 0 or not running:
            return count
        # every job runs and GPUs are left: a change weighs its gain against GPUs that
        # would stay idle, over a horizon of at least idle_horizon (0: off)
        idle = bool(self.idle_horizon) and all(count.get(j.id, 0) > 0 or max(j.min_replicas, 1) > j.max_replicas
                                               for j in jobs)
        models = ModelRoom(jobs, nodes, count)
        self.jobs.prepare_packed([order[r] for r in running], width, node_gpus)  # one search for all
        vals = [None] * len(order)
        # who grows: one heap of best moves per queue (one queue without queues); the
        # queue served next is the book's (below its guarantee first, then the fewest
        # GPUs per unit of weight), its best move by goodput
        heaps: dict[str, list[tuple[float, int, int, int]]] = {}

        def best_move(r: int) -> tuple[float, int] | None:
            j = order[r]
            k = count[j.id]
            hi = int(min(j.max_replicas, k + free, width - 1, k + book.room(used, j.queue), k + models.room(j)))
            if hi <= k:
                return None
            v = vals[r]
            ahead = v[k + 1:hi + 1]
            with np.errstate(invalid="ignore"):  # -inf - -inf where it cannot train: replaced below
                gain = (ahead - v[k]) / np.arange(1, hi - k + 1)
            if not np.isfinite(v[k]):  # cannot train at k: any count it can train at
                gain = np.where(np.isfinite(ahead), np.inf, -np.inf)
            i = int(np.argmax(gain))
            return (float(gain[i]), k + 1 + i) if gain[i] > 0 else None

        def push(r: int) -> None:  # the job's best move from its count now, if any
            mv = best_move(r)
            if mv is not None:
                heapq.heappush(heaps.setdefault(order[r].queue or NO_QUEUE, []),
                               (-mv[0], r, count[order[r].id], mv[1]))

        def next_queue() -> str | None:
            best = None
            for q, h in heaps.items():
                while h and count[order[h[0][1]].id] != h[0][2]:  # stale: a fresher move is on it
                    heapq.heappop(h)
                if h and book.room(used, q) > 0 and (best is None or book.grow_key(used, q, service) < best[0]):
                    best = (book.grow_key(used, q, service), q)
            return None if best is None else best[1]

        for r in running:
            vals[r] = self.values(order[r], width, node_gpus, idle)
            push(r)
        while free > 0 and (q := next_queue()) is not None:
            _, r, k_then, k_new = heapq.heappop(heaps[q])
            jid = order[r].id
            if k_new - k_then <= min(free, book.room(used, q), models.room(order[r])):
                free -= k_new - k_then
                used[q] = used.get(q, 0) + k_new - k_then
                models.charge(order[r], k_new - k_then)
                count[jid] = k_new
            push(r)  # its next move, or its best move within the GPUs left
        return count

    def allocate(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], now: float,
                 queues: QueueBook | None = None) -> Mapping[str, Allocation]:
        self._now = checked_call(self.name, self._now, now, jobs)
        if self.demotion is not None:
            self.demotion.update(jobs, now)
        types = gpu_types(nodes)
        if len(types) > 1:
            return self._allocate_typed(jobs, nodes, queues, types)
        self.jobs.prepare(jobs)  # every job's throughput fit, in one batch
        if self.growth is not None:
            self.growth.prepare(jobs, nodes)
        views = within_room(self.explored(jobs), nodes, self._rooms_on(nodes))
        for _ in range(self.room_rounds):
            count = self.counts(views, nodes, queues)
            by_id = {v.id: v for v in views}
            demand = [(by_id[jid], k) for jid, k in count.items() if k > 0]  # in the order of who runs
            where = keep_or_pack(demand, nodes, partial=True)
            short = {v.id: len(where[v.id]) for v, k in demand if len(where[v.id]) < k}
            if not short:
                break
            # a job limited to some GPU models, or by CPU and memory, whose nodes could not
            # hold its count: at most what they held, and the GPUs decided again
            views = [dataclasses.replace(v, max_replicas=short[v.id]) if v.id in short else v for v in views]
        out: dict[str, Allocation] = {j.id: Allocation() for j in jobs}
        placed = [(v, where[v.id]) for v, _ in demand if len(where[v.id]) >= max(v.min_replicas, 1)]
        # each job's batch on its placement, one search for all (the model tells one
        # node from several, no more)
        choices = optimize_many([self.jobs.model(v) for v, _ in placed], [[len(p)] for _, p in placed],
                                [[1 if len(set(p)) == 1 else 2] for _, p in placed])
        for (v, p), choice in zip(placed, choices):
            batch, accum = int(choice.batch[0]), int(choice.accumulation[0])
            out[v.id] = Allocation(p, *split_batch(v, len(p), batch, accum))
        return out

    # ------------------------------------------------------------------ several GPU types
    def typed_values(self, jobs: Sequence[AllocJob], cols: Sequence[Mapping[str, np.ndarray]],
                     idle: bool = False) -> list[dict[str, np.ndarray]]:
        """``u`` of each job's speedup on ``K`` GPUs of each type of its ``cols`` (its
        packed goodput columns there), the speedup over its goodput on one GPU of its
        slowest type; the restart factor applied at every ``(type, K)`` but the one it
        holds (a move between types is a restart, as a resize is); ``−inf`` where it
        cannot train. One array per type, a row per job offered it (rows padded with
        ``−inf`` beyond the job's column)."""
        n = len(jobs)
        held = np.array([len(j.allocation) for j in jobs], dtype=np.int64)
        f = np.array([self.factor(j, idle, self.measured_restart) if j.allocation else 1.0 for j in jobs])
        w = np.array([self.typed_weight(j) for j in jobs])
        group = np.array([max(j.replica_group, 1) for j in jobs], dtype=np.int64)
        base = np.full(n, np.inf)  # per job: the least of its first positive goodput per type
        tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for t in dict.fromkeys(t for c in cols for t in c):
            rows = np.array([r for r in range(n) if t in cols[r]], dtype=np.int64)
            good = np.zeros((rows.size, max(len(cols[r][t]) for r in rows)))
            for i, r in enumerate(rows):
                good[i, :len(cols[r][t])] = cols[r][t]
            pos = good[:, 1:] > 0
            first = np.where(pos.any(axis=1), good[np.arange(rows.size), 1 + pos.argmax(axis=1)], 0.0) \
                if pos.shape[1] else np.zeros(rows.size)
            base[rows] = np.minimum(base[rows], np.where(first > 0, first, np.inf))
            tables[t] = (rows, good)
        base = np.where(np.isfinite(base), base, 0.0)
        util: dict[str, np.ndarray] = {}
        for t, (rows, good) in tables.items():
            b = base[rows][:, None]
            speed = np.where(b > 0, good / np.where(b > 0, b, 1.0), 0.0)
            K = np.arange(good.shape[1])
            h = held[rows][:, None]
            home = np.array([self._home.get(jobs[r].id) == t for r in rows])[:, None]
            speed = np.where((h == 0) | ((K == h) & home), speed, speed * f[rows][:, None])
            g = group[rows][:, None]
            speed = np.where((g == 1) | (K % g == 0), speed, 0.0)
            util[t] = w[rows][:, None] * self.utility(speed)
        at = {t: {r: i for i, r in enumerate(rows.tolist())} for t, (rows, _) in tables.items()}
        return [{t: util[t][at[t][r]] for t in c} for r, c in enumerate(cols)]

    def prices(self, cols: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
        """What a GPU of each type costs in who grows: with ``type_price = a > 0``,
        ``m_t^a``, ``m_t`` the mean over the jobs offered type ``t`` of their one-GPU
        goodput there over that on their slowest type, so that a fast type goes first to
        the jobs it speeds up more than the others (comparative advantage); 1 for every
        type at ``a = 0``."""
        sums: dict[str, list[float]] = {}
        for c in cols:
            one = {t: float(g[1]) for t, g in c.items() if len(g) > 1 and g[1] > 0}
            low = min(one.values(), default=0.0)
            for t, x in one.items():
                sums.setdefault(t, []).append(x / low)
        out = {t: 1.0 for c in cols for t in c}
        if self.type_price:
            out.update({t: float(np.mean(x)) ** self.type_price for t, x in sums.items()})
        return out

    def _typed_columns(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], queues: QueueBook | None,
                       keep: frozenset[str] | set[str] = frozenset()):
        """What both typed decisions start from: who runs (as on one type, ``keep`` as
        in :meth:`_who_runs`), and each running job's cap and packed goodput column per
        GPU type it may run on (its models there kept in ``_typed_models``). ``(running,
        GPUs per job, book, service per queue, GPUs per queue, GPUs per type, caps,
        columns)``; None: nobody runs."""
        type_of = {n.index: n.gpu_type for n in nodes}
        self._home = {j.id: type_of.get(j.allocation[0]) for j in jobs if j.allocation}
        cap: dict[str, int] = {}
        per_node: dict[str, int] = {}
        for n in nodes:
            cap[n.gpu_type] = cap.get(n.gpu_type, 0) + n.gpus
            per_node[n.gpu_type] = max(per_node.get(n.gpu_type, 0), n.gpus)
        types = list(cap)
        order, book, service, count, used = self._who_runs(jobs, sum(cap.values()), queues, keep)
        running = [j for j in order if count.get(j.id, 0) > 0]
        self._typed_models = {}
        if not running:
            return None
        # each job's cap per type it may run on: its replicas, and what the nodes of the
        # type could hold of it (GPU models, CPU, memory, whole workers)
        jcap: list[dict[str, int]] = []
        reqs, owners = [], []
        for r, j in enumerate(running):
            kinds = [self._home[j.id]] if j.protected and j.id in self._home else types
            if j.gpu_models is None and not j.node_by_node:
                room = {t: min(j.max_replicas, cap[t]) for t in kinds if cap[t] > 0}
            else:
                room = {}
                for n in nodes:
                    if n.gpu_type in kinds:
                        room[n.gpu_type] = room.get(n.gpu_type, 0) + j.room_on(n)
                room = {t: min(j.max_replicas, k) for t, k in room.items() if k > 0}
            models = self.types.models(j, room)
            if not models:  # data, but none about these types: the job's own fit on each
                gm = self.jobs.model(j)
                models = {t: gm for t in room}
            else:
                models = {t: m.goodput for t, m in models.items()}
            self._typed_models[j.id] = models
            jcap.append({t: room[t] for t in models})
            for t, gm in models.items():
                reqs.append((gm, room[t], room[t] + 1, per_node[t]))
                owners.append((r, t))
        cols: list[dict[str, np.ndarray]] = [{} for _ in running]
        for (r, t), g in zip(owners, self.jobs.packed_columns(reqs)):
            cols[r][t] = g
        return running, count, book, service, used, cap, jcap, cols

    def program_counts(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode],
                       queues: QueueBook | None = None) -> dict[str, tuple[str, int]]:
        """Each running job's GPU type and count on nodes of several types by Sia's
        binary program (:mod:`rlsched.core.type_program`), in the order of who runs.

        Who runs is decided as on one type, a job that restarts keeping what it holds
        (as a protected one does), and each job that runs gets a configuration where the
        types' GPUs can hold them all. Its goodput on each comes from its model on that
        type; it may take any count its model scores (Sia lets it at most double what it
        ran on); a change is damped by :meth:`factor` (Pollux's, with the stall the job
        measured); a team's jobs together stay within the team's cap."""
        kept = {j.id for j in jobs if j.allocation and (
            j.protected or self._now - self._changed.get(j.id, -math.inf) < self.stall(j, self.measured_restart))}
        w = self._typed_columns(jobs, nodes, queues, kept)
        if w is None:
            return {}
        running, _, book, _, _, cap, jcap, cols = w
        configs = configurations(nodes)
        index = {c: i for i, c in enumerate(configs)}
        of_type = {t: (np.array([i for i, c in enumerate(configs) if c.gpu_type == t]),
                       np.array([c.gpus for c in configs if c.gpu_type == t])) for t in cap}
        rows, at, vals, forced = [], [], [], []
        for r, j in enumerate(running):
            home, held = self._home.get(j.id), len(j.allocation)
            lo, group = max(j.min_replicas, 1), max(j.replica_group, 1)
            cur = None
            if home in cols[r] and lo <= held <= jcap[r][home]:
                holds = Config(home, len(set(j.allocation)), held)
                cur = index.setdefault(holds, len(configs))
                if cur == len(configs):
                    configs.append(holds)
            ids, good = [], []
            for t, g in cols[r].items():
                idx, k = of_type[t]
                ok = (k >= lo) & (k <= jcap[r][t]) & (k % group == 0)
                ok[ok] = g[k[ok]] > 0
                ids.append(idx[ok])
                good.append(g[k[ok]])
            ids, good = np.concatenate(ids) if ids else np.zeros(0, int), np.concatenate(good) if good else np.zeros(0)
            if cur is not None and cur not in ids:  # what it holds has no estimate now: still possible
                ids, good = np.append(ids, cur), np.append(good, good.min() if good.size else 1.0)
            if not ids.size:
                continue
            damp = np.where(ids == cur, 1.0, self.factor(j, measured=self.measured_restart))
            rows.extend([r] * ids.size)
            at.extend(ids.tolist())
            vals.extend(cost(good / good.min() * damp).tolist())
            if cur is not None and j.id in kept:
                forced.append((r, cur))
        groups = []
        if queues is not None:
            for q in dict.fromkeys(j.queue or NO_QUEUE for j in running):
                most = book.spec_of(q).cap
                if most < sum(cap.values()):
                    groups.append(([r for r, j in enumerate(running) if (j.queue or NO_QUEUE) == q], most))
        chosen: dict[int, int] = {}
        # every job that runs gets a configuration, what is kept kept; where the types'
        # GPUs cannot hold them all, the program chooses who runs too, then keeps nothing
        for keep, must in ((forced, sorted(set(rows))), (forced, []), ([], [])):
            try:
                chosen, _ = solve(len(running), configs, cap, rows, at, vals, keep, groups, must=must, presolve=False)
                break
            except ProgramError:
                continue
        return {running[r].id: (configs[chosen[r]].gpu_type, configs[chosen[r]].gpus)
                for r in range(len(running)) if r in chosen}

    def typed_counts(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode],
                     queues: QueueBook | None = None) -> dict[str, tuple[str, int]]:
        """Each running job's GPU type and count on nodes of several types, in the order
        of who runs (docs/design-notes.md, "The allocator on several GPU types").

        Who runs is decided as on one type (fairness order, gangs, quotas). Then one
        heap of moves, by utility gained per GPU: a job not yet placed may take ``K`` at
        least its gang on any type it is offered on (its gain: over its utility at its
        gang on its worst type, per GPU it takes there); a placed job grows on its type
        (its gain per GPU added). GPUs beyond the gangs of the jobs not yet placed are
        never taken. A job left without a gainful move is placed last at its gang on the
        type where it is worth most that still has room (none: it waits)."""
        w = self._typed_columns(jobs, nodes, queues)
        if w is None:
            return {}
        running, count, book, service, used, cap, jcap, cols = w
        types = list(cap)
        idle = bool(self.idle_horizon) and all(count.get(j.id, 0) > 0 or max(j.min_replicas, 1) > j.max_replicas
                                               for j in jobs)
        vals = self.typed_values(running, cols, idle)
        price = self.prices(cols)
        gang = [count[j.id] for j in running]
        floor = []
        # a job whose gang fits one type only (its GPU models, its size, a protected job's
        # home) has that type's GPUs for its gang kept from the others' moves until it is
        # placed: else a job that could run elsewhere takes them and it waits
        sole: list[str | None] = []
        kept: dict[str, int] = {}
        for r in range(len(running)):
            at = {t: v[gang[r]] for t, v in vals[r].items() if gang[r] <= jcap[r][t] and np.isfinite(v[gang[r]])}
            floor.append(min(at.values()) if at else None)
            sole.append(next(iter(at)) if len(at) == 1 else None)
            if sole[r] is not None:
                kept[sole[r]] = kept.get(sole[r], 0) + gang[r]
        entry = self._entry_gains(vals, floor, gang, price)
        # per type, what ``j`` GPUs more cost (``j · price``, j = 1, 2, ...): a placed job's gain divides by it
        steps = {t: np.arange(1, max(len(v[t]) for v in vals if t in v)) * p for t, p in price.items() if t in entry}
        free = dict(cap)
        pending = sum(gang)
        state: list[tuple[str, int] | None] = [None] * len(running)
        heaps: dict[str, list[tuple[float, int, tuple | None, str, int]]] = {}
        claims = _Claims(self, running, gang, sole, state) if self.displace != "any" or self.take_charge else None

        def spare() -> int:
            return sum(free.values()) - pending

        def room_on(r: int, t: str) -> int:
            """The GPUs of ``t`` job ``r`` may take: the free ones but those kept for the
            gangs of the other jobs not yet placed that fit ``t`` only."""
            own = gang[r] if state[r] is None and sole[r] == t else 0
            return free[t] - (kept.get(t, 0) - own)

        def best_move(r: int) -> tuple[float, str, int] | None:
            j = running[r]
            room = book.room(used, j.queue)
            best = None
            if state[r] is None:
                lo = gang[r]
                ahead = lo + min(spare(), room)
                for t in vals[r]:
                    on = room_on(r, t)
                    hi = int(min(jcap[r][t], on, ahead))
                    if claims is not None:
                        hi = min(hi, claims.most(r, t, on, 0))
                    if hi < lo:
                        continue
                    paid = 0.0 if claims is None or floor[r] is None else \
                        claims.charge(r, t, on, np.arange(lo, hi + 1))
                    if isinstance(paid, np.ndarray) and paid.any():  # the entry's gains, less what it pays
                        K = np.arange(lo, hi + 1)
                        with np.errstate(invalid="ignore"):
                            gains_k = (vals[r][t][lo:hi + 1] - floor[r] - paid) / (K * price[t])
                        i = int(np.argmax(gains_k))
                        gain, at = float(gains_k[i]), lo + i
                    else:
                        row, gains, first = entry[t]
                        gain, at = float(gains[row[r], hi]), int(first[row[r], hi])
                    if gain > 0 and (best is None or gain > best[0]):
                        best = (gain, t, at)
                return best
            t, k = state[r]
            v = vals[r][t]
            on = room_on(r, t)
            hi = int(min(jcap[r][t], k + on, k + spare(), k + room))
            if claims is not None:
                hi = min(hi, claims.most(r, t, on, k))
            if hi <= k:
                return None
            ahead = v[k + 1:hi + 1]
            paid = 0.0 if claims is None else claims.charge(r, t, on, np.arange(1, hi - k + 1))
            with np.errstate(invalid="ignore"):  # -inf - -inf where it cannot train: replaced below
                gain = (ahead - v[k] - paid) / steps[t][:hi - k]
            if not np.isfinite(v[k]):
                gain = np.where(np.isfinite(ahead), np.inf, -np.inf)
            i = int(np.argmax(gain))
            return (float(gain[i]), t, k + 1 + i) if gain[i] > 0 else None

        def push(r: int) -> None:
            mv = best_move(r)
            if mv is not None:
                heapq.heappush(heaps.setdefault(running[r].queue or NO_QUEUE, []), (-mv[0], r, state[r], mv[1], mv[2]))
                if claims is not None:
                    claims.pushed[r] = claims.moves

        def next_queue() -> str | None:
            best = None
            for q, h in heaps.items():
                while h and state[h[0][1]] != h[0][2]:  # stale: a fresher move is on it
                    heapq.heappop(h)
                if h and book.room(used, q) > 0 and (best is None or book.grow_key(used, q, service) < best[0]):
                    best = (book.grow_key(used, q, service), q)
            return None if best is None else best[1]

        for r in range(len(running)):
            push(r)
        while (q := next_queue()) is not None:
            key, r, then, t, k_new = heapq.heappop(heaps[q])
            if claims is not None and claims.pushed.get(r) != claims.moves:
                # moves since it was pushed may have changed what it pays: weighed again
                mv = best_move(r)
                if mv is None:
                    continue
                if (-mv[0], mv[1], mv[2]) != (key, t, k_new):
                    heapq.heappush(heaps[q], (-mv[0], r, state[r], mv[1], mv[2]))
                    claims.pushed[r] = claims.moves
                    continue
            k_then = gang[r] if then is None else then[1]
            extra = k_new - k_then
            take = k_new if then is None else extra
            if take <= room_on(r, t) and extra <= min(spare(), book.room(used, q)):
                if claims is not None:
                    claims.take(r, t, room_on(r, t), take, (t, k_new))
                free[t] -= take
                if then is None:
                    pending -= gang[r]
                    if sole[r] is not None:
                        kept[sole[r]] -= gang[r]
                used[q] = used.get(q, 0) + extra
                state[r] = (t, k_new)
            push(r)
        for r in range(len(running)):  # placed last: at its gang, where it is worth most
            if state[r] is None:
                fit = [t for t in vals[r] if room_on(r, t) >= gang[r] and jcap[r][t] >= gang[r]]
                if fit:
                    t = max(fit, key=lambda t: (vals[r][t][gang[r]], -types.index(t)))
                    free[t] -= gang[r]
                    state[r] = (t, gang[r])
                pending -= gang[r]
                if sole[r] is not None:
                    kept[sole[r]] -= gang[r]
        return {running[r].id: state[r] for r in range(len(running)) if state[r] is not None}

    @staticmethod
    def _entry_gains(vals: Sequence[Mapping[str, np.ndarray]], floor: Sequence[float | None], gang: Sequence[int],
                     price: Mapping[str, float]) -> dict[str, tuple[dict[int, int], np.ndarray, np.ndarray]]:
        """What a job not yet placed gains per GPU by entering on a type with at most
        ``K`` GPUs, for every ``K``: ``entry[t] = (row, best, first)``, job ``r``'s
        ``best[row[r], K]`` the best of ``(u(K') − floor)/(K'·price)`` over ``gang <= K' <=
        K`` (``inf`` where it can train and has no floor; ``−inf``: none) and
        ``first[row[r], K]`` the first ``K'`` that reaches it."""
        entry: dict[str, tuple[dict[int, int], np.ndarray, np.ndarray]] = {}
        for t in dict.fromkeys(t for v in vals for t in v):
            rows = [r for r, v in enumerate(vals) if t in v]
            u = np.stack([vals[r][t] for r in rows])
            K = np.arange(u.shape[1])
            lo = np.array([gang[r] for r in rows])[:, None]
            low = np.array([np.nan if floor[r] is None else floor[r] for r in rows])[:, None]
            with np.errstate(divide="ignore", invalid="ignore"):  # K = 0 and -inf - -inf: masked below
                gain = np.where(np.isnan(low), np.where(np.isfinite(u), np.inf, -np.inf), (u - low) / (K * price[t]))
            gain = np.where(K < lo, -np.inf, gain)
            best = np.maximum.accumulate(gain, axis=1)
            before = np.concatenate([np.full((len(rows), 1), -np.inf), best[:, :-1]], axis=1)
            first = np.maximum.accumulate(np.where(gain > before, K, lo), axis=1)
            entry[t] = ({r: i for i, r in enumerate(rows)}, best, first)
        return entry

    def _rooms_on(self, nodes: Sequence[AllocNode]) -> dict:
        """The room per job shape on ``nodes`` known so far: kept while the nodes are
        the same as at the last decision."""
        key = tuple(nodes)
        if key != self._rooms[0]:
            self._rooms = (key, {})
        return self._rooms[1]

    def _allocate_typed(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], queues: QueueBook | None,
                        types: Sequence[str]) -> Mapping[str, Allocation]:
        """:meth:`allocate` on nodes of several GPU types: every job's type, count, nodes
        (all of one type) and batch in the one decision (:meth:`typed_counts`)."""
        self.types.prepare(jobs, types)  # every fit the models per type need, in one batch
        if self.growth is not None and self.typed_growth and self.typed == "heap":  # the program reads no weight
            self.growth.prepare(jobs, nodes)
        on_type = {t: [n for n in nodes if n.gpu_type == t] for t in types}
        views = within_room(self.explored(jobs), nodes, self._rooms_on(nodes))
        for _ in range(self.room_rounds):
            plan = (self.program_counts if self.typed == "program" else self.typed_counts)(views, nodes, queues)
            by_id = {v.id: v for v in views}
            where: dict[str, tuple[int, ...]] = {}
            for t in types:
                demand = [(by_id[jid], k) for jid, (u, k) in plan.items() if u == t]
                if demand:
                    where.update(keep_or_pack(demand, on_type[t], partial=True))
            short = {jid: len(where[jid]) for jid, (_, k) in plan.items() if len(where[jid]) < k}
            if not short:
                break
            views = [dataclasses.replace(v, max_replicas=short[v.id]) if v.id in short else v for v in views]
        out: dict[str, Allocation] = {j.id: Allocation() for j in jobs}
        placed = [(by_id[jid], t, where[jid]) for jid, (t, _) in plan.items()
                  if len(where[jid]) >= max(by_id[jid].min_replicas, 1)]
        choices = optimize_many([self._typed_models[v.id][t] for v, t, _ in placed], [[len(p)] for _, _, p in placed],
                                [[1 if len(set(p)) == 1 else 2] for _, _, p in placed])
        for (v, _, p), choice in zip(placed, choices):
            batch, accum = int(choice.batch[0]), int(choice.accumulation[0])
            out[v.id] = Allocation(p, *split_batch(v, len(p), batch, accum))
        if self.typed == "program":
            self._changed = {j.id: (self._now if sorted(out[j.id].nodes) != sorted(j.allocation)
                                    else self._changed.get(j.id, -math.inf)) for j in jobs}
        return out


class _Claims:
    """The GPUs each running job holds on its type as a typed decision begins (its
    claim), while it may still keep them (:meth:`GoodputAllocator.typed_counts`).
    Another job's move takes claimed GPUs only where the type's unclaimed ones do not
    suffice: with ``displace="waiting"`` only a job that holds none, and only for its
    gang; with ``take_charge`` the first move that takes from a job pays its restart,
    ``take_charge`` × its weight × its GPUs × its restart stall in the heap's utility
    (the cheapest jobs taken from first). A claim ends where its job is placed on
    another type, and shrinks by what others take."""

    def __init__(self, alloc: GoodputAllocator, running: Sequence[AllocJob], gang: Sequence[int],
                 sole: Sequence[str | None], state: list) -> None:
        self.waiting_only = alloc.displace == "waiting"
        self.gang, self.sole, self.state = gang, sole, state
        n = len(running)
        self.home: list[str | None] = [None] * n
        self.held, self.cut, self.cost = [0] * n, [0] * n, [0.0] * n
        self.on: dict[str, list[int]] = {}
        for r, j in enumerate(running):
            t = alloc._home.get(j.id)
            if j.allocation and t is not None:
                self.home[r], self.held[r] = t, len(j.allocation)
                self.cost[r] = (alloc.take_charge * alloc.typed_weight(j) * len(j.allocation)
                                * alloc.stall(j, alloc.measured_restart))
                self.on.setdefault(t, []).append(r)
        self.charged = any(self.cost)
        #: every claim left on each type
        self.total = {t: sum(self.left(r, t) for r in rs) for t, rs in self.on.items()}
        self._tables: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        #: moves taken so far, and how many had been when each job's move was last pushed
        self.moves = 0
        self.pushed: dict[int, int] = {}

    def left(self, r: int, t: str) -> int:
        """What is left of job ``r``'s claim on ``t`` beyond the GPUs it holds in the
        decision so far (its gang, kept for it already, when it fits ``t`` only)."""
        if self.home[r] != t:
            return 0
        st = self.state[r]
        if st is None:
            return max(self.held[r] - self.cut[r] - (self.gang[r] if self.sole[r] == t else 0), 0)
        return max(self.held[r] - self.cut[r] - st[1], 0) if st[0] == t else 0

    def unclaimed(self, r: int, t: str, room: int) -> int:
        """Of the ``room`` GPUs of ``t`` job ``r`` may take, those no other job claims."""
        return max(room - (self.total.get(t, 0) - self.left(r, t)), 0)

    def most(self, r: int, t: str, room: int, k: int) -> int:
        """The most GPUs of ``t`` job ``r``, at ``k`` there now (0: not placed), may reach."""
        if not self.waiting_only:
            return k + room
        extra = self.gang[r] if self.state[r] is None and self.home[r] is None else 0
        return k + self.unclaimed(r, t, room) + extra

    def _table(self, t: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, frozenset]:
        """(what taking from it costs, its claim left, job) of every job claiming ``t``
        with a claim left, the cheapest first (one already taken from costs nothing
        more); of equals, the last in the order of who runs; with the running sums of
        claims and costs and the set of jobs. Kept until a move changes the claims on
        ``t``."""
        tab = self._tables.get(t)
        if tab is None:
            out = [(0.0 if self.cut[v] else self.cost[v], self.left(v, t), v) for v in self.on.get(t, ())]
            out = sorted((x for x in out if x[1] > 0), key=lambda x: (x[0], -x[2]))
            cost, left = np.array([x[0] for x in out], dtype=float), np.array([x[1] for x in out], dtype=np.int64)
            tab = (cost, left, np.array([x[2] for x in out], dtype=np.int64), np.cumsum(left), np.cumsum(cost),
                   frozenset(x[2] for x in out))
            self._tables[t] = tab
        return tab

    def charge(self, r: int, t: str, room: int, takes: np.ndarray) -> np.ndarray | float:
        """What job ``r`` pays to take each of ``takes`` (ascending) more GPUs of ``t``."""
        if not self.charged:
            return 0.0
        free = self.unclaimed(r, t, room)
        if takes[-1] <= free:
            return 0.0
        short = np.maximum(takes - free, 0)
        cost, left, ids, claimed, paid, members = self._table(t)
        if r in members:  # the sums over the others
            others = ids != r
            if not others.any():
                return 0.0
            claimed, paid = np.cumsum(left[others]), np.cumsum(cost[others])
        elif not ids.size:
            return 0.0
        i = np.minimum(np.searchsorted(claimed, short), claimed.size - 1)
        return np.where(short > 0, paid[i], 0.0)

    def take(self, r: int, t: str, room: int, take: int, now: tuple[str, int]) -> None:
        """Job ``r`` takes ``take`` more GPUs of ``t``, to hold ``now``: the claims it
        needs shrink."""
        self.moves += 1
        short = take - self.unclaimed(r, t, room)
        if short > 0:
            _, lefts, ids, *_ = self._table(t)
            for left, v in zip(lefts.tolist(), ids.tolist()):
                if v == r:
                    continue
                x = min(left, short)
                self.cut[v] += x
                self.total[t] -= x
                short -= x
                if short <= 0:
                    break
            self._tables.pop(t, None)
        home = self.home[r]
        if home is not None:
            self.total[home] -= self.left(r, home)
            self.state[r] = now
            self.total[home] += self.left(r, home)
            self._tables.pop(home, None)


def gpu_types(nodes: Sequence[AllocNode]) -> list[str]:
    """The GPU types of ``nodes`` (:attr:`AllocNode.gpu_type`), in node order."""
    return list(dict.fromkeys(n.gpu_type for n in nodes))


class ModelRoom:
    """GPUs left for growth on the nodes of each set of GPU models jobs are limited to
    (``AllocJob.gpu_models``): a job so limited may grow only while every such set of
    nodes that contains its own still has GPUs left after the counts of the jobs limited
    to it (Hall's condition on the sets that occur). Jobs that may run anywhere are
    bound by the cluster's free GPUs alone."""

    def __init__(self, jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], count: Mapping[str, int]) -> None:
        self.allowed = {j.id: ok for j in jobs if (ok := j.allowed_nodes(nodes)) is not None}
        gpus = {n.index: n.gpus for n in nodes}
        self.left = {a: sum(gpus[i] for i in a) for a in set(self.allowed.values())}
        for jid, a in self.allowed.items():
            self.charge_set(a, count.get(jid, 0))

    def _sets(self, a: frozenset[int]):
        return [g for g in self.left if a <= g]

    def charge_set(self, a: frozenset[int], gpus: int) -> None:
        for g in self._sets(a):
            self.left[g] -= gpus

    def room(self, job: AllocJob) -> float:
        a = self.allowed.get(job.id)
        return math.inf if a is None else min(self.left[g] for g in self._sets(a))

    def charge(self, job: AllocJob, gpus: int) -> None:
        a = self.allowed.get(job.id)
        if a is not None:
            self.charge_set(a, gpus)


def within_room(jobs: Sequence[AllocJob], nodes: Sequence[AllocNode], rooms: dict | None = None) -> list[AllocJob]:
    """``jobs`` as the allocator weighs them: a job limited to some GPU models
    (``AllocJob.gpu_models``), whose replicas ask for CPU or memory or come in groups
    of several GPUs (whole workers per node) may grow at most to the replicas the nodes
    could hold of it alone (:meth:`AllocJob.room_on`; none: it
    cannot run); the others unchanged (the same objects). ``rooms``: that room per job
    shape on these ``nodes``, filled in as it is found (jobs of one shape share it)."""
    rooms = {} if rooms is None else rooms
    out = []
    for j in jobs:
        if j.gpu_models is None and not j.node_by_node:
            out.append(j)
            continue
        room = rooms.get(j.shape)
        if room is None:
            room = rooms[j.shape] = sum(j.room_on(n) for n in nodes)
        out.append(dataclasses.replace(j, max_replicas=min(j.max_replicas, room)) if room < j.max_replicas else j)
    return out
