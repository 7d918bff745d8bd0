"""RLPTO's elastic-scaling environment: a PettingZoo ``ParallelEnv`` on the simulator engine.

The event engine decides with core's gang allocator through the one call the operator
makes; its planner asks every running job with a new evaluation, an agent of one shared
policy over RLPTO's eleven features, for ``−1/0/+1`` worker (Lu et al., IEEE TPDS
34(12), 2023). Rewards: the paper's, or the cluster's JCT. Interface and rewards:
docs/design-notes.md.
"""

from __future__ import annotations

import math
import queue
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, Sequence

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from rlsched.core import Bandwidth, ClusterState, JobView, Scaling, Topology, make_ordering, make_placement
from rlsched.core.gang_allocator import GangAllocator
from rlsched.core.learned import RLPTO_FEATURES, job_observation
from rlsched.core.live_allocation import LiveAllocation

from .convergence import ConvergenceModel
from .engine import SimConfig, Simulator
from .job import JobSpec

__all__ = ["ScalingJob", "ScalingEnvConfig", "ScalingEnv", "make_jobs", "EpisodeResult", "K_W", "BUDGETS", "ACTIONS",
           "scaling_allocator", "engine_config"]

#: RLPTO's worker-cost coefficient k_w
K_W = 0.000625
#: action index -> worker change
ACTIONS = (-1, 0, 1)
#: epoch-budget models of :func:`make_jobs`
BUDGETS = ("oracle", "recipe")
#: range of the per-job over-provisioning factor of the "recipe" budget: a user's
#: budget is at best what the job needs and at most twice that (mean 1.5x); chosen once,
#: before any RLPTO result under it was seen (docs/training.md)
OVERPROVISION = (1.0, 2.0)
#: rewards of the environment (module docstring)
REWARDS = ("paper", "cluster")
#: bounds of the eleven RLPTO features (rlsched.core.learned.rlpto_observation)
OBS_LOW = np.array([0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=np.float32)
OBS_HIGH = np.array([1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=np.float32)


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

    def job_spec(self, *, nodes: int, gpus_per_node: int, beta: float, stop: str) -> JobSpec:
        """The simulator job of this workload job on ``nodes`` nodes: a worker takes a
        node's ``gpus_per_node`` GPUs, worker counts are capped at ``nodes``, β and the
        stop rule come from the environment (``stop="epochs"``: a patience the β rule
        cannot reach, so the job trains ``max_epochs``). The convergence ``seed`` is
        dropped: the engine draws evaluation noise from its own seed."""
        mx = min(self.max_workers, nodes)
        w = min(self.workers, mx)
        return JobSpec(
            id=self.id, submit_time=self.submit_time, workers=w, gpus_per_worker=gpus_per_node,
            min_workers=min(self.min_workers, w), max_workers=mx, compute_time=self.compute_time,
            grad_gb=self.grad_gb, batch_per_worker=self.batch_per_worker, samples_per_epoch=self.samples_per_epoch,
            max_epochs=self.max_epochs, beta=beta, patience=self.patience if stop == "beta" else self.max_epochs,
            convergence={k: v for k, v in self.convergence.items() if k != "seed"},
        )


@dataclass(frozen=True)
class ScalingEnvConfig:
    """Cluster, workload and reward of the environment (module docstring)."""

    nodes: int = 12
    gpus_per_node: int = 1
    #: seconds between the allocator's decisions on its interval (it decides on events too)
    interval: float = 60.0
    #: GB/s of the links between nodes (every level above the node)
    bandwidth_gbps: float = 12.5
    beta: float = 0.0003  # stopping threshold β of every job
    beta0: float | None = None  # reward threshold β0 (default: beta)
    k_w: float = K_W
    n_jobs: int = 16
    mean_interarrival: float = 300.0
    #: the episode is truncated this long after its first arrival
    max_time: float = 4 * 86400.0
    #: how a job ends: "beta" (RLPTO's rule: ``patience`` evaluations gaining < β, or
    #: max_epochs) or "epochs" (the traditional fixed epoch budget, max_epochs)
    stop: str = "beta"
    #: epoch budget of the generated jobs (:func:`make_jobs`): "oracle" or "recipe"
    budget: str = "oracle"
    #: the engine's admission ordering and placement policy (core names)
    ordering: str = "fifo"
    placement: str = "firstfit"
    backfill: bool = False
    #: seconds without progress after a resize or a resume (the engine's)
    restart_cost: float = 30.0
    #: show the policies every job's true remaining time (``SimConfig.clairvoyant``):
    #: for labelled oracle references only, never a baseline or a training run
    clairvoyant: bool = False
    #: "paper": RLPTO's per-job reward; "cluster": −(jobs in system × seconds)/3600 per
    #: cycle, split equally among the cycle's agents (module docstring)
    reward: str = "paper"

    def __post_init__(self) -> None:
        if self.budget not in BUDGETS:
            raise ValueError(f"budget must be one of {BUDGETS}, not {self.budget!r}")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, not {self.reward!r}")
        if self.stop not in ("beta", "epochs"):
            raise ValueError(f"stop must be 'beta' or 'epochs', not {self.stop!r}")
        if self.nodes < 1 or self.gpus_per_node < 1 or self.interval <= 0 or self.n_jobs < 1:
            raise ValueError("need nodes >= 1, gpus_per_node >= 1, interval > 0, n_jobs >= 1")
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if self.bandwidth_gbps <= 0 or self.restart_cost < 0 or self.max_time <= 0:
            raise ValueError("need bandwidth_gbps > 0, restart_cost >= 0, max_time > 0")

    def topology(self) -> Topology:
        bw = self.bandwidth_gbps
        return Topology.uniform(self.nodes, gpus_per_node=self.gpus_per_node,
                                bandwidth=Bandwidth(rack=bw, block=bw, cluster=bw))


def scaling_allocator(config: ScalingEnvConfig, scaling: Scaling) -> GangAllocator:
    """The environment's one decision: core's gang allocator with the configured
    admission ordering and placement, and ``scaling`` answering its planner."""
    return GangAllocator(make_ordering(config.ordering), make_placement(config.placement), scaling,
                         backfill=config.backfill)


def engine_config(config: ScalingEnvConfig, max_time: float = math.inf) -> SimConfig:
    """The engine's settings of the environment: the allocator decides at every event
    time (an arrival, a job's end) and every ``interval`` seconds."""
    return SimConfig(scaling_interval=config.interval, decision_gap=0.0, restart_cost=config.restart_cost,
                     max_time=max_time, record_series=False, clairvoyant=config.clairvoyant)


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
    rescales: int = 0


class _Actions:
    """Agents' actions as a core scaling policy: the planner asks it about the jobs it
    decides on and applies its invariants to the answer."""

    name = "actions"

    def __init__(self, deltas: Mapping[str, int]) -> None:
        self.deltas = deltas

    def decide(self, running: Sequence[JobView], state: ClusterState) -> dict[str, int]:
        return {v.id: self.deltas[v.id] for v in running if self.deltas.get(v.id)}


class _Closed(Exception):
    """The environment closed or reset while its engine waited for the agents."""


class _Agents:
    """The scaling policy of the environment's allocator. The engine runs in a thread of
    its own; each time core's planner asks this policy (the running jobs with a new
    evaluation, and the cluster as the allocator sees it after admitting), the question
    goes to the environment and the engine waits for the agents' answer."""

    name = "agents"

    def __init__(self) -> None:
        self.questions: queue.Queue = queue.Queue(maxsize=1)
        self.answers: queue.Queue = queue.Queue(maxsize=1)

    def decide(self, running: Sequence[JobView], state: ClusterState) -> dict[str, int]:
        self.questions.put(("ask", (list(running), state)))
        answer = self.answers.get()
        if answer is None:
            raise _Closed()
        return answer

    def drive(self, sim: Simulator) -> None:
        """Run ``sim`` to its end (the thread's target); its end or its error is the last
        message the environment gets."""
        try:
            sim.run()
        except _Closed:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the environment, which raises it
            self.questions.put(("error", exc))
            return
        self.questions.put(("done", None))


class ScalingEnv(ParallelEnv):
    """The RLPTO elastic-scaling environment (see the module docstring)."""

    metadata = {"name": "rlsched_scaling_v0", "render_modes": []}

    def __init__(self, config: ScalingEnvConfig | None = None, jobs: Sequence[ScalingJob] | None = None,
                 job_factory: Callable[[np.random.Generator], Sequence[ScalingJob]] | None = None) -> None:
        self.config = config or ScalingEnvConfig()
        self._fixed_jobs = list(jobs) if jobs is not None else None
        self._factory = job_factory
        self.topology = self.config.topology()
        self._obs_space = spaces.Box(OBS_LOW, OBS_HIGH, shape=(len(RLPTO_FEATURES),), dtype=np.float32)
        self._act_space = spaces.Discrete(len(ACTIONS))
        self.sim: Simulator | None = None
        self.jobs: dict[str, ScalingJob] = {}
        self.possible_agents: list[str] = [j.id for j in self._fixed_jobs] if self._fixed_jobs is not None else []
        self.agents: list[str] = []
        self.t0 = 0.0
        self.engine_seed = 0
        #: the last step's cluster reward −(jobs in system × seconds)/3600 (both rewards)
        self.last_cluster_reward = 0.0
        #: jobs in system × seconds up to the last step (the first step counts from the start)
        self._system_s = 0.0
        self._agents_policy: _Agents | None = None
        self._thread: threading.Thread | None = None
        #: the planner's question the engine waits on: the jobs it decides on and the
        #: cluster as the allocator sees it (None: the episode is over)
        self._turn: tuple[list[JobView], ClusterState] | None = None

    # ------------------------------------------------------------------ spaces
    def observation_space(self, agent: str) -> spaces.Box:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._act_space

    # ------------------------------------------------------------------ episode
    def reset(self, seed: int | None = None, options: dict | None = None):
        self.close()
        rng = np.random.default_rng(seed)
        cfg = self.config
        if self._fixed_jobs is not None:
            specs = self._fixed_jobs
        elif self._factory is not None:
            specs = list(self._factory(rng))
        else:
            specs = make_jobs(rng, cfg.n_jobs, cfg.mean_interarrival, budget=cfg.budget)
        if not specs:
            raise ValueError("scaling env: the episode has no jobs")
        specs = sorted(specs, key=lambda s: (s.submit_time, s.id))
        self.jobs = {s.id: s for s in specs}
        self.possible_agents = list(self.jobs)
        self.t0 = specs[0].submit_time
        #: the engine's seed (evaluation noise), drawn after the workload: same jobs as before for a seed
        self.engine_seed = int(rng.integers(2**31))
        agents = _Agents()
        self.sim = Simulator(
            [s.job_spec(nodes=cfg.nodes, gpus_per_node=cfg.gpus_per_node, beta=cfg.beta, stop=cfg.stop) for s in specs],
            self.topology,
            placement=make_placement(cfg.placement),
            allocation=LiveAllocation(scaling_allocator(cfg, agents)),
            seed=self.engine_seed,
            config=engine_config(cfg, max_time=self.t0 + cfg.max_time),
        )
        self._agents_policy = agents
        self._thread = threading.Thread(target=agents.drive, args=(self.sim,), name="scaling-env-engine", daemon=True)
        self._thread.start()
        self.last_cluster_reward = 0.0
        self._system_s = 0.0
        self._wait()
        self.agents = [v.id for v in self.sim.running] if self._turn is not None else []
        deciding = self._deciding()
        return self._observations(self.agents), {a: self._info(a, deciding) for a in self.agents}

    def close(self) -> None:
        """Stop the engine's thread of an episode under way."""
        if self._thread is not None and self._thread.is_alive() and self._turn is not None:
            self._agents_policy.answers.put(None)
        if self._thread is not None:
            self._thread.join()
        self._thread, self._turn = None, None

    @property
    def cluster(self) -> ClusterState:
        """The cluster as the allocator sees it at this decision (what a policy decides
        on); the engine's once the episode is over."""
        return self._turn[1] if self._turn is not None else self.sim.state

    @property
    def asked(self) -> list[JobView]:
        """The jobs this decision asks (those with a new evaluation), as the planner shows
        them to its policy; none once the episode is over."""
        return list(self._turn[0]) if self._turn is not None else []

    @property
    def time(self) -> float:
        return self.sim.now

    @property
    def done(self) -> bool:
        return not self.agents

    def running(self) -> list[JobView]:
        return self.sim.running

    def observe(self) -> dict[str, np.ndarray]:
        """RLPTO features of every agent (:func:`rlsched.core.learned.job_observation`)."""
        return self._observations(self.agents)

    # ------------------------------------------------------------------ stepping
    def step(self, actions: Mapping[str, int]):
        """Apply action indices ``{job: 0|1|2}`` meaning ``(−1, 0, +1)`` workers (only
        deciding agents' count) in this decision, then run the engine to the next
        decision that asks an agent."""
        deltas = {}
        for jid, a in actions.items():
            if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)) or not 0 <= int(a) < len(ACTIONS):
                raise ValueError(f"action for {jid} must be 0, 1 or 2, got {a!r}")
            if ACTIONS[int(a)]:
                deltas[jid] = ACTIONS[int(a)]
        return self._cycle(_Actions(deltas))

    def step_policy(self, policy):
        """One decision with a :class:`~rlsched.core.policy.Scaling` policy answering the
        planner (as in the operator), on the jobs and cluster the planner shows it."""
        return self._cycle(policy)

    def run_policy(self, policy, max_steps: int | None = None) -> EpisodeResult:
        """Run the current episode to its end with a Scaling policy."""
        steps = 0
        while self.agents:
            self.step_policy(policy)
            steps += 1
            if max_steps is not None and steps >= max_steps:
                return self.result()
        if self.sim.result().unfinished:
            raise RuntimeError(f"scaling env: episode exceeded max_time {self.config.max_time} s")
        return self.result()

    def _cycle(self, policy):
        sim, cfg = self.sim, self.config
        prev = list(self.agents)
        if not prev:
            return {}, {}, {}, {}, {}
        before = {a: self._meter(a) for a in prev}
        running, state = self._turn
        self._agents_policy.answers.put(dict(policy.decide(running, state)))
        self._wait()
        sys0, self._system_s = self._system_s, self.system_seconds()
        self.last_cluster_reward = -(self._system_s - sys0) / 3600.0
        rewards = {}
        if cfg.reward == "cluster":
            share = self.last_cluster_reward / len(prev)
            rewards = {a: share for a in prev}
        else:
            beta0 = cfg.beta if cfg.beta0 is None else cfg.beta0
            g = cfg.gpus_per_node
            for a in prev:
                (acc0, att0), (acc1, att1) = before[a], self._meter(a)
                va = acc1 - acc0
                worker_min = (att1 - att0) / (g * 60.0)
                rewards[a] = va + float(np.sign(va - beta0)) * worker_min * cfg.k_w
        running_now = {v.id for v in sim.running}
        waiting = {v.id for v in sim.pending}
        ended = {a for a in prev if a not in running_now and a not in waiting}
        truncated = self._turn is None and bool(running_now or waiting)  # the engine stopped at max_time
        seen = set(prev)
        new = [v.id for v in sim.running if v.id not in seen]
        keys = prev + new
        for a in new:
            rewards[a] = 0.0
        terms = {a: a in ended for a in keys}
        truncs = {a: truncated and a not in ended for a in keys}
        self.agents = [a for a in keys if not (terms[a] or truncs[a])]
        deciding = self._deciding()
        return self._observations(keys), rewards, terms, truncs, {a: self._info(a, deciding) for a in keys}

    # ------------------------------------------------------------------ internals
    def _wait(self) -> None:
        """Wait for the engine's next question to the agents, or for its end."""
        kind, payload = self._agents_policy.questions.get()
        if kind == "ask":
            self._turn = payload
            return
        self._turn = None
        self._thread.join()
        if kind == "error":
            self.agents = []  # the episode is over; reset() starts another
            raise RuntimeError(f"scaling env: the engine failed: {payload}") from payload

    def system_seconds(self) -> float:
        """Seconds jobs have spent in the system (submitted, not finished) up to now,
        summed over jobs: the sum of JCTs once every job has finished."""
        sim = self.sim
        now = sim.now
        done = sum(r.end - r.submit for r in sim.result().records)
        live = sum(max(now - v.submit_time, 0.0) for v in (*sim.running, *sim.pending))
        return float(done + live)

    def _deciding(self) -> set[str]:
        """The agents this decision asks: the running jobs with an evaluation newer than
        their last decision (core's planner chooses them)."""
        return {v.id for v in self._turn[0]} if self._turn is not None else set()

    def _info(self, agent: str, deciding: set[str]) -> dict:
        v = self.sim.job(agent)
        return {"decides": agent in deciding, "workers": v.workers, "epoch": v.progress.epoch, "time": self.sim.now}

    def _meter(self, agent: str) -> tuple[float, float]:
        """(denoised accuracy, attained GPU-seconds) of a job now."""
        conv, eff = self.sim.training_curve(agent)
        return float(conv.accuracy_at(eff)), float(self.sim.job(agent).attained_service)

    def _observations(self, agents: Sequence[str]) -> dict[str, np.ndarray]:
        """Each agent's features on what the planner shows its policy: a job it asks, as
        it is shown (with what one more worker is worth to it, from its own reports);
        any other on the allocator's cluster, or the engine's once the episode is over."""
        if self._turn is None:
            st = self.sim.state
            return {a: job_observation(self.sim.job(a), st) for a in agents}
        running, st = self._turn
        asked = {v.id: v for v in running}
        return {a: job_observation(asked.get(a) or st.running.get(a) or self.sim.job(a), st) for a in agents}

    def result(self) -> EpisodeResult:
        sim = self.sim
        res = sim.result()
        fin = {r.id: r.end for r in res.records}
        views = {jid: sim.job(jid) for jid in self.jobs}
        return EpisodeResult(
            total_time=(max(fin.values()) - self.t0) if fin else math.nan,
            mean_accuracy=float(np.mean([v.progress.accuracy for v in views.values()])),
            mean_jct=float(np.mean([r.end - r.submit for r in res.records])) if res.records else math.nan,
            accuracies={jid: v.progress.accuracy for jid, v in views.items()},
            finish=fin,
            epochs={jid: v.progress.epoch for jid, v in views.items()},
            gpu_seconds=float(sum(v.attained_service for v in views.values())),
            rescales=sum(r.rescales for r in res.records),
        )
