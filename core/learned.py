"""Learned scalings served with numpy: RLPTO (Lu et al., IEEE TPDS 34(12), 2023).

RLPTO's PPO actor decides, for every running job, to add or remove workers or keep them,
from eleven features (:func:`rlpto_observation`, computed identically in training and
serving). :class:`RLPTOScaling` loads ``weights/rlpto.safetensors`` and falls back to the
``fs`` heuristic, saying why in ``fallback_reason``, when the file is missing, corrupt or
of another layout. The features: docs/design-notes.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np

from .cluster import ClusterState, JobView
from .nn import PolicyFileError, load_policy_file, mlp
from .ordering import remaining_time
from .policy import make_scaling, register_scaling

__all__ = ["RLPTO_FEATURES", "RLPTO_LAYOUT", "rlpto_observation", "job_observation", "remaining_rank", "RLPTOActor",
           "RLPTOScaling", "DEFAULT_WEIGHTS"]

RLPTO_FEATURES = ("m", "e", "l", "n", "a", "c", "w", "s", "x", "r", "q")
#: observation layout: 1 = the paper's seven features (m..w), 2 = + s, x, r, q
RLPTO_LAYOUT = 2
#: features of each layout a model file may declare
LAYOUT_FEATURES = {1: RLPTO_FEATURES[:7], 2: RLPTO_FEATURES}
#: action index -> sign of the worker change (times the step ``i``)
RLPTO_ACTIONS = (-1, 0, 1)
DEFAULT_WEIGHTS = Path(__file__).resolve().parent / "weights" / "rlpto.safetensors"


def rlpto_observation(
    *,
    free: float,
    total: float,
    epoch: float,
    loss: float,
    max_loss: float,
    pending: float,
    accuracy: float,
    gain: float,
    beta: float,
    workers: float,
    speedup: float,
    stat_efficiency: float,
    rank: float,
    queued_gpus: float,
    total_gpus: float,
) -> np.ndarray:
    """The eleven RLPTO features (see the module table) as a float32 vector.

    ``speedup``: throughput at ``workers + 1`` over throughput now (0: unknown);
    ``stat_efficiency``: efficiency of a sample at ``workers + 1`` over now (0: unknown);
    ``rank``: the job's rank in remaining work among running jobs, already in [0, 1]
    (:func:`remaining_rank`); ``queued_gpus``: GPUs the waiting jobs ask for, of
    ``total_gpus``."""
    total = max(float(total), 1.0)
    if math.isfinite(loss) and math.isfinite(max_loss) and max_loss > 0:
        l_feat = min(max(loss / max_loss, 0.0), 2.0)
    else:
        l_feat = 1.0
    if math.isinf(gain) and gain > 0:
        c = 1.0  # fewer than two evaluations: treat as still learning fast
    elif math.isfinite(gain):
        c = min(max(gain / max(beta, 1e-12), -10.0), 10.0) / 10.0
    else:
        c = 0.0
    return np.array(
        [
            min(max(free / total, 0.0), 1.0),
            min(max(epoch, 0.0), 100.0) / 100.0,
            l_feat,
            min(max(pending, 0.0), total) / total,
            min(max(accuracy, 0.0), 1.0),
            c,
            min(max(workers, 0.0), 16.0) / 16.0,
            min(max(speedup - 1.0, 0.0), 1.0) if speedup > 0 and math.isfinite(speedup) else 0.0,
            min(max(stat_efficiency, 0.0), 1.0) if stat_efficiency > 0 and math.isfinite(stat_efficiency) else 1.0,
            min(max(rank, 0.0), 1.0) if math.isfinite(rank) else 1.0,
            min(max(queued_gpus, 0.0) / max(float(total_gpus), 1.0), 2.0) / 2.0,
        ],
        dtype=np.float32,
    )


def remaining_rank(job: JobView, state: ClusterState) -> float:
    """The job's rank in estimated remaining work among the running jobs of ``state``,
    scaled to [0, 1] (0: the least work left; a job alone ranks 0).

    Remaining work is :func:`~rlsched.core.ordering.remaining_time` (the non-clairvoyant
    estimate from progress) times the GPUs the job holds; jobs whose remaining time is
    unknown rank after every known one, ties go by submit time then id."""
    others = [v for v in state.running.values() if v.id != job.id]
    if not others:
        return 0.0

    def key(v: JobView) -> tuple:
        r = remaining_time(v)
        return ((0, r * v.gpus) if r > 0 else (1, 0.0), v.submit_time, v.id)

    mine = key(job)
    below = sum(1 for v in others if key(v) < mine)
    return below / len(others)


def job_observation(job: JobView, state: ClusterState) -> np.ndarray:
    """RLPTO features of a running job from a cluster snapshot (GPUs count as slots
    of ``job.gpus_per_worker``)."""
    g = job.gpus_per_worker
    p = job.progress
    return rlpto_observation(
        free=state.free_gpus / g,
        total=state.total_gpus / g,
        epoch=p.epoch,
        loss=p.loss,
        max_loss=p.max_loss,
        pending=len(state.pending),
        accuracy=p.accuracy,
        gain=p.gain,
        beta=job.beta,
        workers=job.workers,
        speedup=job.speedup,
        stat_efficiency=job.stat_efficiency,
        rank=remaining_rank(job, state),
        queued_gpus=sum(v.workers * v.gpus_per_worker for v in state.pending),
        total_gpus=state.total_gpus,
    )


class RLPTOActor:
    """Numpy forward of the exported PPO actor: ``obs [B, 11] -> logits [B, 3]``; a
    file of another observation layout is refused with :class:`PolicyFileError`."""

    def __init__(self, weights: dict[str, np.ndarray], metadata: dict) -> None:
        arch = metadata.get("architecture", {})
        n_layers = int(arch.get("actor_layers", 0))
        if n_layers < 1:
            raise PolicyFileError("rlpto metadata: architecture.actor_layers missing")
        try:
            self.layers = [(weights[f"actor.{k}.weight"], weights[f"actor.{k}.bias"]) for k in range(0, 2 * n_layers, 2)]
        except KeyError as exc:
            raise PolicyFileError(f"rlpto weights: tensor {exc.args[0]!r} missing") from None
        self.activation = str(arch.get("activation", "tanh"))
        obs = metadata.get("observation", {})
        layout = int(obs.get("layout", 1))  # files written before layouts existed: the paper's 7 features
        if layout != RLPTO_LAYOUT or list(obs.get("features", LAYOUT_FEATURES.get(layout, ()))) != list(RLPTO_FEATURES):
            got = LAYOUT_FEATURES.get(layout, obs.get("features", "?"))
            raise PolicyFileError(
                f"rlpto model has observation layout {layout} ({len(got)} features {','.join(map(str, got))}); "
                f"this rlsched computes layout {RLPTO_LAYOUT} ({len(RLPTO_FEATURES)} features {','.join(RLPTO_FEATURES)}): "
                "retrain it (rlsched train rlpto) and promote the run")
        if self.layers[0][0].shape[1] != len(RLPTO_FEATURES) or self.layers[-1][0].shape[0] != len(RLPTO_ACTIONS):
            raise PolicyFileError(f"rlpto weights: actor must map {len(RLPTO_FEATURES)} features to 3 actions, "
                                  f"got {self.layers[0][0].shape[1]} -> {self.layers[-1][0].shape[0]}")
        self.step = int(metadata.get("observation", {}).get("action_step", 1))

    def logits(self, obs: np.ndarray) -> np.ndarray:
        return mlp(np.asarray(obs, dtype=np.float32), self.layers, self.activation)


@register_scaling("rlpto")
class RLPTOScaling:
    """RLPTO elastic scaling: the exported PPO actor, greedy, over each running job.

    Keeps every job within ``[min_workers, max_workers]``; grows a job only when a node
    can host the new worker (checked with tentative allocations, released before
    returning, counting GPUs this call's shrinks free up). Jobs that want to grow are
    served in order of the actor's preference for growing.
    """

    name = "rlpto"

    def __init__(
        self,
        *,
        path: str | Path | None = None,
        rng: np.random.Generator | None = None,
        fallback: str = "fs",
    ) -> None:
        self.path = Path(path) if path is not None else DEFAULT_WEIGHTS
        self.rng = rng
        self.fallback_reason: str | None = None
        self.metadata: dict = {}
        self._actor: RLPTOActor | None = None
        self._fallback = None
        try:
            weights, meta = load_policy_file(self.path, policy="rlpto")
            self._actor = RLPTOActor(weights, meta)
            self.metadata = meta
        except PolicyFileError as exc:
            self.fallback_reason = f"{exc}; deciding with the {fallback!r} heuristic instead"
            try:
                self._fallback = make_scaling(fallback)
            except ValueError:
                self.fallback_reason = f"{exc}; heuristic {fallback!r} unavailable, not scaling"
                self._fallback = make_scaling("none")

    @property
    def step(self) -> int:
        return self._actor.step if self._actor else 1

    def __repr__(self) -> str:
        return f"RLPTOScaling(path={str(self.path)!r}, fallback={self.fallback_reason is not None})"

    def probabilities(self, running: Sequence[JobView], state: ClusterState) -> np.ndarray:
        """Actor probabilities ``[len(running), 3]`` over (−i, 0, +i)."""
        if self._actor is None:
            raise RuntimeError(f"rlpto policy not loaded: {self.fallback_reason}")
        if not running:
            return np.zeros((0, 3))
        obs = np.stack([job_observation(j, state) for j in running])
        z = self._actor.logits(obs)
        z = z - z.max(axis=1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def decide(self, running: Sequence[JobView], state: ClusterState) -> dict[str, int]:
        if self._actor is None:
            return self._fallback.decide(running, state)
        probs = self.probabilities(running, state)
        step = self.step
        out: dict[str, int] = {}
        grow: list[tuple[float, JobView]] = []
        freed: list[tuple[JobView, list[int]]] = []
        for job, p in zip(running, probs):
            a = RLPTO_ACTIONS[int(np.argmax(p))]
            if a < 0:
                k = min(step, job.workers - job.min_workers, len(job.placement) if job.placement else step)
                if k > 0:
                    out[job.id] = -k
                    nodes = list(job.placement[-k:]) if job.placement else []
                    freed.append((job, nodes))
            elif a > 0 and job.workers < job.max_workers:
                grow.append((float(p[2]), job))
        taken: list[tuple[JobView, int]] = []
        try:
            for job, nodes in freed:
                state.release_job(job, nodes)
            for _, job in sorted(grow, key=lambda t: -t[0]):
                k = min(step, job.max_workers - job.workers)
                got = 0
                for _ in range(k):
                    i = state.first_fit(job.gpus_per_worker, job.gpu_models)
                    if i is None:
                        break
                    state.allocate(i, job.gpus_per_worker, job.cpu_milli, job.memory_mib)
                    taken.append((job, i))
                    got += 1
                if got:
                    out[job.id] = got
        finally:
            for job, i in taken:
                state.release(i, job.gpus_per_worker, job.cpu_milli, job.memory_mib)
            for job, nodes in freed:
                state.allocate_job(job, nodes)
        return out
