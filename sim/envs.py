"""Reinforcement-learning environments over the simulator.

:class:`SchedulingEnv` (Gymnasium) and :class:`DualAgentSchedulingEnv` (PettingZoo: the
DAS ordering and placement agents taking turns) drive a
:class:`~rlsched.sim.engine.Simulator` one start at a time through the engine's one
allocator call (core's gang allocator over the agents' pick); the reward is DAS's
JCT-and-fee objective (Xing et al., KDD 2023). All randomness comes from the seed given
to ``reset``. Decision points, spaces and reward:
docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from rlsched.core import ClusterState, JobView, Topology, make_placement
from rlsched.core.policy import Placement
from rlsched.core.das import PLACEMENT_FEATURES
from rlsched.core.placement import worker_slots
from rlsched.core.estimate import estimate_remaining
from rlsched.core.gang_allocator import GangAllocator
from rlsched.core.live_allocation import LiveAllocation
from rlsched.core.das_agent import (
    CLUSTER_FEATURES,
    JOB_FEATURES,
    cluster_summary,
    fits_now,
    job_features,
    node_features,
    placement_features,
    rack_first_fill,
    select_window,
    WINDOW_SELECT,
)

from .engine import SimConfig, Simulator
from .job import JobSpec

__all__ = [
    "Workload",
    "EnvConfig",
    "SchedulingCore",
    "SchedulingEnv",
    "DualAgentSchedulingEnv",
    "trace_workload",
    "ENV_ID",
    "register_envs",
]

#: ``workload(rng) -> (jobs, topology)``: one episode's jobs and cluster, drawn with rng.
Workload = Callable[[np.random.Generator], tuple[Sequence[JobSpec], Topology]]

ENV_ID = "rlsched/Scheduling-v0"

_FEAT_LOW, _FEAT_HIGH = -1.0, 10.0


def trace_workload(spec: str, jobs: int | None = None, *, loads: tuple[float, float] | None = None,
                   split: str = "train") -> Workload:
    """A :data:`Workload` loading ``spec`` (:func:`rlsched.sim.traces.load_trace`) per
    episode. ``spec`` may list several SPECs separated by ``;`` (one drawn uniformly
    per episode). Synthetic specs get a fresh trace seed per episode, drawn from the
    episode's rng inside the seed ``split`` of :mod:`rlsched.sim.protocol` (training
    draws only train seeds, never a validation or test one), and ``jobs`` overrides
    their job count. ``loads=(lo, hi)``: each episode's offered load is drawn
    uniformly from ``[lo, hi]`` and appended as ``,load=X`` (a spec giving its own
    ``load`` keeps it). Other traces are the same each time."""
    from .protocol import SPLITS, SplitError
    from .traces import load_trace  # imported only when used

    specs = [s.strip() for s in spec.split(";") if s.strip()]
    if not specs:
        raise ValueError(f"no trace SPEC in {spec!r}")
    if split not in SPLITS:
        raise SplitError(f"unknown seed split {split!r}; known: {', '.join(SPLITS)}")
    lo_seed, hi_seed = SPLITS[split]
    if loads is not None:
        lo, hi = float(loads[0]), float(loads[1])
        if not (0 < lo <= hi):
            raise ValueError(f"loads must be 0 < lo <= hi, got {loads}")
    if jobs is not None:
        specs = [f"{s},jobs={int(jobs)}" if s.startswith("synthetic:") else s for s in specs]

    def draw(rng: np.random.Generator):
        s = specs[int(rng.integers(0, len(specs)))] if len(specs) > 1 else specs[0]
        seed = int(rng.integers(lo_seed, hi_seed))
        if loads is not None and "load=" not in s and "arrival_rate=" not in s:
            s = f"{s},load={rng.uniform(lo, hi):.3f}"
        trace = load_trace(s, seed=seed)
        if trace.topology is None:
            from .traces import default_topology

            return trace.jobs, default_topology(trace.jobs)
        return trace.jobs, trace.topology

    return draw


@dataclass(frozen=True)
class EnvConfig:
    """Options of the scheduling environments.

    ``window``: job slots the agents choose from; ``window_select``: which pending jobs
    fill them (:func:`rlsched.core.das_agent.select_window`). ``time_scale``: seconds per unit of
    the JCT reward. ``fee_weight``: reward units per dollar of fee. ``image_steps`` x
    ``image_dt``: horizon of the cluster image (node x future time busy share).
    ``placements``: the heuristics :class:`SchedulingEnv` offers. ``max_nodes``: node
    rows in observations (clusters up to this size; default = the first workload's).
    ``cycle_placement``: the core placement of the jobs the cycle starts without the
    agents (``highest``-class jobs, see the module docstring).
    """

    window: int = 16
    window_select: str = "oldest"
    time_scale: float = 3600.0
    fee_weight: float = 0.02
    image_steps: int = 16
    image_dt: float = 900.0
    placements: tuple[str, ...] = ("firstfit", "bestfit", "loadbalance", "topology")
    cycle_placement: str = "topology"
    sim: SimConfig = field(default_factory=lambda: SimConfig(record_series=False))

    def __post_init__(self) -> None:
        if self.window_select not in WINDOW_SELECT:
            raise ValueError(f"window_select must be one of {WINDOW_SELECT}, not {self.window_select!r}")
        if self.window < 1 or self.image_steps < 1:
            raise ValueError("window and image_steps must be >= 1")
        if self.time_scale <= 0 or self.image_dt <= 0 or self.fee_weight < 0:
            raise ValueError("need time_scale > 0, image_dt > 0, fee_weight >= 0")
        if not self.placements:
            raise ValueError("need at least one placement heuristic")


class AgentTurn(Placement):
    """The agents' decision as core's :class:`~rlsched.core.policy.Ordering` and
    :class:`~rlsched.core.policy.Placement`, for the engine's cycle to admit.

    :meth:`rank`: the picked job first, then the waiting ``highest``-class jobs
    (oldest first), then the rest in the queue's order. :meth:`place`: the picked job
    on the agents' nodes (None when they cannot hold its workers now); a ``highest``
    job where ``cycle`` puts it; nobody else, so head-of-line admission starts the pick
    and stops at the first job the agents did not choose.
    Translation only: the pick is the agents', the class rule the cycle's.
    """

    name = "agent-turn"
    #: the agents' pick never preempts; a ``highest`` job does, by the cycle's class rule
    preemptive = False
    thresholds: tuple[float, ...] = ()

    def __init__(self, klass, cycle) -> None:
        self._klass = klass  # job id -> its service class
        self._cycle = cycle  # the core placement of the cycle's own starts
        self.pick: tuple[str, list[int]] | None = None  # (job id, nodes) of this decision

    def _highest(self, v: JobView) -> bool:
        return self._klass(v.id) == "highest"

    def rank(self, pending, state: ClusterState) -> list[JobView]:
        picked = self.pick[0] if self.pick is not None else None
        first, highest, rest = [], [], []  # nobody else starts in this pass: the rest keep the queue's order
        for v in pending:
            (first if v.id == picked else highest if self._highest(v) else rest).append(v)
        return first + sorted(highest, key=lambda v: (v.submit_time, v.id)) + rest

    def preempts(self, job: JobView, victim: JobView, state: ClusterState) -> bool:
        return False

    def outranked(self, job: JobView, others, state: ClusterState) -> list[JobView]:
        return []

    def demotes_at(self, job: JobView, now: float) -> float | None:
        return None

    def place(self, job: JobView, state: ClusterState, workers: int | None = None) -> list[int] | None:
        if self.pick is not None and job.id == self.pick[0]:
            nodes = self.pick[1]
            per_node = np.bincount(np.asarray(nodes, dtype=np.int64), minlength=len(state.free))
            if len(per_node) != len(state.free) or (per_node > worker_slots(job, state)).any():
                return None  # the agents' nodes cannot hold its workers now: it waits
            return list(nodes)
        if self._highest(job):
            return self._cycle.place(job, state, workers)
        return None

    def score(self, job: JobView, candidates, state: ClusterState) -> np.ndarray:
        return self._cycle.score(job, candidates, state)


def agents_allocation(turn: AgentTurn, config: SimConfig) -> LiveAllocation:
    """The agents' turn as the one allocator call the engine makes: core's gang
    allocator over the pick (ordering and placement), with the engine's queue rules."""
    return LiveAllocation(GangAllocator(turn, turn, backfill=config.backfill, preemption=config.preemption,
                                        name=turn.name))


class SchedulingCore:
    """One episode of decision-by-decision scheduling on the simulator.

    The shared engine of both environments and of the trainers in
    :mod:`rlsched.models` (which call it directly to avoid wrapper overhead).
    """

    def __init__(self, workload: Workload, config: EnvConfig | None = None) -> None:
        self.workload = workload
        self.config = config or EnvConfig()
        self.sim: Simulator | None = None
        self.rng = np.random.default_rng(0)
        self.returns = 0.0
        self.decisions = 0

    # ------------------------------------------------------------------ episode
    def reset(self, seed: int | None) -> None:
        self.rng = np.random.default_rng(seed)
        jobs, topology = self.workload(self.rng)
        self.topology = topology
        sim_seed = int(self.rng.integers(0, 2**31 - 1))
        self._placements = {name: make_placement(name, rng=self.rng) for name in self.config.placements}
        cycle = self._placements.get(self.config.cycle_placement) or make_placement(self.config.cycle_placement,
                                                                                   rng=self.rng)
        by_id = {j.id: j for j in jobs}
        self.turn = AgentTurn(lambda job_id: by_id[job_id].priority_class, cycle)
        self.sim = Simulator(jobs, topology, placement=self.turn, seed=sim_seed, config=self._sim_config(),
                             allocation=agents_allocation(self.turn, self.config.sim))
        self._price = np.array([n.price_per_gpu_hour for n in topology.nodes]) / 3600.0
        self.returns = 0.0
        self.decisions = 0
        self._advance()

    def _sim_config(self) -> SimConfig:
        """The engine deciding at every event time (no spacing), as an agent decides
        whenever a job it may start fits."""
        return replace(self.config.sim, decision_gap=0.0, allocate_on_events=True)

    @property
    def done(self) -> bool:
        return self.sim is None or (self.sim.done and not self.mask().any())

    def window_jobs(self) -> list[JobView]:
        return select_window(self.sim.pending, self.sim.state, self.config.window, self.config.window_select)

    def mask(self) -> np.ndarray:
        """Bool per job slot: holds a job that fits now."""
        m = np.zeros(self.config.window, dtype=bool)
        if self.sim is None:
            return m
        for k, job in enumerate(self.window_jobs()):
            m[k] = fits_now(job, self.sim.state)
        return m

    def _cost_rate(self) -> tuple[int, float]:
        st = self.sim.state
        fee_rate = 0.0
        for v in st.running.values():
            fee_rate += v.gpus_per_worker * float(self._price[v.placement].sum())
        return len(st.pending) + len(st.running), fee_rate

    def _advance(self) -> float:
        """Advance to the next decision point (or the end), the engine's cycle deciding
        at each event time with no pick; the reward accrued."""
        cfg = self.config
        r = 0.0
        sim = self.sim
        while not self.mask().any():
            n, fee_rate = self._cost_rate()
            t0 = sim.now
            if not sim.step():
                break
            dt = sim.now - t0
            r -= n * dt / cfg.time_scale + cfg.fee_weight * fee_rate * dt
        return r

    def start(self, slot: int, nodes: Sequence[int]) -> float:
        """The agents' decision: the job in ``slot`` on ``nodes``, admitted by the engine's
        allocator call (:class:`AgentTurn`); advance; return the reward. ValueError when
        it could not start there (a job that does not fit now, nodes that cannot hold
        its workers, another worker count than the gang it asks for)."""
        job = self.window_jobs()[slot]
        nodes = list(nodes)
        if len(nodes) != job.workers:
            raise ValueError(f"job {job.id}: {len(nodes)} workers, not the gang of {job.workers} it asks for")
        self.turn.pick = (job.id, nodes)
        try:
            self.sim.decide()
        finally:
            self.turn.pick = None
        if job.start_time is None:
            raise ValueError(f"job {job.id} could not start on nodes {nodes} now")
        self.decisions += 1
        r = self._advance()
        self.returns += r
        return r

    def wait(self) -> float:
        """Start nothing: advance one event time, then to the next decision point;
        return the reward (for agents that may hold jobs back, e.g. HierRL)."""
        cfg = self.config
        sim = self.sim
        n, fee_rate = self._cost_rate()
        t0 = sim.now
        r = 0.0
        if sim.step():
            dt = sim.now - t0
            r -= n * dt / cfg.time_scale + cfg.fee_weight * fee_rate * dt
        r += self._advance()
        self.returns += r
        return r

    # ------------------------------------------------------------------ placement
    def place_by_scores(self, job: JobView, scores: np.ndarray) -> list[int]:
        """Place the gang by node scores, rack first
        (:func:`rlsched.core.das_agent.rack_first_fill`). The job must fit now (see
        :meth:`mask`)."""
        nodes = rack_first_fill(job, self.sim.state, scores)
        if nodes is None:
            raise ValueError(f"job {job.id} does not fit now")
        return nodes

    def place_by_policy(self, job: JobView, name: str) -> list[int]:
        """Nodes from a core placement heuristic (first-fit fill if it declines)."""
        nodes = self._placements[name].place(job, self.sim.state)
        if nodes is None or len(nodes) != job.workers:
            nodes = self.place_by_scores(job, -np.arange(len(self.topology), dtype=float))
        return nodes

    # ------------------------------------------------------------------ features
    def ordering_obs(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(jobs [W, F], cluster [C], valid [W])`` — the DAS ordering input."""
        w = self.config.window
        feats = np.zeros((w, len(JOB_FEATURES)), dtype=np.float32)
        valid = np.zeros(w, dtype=bool)
        st = self.sim.state
        for k, job in enumerate(self.window_jobs()):
            feats[k] = job_features(job, st)
            valid[k] = True
        clus = cluster_summary(st, len(self.sim.pending), w)
        return np.clip(feats, _FEAT_LOW, _FEAT_HIGH), np.clip(clus, _FEAT_LOW, _FEAT_HIGH), valid

    def placement_obs(self, job: JobView) -> tuple[np.ndarray, np.ndarray]:
        """``(features [N, len(PLACEMENT_FEATURES)], feasible [N])`` for placing ``job``
        (:func:`rlsched.core.das_agent.placement_features`)."""
        return placement_features(job, self.sim.state)

    def image(self) -> np.ndarray:
        """``[nodes, image_steps]``: share of each node's GPUs busy at now + k·image_dt,
        from the running jobs' estimated remaining time: the user's estimate less the
        time run (:func:`rlsched.core.estimate.estimate_remaining`; a job without an
        estimate, or one it outran, counts as busy over the whole image). Clairvoyant
        runs (``SimConfig.clairvoyant``): the true ideal run time less the time run."""
        cfg = self.config
        st = self.sim.state
        img = np.zeros((len(st.total), cfg.image_steps), dtype=np.float32)
        now = self.sim.now
        edges = np.arange(cfg.image_steps) * cfg.image_dt
        clairvoyant = self.sim.config.clairvoyant
        for v in st.running.values():
            ran = now - (v.start_time or now)
            if clairvoyant:  # the old image: true run time less time run
                left = max(v.est_runtime - ran, 0.0)
            else:  # unknown (no estimate, or one the job outran): busy over the whole image
                left = estimate_remaining(v.est_runtime, ran, 0, 0) or float("inf")
            busy = (edges < left).astype(np.float32)
            for i in v.placement:
                img[i] += busy * v.gpus_per_worker
        return img / np.maximum(st.total, 1)[:, None].astype(np.float32)

    def gym_obs(self) -> dict[str, np.ndarray]:
        """The :class:`SchedulingEnv` observation of the current decision point."""
        jobs, clus, valid = self.ordering_obs()
        return {
            "jobs": jobs,
            "valid": valid.astype(np.int8),
            "cluster": clus,
            "nodes": np.clip(node_features(self.sim.state), _FEAT_LOW, _FEAT_HIGH),
            "image": np.clip(self.image(), 0.0, 1.0),
        }

    def state_vector(
        self,
        phase: int = 0,
        slot: int | None = None,
        obs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Fixed-size global state (independent of the cluster size): the window's job
        features and validity, the cluster summary, the turn and the chosen slot.
        ``obs`` / ``mask``: :meth:`ordering_obs` / :meth:`mask` of this decision point
        when the caller already has them."""
        jobs, clus, valid = self.ordering_obs() if obs is None else obs
        turn = np.zeros(2, dtype=np.float32)
        turn[phase] = 1.0
        chosen = np.zeros(self.config.window, dtype=np.float32)
        if slot is not None:
            chosen[slot] = 1.0
        mask = (self.mask() if mask is None else mask).astype(np.float32)
        return np.concatenate([jobs.ravel(), valid.astype(np.float32), mask, clus, turn, chosen]).astype(np.float32)

    def state_size(self) -> int:
        """Length of :meth:`state_vector`."""
        w = self.config.window
        return w * len(JOB_FEATURES) + 3 * w + _cluster_size() + 2


def _cluster_size() -> int:
    from rlsched.core.das_agent import NODE_FEATURES

    return len(NODE_FEATURES) + len(CLUSTER_FEATURES)


def _n_nodes(workload: Workload, config: EnvConfig) -> int:
    _, topology = workload(np.random.default_rng(0))
    return len(topology)


# ====================================================================== Gymnasium
class SchedulingEnv(gym.Env):
    """One agent picks the next job (window slot) and a placement heuristic.

    Action ``a`` means slot ``a // P`` with heuristic ``placements[a % P]``. An action
    outside ``info["action_mask"]`` is replaced by the first valid one
    (``info["invalid_action"] = True``). Observation (a ``Dict``): ``jobs``
    ``[window, F]``, ``valid`` ``[window]``, ``cluster`` ``[C]``, ``nodes``
    ``[nodes, 4]`` and ``image`` ``[nodes, image_steps]``. Every episode's cluster must
    have the node count of the first one.
    """

    metadata = {"render_modes": []}

    def __init__(self, workload: Workload | None = None, config: EnvConfig | None = None, *, trace: str = "synthetic:small", jobs: int | None = 40) -> None:
        self.config = config or EnvConfig()
        self.workload = workload or trace_workload(trace, jobs)
        self.core = SchedulingCore(self.workload, self.config)
        n = _n_nodes(self.workload, self.config)
        w, p = self.config.window, len(self.config.placements)
        self.n_nodes = n
        self.action_space = spaces.Discrete(w * p)
        box = lambda *shape: spaces.Box(_FEAT_LOW, _FEAT_HIGH, shape=shape, dtype=np.float32)  # noqa: E731
        from rlsched.core.das_agent import NODE_FEATURES

        self.observation_space = spaces.Dict(
            {
                "jobs": box(w, len(JOB_FEATURES)),
                "valid": spaces.MultiBinary(w),
                "cluster": box(_cluster_size()),
                "nodes": box(n, len(NODE_FEATURES)),
                "image": spaces.Box(0.0, 1.0, shape=(n, self.config.image_steps), dtype=np.float32),
            }
        )

    def action_mask(self) -> np.ndarray:
        return np.repeat(self.core.mask(), len(self.config.placements)).astype(np.int8)

    def _obs(self) -> dict:
        n = len(self.core.sim.state.total)
        if n != self.n_nodes:
            raise ValueError(f"episode cluster has {n} nodes, the env was built for {self.n_nodes}")
        return self.core.gym_obs()

    def _info(self, **extra) -> dict:
        return {"action_mask": self.action_mask(), "time": self.core.sim.now, "decisions": self.core.decisions, **extra}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(0, 2**31 - 1))
        self.core.reset(seed)
        return self._obs(), self._info()

    def step(self, action):
        a = int(action)
        mask = self.action_mask()
        invalid = not (0 <= a < len(mask) and mask[a])
        if invalid:
            a = int(np.flatnonzero(mask)[0])
        p = len(self.config.placements)
        slot, heur = divmod(a, p)
        job = self.core.window_jobs()[slot]
        nodes = self.core.place_by_policy(job, self.config.placements[heur])
        r = self.core.start(slot, nodes)
        terminated = self.core.done
        return self._obs(), float(r), terminated, False, self._info(invalid_action=invalid)


# ====================================================================== PettingZoo
class DualAgentSchedulingEnv(ParallelEnv):
    """DAS's two agents, ``ordering`` and ``placement``, taking turns (module docstring)."""

    metadata = {"name": "rlsched_dual_agent_v0", "render_modes": []}

    def __init__(self, workload: Workload | None = None, config: EnvConfig | None = None, *, trace: str = "synthetic:small", jobs: int | None = 40) -> None:
        self.config = config or EnvConfig()
        self.workload = workload or trace_workload(trace, jobs)
        self.core = SchedulingCore(self.workload, self.config)
        n = _n_nodes(self.workload, self.config)
        self.n_nodes = n
        w = self.config.window
        self.possible_agents = ["ordering", "placement"]
        self.agents: list[str] = []
        box = lambda *shape: spaces.Box(_FEAT_LOW, _FEAT_HIGH, shape=shape, dtype=np.float32)  # noqa: E731
        turn = spaces.MultiBinary(1)
        self._obs_spaces = {
            "ordering": spaces.Dict(
                {"jobs": box(w, len(JOB_FEATURES)), "cluster": box(_cluster_size()), "action_mask": spaces.MultiBinary(w), "my_turn": turn}
            ),
            "placement": spaces.Dict(
                {"nodes": box(n, len(PLACEMENT_FEATURES)), "feasible": spaces.MultiBinary(n), "my_turn": turn}
            ),
        }
        self._act_spaces = {
            "ordering": spaces.Discrete(w),
            "placement": spaces.Box(-10.0, 10.0, shape=(n,), dtype=np.float32),
        }
        size = self.core.state_size()
        self.state_space = spaces.Box(_FEAT_LOW, _FEAT_HIGH, shape=(size,), dtype=np.float32)
        self._phase = 0
        self._slot: int | None = None

    def observation_space(self, agent: str):
        return self._obs_spaces[agent]

    def action_space(self, agent: str):
        return self._act_spaces[agent]

    def state(self) -> np.ndarray:
        return np.clip(self.core.state_vector(self._phase, self._slot), _FEAT_LOW, _FEAT_HIGH)

    def _observations(self) -> dict:
        jobs, clus, _ = self.core.ordering_obs()
        my = self._phase == 0
        omask = self.core.mask() if my else np.zeros(self.config.window, dtype=bool)
        if self._phase == 1:
            job = self.core.window_jobs()[self._slot]
            nodes, feasible = self.core.placement_obs(job)
        else:
            nodes = np.zeros((self.n_nodes, len(PLACEMENT_FEATURES)), dtype=np.float32)
            feasible = np.zeros(self.n_nodes, dtype=bool)
        return {
            "ordering": {"jobs": jobs, "cluster": clus, "action_mask": omask.astype(np.int8), "my_turn": np.array([int(my)], dtype=np.int8)},
            "placement": {
                "nodes": np.clip(nodes, _FEAT_LOW, _FEAT_HIGH),
                "feasible": feasible.astype(np.int8),
                "my_turn": np.array([int(not my)], dtype=np.int8),
            },
        }

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % (2**31 - 1))
        self.core.reset(seed)
        if len(self.core.topology) != self.n_nodes:
            raise ValueError(f"episode cluster has {len(self.core.topology)} nodes, the env was built for {self.n_nodes}")
        self.agents = list(self.possible_agents)
        self._phase, self._slot = 0, None
        infos = {a: {} for a in self.agents}
        if self.core.done:
            self.agents = []
        return self._observations(), infos

    def step(self, actions: dict):
        r = 0.0
        info: dict = {}
        if self._phase == 0:
            slot = int(actions.get("ordering", -1))
            mask = self.core.mask()
            if not (0 <= slot < len(mask) and mask[slot]):
                slot = int(np.flatnonzero(mask)[0])
                info["invalid_action"] = True
            self._slot, self._phase = slot, 1
        else:
            job = self.core.window_jobs()[self._slot]
            scores = np.asarray(actions.get("placement", np.zeros(self.n_nodes)), dtype=float)
            nodes = self.core.place_by_scores(job, scores)
            r = self.core.start(self._slot, nodes)
            self._phase, self._slot = 0, None
        done = self.core.done
        agents = list(self.agents)
        obs = self._observations()
        rewards = {a: float(r) for a in agents}
        terms = {a: done for a in agents}
        truncs = {a: False for a in agents}
        infos = {a: dict(info) for a in agents}
        if done:
            self.agents = []
        return {a: obs[a] for a in agents}, rewards, terms, truncs, infos


def register_envs() -> None:
    """Register ``rlsched/Scheduling-v0`` with Gymnasium (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="rlsched.sim.envs:SchedulingEnv")


register_envs()
