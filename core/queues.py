"""Teams' queues: GPU quotas with borrowing, weighted fair share, allowed service classes
and a minimum run time — the rules a platform team sets per team (a TrainingQueue).

:meth:`QueueBook.who_runs` is the one rule deciding which jobs run under the quotas:
guarantees first, then weighted max-min fair share of the rest (DRF with the GPU as the
one resource, Ghodsi et al., NSDI'11). Pure: the operator parses TrainingQueues, the
simulator builds them from a trace's tenants. Rules: docs/queues.md, docs/design-notes.md.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from .contract import PRIORITY_CLASSES

__all__ = ["QueueSpec", "QueueBook", "QueueError", "NO_QUEUE", "DEFAULT_CLASSES"]

#: the implicit queue of jobs that name none (when queues exist)
NO_QUEUE = ""
#: the service classes a queue allows unless it says otherwise (``highest`` preempts:
#: a platform team grants it explicitly)
DEFAULT_CLASSES = frozenset({"normal", "urgent"})

J = TypeVar("J")


class QueueError(ValueError):
    """A TrainingQueue that cannot be read (its name and the field at fault)."""


@dataclass(frozen=True)
class QueueSpec:
    """One team's queue (module docstring)."""

    name: str
    nominal_gpus: int = 0
    borrowing_limit: int | None = None
    weight: float = 1.0
    priority_classes: frozenset[str] = DEFAULT_CLASSES
    min_run_s: float | None = None
    namespaces: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.nominal_gpus < 0:
            raise QueueError(f"queue {self.name!r}: nominalGpus must be >= 0, got {self.nominal_gpus}")
        if self.borrowing_limit is not None and self.borrowing_limit < 0:
            raise QueueError(f"queue {self.name!r}: borrowingLimitGpus must be >= 0, got {self.borrowing_limit}")
        if not (math.isfinite(self.weight) and self.weight > 0):
            raise QueueError(f"queue {self.name!r}: weight must be > 0, got {self.weight}")
        bad = set(self.priority_classes) - set(PRIORITY_CLASSES)
        if bad:
            raise QueueError(f"queue {self.name!r}: unknown priority classes {sorted(bad)}")
        if self.min_run_s is not None and not (math.isfinite(self.min_run_s) and self.min_run_s >= 0):
            raise QueueError(f"queue {self.name!r}: minRunSeconds must be >= 0, got {self.min_run_s}")

    @property
    def cap(self) -> float:
        """The most GPUs its jobs may hold: nominal plus the borrowing limit."""
        return math.inf if self.borrowing_limit is None else self.nominal_gpus + self.borrowing_limit

    def allows(self, priority_class: str) -> bool:
        return priority_class in self.priority_classes

    @classmethod
    def from_manifest(cls, body: Mapping[str, Any]) -> "QueueSpec":
        """A TrainingQueue object (``metadata.name`` and ``spec``, as the API server
        returns it, defaults applied or not); :class:`QueueError` naming what is wrong."""
        name = (body.get("metadata") or {}).get("name")
        if not isinstance(name, str) or not name:
            raise QueueError("a TrainingQueue without metadata.name")
        spec = body.get("spec") or {}
        if not isinstance(spec, Mapping):
            raise QueueError(f"queue {name!r}: spec must be an object")

        def whole(key: str, default: int | None) -> int | None:
            v = spec.get(key, default)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, int):
                raise QueueError(f"queue {name!r}: {key} must be a whole number, got {v!r}")
            return v

        def number(key: str, default: float | None) -> float | None:
            v = spec.get(key, default)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise QueueError(f"queue {name!r}: {key} must be a number, got {v!r}")
            return float(v)

        classes = spec.get("priorityClasses", sorted(DEFAULT_CLASSES))
        spaces = spec.get("namespaces") or []
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise QueueError(f"queue {name!r}: priorityClasses must be a list of class names")
        if not isinstance(spaces, list) or not all(isinstance(n, str) for n in spaces):
            raise QueueError(f"queue {name!r}: namespaces must be a list of names")
        return cls(name, whole("nominalGpus", 0) or 0, whole("borrowingLimitGpus", None),
                   number("weight", 1.0), frozenset(classes), number("minRunSeconds", None), tuple(spaces))


@dataclass
class QueueBook:
    """The queues of one decision and the scheduler's default minimum run time."""

    queues: Sequence[QueueSpec] = ()
    min_run_s: float = 0.0
    #: what fair share equalises per unit of weight: ``gpus``, the GPUs a queue holds
    #: now (weighted DRF over GPUs, the default), or ``service``, the GPU-seconds its
    #: unfinished jobs attained plus what it holds for ``horizon_s`` more (weighted
    #: attained service, Tiresias' least-attained-service between teams)
    fair_share: str = "gpus"
    horizon_s: float = 60.0
    _by_name: dict[str, QueueSpec] = field(init=False, repr=False)
    _default_of: dict[str, str] = field(init=False, repr=False)
    _implicit: QueueSpec = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._implicit = QueueSpec(NO_QUEUE, priority_classes=frozenset(PRIORITY_CLASSES))
        self._by_name = {}
        self._default_of = {}
        for q in sorted(self.queues, key=lambda q: q.name):
            if q.name in self._by_name:
                raise QueueError(f"two queues named {q.name!r}")
            self._by_name[q.name] = q
            for ns in q.namespaces:  # the first by name wins, documented
                self._default_of.setdefault(ns, q.name)
        if not (math.isfinite(self.min_run_s) and self.min_run_s >= 0):
            raise QueueError(f"min_run_s must be >= 0, got {self.min_run_s}")
        if self.fair_share not in ("gpus", "service"):
            raise QueueError(f"fair_share must be 'gpus' or 'service', got {self.fair_share!r}")
        if not (math.isfinite(self.horizon_s) and self.horizon_s > 0):
            raise QueueError(f"horizon_s must be > 0, got {self.horizon_s}")

    @property
    def active(self) -> bool:
        """Whether any queue exists (else the policy decides alone)."""
        return bool(self._by_name)

    def get(self, name: str | None) -> QueueSpec | None:
        return self._by_name.get(name or NO_QUEUE)

    def resolve(self, namespace: str | None, named: str | None) -> str | None:
        """The queue a job is charged to: the one it names, else its namespace's default
        (the queue listing the namespace; the first by name if several do), else none
        (:data:`NO_QUEUE`). A named queue is returned even when it does not exist (the
        job then waits: :meth:`exists`)."""
        if named:
            return named
        return self._default_of.get(namespace or "", NO_QUEUE) if self.active else NO_QUEUE

    def exists(self, name: str | None) -> bool:
        return not name or name in self._by_name

    def spec_of(self, name: str | None) -> QueueSpec:
        """The queue's spec; the implicit queue (no guarantee, no cap, weight 1, every
        class) for :data:`NO_QUEUE` or a queue that does not exist."""
        return self._by_name.get(name or NO_QUEUE) or self._implicit

    def min_run(self, name: str | None) -> float:
        q = self.get(name)
        return q.min_run_s if q is not None and q.min_run_s is not None else self.min_run_s

    # ------------------------------------------------------------------ the rule
    def who_runs(self, order: Sequence[J], *, total: int, queue: Callable[[J], str | None],
                 gang: Callable[[J], int], key: Callable[[J], str], kept: Mapping[str, int] | None = None,
                 service: Mapping[str, float] | None = None) -> tuple[dict[str, int], dict[str, int]]:
        """Which jobs of ``order`` (the policy's ranking) run, under the quotas: their
        gang counts by ``key`` and each queue's GPUs in use. ``kept``: jobs that keep
        the GPUs they hold (minimum run time), charged first. ``service``: GPU-seconds each
        queue's jobs attained (read when ``fair_share`` is ``service``)."""
        kept = kept or {}
        count: dict[str, int] = {}
        used: dict[str, int] = defaultdict(int)
        free = total
        for j in order:
            k = kept.get(key(j), 0)
            if k > 0:
                count[key(j)] = k
                used[queue(j) or NO_QUEUE] += k
                free -= k
        rest = [j for j in order if key(j) not in count]
        # 1. guarantees: a job within its queue's unused nominal GPUs
        later: list[J] = []
        for j in rest:
            q, n = queue(j) or NO_QUEUE, gang(j)
            nominal = self.spec_of(q).nominal_gpus
            if 0 < n <= free and used[q] + n <= nominal:
                count[key(j)] = n
                used[q] += n
                free -= n
            else:
                later.append(j)
        # 2. fair share of the rest: the queue with the fewest GPUs per unit of weight
        by_queue: dict[str, list[J]] = defaultdict(list)
        for j in later:
            by_queue[queue(j) or NO_QUEUE].append(j)
        rank = {key(j): r for r, j in enumerate(order)}
        pos = {q: 0 for q in by_queue}
        while True:
            best: tuple[float, int, str] | None = None
            for q, jobs in by_queue.items():
                spec = self.spec_of(q)
                i = pos[q]
                while i < len(jobs) and not (0 < gang(jobs[i]) <= free and used[q] + gang(jobs[i]) <= spec.cap):
                    i += 1  # never fits in this pass: free only falls, use only rises
                pos[q] = i
                if i < len(jobs):
                    cand = (self.share(used, q, service), rank[key(jobs[i])], q)
                    best = cand if best is None or cand < best else best
            if best is None:
                break
            q = best[2]
            j = by_queue[q][pos[q]]
            pos[q] += 1
            n = gang(j)
            count[key(j)] = n
            used[q] += n
            free -= n
        return count, dict(used)

    def room(self, used: Mapping[str, int], name: str | None) -> float:
        """GPUs the queue's next growth move may take: up to its nominal while it holds
        less (a guarantee is reached before it is exceeded), else up to its cap."""
        q = name or NO_QUEUE
        spec, u = self.spec_of(q), used.get(q, 0)
        return spec.nominal_gpus - u if u < spec.nominal_gpus else spec.cap - u

    def share(self, used: Mapping[str, int], name: str | None, service: Mapping[str, float] | None = None) -> float:
        """What fair share equalises, per unit of the queue's weight: GPUs held, or
        (``fair_share="service"``) attained GPU-seconds plus the GPUs held over the
        horizon."""
        q = name or NO_QUEUE
        spec, u = self.spec_of(q), used.get(q, 0)
        if self.fair_share == "service":
            return ((service or {}).get(q, 0.0) + u * self.horizon_s) / spec.weight
        return u / spec.weight

    def grow_key(self, used: Mapping[str, int], name: str | None,
                 service: Mapping[str, float] | None = None) -> tuple:
        """Which queue grows next: those below their guarantee first (the least filled
        first), then the one with the smallest :meth:`share` (ties by name)."""
        q = name or NO_QUEUE
        spec, u = self.spec_of(q), used.get(q, 0)
        if u < spec.nominal_gpus:
            return (0, u / spec.nominal_gpus, q)
        return (1, self.share(used, q, service), q)

    def usage(self, jobs: Iterable[tuple[str | None, int]]) -> dict[str, dict[str, int]]:
        """Per queue — every queue object and any queue a job is charged to — GPUs in use,
        borrowed (beyond nominal), jobs running and jobs pending, from ``(queue, GPUs
        held)`` of each job (0: it waits): what the queue's status and metrics show."""
        use: dict[str, int] = defaultdict(int)
        running: dict[str, int] = defaultdict(int)
        pending: dict[str, int] = defaultdict(int)
        for q, g in jobs:
            q = q or NO_QUEUE
            use[q] += g
            (running if g > 0 else pending)[q] += 1
        out = {}
        for name in set(self._by_name) | set(use):
            u = use.get(name, 0)
            out[name] = {"gpusInUse": u, "borrowedGpus": max(0, u - self.spec_of(name).nominal_gpus),
                         "pendingJobs": pending.get(name, 0), "runningJobs": running.get(name, 0)}
        return out
