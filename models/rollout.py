"""The one rollout pool: run rollout functions in several simulator processes.

:class:`RolloutPool` maps a picklable function over tasks in ``spawn``-ed processes, in
order (``map``: the tasks carry their seeds; ``run``: one seed per task from a
SeedSequence); :class:`RayRolloutPool` is the same interface on Ray actors (an optional
extra), with the same results; :func:`make_pool` picks the engine.
Details: docs/design-notes.md.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["RolloutPool", "RayRolloutPool", "RayRuntime", "import_ray", "EngineUnavailable", "make_pool", "task_seeds", "split_episodes", "merge"]


class EngineUnavailable(RuntimeError):
    """The rollout engine asked for cannot run here (Ray is not installed or does not start)."""


def task_seeds(seed: int, n: int, round_: int = 0) -> list[int]:
    """``n`` independent 32-bit seeds for round ``round_`` of a run seeded with ``seed``."""
    ss = np.random.SeedSequence([int(seed), int(round_)])
    return [int(s.generate_state(1)[0]) for s in ss.spawn(n)]


def _call(args):
    fn, payload, seed = args
    return fn(payload, seed)


class _Seeded:
    """``run`` on top of ``map``: one seed per task, a new round per call."""

    seed: int
    _round: int

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def run(self, fn: Callable[[Any, int], Any], payloads: Sequence[Any]) -> list[Any]:
        """``[fn(p, seed_k) for k, p in enumerate(payloads)]``, in parallel, in order."""
        seeds = task_seeds(self.seed, len(payloads), self._round)
        self._round += 1
        return self.map(_call, [(fn, p, s) for p, s in zip(payloads, seeds)])


class RolloutPool(_Seeded):
    """Map rollout tasks over worker processes; use as a context manager."""

    def __init__(self, workers: int = 2, seed: int = 0) -> None:
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        self.workers = workers
        self.seed = seed
        self._round = 0
        self._pool = None

    @property
    def in_process(self) -> bool:
        return self.workers <= 1

    def __enter__(self) -> "RolloutPool":
        if not self.in_process:
            self._pool = mp.get_context("spawn").Pool(self.workers)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        """``[fn(t) for t in tasks]``, in parallel, in order."""
        if self.in_process:
            return [fn(t) for t in tasks]
        if self._pool is None:
            raise RuntimeError("RolloutPool.map outside its `with` block")
        return self._pool.map(fn, tasks, chunksize=1)


def import_ray():
    """The ``ray`` module, or :class:`EngineUnavailable` with the install hint."""
    try:
        import ray
    except ImportError:  # the documented optional extra
        raise EngineUnavailable(
            "the Ray engine needs Ray, which is not installed: pip install 'rlsched[ray]' (ray==2.60.0), or use --engine process"
        ) from None
    return ray


class RayRuntime:
    """A local Ray runtime of its own for one training run: started with ``num_cpus`` CPUs, no
    dashboard and quiet logs (warnings and the workers' output are not echoed; errors
    still reach the learner through ``ray.get``), and shut down on :meth:`close` when
    this object started it. A runtime already initialised in the process (a test's
    ``ray.init(num_cpus=2)``) is used as it is and left running."""

    def __init__(self, num_cpus: int) -> None:
        self.ray = import_ray()
        self.owned = False
        if self.ray.is_initialized():
            return
        try:
            self.ray.init(
                address="local",  # this run's own runtime, never a cluster found on the machine (RAY_ADDRESS, `ray start`)
                num_cpus=max(int(num_cpus), 1),
                include_dashboard=False,
                logging_level=logging.ERROR,
                log_to_driver=False,
                configure_logging=True,
            )
        except Exception as exc:  # any start failure: one clear error, not Ray's traceback
            raise EngineUnavailable(f"Ray failed to start a local runtime ({type(exc).__name__}: {exc}); use --engine process") from exc
        self.owned = True

    def close(self) -> None:
        if self.owned and self.ray.is_initialized():
            self.ray.shutdown()
        self.owned = False


class _RayWorker:
    """One rollout worker: calls what it is given (a Ray actor with one CPU)."""

    def call(self, fn, task):
        return fn(task)


class RayRolloutPool(_Seeded):
    """:class:`RolloutPool`'s interface on ``workers`` Ray actors (optional extra).

    ``map`` sends task ``k`` to actor ``k % workers`` and returns the results in the
    order of the tasks; ``run`` draws the same seeds as :class:`RolloutPool`, so a run is
    the same on either engine. The runtime is sized ``num_cpus=workers``
    (:class:`RayRuntime`); use the pool as a context manager (``close`` kills the actors
    and stops the runtime it started)."""

    def __init__(self, workers: int = 2, seed: int = 0) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1 on Ray, got {workers}")
        self.workers = workers
        self.seed = seed
        self._round = 0
        self._runtime = RayRuntime(workers)
        self._ray = self._runtime.ray
        worker = self._ray.remote(num_cpus=1)(_RayWorker)
        self._actors = [worker.remote() for _ in range(workers)]

    def __enter__(self) -> "RayRolloutPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for a in self._actors:
            self._ray.kill(a)
        self._actors = []
        self._runtime.close()

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
        """``[fn(t) for t in tasks]`` on the actors, in order."""
        if not self._actors:
            raise RuntimeError("RayRolloutPool.map after close()")
        refs = [self._actors[k % len(self._actors)].call.remote(fn, t) for k, t in enumerate(tasks)]
        return self._ray.get(refs)


def make_pool(engine: str = "process", workers: int = 2, seed: int = 0):
    """``"process"`` (local worker processes; ``"local"`` is an alias) or ``"ray"``."""
    if engine in ("process", "local"):
        return RolloutPool(workers, seed)
    if engine == "ray":
        return RayRolloutPool(max(workers, 1), seed)
    raise ValueError(f"unknown rollout engine {engine!r}; use 'process' or 'ray'")


def split_episodes(total: int, workers: int) -> list[int]:
    """Episodes per rollout task for one iteration: ``total`` spread as evenly as
    possible over ``max(workers, 1)`` tasks, the first ones taking the remainder."""
    workers = max(int(workers), 1)
    return [total // workers + (1 if k < total % workers else 0) for k in range(workers)]


def merge(parts: Sequence[dict]) -> dict:
    """Concatenate the lists of several rollout results key by key."""
    out: dict[str, list] = {}
    for p in parts:
        for k, v in p.items():
            out.setdefault(k, []).extend(v)
    return out
