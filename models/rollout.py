"""The one rollout pool: run rollout functions in several simulator processes.

:class:`RolloutPool` maps a picklable top-level function over tasks in ``workers``
processes (``spawn`` start method, so torch state in the learner is never forked), in
order. With ``workers`` 0 or 1 everything runs in the learner's process (tests,
debugging, and no gain from a single extra process). Two ways to call it:

- ``pool.map(fn, tasks)`` -> ``[fn(t) for t in tasks]``: the tasks carry their own seeds
  (DAS, A2C, DQN and HierRL draw them from the learner's generator);
- ``pool.run(fn, payloads)`` -> ``[fn(p, seed_k) ...]``: each task gets its own seed
  from one :class:`numpy.random.SeedSequence` per round (:func:`task_seeds`), so a run is
  reproducible for a given ``seed`` whatever the number of workers (RLPTO).

:class:`RayRolloutPool` is the optional Ape-X-style engine for larger runs (Horgan et
al., ICLR 2018: many actors generate experience with a recent copy of the policy, one
learner consumes it): the same interface, executed by Ray actors. Ray is an optional
extra (``pip install 'rlsched[ray]'``) and is imported only when that pool is built;
without it :class:`EngineUnavailable` says how to install it. :func:`make_pool` picks
the engine by name (``--engine``).

Also the two small helpers every iteration loop needs: :func:`split_episodes` (episodes
per worker) and :func:`merge` (concatenate the workers' result dicts).
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["RolloutPool", "RayRolloutPool", "EngineUnavailable", "make_pool", "task_seeds", "split_episodes", "merge"]


class EngineUnavailable(RuntimeError):
    """The rollout engine asked for cannot run here (Ray is not installed)."""


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


class RayRolloutPool(_Seeded):
    """Ape-X-style actors on Ray with :class:`RolloutPool`'s interface (optional extra)."""

    def __init__(self, workers: int = 4, seed: int = 0, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:  # the documented optional extra
            raise EngineUnavailable(
                "the Ray rollout engine needs Ray, which is not installed: pip install 'rlsched[ray]', or use --engine process"
            ) from None
        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, include_dashboard=False)

        @ray.remote
        class _Actor:
            def call(self, fn, task):
                return fn(task)

        self.workers = workers
        self.seed = seed
        self._round = 0
        self._actors = [_Actor.remote() for _ in range(workers)]

    def __enter__(self) -> "RayRolloutPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for a in self._actors:
            self._ray.kill(a)
        self._actors = []

    def map(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> list[Any]:
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
