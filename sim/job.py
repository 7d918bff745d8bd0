"""Job model: what a job asks for and how fast it runs where it is placed.

A job is ``workers`` data-parallel workers of ``gpus_per_worker`` GPUs; a step costs its
compute plus a ring all-reduce at the slowest link its GPUs span (:func:`ring_throughput`,
the one formula). A job trains until its convergence model's β stop, or runs a fixed
duration (trace pods). Its true run time is the engine's secret; policies see a user's
estimate only where one is given. Details: docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from rlsched.core import Bandwidth, JobView, Level, Topology
from rlsched.core.batch import BatchBounds
from rlsched.core.contract import PRIORITY_CLASSES
from rlsched.core.planning import HIGHEST_BONUS

from .convergence import ConvergenceModel

__all__ = ["JobSpec", "comm_time", "ring_throughput", "step_time", "throughput", "batch_throughput", "batch_rate", "ideal_level", "best_step_time", "topology_limits"]


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job of a trace. Times in seconds, sizes in GB."""

    id: str
    submit_time: float
    workers: int = 1
    gpus_per_worker: int = 1
    min_workers: int | None = None
    max_workers: int | None = None
    gpu_models: frozenset[str] | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    queue: str = "normal"
    priority: float = 0.0
    #: service class (``highest``/``urgent``/``normal``, as a TrainingJob's
    #: ``spec.priority.class``); None: ``urgent`` in the urgent queue, else ``normal``.
    #: A ``highest`` job waits in the urgent queue and may preempt lower classes.
    priority_class: str | None = None
    # speed model
    compute_time: float = 0.2
    grad_gb: float = 0.1
    batch_per_worker: int = 32
    # an adaptive global batch (a TrainingJob's ``spec.batchSize``/``maxBatchSize``);
    # None: every worker trains at ``batch_per_worker`` and no scheduler sets a batch
    #: ``M0``, the global batch the job was tuned for (``spec.batchSize``)
    batch_size: int | None = None
    #: the largest global batch a scheduler may choose (``spec.maxBatchSize``; None: ``batch_size``)
    max_batch_size: int | None = None
    #: the gradient noise scale ``φ = tr(Σ)/|G|²`` in samples its trainer measures (with a
    #: ``batch_size``): statistical efficiency ``(φ + M0)/(φ + M)`` at global batch ``M``
    #: (Pollux's, instead of the convergence model's per-worker one); None: never measured
    grad_noise_scale: float | None = None
    # fixed-duration mode
    duration: float | None = None
    # training mode
    samples_per_epoch: int = 50_000
    max_epochs: int = 30
    beta: float = 0.001
    patience: int = 3
    convergence: Mapping[str, float] = field(default_factory=dict)
    # what the user tells of the run time (at most one; neither: no estimate)
    #: the user's run-time estimate in seconds (TrainingJob ``spec.estimatedRuntime``;
    #: 0 means none there and here)
    estimated_runtime: float | None = None
    #: a simulated user: the estimate is this factor × the true ideal run time
    estimate_factor: float | None = None
    #: the team that submitted it (its TrainingQueue when the engine runs teams' queues)
    tenant: str | None = None
    #: how many times faster it computes on a GPU type than ``compute_time`` says
    #: (type -> factor; a type not named: 1), where the engine's nodes carry types
    #: (``SimConfig.gpu_types``); communication is the same on every type
    gpu_speed: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("job id must not be empty")
        if self.workers < 1 or self.gpus_per_worker < 1:
            raise ValueError(f"job {self.id}: workers and gpus_per_worker must be >= 1")
        lo = self.workers if self.min_workers is None else self.min_workers
        hi = self.workers if self.max_workers is None else self.max_workers
        if not (1 <= lo <= self.workers <= hi):
            raise ValueError(f"job {self.id}: need 1 <= min_workers <= workers <= max_workers")
        object.__setattr__(self, "min_workers", lo)
        object.__setattr__(self, "max_workers", hi)
        klass = self.priority_class
        if klass is None:
            klass = "urgent" if self.queue == "urgent" else "normal"
        if klass not in PRIORITY_CLASSES:
            raise ValueError(f"job {self.id}: unknown priority_class {klass!r}")
        object.__setattr__(self, "priority_class", klass)
        if klass == "highest" and self.queue == "normal":
            object.__setattr__(self, "queue", "urgent")
        if self.submit_time < 0:
            raise ValueError(f"job {self.id}: submit_time must be >= 0")
        if self.compute_time <= 0 or self.grad_gb < 0 or self.batch_per_worker < 1:
            raise ValueError(f"job {self.id}: need compute_time > 0, grad_gb >= 0, batch_per_worker >= 1")
        if self.duration is not None and self.duration <= 0:
            raise ValueError(f"job {self.id}: duration must be > 0")
        self._check_batch()
        if self.max_epochs < 1 or self.patience < 1 or self.samples_per_epoch < 1:
            raise ValueError(f"job {self.id}: need max_epochs, patience, samples_per_epoch >= 1")
        if self.estimated_runtime == 0 and not isinstance(self.estimated_runtime, bool):
            object.__setattr__(self, "estimated_runtime", None)  # 0: none, as the CRD's default
        for name in ("estimated_runtime", "estimate_factor"):
            x = getattr(self, name)
            if x is not None and not (isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf")):
                raise ValueError(f"job {self.id}: {name} must be a positive finite number, got {x!r}")
        if self.estimated_runtime is not None and self.estimate_factor is not None:
            raise ValueError(f"job {self.id}: give estimated_runtime or estimate_factor, not both")
        for t, f in self.gpu_speed.items():
            if not (isinstance(t, str) and t and isinstance(f, (int, float)) and not isinstance(f, bool)
                    and 0 < f < float("inf")):
                raise ValueError(f"job {self.id}: gpu_speed needs GPU types -> positive finite factors, got {t!r}: {f!r}")

    def _check_batch(self) -> None:
        b, mb, phi = self.batch_size, self.max_batch_size, self.grad_noise_scale
        for name, x in (("batch_size", b), ("max_batch_size", mb)):
            if x is not None and (isinstance(x, bool) or not isinstance(x, int) or x < 1):
                raise ValueError(f"job {self.id}: {name} must be a whole number >= 1, got {x!r}")
        if b is None and (mb is not None or phi is not None):
            raise ValueError(f"job {self.id}: max_batch_size and grad_noise_scale need batch_size")
        if mb is not None and mb < b:
            raise ValueError(f"job {self.id}: max_batch_size {mb} < batch_size {b}")
        if phi is not None and not (isinstance(phi, (int, float)) and not isinstance(phi, bool) and 0 < phi < float("inf")):
            raise ValueError(f"job {self.id}: grad_noise_scale must be a positive finite number, got {phi!r}")
        if b is not None and self.duration is not None:
            raise ValueError(f"job {self.id}: a fixed-duration job has no batch size")

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    @property
    def adaptive_batch(self) -> bool:
        """Whether a scheduler sets its global batch (it gives ``batch_size``)."""
        return self.batch_size is not None

    @property
    def bounds(self) -> BatchBounds | None:
        """The batch bounds its TrainingJob carries (``spec.batchSize`` up to
        ``maxBatchSize``); None without ``batch_size``: no adaptive batch."""
        return None if self.batch_size is None else BatchBounds(self.batch_size, self.max_batch_size)

    def global_batch(self, workers: int, batch: int | None = None) -> int:
        """The global batch it trains at on ``workers`` workers: ``batch`` (what the
        scheduler set) or ``batch_size`` with an adaptive batch, else every worker's
        ``batch_per_worker``."""
        if self.batch_size is None:
            return workers * self.batch_per_worker
        return int(batch) if batch is not None else self.batch_size

    def batch_efficiency(self, batch: int | None = None) -> float:
        """Statistical efficiency of one sample at global batch ``batch`` (default
        ``batch_size``) relative to ``batch_size``: ``(φ + M0)/(φ + M)`` (Pollux §3.1,
        ``rlsched.core.goodput.EfficiencyModel`` with the statistics it reports, see
        :meth:`grad_stats`); 1 without a noise scale. Only for an adaptive batch."""
        if self.batch_size is None:
            raise ValueError(f"job {self.id}: no adaptive batch (batch_size is None)")
        m0 = float(self.batch_size)
        m = m0 if batch is None else float(batch)
        phi = self.grad_noise_scale
        return 1.0 if phi is None else (phi + m0) / (phi + m)

    def grad_stats(self) -> tuple[float, float] | None:
        """``(gradSqr, gradVar)`` its trainer reports (``rlsched.trainer``: ``|G|²`` and
        the per-sample ``tr(Σ)``), ``|G|²`` normalised to 1: their ratio is
        ``grad_noise_scale``. None when it measures none."""
        if self.grad_noise_scale is None:
            return None
        return 1.0, float(self.grad_noise_scale)

    def on_gpu(self, gpu_type: str) -> "JobSpec":
        """The job as it runs on GPUs of ``gpu_type``: ``compute_time`` divided by its
        ``gpu_speed`` there (itself when that is 1)."""
        f = self.gpu_speed.get(gpu_type, 1.0)
        return self if f == 1.0 else replace(self, compute_time=self.compute_time / f)

    def seed_profile(self, gpu_types: Iterable[str]) -> tuple[tuple[str, int, float], ...]:
        """The one-GPU seed profile it declares on a cluster of ``gpu_types`` (a
        TrainingJob's ``spec.seedProfile``): on each type, the step time of one GPU at
        ``batch_per_worker`` samples, ``(type, batch, seconds)``; empty without
        ``gpu_speed`` (it declares none)."""
        if not self.gpu_speed:
            return ()
        return tuple((t, self.batch_per_worker, self.on_gpu(t).compute_time) for t in sorted(set(gpu_types)))

    @property
    def fixed(self) -> bool:
        return self.duration is not None

    @property
    def has_estimate(self) -> bool:
        return self.estimated_runtime is not None or self.estimate_factor is not None

    def user_estimate(self, true_runtime: float) -> float:
        """The run time the user tells the scheduler, in seconds; 0 when none.
        ``true_runtime`` (the engine's secret ideal run time) is read only for a
        simulated user's ``estimate_factor``."""
        if self.estimated_runtime is not None:
            return float(self.estimated_runtime)
        if self.estimate_factor is not None:
            return float(self.estimate_factor) * float(true_runtime)
        return 0.0

    def convergence_model(self, seed: int, noise_values=None) -> ConvergenceModel:
        return ConvergenceModel(self.samples_per_epoch, seed=seed, noise_values=noise_values, **dict(self.convergence))

    def view(self) -> JobView:
        """A fresh pending :class:`JobView` of this job."""
        return JobView(
            id=self.id,
            submit_time=self.submit_time,
            gpus_per_worker=self.gpus_per_worker,
            workers=self.workers,
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            gpu_models=self.gpu_models,
            priority=self.priority + (HIGHEST_BONUS if self.priority_class == "highest" else 0.0),
            queue=self.queue,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            beta=self.beta,
            priority_class=self.priority_class,
        )

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["gpu_models"] = sorted(self.gpu_models) if self.gpu_models is not None else None
        d["convergence"] = dict(self.convergence)
        d["gpu_speed"] = dict(self.gpu_speed)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "JobSpec":
        allowed = set(cls.__dataclass_fields__)
        unknown = set(d) - allowed
        if unknown:
            raise ValueError(f"unknown job keys {sorted(unknown)}")
        d = dict(d)
        if d.get("gpu_models") is not None:
            models = d["gpu_models"]
            d["gpu_models"] = frozenset([models] if isinstance(models, str) else models)
        d["id"] = str(d.get("id", ""))
        return cls(**d)

    def with_(self, **changes) -> "JobSpec":
        return replace(self, **changes)


def comm_time(grad_gb: float, gpus: int, bandwidth_gbps: float) -> float:
    """Ring all-reduce time of ``grad_gb`` GB over ``gpus`` GPUs at ``bandwidth_gbps`` GB/s."""
    if gpus <= 1 or grad_gb == 0:
        return 0.0
    return 2.0 * (gpus - 1) / gpus * grad_gb / bandwidth_gbps


def ring_throughput(
    workers: int, batch_per_worker: int, compute_time: float, grad_gb: float, ring: int, bandwidth_gbps: float
) -> float:
    """Samples per second of ``workers`` synchronous data-parallel workers whose
    gradients all-reduce over a ring of ``ring`` members at ``bandwidth_gbps`` GB/s:
    ``workers * batch_per_worker / (compute_time + comm_time(grad_gb, ring, bandwidth_gbps))``.

    ``ring`` is who takes part in the all-reduce: every GPU of the job in this
    simulator (``workers * gpus_per_worker``, :func:`throughput`), one member per
    worker in RLPTO's scaling environment (a worker holds a whole node there)."""
    return workers * batch_per_worker / (compute_time + comm_time(grad_gb, ring, bandwidth_gbps))


def step_time(spec: JobSpec, workers: int, level: Level, bandwidth: Bandwidth) -> float:
    return spec.compute_time + comm_time(spec.grad_gb, workers * spec.gpus_per_worker, bandwidth.at(level))


def throughput(spec: JobSpec, workers: int, level: Level, bandwidth: Bandwidth, batch: int | None = None) -> float:
    """Samples per second at ``workers`` workers spanning ``level``; with an adaptive
    batch (``spec.batch_size``) at global batch ``batch`` (default ``batch_size``):
    each worker computes its share ``batch / workers`` at ``compute_time`` per
    ``batch_per_worker`` samples, then one all-reduce (:func:`batch_throughput`)."""
    if spec.batch_size is not None:
        return batch_throughput(spec, workers, level, bandwidth, spec.global_batch(workers, batch))
    return ring_throughput(
        workers, spec.batch_per_worker, spec.compute_time, spec.grad_gb, workers * spec.gpus_per_worker, bandwidth.at(level)
    )


def batch_throughput(spec: JobSpec, workers: int, level: Level, bandwidth: Bandwidth, batch: int) -> float:
    """Samples per second of ``workers`` workers training at global batch ``batch``:
    ``batch / (compute_time * batch / (workers * batch_per_worker) + comm_time)`` (the
    compute of a worker is linear in its share of the batch, as at
    ``batch_per_worker``; gradient accumulation changes nothing here). At ``batch =
    workers * batch_per_worker`` this is :func:`ring_throughput`."""
    if batch < 1:
        raise ValueError(f"job {spec.id}: global batch {batch} < 1")
    return batch_rate(spec, workers, batch, comm_time(spec.grad_gb, workers * spec.gpus_per_worker, bandwidth.at(level)))


def batch_rate(spec: JobSpec, workers: int, batch: int, comm: float) -> float:
    """Samples per second of ``workers`` workers at global batch ``batch`` whose
    all-reduce takes ``comm`` seconds a step (:func:`batch_throughput`'s formula)."""
    return batch / (spec.compute_time * batch / (workers * spec.batch_per_worker) + comm)


def topology_limits(topology: Topology) -> tuple[int, int]:
    """(largest NVLink domain, largest node) in GPUs: what :func:`ideal_level` needs."""
    dom = max((max(n.nvlink_domain_size, 1) for n in topology.nodes), default=1)
    return dom, max((n.gpus for n in topology.nodes), default=0)


def ideal_level(gpus: int, limits: tuple[int, int]) -> Level:
    """The finest level any placement of ``gpus`` GPUs can reach on a topology with
    :func:`topology_limits` ``limits``: one NVLink domain, one node, or one rack. Used
    for ideal (lower-bound) run times."""
    dom, node = limits
    if gpus <= dom:
        return Level.NVLINK
    if gpus <= node:
        return Level.NODE
    return Level.RACK


def best_step_time(spec: JobSpec, workers: int, bandwidth: Bandwidth, limits: tuple[int, int]) -> float:
    """Fastest step time over every level a placement could span (a lower bound)."""
    lvl = ideal_level(workers * spec.gpus_per_worker, limits)
    return min(step_time(spec, workers, Level(v), bandwidth) for v in range(int(lvl), int(Level.CLUSTER) + 1))
