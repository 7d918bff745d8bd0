"""Rollouts from several simulator processes.

:class:`RolloutPool` runs a picklable ``fn(payload, seed) -> result`` in worker
processes (2 by default, ``spawn`` start method so that torch state in the learner is
never forked). Each task gets its own seed from one :class:`numpy.random.SeedSequence`,
so a run is reproducible for a given ``seed`` whatever the number of workers. With
``workers=0`` everything runs in-process (tests, debugging).

:class:`RayRolloutPool` is the optional Ape-X-style engine for larger runs (Horgan et
al., ICLR 2018: many actors generate experience with a recent copy of the policy, one
learner consumes it): the same ``run`` interface, executed by Ray actors that keep their
environment between calls. Ray is an optional extra (``pip install rlsched[ray]``) and is
imported only when this class is constructed.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["RolloutPool", "RayRolloutPool", "make_pool", "task_seeds"]


def task_seeds(seed: int, n: int, round_: int = 0) -> list[int]:
    """``n`` independent 32-bit seeds for round ``round_`` of a run seeded with ``seed``."""
    ss = np.random.SeedSequence([int(seed), int(round_)])
    return [int(s.generate_state(1)[0]) for s in ss.spawn(n)]


def _call(args):
    fn, payload, seed = args
    return fn(payload, seed)


class RolloutPool:
    """Map rollout tasks over worker processes; use as a context manager."""

    def __init__(self, workers: int = 2, seed: int = 0) -> None:
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        self.workers = workers
        self.seed = seed
        self._round = 0
        self._pool = None

    def __enter__(self) -> "RolloutPool":
        if self.workers > 0:
            self._pool = mp.get_context("spawn").Pool(self.workers)
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()
            self._pool = None

    def run(self, fn: Callable[[Any, int], Any], payloads: Sequence[Any]) -> list[Any]:
        """``[fn(p, seed_k) for k, p in enumerate(payloads)]``, in parallel, in order."""
        seeds = task_seeds(self.seed, len(payloads), self._round)
        self._round += 1
        tasks = [(fn, p, s) for p, s in zip(payloads, seeds)]
        if self._pool is None:
            if self.workers > 0:
                raise RuntimeError("RolloutPool.run outside its `with` block")
            return [_call(t) for t in tasks]
        return self._pool.map(_call, tasks, chunksize=1)


class RayRolloutPool:
    """Ape-X-style actors on Ray with :class:`RolloutPool`'s interface (optional extra)."""

    def __init__(self, workers: int = 4, seed: int = 0, address: str | None = None) -> None:
        try:
            import ray
        except ImportError as exc:  # the documented optional extra
            raise RuntimeError("the Ray rollout engine needs the optional extra: pip install 'rlsched[ray]'") from exc
        self._ray = ray
        if not ray.is_initialized():
            ray.init(address=address, ignore_reinit_error=True, include_dashboard=False)

        @ray.remote
        class _Actor:
            def run(self, fn, payload, seed):
                return fn(payload, seed)

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

    def run(self, fn: Callable[[Any, int], Any], payloads: Sequence[Any]) -> list[Any]:
        seeds = task_seeds(self.seed, len(payloads), self._round)
        self._round += 1
        refs = [self._actors[k % len(self._actors)].run.remote(fn, p, s) for k, (p, s) in enumerate(zip(payloads, seeds))]
        return self._ray.get(refs)


def make_pool(engine: str = "process", workers: int = 2, seed: int = 0):
    """``"process"`` (local worker processes; ``"local"`` is an alias) or ``"ray"``."""
    if engine in ("process", "local"):
        return RolloutPool(workers, seed)
    if engine == "ray":
        return RayRolloutPool(max(workers, 1), seed)
    raise ValueError(f"unknown rollout engine {engine!r}; use 'process' or 'ray'")
