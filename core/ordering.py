"""Job orderings: which pending job starts first.

Every ordering ranks inside the service order of the queues
(``interrupt > urgent > normal``, :data:`~rlsched.core.cluster.QUEUES`) and, inside a
queue, by ``priority`` descending; only then does the policy's own key apply, and ties
fall back to FIFO (submit time, then id). The operator calls :meth:`rank` once per
queue, where the first two keys are constant; the simulator may call it on the mixed
pending list and gets the same service order. Formulas and citations:
``docs/policies.md``.
"""

from __future__ import annotations

import bisect
from typing import Callable, Hashable, Sequence

import numpy as np

from .cluster import QUEUES, ClusterState, JobView
from .estimate import duration_key
from .policy import register_ordering

__all__ = [
    "reached_threshold",
    "FIFO",
    "SJF",
    "SRTF",
    "DRF",
    "Tetris",
    "Tiresias",
    "RandomOrdering",
    "demand_vector",
    "POLLUX_THRESHOLD",
]

#: 16 GPU-hours in GPU-seconds: the queue threshold of the Pollux paper's Tiresias
#: baseline (Qiao et al. OSDI'21 artifact)
POLLUX_THRESHOLD = 16 * 3600.0

_QUEUE_RANK = {q: i for i, q in enumerate(QUEUES)}


def _class_key(job: JobView) -> tuple:
    return (_QUEUE_RANK[job.queue], -job.priority)


def _fifo_key(job: JobView) -> tuple:
    return (job.submit_time, job.id)


def remaining_time(job: JobView) -> float:
    """Remaining run time: ``remaining`` when known (> 0), else ``est_runtime``; 0 when
    neither is known. Both are estimates (:mod:`rlsched.core.estimate`): the simulator
    and the operator never put a job's true run time in a view (except a simulator run
    marked clairvoyant, a labelled reference)."""
    return job.remaining if job.remaining > 0 else job.est_runtime


def demand_vector(job: JobView) -> np.ndarray:
    """Total (GPUs, CPU milli, memory MiB) the job asks for at ``job.workers`` workers."""
    return job.workers * np.array(
        [job.gpus_per_worker, job.cpu_milli, job.memory_mib], dtype=float
    )


def _capacity(state: ClusterState) -> np.ndarray:
    cap = np.array(
        [state.total_gpus, state.cpu_total.sum(), state.mem_total.sum()], dtype=float
    )
    cap[cap <= 0] = np.inf  # a resource the cluster lacks counts as share 0
    return cap


class _KeyOrdering:
    """Sort by (queue, -priority, policy key, submit time, id)."""

    name = ""
    #: whether a waiting job may evict a running one this policy ranks strictly after
    #: it (SRTF, Tiresias); the planning layer (``Admission``) decides the victims
    preemptive = False
    #: attained-service thresholds that demote a job (Tiresias); none by default
    thresholds: tuple[float, ...] = ()

    def __init__(self, *, rng: np.random.Generator | None = None) -> None:
        # ``rng`` is accepted so callers can build every ordering the same way;
        # deterministic orderings ignore it.
        del rng

    def preempts(self, job: JobView, victim: JobView, state: ClusterState) -> bool:
        """Whether waiting ``job`` outranks running ``victim`` on this policy's own key
        alone, strictly (a tie never preempts: no thrashing between equals). Queue and
        priority classes are the planning layer's business, not compared here."""
        kj, kv = self._keys([job, victim], state)
        return kj < kv

    def outranked(self, job: JobView, others: Sequence[JobView], state: ClusterState) -> list[JobView]:
        """The jobs of ``others`` that :meth:`preempts` says ``job`` outranks, keys
        computed once (what a simulator asks on every pass)."""
        keys = self._keys([job, *others], state)
        kj = keys[0]
        return [o for o, k in zip(others, keys[1:]) if kj < k]

    def demotes_at(self, job: JobView, now: float) -> float | None:
        """Never: no thresholds (Tiresias overrides)."""
        return None

    def _keys(self, pending: Sequence[JobView], state: ClusterState) -> list[tuple]:
        raise NotImplementedError

    def rank(self, pending: Sequence[JobView], state: ClusterState) -> list[JobView]:
        keys = self._keys(pending, state)
        order = sorted(
            range(len(pending)),
            key=lambda k: (_class_key(pending[k]), keys[k], _fifo_key(pending[k])),
        )
        return [pending[k] for k in order]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@register_ordering("fifo")
class FIFO(_KeyOrdering):
    """First in, first out: submit time, then id."""

    name = "fifo"

    def _keys(self, pending, state):
        return [()] * len(pending)


@register_ordering("sjf")
class SJF(_KeyOrdering):
    """Shortest job first: ``est_runtime`` (the user's estimate) ascending; jobs
    without an estimate after those with one, FIFO among themselves."""

    name = "sjf"

    def _keys(self, pending, state):
        return [duration_key(j.est_runtime) for j in pending]


@register_ordering("srtf")
class SRTF(_KeyOrdering):
    """Shortest remaining time first: ``remaining`` (``est_runtime`` if unknown), the
    estimate of :func:`rlsched.core.estimate.estimate_remaining`; jobs with neither
    after every job with one, FIFO among themselves.

    Preemptive: a waiting job with a strictly shorter remaining time evicts a running
    one (the longest remaining first) when it does not fit otherwise; a job whose
    remaining time is unknown never preempts (and one known beats an unknown)."""

    name = "srtf"
    preemptive = True

    def _keys(self, pending, state):
        return [duration_key(remaining_time(j)) for j in pending]


@register_ordering("drf")
class DRF(_KeyOrdering):
    """Dominant Resource Fairness (Ghodsi et al., NSDI'11) as an ordering.

    ``owner`` maps a job to its tenant (user, team, queue). Ranking is DRF's
    progressive filling: repeatedly take the tenant with the smallest dominant share
    (its running jobs plus the jobs already ranked), and rank its next job (FIFO
    inside a tenant). Without ``owner`` every job is its own tenant with no running
    usage, so the order is by the job's own dominant share of demand
    ``max_r(demand_r / capacity_r)`` over GPU, CPU and memory, smallest first.
    """

    name = "drf"

    def __init__(
        self,
        owner: Callable[[JobView], Hashable] | None = None,
        *,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__(rng=rng)
        self.owner = owner

    def _keys(self, pending, state):
        cap = _capacity(state)
        if self.owner is None:
            if not pending:
                return []
            per_worker = np.array([[j.gpus_per_worker, j.cpu_milli, j.memory_mib] for j in pending], dtype=float)
            workers = np.array([j.workers for j in pending], dtype=float)
            share = (per_worker * workers[:, None] / cap).max(axis=1)
            return [(x,) for x in share.tolist()]
        usage: dict[Hashable, np.ndarray] = {}
        for j in state.running.values():
            o = self.owner(j)
            usage[o] = usage.get(o, np.zeros(3)) + demand_vector(j)
        queues: dict[Hashable, list[int]] = {}
        for k in sorted(range(len(pending)), key=lambda k: (_class_key(pending[k]), _fifo_key(pending[k]))):
            queues.setdefault(self.owner(pending[k]), []).append(k)
        keys: list[tuple] = [()] * len(pending)
        step = 0
        while queues:
            # the tenant with the smallest dominant share (ties: its first job's FIFO key)
            o = min(
                queues,
                key=lambda o: (
                    float(np.max(usage.get(o, np.zeros(3)) / cap)),
                    _fifo_key(pending[queues[o][0]]),
                ),
            )
            k = queues[o].pop(0)
            keys[k] = (step,)
            step += 1
            usage[o] = usage.get(o, np.zeros(3)) + demand_vector(pending[k])
            if not queues[o]:
                del queues[o]
        return keys

    def __repr__(self) -> str:
        return f"DRF(owner={self.owner!r})"


@register_ordering("tetris")
class Tetris(_KeyOrdering):
    """Tetris (Grandl et al., SIGCOMM'14): packing alignment plus an SRPT term.

    ``a = d · f`` with ``d`` the job's (GPU, CPU, memory) demand and ``f`` the cluster's
    free resources, both normalised by cluster capacity; ``p = remaining × GPUs`` is
    the job's remaining work (the estimate, :func:`remaining_time`). Score ``a − ε p``
    with ``ε = m · mean(a) / mean(p)`` over the pending jobs (``m`` = ``srpt_weight``);
    highest first. A job whose remaining time is unknown gets the mean ``p`` of those
    known (the SRPT term is neutral for it; none known: packing alone). Jobs whose
    demand exceeds the free resources now go after those that fit (Tetris never
    over-allocates).
    """

    name = "tetris"

    def __init__(self, srpt_weight: float = 1.0, *, rng: np.random.Generator | None = None) -> None:
        super().__init__(rng=rng)
        if srpt_weight < 0:
            raise ValueError(f"srpt_weight must be >= 0, got {srpt_weight}")
        self.srpt_weight = srpt_weight

    def scores(self, pending: Sequence[JobView], state: ClusterState) -> tuple[np.ndarray, np.ndarray]:
        """(score, fits-now) per pending job."""
        if not pending:
            return np.zeros(0), np.zeros(0, dtype=bool)
        cap = _capacity(state)
        free = np.array(
            [state.free_gpus, state.cpu_free.sum(), state.mem_free.sum()], dtype=float
        )
        d = np.stack([demand_vector(j) for j in pending])
        a = (d / cap) @ (free / cap)
        p = np.array([remaining_time(j) * j.gpus for j in pending], dtype=float)
        unknown = p <= 0
        if unknown.any():
            p[unknown] = p[~unknown].mean() if not unknown.all() else 0.0
        eps = 0.0
        if self.srpt_weight > 0 and p.mean() > 0:
            eps = self.srpt_weight * a.mean() / p.mean()
        fits = np.all(d <= free + 1e-9, axis=1)
        return a - eps * p, fits

    def _keys(self, pending, state):
        score, fits = self.scores(pending, state)
        return [(not f, -s) for s, f in zip(score.tolist(), fits.tolist())]

    def __repr__(self) -> str:
        return f"Tetris(srpt_weight={self.srpt_weight})"


@register_ordering("tiresias")
class Tiresias(_KeyOrdering):
    """Tiresias discretized 2D-LAS (Gu et al., NSDI'19).

    Attained service ``a = GPUs × executed time`` (``JobView.attained_service``, in
    GPU-seconds) puts a job in queue ``q = #{thresholds ≤ a}``; lower queues first,
    FIFO (submit time) inside a queue. With ``promote_knob`` set, a job that has waited
    at least ``promote_knob ×`` its executed time is promoted to queue 0 (Tiresias'
    starvation guard).

    Preemptive: a waiting job in a strictly lower queue evicts running jobs of higher
    queues (the highest queue first) when it does not fit otherwise; a running job is
    demoted when its attained service crosses a threshold (:meth:`demotes_at`), which
    lets waiting jobs of lower queues preempt it then.

    Thresholds (attained GPU-seconds): discretized 2D-LAS puts jobs in K queues split
    by attained-service limits (Gu et al., NSDI'19, "Discretized 2D-LAS"). The default
    is two queues split at 3600 GPU-seconds: the example configuration of the
    authors' simulator (github.com/SymbioticLab/Tiresias, simulator/README.md: "two
    queues, and the threshold for Q1 is 3600 seconds", compared with GPU time by its
    ``dlas-gpu`` schedule), and the 2-queue discretized LAS the Pollux paper ran as
    its Tiresias baseline (../shared/data/pollux-osdi21/README.md). The same
    simulator's global default is three queues at 3250 and 7200:
    ``thresholds=(3250, 7200)``.
    """

    name = "tiresias"
    preemptive = True

    def __init__(
        self,
        thresholds: Sequence[float] = (3600.0,),
        promote_knob: float | None = None,
        *,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__(rng=rng)
        th = [float(t) for t in thresholds]
        if any(t <= 0 for t in th) or th != sorted(th):
            raise ValueError(f"thresholds must be positive and ascending, got {thresholds}")
        if promote_knob is not None and promote_knob <= 0:
            raise ValueError("promote_knob must be > 0")
        self.thresholds = tuple(th)
        self.promote_knob = promote_knob

    def queue_of(self, job: JobView, now: float) -> int:
        q = bisect.bisect_right(self.thresholds, job.attained_service)
        if self.promote_knob is not None and job.attained_service > 0:
            executed = job.attained_service / max(job.gpus, 1)
            waited = now - job.submit_time - executed
            if waited >= self.promote_knob * executed:
                q = 0
        return q

    def _keys(self, pending, state):
        return [(self.queue_of(j, state.time),) for j in pending]

    def demotes_at(self, job: JobView, now: float) -> float | None:
        """When a job running with ``job.gpus`` GPUs from ``now`` reaches the next
        threshold (None past the last): the time its queue can change."""
        a = job.attained_service
        k = bisect.bisect_right(self.thresholds, a)
        if k >= len(self.thresholds) or job.gpus <= 0:
            return None
        return now + (self.thresholds[k] - a) / job.gpus

    def __repr__(self) -> str:
        return f"Tiresias(thresholds={self.thresholds}, promote_knob={self.promote_knob})"


def reached_threshold(attained: float, thresholds: Sequence[float]) -> float:
    """``attained`` GPU-seconds, or the threshold it falls a hair short of: the clock's
    float sums stop just short of the time a demotion was due, which counts as reached."""
    for th in thresholds:
        if 0 < th - attained <= 1e-9 * max(1.0, th):
            return float(th)
    return attained


@register_ordering("random")
class RandomOrdering(_KeyOrdering):
    """A uniformly random order inside each (queue, priority) class."""

    name = "random"

    def __init__(self, *, rng: np.random.Generator | None = None) -> None:
        self.rng = rng if rng is not None else np.random.default_rng(0)

    def _keys(self, pending, state):
        return [(float(u),) for u in self.rng.random(len(pending))]

    def __repr__(self) -> str:
        return "RandomOrdering()"
