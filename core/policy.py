"""The three policy protocols and the registry that names every policy.

A policy is a pure object over a :class:`~rlsched.core.cluster.ClusterState`: it
reads the snapshot and returns a decision; it never mutates the state it is given
(placements may allocate tentatively but must release before returning). The same
object decides in the simulator, the extender and the operator.

Besides the decision, each protocol declares what the adapters ask of a policy (the
extender's debug terms and node-speed feedback, the operator's fallback notice), with
a default: the built-in policies inherit the protocol class, so the adapters call these
methods directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from .cluster import ClusterState, JobView

__all__ = [
    "Ordering",
    "Placement",
    "Scaling",
    "ORDERINGS",
    "PLACEMENTS",
    "SCALINGS",
    "ALLOCATORS",
    "AllocatorEntry",
    "register_allocator",
    "allocator_entry",
    "allocator_names",
    "make_allocator",
    "register_ordering",
    "register_placement",
    "register_scaling",
    "make_ordering",
    "make_placement",
    "make_scaling",
    "scores_to_extender",
]


@runtime_checkable
class Ordering(Protocol):
    """Ranks pending jobs: the first is started first. A preemptive ordering (SRTF,
    Tiresias) also says whom a waiting job outranks; admission decides the victims."""

    name: str
    #: whether a waiting job may evict running jobs it outranks
    preemptive: bool
    #: attained-service thresholds (GPU-seconds) at which a job moves down a queue; ()
    thresholds: tuple[float, ...]

    def rank(self, pending: Sequence[JobView], state: ClusterState) -> list[JobView]: ...

    def preempts(self, job: JobView, victim: JobView, state: ClusterState) -> bool:
        """Whether waiting ``job`` strictly outranks running ``victim`` on the policy's key."""
        ...

    def outranked(self, job: JobView, others: Sequence[JobView], state: ClusterState) -> list[JobView]:
        """The jobs of ``others`` that :meth:`preempts` says ``job`` outranks."""
        ...

    def demotes_at(self, job: JobView, now: float) -> float | None:
        """When ``job``, running on its GPUs from ``now``, reaches its next threshold
        (None: never)."""
        ...


@runtime_checkable
class Placement(Protocol):
    """Chooses nodes for a job's workers, and scores candidates for one pod."""

    name: str
    #: why the policy places with a fallback rather than as configured (e.g. its
    #: model file could not be read); ``None`` when it runs as configured
    fallback_reason: str | None = None
    #: version of the model file the policy serves ("" for a policy without one),
    #: reported by the extender's ``/version`` and ``rlsched_extender_model_info``
    model_version: str = ""

    def place(self, job: JobView, state: ClusterState, workers: int | None = None) -> list[int] | None:
        """Node index for each of ``workers`` (default ``job.workers``) new workers,
        taking the job's already-placed workers (``job.placement``) into account;
        ``None`` if they do not all fit now."""
        ...

    def score(self, job: JobView, candidates: Sequence[int], state: ClusterState) -> np.ndarray:
        """A float score per candidate node (higher is better) for one more worker of
        ``job``; candidates that cannot host it get ``-inf``."""
        ...

    def score_terms(
        self, job: JobView, candidates: Sequence[int], state: ClusterState
    ) -> tuple[np.ndarray, dict[str, np.ndarray] | None]:
        """:meth:`score` and the unweighted terms behind it, one array per term over
        the candidates (shown by the extender's ``/debug``); ``None``: no terms."""
        return self.score(job, candidates, state), None

    def observe(self, node: str, performance: float) -> None:
        """A measured performance of ``node`` (by name; 1.0 = nominal speed), fed by
        the extender from pods' ``rlsched.dev/observed-speed``. Default: ignored."""
        return None

    def parameters(self) -> dict[str, Any] | None:
        """The policy's parameters (shown by the extender's ``/debug``); ``None``: none."""
        return None


@runtime_checkable
class Scaling(Protocol):
    """Decides +1 / -1 / 0 workers for each running job."""

    name: str
    #: why the policy decides with a fallback rather than as configured (e.g. its
    #: weights file could not be read); ``None`` when it runs as configured
    fallback_reason: str | None = None

    def decide(self, running: Sequence[JobView], state: ClusterState) -> dict[str, int]: ...


ORDERINGS: dict[str, Callable[..., Ordering]] = {}
PLACEMENTS: dict[str, Callable[..., Placement]] = {}
SCALINGS: dict[str, Callable[..., Scaling]] = {}


def _register(table: dict, name: str):
    def deco(factory):
        if name in table:
            raise ValueError(f"policy {name!r} registered twice")
        table[name] = factory
        return factory

    return deco


def register_ordering(name: str):
    return _register(ORDERINGS, name)


def register_placement(name: str):
    return _register(PLACEMENTS, name)


def register_scaling(name: str):
    return _register(SCALINGS, name)


@dataclass(frozen=True)
class AllocatorEntry:
    """A registered allocation policy (:class:`rlsched.core.allocation.Allocator`):
    ``factory(**options)`` builds a fresh one. ``live``: non-clairvoyant and built from
    core alone, so the operator and the event engine may run it; ``clairvoyant``: it
    reads the true remaining work, a reference and never a baseline."""

    name: str
    factory: Callable[..., Any]
    live: bool = False
    clairvoyant: bool = False


#: allocation policy name -> entry, in registration order: core's own here, the
#: simulator's peers when :mod:`rlsched.sim.allocators` is imported
ALLOCATORS: dict[str, AllocatorEntry] = {}


def register_allocator(name: str, *, live: bool = False, clairvoyant: bool = False):
    """Decorator registering ``factory(**options) -> Allocator`` under ``name``."""
    if live and clairvoyant:
        raise ValueError(f"allocator {name!r}: a clairvoyant policy cannot run live")

    def deco(factory):
        if name in ALLOCATORS:
            raise ValueError(f"policy {name!r} registered twice")
        ALLOCATORS[name] = AllocatorEntry(name, factory, live=live, clairvoyant=clairvoyant)
        return factory

    return deco


def allocator_names(*, live: bool = False) -> tuple[str, ...]:
    """The registered allocation policies; ``live``: only those the operator and the
    event engine may run."""
    return tuple(n for n, e in ALLOCATORS.items() if e.live or not live)


def allocator_entry(name: str) -> AllocatorEntry:
    """The entry of ``name``; ``ValueError`` naming the registered ones."""
    try:
        return ALLOCATORS[name]
    except KeyError:
        raise ValueError(f"unknown allocation policy {name!r}; known: {', '.join(ALLOCATORS)}") from None


def make_allocator(name: str, **options) -> Any:
    """A fresh allocator of the registered policy ``name`` (each run needs its own:
    allocators keep state)."""
    return allocator_entry(name).factory(**options)


def _core(module: str):
    # core's allocators are imported when built, not when named (they import this module)
    import importlib

    return importlib.import_module(f"{__package__}.{module}")


@register_allocator("goodput", live=True)
def _goodput(**options):
    return _core("goodput_allocator").GoodputAllocator(**options)


@register_allocator("goodput-learned", live=True)
def _goodput_learned(growth_model=None, **options):
    return _core("growth_weight").learned_goodput(growth_model, **options)


@register_allocator("goodput-rlpto", live=True)
def _goodput_rlpto(rlpto_model=None, **options):
    return _core("rlpto_weight").rlpto_goodput(rlpto_model, **options)


def _make(table: Mapping, kind: str, name: str, kwargs: dict):
    _load_builtin()
    key = name.lower()
    if key not in table:
        raise ValueError(f"unknown {kind} policy {name!r}; known: {', '.join(sorted(table))}")
    return table[key](**kwargs)


def make_ordering(name: str, **kwargs) -> Ordering:
    return _make(ORDERINGS, "ordering", name, kwargs)


def make_placement(name: str, **kwargs) -> Placement:
    return _make(PLACEMENTS, "placement", name, kwargs)


def make_scaling(name: str, **kwargs) -> Scaling:
    return _make(SCALINGS, "scaling", name, kwargs)


_BUILTIN = ("heuristics", "das", "learned", "das_agent")


def _load_builtin() -> None:
    """Import the policy modules for their registration side effect (cheap after the
    first call). A module that is not there is skipped; an error inside one is not."""
    import importlib

    for name in _BUILTIN:
        full = f"{__package__}.{name}"
        try:
            importlib.import_module(full)
        except ModuleNotFoundError as exc:
            if exc.name != full:
                raise


def scores_to_extender(scores: np.ndarray, max_priority: int = 10) -> np.ndarray:
    """Map raw scores to kube-scheduler extender integers 0..max_priority.

    Min-max over the finite scores; infeasible (-inf) nodes get 0; all-equal gives
    the maximum to every feasible node.
    """
    s = np.asarray(scores, dtype=float)
    out = np.zeros(len(s), dtype=np.int64)
    finite = np.isfinite(s)
    if not finite.any():
        return out
    lo, hi = s[finite].min(), s[finite].max()
    if hi - lo < 1e-12:
        out[finite] = max_priority
        return out
    out[finite] = np.rint((s[finite] - lo) / (hi - lo) * max_priority).astype(np.int64)
    return out
