"""What planning knows of a training job: the scheduling-relevant part of its spec.

The operator parses a TrainingJob's ``spec`` into a :class:`TrainingSpec`
(``rlsched.operator.spec.parse_spec``); the simulator builds one from a trace job.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..batch import BatchBounds
from ..cluster import JobView, Progress
from ..contract import DEFAULT_BACKOFF_LIMIT
from ..estimate import estimate_remaining

__all__ = ["TrainingSpec", "gang_spec"]


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    """The parts of a TrainingJob spec the scheduler decides on."""

    min_workers: int
    max_workers: int
    gpus_per_worker: int = 1
    priority_class: str = "normal"
    priority_value: float = 0.0
    beta: float = 0.001
    max_epochs: int = 100
    data_size: int = 0
    estimated_runtime: float = 0.0
    #: pinned worker count (``spec.workers``, what ``kubectl scale`` sets), or None
    pinned_workers: int | None = None
    #: ``spec.successPolicy``: ``Chief`` (worker 0 exits 0) or ``AllWorkers``
    success_policy: str = "Chief"
    #: ``spec.backoffLimit``: unexpected worker failures tolerated before the job Fails
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    #: ``spec.batchSize``: the global batch size the job asked for (None: its own choice)
    batch_size: int | None = None
    #: ``spec.maxBatchSize``: the largest global batch an adaptive policy may choose
    #: (None: ``batch_size``, a fixed global batch)
    max_batch_size: int | None = None
    #: ``spec.localBatchSize``: ``(min, max)`` samples per worker per micro-batch
    #: (None: any); larger shares run with gradient accumulation
    local_batch_size: tuple[int | None, int | None] = (None, None)
    #: the GPU models its workers may run on (the template's constraint on the
    #: cluster's models, as the extender reads it); None: any
    gpu_models: frozenset[str] | None = None
    #: ``spec.suspend``: the job holds no workers and is not admitted (Kueue's field)
    suspend: bool = False
    #: ``spec.queueName``: the team queue it names (None: its namespace's default)
    queue_name: str | None = None
    #: what one worker pod asks for besides GPUs (the worker template's effective
    #: request, :func:`~rlsched.core.contract.pod_requests`): millicores and MiB
    cpu_milli: int = 0
    memory_mib: int = 0
    #: ``spec.seedProfile``: one-GPU step times of the job's model measured before it
    #: runs, ``(GPU type or product, per-GPU batch, seconds per step)`` each (Sia's seed:
    #: how a job's speed on a GPU type it has not run on is estimated)
    seed_profile: tuple[tuple[str, int, float], ...] = ()

    @property
    def bounds(self) -> BatchBounds | None:
        """The job's batch bounds: ``batchSize`` up to ``maxBatchSize``, per worker
        ``localBatchSize``; None without ``spec.batchSize`` (each worker trains at its
        own fixed batch and the scheduler sets none)."""
        if self.batch_size is None:
            return None
        lo, hi = self.local_batch_size
        return BatchBounds(self.batch_size, self.max_batch_size, 1 if lo is None else lo, hi)

    @property
    def gang_gpus(self) -> int:
        return self.min_workers * self.gpus_per_worker

    def clamp_workers(self, n: object) -> int:
        """``n`` workers clamped into ``[minWorkers, maxWorkers]``: the only worker counts
        a running job may have, whoever wrote ``n`` (a status field is not trusted).
        Anything not a whole number gives ``minWorkers``."""
        if isinstance(n, bool) or not isinstance(n, (int, float)) or n != n or n in (float("inf"), float("-inf")):
            return self.min_workers
        return max(self.min_workers, min(self.max_workers, int(n)))

    def view(self, key: str, *, submit_time: float, workers: int, priority: float, ran: float = 0.0,
             **state) -> JobView:
        """The job as policies see it: the spec's bounds, GPUs, β and the user's run-time
        estimate (never a true run time), plus the live ``state`` (queue, progress,
        start time, placement). ``remaining`` (unless given) is core's estimate from the
        user's estimate, the reported epochs and ``ran``, the seconds the job has run
        (:func:`rlsched.core.estimate.estimate_remaining`: the simulator's rule too)."""
        if "remaining" not in state:
            prog = state.get("progress") or Progress()
            state["remaining"] = estimate_remaining(self.estimated_runtime, ran, prog.epochs_done, self.max_epochs)
        return JobView(
            id=key,
            submit_time=submit_time,
            gpus_per_worker=self.gpus_per_worker,
            workers=workers,
            min_workers=self.min_workers,
            max_workers=self.max_workers,
            priority=priority,
            est_runtime=self.estimated_runtime,
            beta=self.beta,
            gpu_models=self.gpu_models,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            priority_class=self.priority_class,
            max_epochs=self.max_epochs,
            pinned_workers=self.pinned_workers,
            **state,
        )


def gang_spec(v: JobView) -> TrainingSpec:
    """The spec of ``v``'s gang as admission holds it: its ``workers`` (no more, no
    fewer), their GPUs, GPU models, CPU and memory, and its service class. One object
    per shape."""
    return _gang(v.workers, v.gpus_per_worker, v.priority_class, v.gpu_models, v.cpu_milli, v.memory_mib)


@lru_cache(maxsize=4096)
def _gang(workers: int, gpus_per_worker: int, priority_class: str, gpu_models: frozenset[str] | None,
          cpu_milli: int, memory_mib: int) -> TrainingSpec:
    return TrainingSpec(min_workers=workers, max_workers=workers, gpus_per_worker=gpus_per_worker,
                        priority_class=priority_class, gpu_models=gpu_models, cpu_milli=cpu_milli,
                        memory_mib=memory_mib)
