"""RLPTO's elastic-scaling environment over :class:`~rlsched.sim.convergence.ConvergenceModel`.

A cluster of ``nodes`` nodes with one worker slot each (``gpus_per_node`` GPUs; a
worker takes them all) runs a set of elastic training jobs that arrive over time.
Time advances in decision intervals of ``interval`` seconds. In every interval:

1. pending jobs start first-come first-served with as many of their requested workers
   as fit (at least ``min_workers``);
2. the scaling decides ``+i / −i / 0`` workers per running job — either a
   :class:`~rlsched.core.policy.Scaling` policy over the same
   :class:`~rlsched.core.ClusterState` / :class:`~rlsched.core.JobView` snapshot the
   operator builds (:meth:`ScalingEnv.step_policy`), or RL actions (:meth:`ScalingEnv.step`);
3. every running job processes ``throughput(w) · interval`` samples. Its accuracy is
   evaluated after each epoch (the convergence model's curve plus its seeded noise);
   it stops when ``patience`` consecutive evaluations gain less than its ``beta``, or
   at ``max_epochs`` (the β rule of RLPTO, as ``sim.convergence.stop_epoch``). The
   baselines' ``stop="epochs"`` trains every job for ``max_epochs``, its epoch budget
   (``budget``: an oracle or a user's recipe, see :func:`make_jobs`).

Throughput of ``w`` workers is synchronous data parallelism with ring all-reduce,
the simulator's formula (:func:`rlsched.sim.job.ring_throughput`) with one ring member
per worker: ``w · batch / (compute + 2 (w − 1)/w · grad_gb / bandwidth)`` samples/s; each sample
is worth ``efficiency(w)`` effective samples (the convergence model's large-batch
discount), so adding workers has diminishing returns.

RL interface (parameter sharing: every running job is an agent of one policy):
``reset(seed) -> obs``; ``step({job_id: action}) -> (obs, rewards, dones, info)``,
actions index ``(−i, 0, +i)``. The reward of a job for an interval is RLPTO's

    r = v_a + sign(v_a − β0) · T · w · k_w,   k_w = 0.000625

with ``v_a`` the accuracy the job gained during the interval (on its noise-free curve,
the simulator's denoised measurement, so the ``v_a`` of an episode sum to the accuracy
gained), ``T`` the interval in minutes and ``w`` its workers during the interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from rlsched.core import ClusterState, JobView, Topology
from rlsched.core.learned import rlpto_observation

from .convergence import ConvergenceModel
from .job import ring_throughput

__all__ = ["ScalingJob", "ScalingEnvConfig", "ScalingEnv", "make_jobs", "EpisodeResult", "K_W", "BUDGETS"]

#: RLPTO's worker-cost coefficient k_w
K_W = 0.000625
ACTIONS = (-1, 0, 1)
#: epoch-budget models of :func:`make_jobs`
BUDGETS = ("oracle", "recipe")
#: range of the per-job over-provisioning factor of the "recipe" budget: a user's
#: budget is at best what the job needs and at most twice that (mean 1.5x); chosen once,
#: before any RLPTO result under it was seen (docs/training.md)
OVERPROVISION = (1.0, 2.0)


@dataclass(frozen=True, slots=True)
class ScalingJob:
    """An elastic training job of the scaling environment."""

    id: str
    submit_time: float
    workers: int = 2
    min_workers: int = 1
    max_workers: int = 8
    batch_per_worker: int = 32
    compute_time: float = 0.2
    grad_gb: float = 0.2
    samples_per_epoch: int = 50_000
    max_epochs: int = 60
    patience: int = 3  # evaluations gaining < β before the β rule stops the job
    convergence: Mapping[str, float] = field(default_factory=dict)

    def throughput(self, w: int, bandwidth_gbps: float) -> float:
        """Samples per second with ``w`` workers: the simulator's
        :func:`~rlsched.sim.job.ring_throughput` with one ring member per worker."""
        if w <= 0:
            return 0.0
        return ring_throughput(w, self.batch_per_worker, self.compute_time, self.grad_gb, w, bandwidth_gbps)


@dataclass(frozen=True)
class ScalingEnvConfig:
    nodes: int = 12
    gpus_per_node: int = 1
    interval: float = 60.0
    bandwidth_gbps: float = 12.5
    beta: float = 0.0003  # stopping threshold β of every job
    beta0: float | None = None  # reward threshold β0 (default: beta)
    k_w: float = K_W
    step: int = 1  # i: workers added/removed by one action
    n_jobs: int = 16
    mean_interarrival: float = 300.0
    max_time: float = 4 * 86400.0
    #: how a job ends: "beta" (RLPTO's rule: ``patience`` evaluations gaining < β, or
    #: max_epochs) or "epochs" (the traditional fixed epoch budget, max_epochs)
    stop: str = "beta"
    #: epoch budget of the generated jobs (:func:`make_jobs`): "oracle" or "recipe"
    budget: str = "oracle"

    def __post_init__(self) -> None:
        if self.budget not in BUDGETS:
            raise ValueError(f"budget must be one of {BUDGETS}, not {self.budget!r}")
        if self.stop not in ("beta", "epochs"):
            raise ValueError(f"stop must be 'beta' or 'epochs', not {self.stop!r}")
        if self.nodes < 1 or self.interval <= 0 or self.step < 1 or self.n_jobs < 1:
            raise ValueError("need nodes >= 1, interval > 0, step >= 1, n_jobs >= 1")
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")


def make_jobs(
    rng: np.random.Generator,
    n: int,
    mean_interarrival: float = 300.0,
    max_workers: int = 8,
    converged_gap: float = 0.001,
    budget: str = "oracle",
    overprovision: tuple[float, float] = OVERPROVISION,
) -> list[ScalingJob]:
    """A synthetic elastic workload: Poisson arrivals; dataset size, step time, gradient
    size and convergence curve drawn per job (the first job arrives at 0).

    ``budget`` sets each job's epoch budget ``max_epochs``:

    * ``"oracle"``: the epochs its noise-free curve needs, at the workers it asks for, to
      come within ``converged_gap`` (0.1 accuracy points) of its plateau — a budget no
      user can know before training;
    * ``"recipe"``: a budget set from a recipe before training, independent of the
      curve: the oracle epochs times a factor drawn per job from
      ``U(*overprovision)``, rounded up. The factors are drawn after every other
      attribute, so for one seed both models give the same jobs except ``max_epochs``.
    """
    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {BUDGETS}, not {budget!r}")
    lo, hi = overprovision
    if not 1.0 <= lo <= hi:
        raise ValueError(f"overprovision must be (lo, hi) with 1 <= lo <= hi, got {overprovision!r}")
    t = 0.0
    jobs = []
    for k in range(n):
        if k:
            t += float(rng.exponential(mean_interarrival))
        workers = int(rng.choice([1, 2, 2, 4]))
        conv = {
            "acc_max": float(rng.uniform(0.75, 0.95)),
            "acc0": 0.1,
            "tau": float(rng.uniform(3.0, 8.0)),
            "gamma": float(rng.uniform(0.02, 0.1)),
            "noise": 0.0005,
            "seed": int(rng.integers(2**31)),
        }
        spe = int(rng.integers(20_000, 80_001))
        needed = ConvergenceModel(spe, **conv).epochs_to(conv["acc_max"] - converged_gap, workers)
        jobs.append(
            ScalingJob(
                id=f"job-{k:03d}",
                submit_time=t,
                workers=workers,
                max_epochs=max(int(math.ceil(needed)), 1),
                min_workers=1,
                max_workers=max_workers,
                compute_time=float(rng.uniform(0.1, 0.3)),
                grad_gb=float(rng.uniform(0.05, 0.5)),
                samples_per_epoch=spe,
                convergence=conv,
            )
        )
    if budget == "recipe":
        factors = rng.uniform(lo, hi, size=n)
        jobs = [replace(j, max_epochs=int(math.ceil(j.max_epochs * float(f)))) for j, f in zip(jobs, factors)]
    return jobs


@dataclass
class EpisodeResult:
    """Outcome of one episode: what RLPTO's Tables II/III report, plus detail."""

    total_time: float  # makespan: first submission to last finish, seconds
    mean_accuracy: float  # mean final accuracy over jobs
    mean_jct: float
    accuracies: dict[str, float]
    finish: dict[str, float]
    epochs: dict[str, int]
    gpu_seconds: float


class _Run:
    """Mutable state of one job in an episode."""

    __slots__ = ("spec", "view", "conv", "samples", "eff", "streak", "done", "finish")

    def __init__(self, spec: ScalingJob, beta: float) -> None:
        self.spec = spec
        self.conv = ConvergenceModel(spec.samples_per_epoch, **dict(spec.convergence))
        self.view = JobView(
            id=spec.id,
            submit_time=spec.submit_time,
            workers=spec.workers,
            min_workers=spec.min_workers,
            max_workers=spec.max_workers,
            beta=beta,
        )
        self.view.progress.accuracy = self.conv.acc0
        self.view.progress.max_loss = self.conv.loss0
        self.view.progress.loss = self.conv.loss0
        self.samples = 0.0
        self.eff = 0.0  # effective epochs
        self.streak = 0
        self.done = False
        self.finish = math.nan


class ScalingEnv:
    """The RLPTO elastic-scaling environment (see the module docstring)."""

    def __init__(self, config: ScalingEnvConfig | None = None, jobs: Sequence[ScalingJob] | None = None,
                 job_factory: Callable[[np.random.Generator], Sequence[ScalingJob]] | None = None) -> None:
        self.config = config or ScalingEnvConfig()
        self._fixed_jobs = list(jobs) if jobs is not None else None
        self._factory = job_factory
        self.topology = Topology.uniform(self.config.nodes, gpus_per_node=self.config.gpus_per_node)
        self.state: ClusterState | None = None
        self.time = 0.0
        self.runs: dict[str, _Run] = {}
        self._queue: list[_Run] = []  # arrived, waiting to start
        self._future: list[_Run] = []  # not yet arrived

    # ------------------------------------------------------------------ episode
    def reset(self, seed: int | None = None) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        if self._fixed_jobs is not None:
            specs = self._fixed_jobs
        elif self._factory is not None:
            specs = list(self._factory(rng))
        else:
            specs = make_jobs(rng, self.config.n_jobs, self.config.mean_interarrival, budget=self.config.budget)
        cfg = self.config
        self.state = ClusterState(self.topology)
        self.time = min(s.submit_time for s in specs)
        self.t0 = self.time
        self.runs = {}
        for s in sorted(specs, key=lambda s: (s.submit_time, s.id)):
            s = replace(s, max_workers=min(s.max_workers, cfg.nodes), workers=min(s.workers, cfg.nodes))
            self.runs[s.id] = _Run(s, cfg.beta)
        self._future = list(self.runs.values())
        self._queue = []
        self._arrive()
        self._admit()
        return self.observe()

    @property
    def done(self) -> bool:
        return all(r.done for r in self.runs.values())

    def running(self) -> list[JobView]:
        return list(self.state.running.values())

    def observe(self) -> dict[str, np.ndarray]:
        """RLPTO features of every running job (see :func:`rlsched.core.learned.rlpto_observation`)."""
        st = self.state
        total = st.total_gpus / self.config.gpus_per_node
        free = st.free_gpus / self.config.gpus_per_node
        pending = len(st.pending)
        out = {}
        for jid, v in st.running.items():
            p = v.progress
            out[jid] = rlpto_observation(
                free=free, total=total, epoch=p.epoch, loss=p.loss, max_loss=p.max_loss, pending=pending,
                accuracy=p.accuracy, gain=p.gain, beta=v.beta, workers=v.workers,
            )
        return out

    # ------------------------------------------------------------------ stepping
    def step(self, actions: Mapping[str, int]) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, bool], dict]:
        """Apply action indices ``{job_id: 0|1|2}`` meaning ``(−i, 0, +i)``, advance one interval."""
        i = self.config.step
        deltas = {}
        for jid, a in actions.items():
            if not 0 <= int(a) < 3:
                raise ValueError(f"action for {jid} must be 0, 1 or 2, got {a}")
            if ACTIONS[int(a)]:
                deltas[jid] = ACTIONS[int(a)] * i
        return self._advance(deltas)

    def step_policy(self, policy) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, bool], dict]:
        """Let a :class:`~rlsched.core.policy.Scaling` decide on the live snapshot, then advance."""
        return self._advance(policy.decide(self.running(), self.state))

    def _advance(self, deltas: Mapping[str, int]):
        st = self.state
        held = {}
        # shrink first, then grow in the order given while nodes are free
        for jid, d in deltas.items():
            if d < 0 and jid in st.running:
                self._resize(self.runs[jid], d)
        for jid, d in deltas.items():
            if d > 0 and jid in st.running:
                self._resize(self.runs[jid], d)
        for jid, v in st.running.items():
            held[jid] = v.workers
        rewards = self._progress(held)
        dones = {jid: self.runs[jid].done for jid in held}
        self._arrive()
        self._admit()
        info = {"time": self.time}
        if self.done:
            info["result"] = self.result()
        return self.observe(), rewards, dones, info

    def run_policy(self, policy, max_steps: int | None = None) -> EpisodeResult:
        """Run the current episode to the end with a Scaling policy."""
        steps = 0
        while not self.done:
            self.step_policy(policy)
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
        return self.result()

    # ------------------------------------------------------------------ internals
    def _resize(self, run: _Run, delta: int) -> None:
        v, st = run.view, self.state
        g = v.gpus_per_worker
        if delta < 0:
            k = min(-delta, v.workers - v.min_workers)
            for _ in range(k):
                st.release(v.placement.pop(), g)
            v.workers -= k
        else:
            k = min(delta, v.max_workers - v.workers)
            for _ in range(k):
                i = st.first_fit(g)
                if i is None:
                    break
                st.allocate(i, g)
                v.placement.append(i)
                v.workers += 1

    def _arrive(self) -> None:
        while self._future and self._future[0].spec.submit_time <= self.time + 1e-9:
            r = self._future.pop(0)
            self._queue.append(r)
            self.state.pending.append(r.view)

    def _admit(self) -> None:
        st = self.state
        g = self.config.gpus_per_node
        while self._queue:
            r = self._queue[0]
            v = r.view
            slots = st.free_gpus // g
            if slots < v.min_workers:
                break
            self._queue.pop(0)
            st.pending.remove(v)
            want = min(r.spec.workers, slots)
            v.workers = 0
            v.placement = []
            v.start_time = self.time
            st.running[v.id] = v
            self._resize(r, want)
            self._estimate(r)
        if not st.running and not self._queue and self._future:
            # idle cluster: jump to the next arrival
            self.time = max(self.time, self._future[0].spec.submit_time)
            self._arrive()
            self._admit()

    def _progress(self, held: Mapping[str, int]) -> dict[str, float]:
        cfg = self.config
        dt = cfg.interval
        beta0 = cfg.beta if cfg.beta0 is None else cfg.beta0
        t_min = dt / 60.0
        rewards = {}
        t_end = self.time + dt
        for jid in list(held):
            r = self.runs[jid]
            v, s, conv = r.view, r.spec, r.conv
            w = v.workers
            thr = s.throughput(w, cfg.bandwidth_gbps)
            eff_rate = conv.efficiency(w) / s.samples_per_epoch  # effective epochs per sample
            start_samples = r.samples
            end_samples = start_samples + thr * dt
            first_epoch = int(start_samples // s.samples_per_epoch) + 1
            last_epoch = int(end_samples // s.samples_per_epoch)
            p = v.progress
            e = first_epoch
            while e <= last_epoch and not r.done:
                at = e * s.samples_per_epoch
                eff_e = r.eff + (at - start_samples) * eff_rate
                acc = float(conv.evaluate([e], [eff_e])[0])
                prev = p.history[-1] if p.history else conv.acc0
                gain = acc - prev
                p.history.append(acc)
                p.accuracy = acc
                p.epoch = e
                p.loss = float(conv.loss_at(eff_e))
                if cfg.stop == "beta" and len(p.history) >= 2 and gain < v.beta:
                    r.streak += 1
                else:
                    r.streak = 0
                if r.streak >= s.patience or e >= s.max_epochs:
                    r.done = True
                    r.finish = self.time + (at - start_samples) / thr
                e += 1
            if r.done:
                used = r.finish - self.time
                r.samples = (e - 1) * s.samples_per_epoch
            else:
                used = dt
                r.samples = end_samples
            eff_before = r.eff
            r.eff += (r.samples - start_samples) * eff_rate
            # v_a: accuracy gained in this interval, on the job's noise-free curve (the
            # simulator's denoised measurement); sums to the accuracy gained overall
            va = float(conv.accuracy_at(r.eff) - conv.accuracy_at(eff_before))
            rewards[jid] = va + float(np.sign(va - beta0)) * t_min * w * cfg.k_w
            v.attained_service += used * w
            if not r.done:
                self._estimate(r)
            if r.done:
                for i in v.placement:
                    self.state.release(i, v.gpus_per_worker)
                v.placement = []
                del self.state.running[jid]
        self.time = t_end
        self.state.time = t_end
        if self.time - self.t0 > cfg.max_time:
            raise RuntimeError(f"scaling env: episode exceeded max_time {cfg.max_time} s")
        return rewards

    def _estimate(self, r: _Run) -> None:
        """Fill the view's ``throughput`` and ``remaining`` (seconds, at its current
        workers) from the noise-free curve: the effective epoch where the per-epoch gain
        falls below β, plus ``patience`` epochs. Heuristics that need a runtime estimate
        (Optimus-style) read these — an oracle stand-in for their online curve fitting."""
        v, s, conv = r.view, r.spec, r.conv
        w = max(v.workers, 1)
        eff = conv.efficiency(w)
        span = conv.acc_max - conv.acc0
        ratio = span * eff / (conv.tau * v.beta) if span > 0 else 0.0
        e_stop = conv.tau * math.log(ratio) if ratio > 1 else 0.0
        rem_eff = max(e_stop - r.eff, 0.0) + s.patience * eff
        rem_eff = min(rem_eff, max(s.max_epochs - r.samples / s.samples_per_epoch, 0.0) * eff)
        thr = s.throughput(w, self.config.bandwidth_gbps)
        v.throughput = s.throughput(1, self.config.bandwidth_gbps)
        v.remaining = rem_eff * s.samples_per_epoch / eff / thr if thr > 0 else 0.0
        v.est_runtime = v.remaining

    def result(self) -> EpisodeResult:
        runs = list(self.runs.values())
        finished = [r for r in runs if r.done]
        fin = {r.spec.id: r.finish for r in finished}
        return EpisodeResult(
            total_time=(max(fin.values()) - self.t0) if fin else math.nan,
            mean_accuracy=float(np.mean([r.view.progress.accuracy for r in runs])),
            mean_jct=float(np.mean([r.finish - r.spec.submit_time for r in finished])) if finished else math.nan,
            accuracies={r.spec.id: r.view.progress.accuracy for r in runs},
            finish=fin,
            epochs={r.spec.id: r.view.progress.epoch for r in runs},
            gpu_seconds=float(sum(r.view.attained_service for r in runs)) * self.config.gpus_per_node,
        )
