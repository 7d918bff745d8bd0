"""DQN with dueling heads and prioritized replay; Ape-X on Ray.

Dueling heads (Wang et al., ICML 2016), proportional prioritized replay on a sum tree
(Schaul et al., ICLR 2016) and double-DQN targets (van Hasselt et al., AAAI 2016);
rollouts in synchronous process rounds, or as Ape-X actors on Ray (Horgan et al., ICLR
2018). Action = slot × placement heuristic of :class:`rlsched.sim.envs.SchedulingEnv`.
Details: docs/design-notes.md.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from torch import nn

from rlsched.core.das_agent import JOB_FEATURES
from rlsched.sim.envs import EnvConfig
from rlsched.sim.protocol import SPLITS

from .base import seed_everything
from .runs import new_run
from .scheduling import (
    CLUSTER_DIM,
    apply_gym_action,
    common_arguments,
    env_dict,
    episode_summary,
    evaluate_against_seed_baselines,
    export_model,
    gym_mask,
    load_for_eval,
    load_state,
    make_core,
    numpy_state,
    run_iterations,
    stack_obs,
)

__all__ = [
    "DuelingQNet", "make_net", "dueling_aggregate", "SumTree", "PrioritizedReplay", "apex_epsilons", "td_error", "dqn_step",
    "ReplayServer", "ApexActor", "train_apex", "add_arguments", "train", "evaluate",
]


def dueling_aggregate(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """``Q = V + A - mean(A)`` over the action axis (last)."""
    return value + advantage - advantage.mean(dim=-1, keepdim=True)


class DuelingQNet(nn.Module):
    """MLP over the window's jobs and the cluster summary, dueling V / A heads; the
    advantage head is shared by the job slots (a job's advantages over the placement
    heuristics come from its features and the state context)."""

    def __init__(self, window: int, n_placements: int, hidden: int = 128) -> None:
        super().__init__()
        self.window, self.n_placements = window, n_placements
        self.body = nn.Sequential(nn.Linear(window * (len(JOB_FEATURES) + 1) + CLUSTER_DIM, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.value = nn.Linear(hidden, 1)
        self.advantage = nn.Sequential(nn.Linear(len(JOB_FEATURES) + hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_placements))

    def features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        jobs = torch.cat([obs["jobs"], obs["valid"][..., None].float()], -1).flatten(1)
        return self.body(torch.cat([jobs, obs["cluster"]], -1))

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        h = self.features(obs)
        per_slot = torch.cat([obs["jobs"], h[:, None, :].expand(-1, obs["jobs"].shape[1], -1)], -1)
        return dueling_aggregate(self.value(h), self.advantage(per_slot).flatten(1))


def make_net(spec: dict) -> DuelingQNet:
    """The network of an exported or training ``spec`` (its architecture metadata)."""
    return DuelingQNet(spec["window"], spec["n_placements"], spec.get("hidden", 128))


class SumTree:
    """Binary tree whose leaves hold priorities and inner nodes their sums."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.tree = np.zeros(2 * capacity)

    def update(self, idx: np.ndarray, value: np.ndarray) -> None:
        for i, v in zip(np.atleast_1d(idx), np.atleast_1d(value)):
            k = int(i) + self.capacity
            self.tree[k] = v
            k //= 2
            while k >= 1:
                self.tree[k] = self.tree[2 * k] + self.tree[2 * k + 1]
                k //= 2

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def leaf(self, idx) -> np.ndarray:
        return self.tree[np.asarray(idx) + self.capacity]

    def find(self, mass: float) -> int:
        """The leaf ``i`` with ``sum(p[:i]) <= mass < sum(p[:i+1])``."""
        k = 1
        while k < self.capacity:
            left = self.tree[2 * k]
            if mass < left:
                k = 2 * k
            else:
                mass -= left
                k = 2 * k + 1
        return k - self.capacity


class PrioritizedReplay:
    """Proportional prioritized replay (module docstring); transitions are dicts."""

    def __init__(self, capacity: int, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-3) -> None:
        self.capacity, self.alpha, self.beta, self.eps = capacity, alpha, beta, eps
        # a power-of-two tree keeps find() exact for any capacity
        self.tree = SumTree(1 << max(int(np.ceil(np.log2(capacity))), 0))
        self.data: list = [None] * capacity
        self.size = 0
        self.pos = 0
        self.max_priority = 1.0

    def __len__(self) -> int:
        return self.size

    def add(self, item, priority: float | None = None) -> None:
        """Store ``item`` with ``priority`` (an |TD error| computed by the actor, Ape-X),
        else with the largest priority seen so far."""
        p = self.max_priority if priority is None else abs(float(priority)) + self.eps
        self.max_priority = max(self.max_priority, p)
        self.data[self.pos] = item
        self.tree.update(np.array([self.pos]), np.array([p**self.alpha]))
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def probabilities(self) -> np.ndarray:
        """``P(i)`` of every stored transition."""
        p = self.tree.leaf(np.arange(self.size))
        return p / p.sum()

    def sample(self, batch: int, rng: np.random.Generator) -> tuple[np.ndarray, list, np.ndarray]:
        """Stratified proportional sampling: ``(indices, items, importance weights)``."""
        if self.size == 0:
            raise ValueError("cannot sample an empty replay")
        total = self.tree.total
        seg = total / batch
        mass = (np.arange(batch) + rng.random(batch)) * seg
        idx = np.array([min(self.tree.find(m), self.size - 1) for m in mass], dtype=np.int64)
        probs = self.tree.leaf(idx) / total
        w = (self.size * probs) ** (-self.beta)
        # normalise by the largest possible weight (that of the smallest priority)
        pmin = self.tree.leaf(np.arange(self.size)).min() / total
        w = w / (self.size * pmin) ** (-self.beta)
        return idx, [self.data[i] for i in idx], w

    def update(self, idx: np.ndarray, td_errors: np.ndarray) -> None:
        pr = np.abs(np.asarray(td_errors, dtype=float)) + self.eps
        if pr.size == 0:
            return
        self.max_priority = max(self.max_priority, float(pr.max()))
        self.tree.update(idx, pr**self.alpha)


def apex_epsilons(n: int, eps: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Ape-X per-actor exploration: ``eps^(1 + alpha i / (n - 1))``."""
    if n == 1:
        return np.array([eps])
    return eps ** (1.0 + alpha * np.arange(n) / (n - 1))


def td_error(net: nn.Module, target: nn.Module, items: list, gamma: float, reward_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Q(s, a), y)`` of transitions ``(obs, a, r, next obs, next mask, done)``: the
    double-DQN target ``y = r + gamma Q_target(s', argmax_valid Q(s', .))`` (0 after the
    last step); ``Q(s, a)`` keeps its gradient."""
    obs = stack_obs([it[0] for it in items])
    nobs = stack_obs([it[3] for it in items])
    act = torch.as_tensor([it[1] for it in items])
    rew = torch.as_tensor([it[2] * reward_scale for it in items], dtype=torch.float32)
    done = torch.as_tensor([float(it[5]) for it in items])
    nmask = torch.as_tensor(np.stack([it[4] for it in items]))
    with torch.no_grad():
        q_next = net(nobs).masked_fill(~nmask, float("-inf"))
        a_star = q_next.argmax(-1, keepdim=True)
        q_t = target(nobs).gather(1, a_star).squeeze(1)
        q_t = torch.where(done > 0, torch.zeros_like(q_t), q_t)
        y = rew + gamma * q_t
    return net(obs).gather(1, act[:, None]).squeeze(1), y


def dqn_step(net: nn.Module, target: nn.Module, opt, items: list, weights: np.ndarray, gamma: float, reward_scale: float) -> tuple[float, np.ndarray]:
    """One learner update on a sampled batch (importance-weighted Huber loss, gradient
    norm clipped at 10): ``(loss, TD errors)``, the TD errors being the new priorities."""
    q, y = td_error(net, target, items, gamma, reward_scale)
    loss = (torch.tensor(np.asarray(weights), dtype=torch.float32) * torch.nn.functional.smooth_l1_loss(q, y, reduction="none")).mean()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
    opt.step()
    return float(loss.detach()), (y - q).detach().numpy()


def train_seed(rng: np.random.Generator) -> int:
    """An episode's trace seed, drawn from the protocol's train split."""
    lo, hi = SPLITS["train"]
    return int(rng.integers(lo, hi))


def collect_dqn(task: dict) -> dict:
    torch.set_num_threads(1)
    net = load_state(make_net(task["spec"]), task["state"])
    core = make_core(task["env"])
    rng = np.random.default_rng(task["seed"])
    eps = task["epsilon"]
    out: dict[str, list] = {k: [] for k in ("transition", "reward", "episode_return", "episode_jct", "episode_fee")}
    for _ in range(task["episodes"]):
        core.reset(train_seed(rng))
        obs, mask = core.gym_obs(), gym_mask(core)
        while not core.done:
            if rng.random() < eps:
                a = int(rng.choice(np.flatnonzero(mask)))
            else:
                with torch.no_grad():
                    q = net(stack_obs([obs]))[0].numpy()
                a = int(np.argmax(np.where(mask, q, -np.inf)))
            r = apply_gym_action(core, a)
            done = core.done
            nobs, nmask = core.gym_obs(), gym_mask(core)
            out["transition"].append((obs, a, r, nobs, nmask, done))
            out["reward"].append(r)
            obs, mask = nobs, nmask
        for k, v in zip(("episode_return", "episode_jct", "episode_fee"), episode_summary(core)):
            out[k].append(v)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_arguments(parser, "dqn", 40)
    parser.add_argument("--buffer", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--updates-per-iter", type=int, default=50)
    parser.add_argument("--target-every", type=int, default=200)
    parser.add_argument("--alpha", type=float, default=0.6, help="priority exponent")
    parser.add_argument("--beta", type=float, default=0.4, help="importance-sampling exponent (annealed to 1)")
    parser.add_argument("--epsilon", type=float, default=0.4, help="Ape-X base exploration")
    g = parser.add_argument_group("Ape-X on Ray (--engine ray; --workers actors, an iteration = --updates-per-iter learner updates)")
    g.add_argument("--apex-alpha", type=float, default=7.0, help="actor i explores at epsilon^(1 + apex_alpha i/(N-1))")
    g.add_argument("--push-every", type=int, default=50, help="transitions an actor sends to the replay at once, with its priorities")
    g.add_argument("--sync-every", type=int, default=100, help="actor steps between two pulls of the latest weights")
    g.add_argument("--publish-every", type=int, default=25, help="learner updates between two weight publications")
    g.add_argument("--warmup", type=int, default=1000, help="transitions in the replay before the learner starts")
    parser.add_argument("--max-wall", type=float, default=0.0, help="stop after this many seconds of wall time, on either engine (0: after --iterations)")


def train(args) -> int:
    if args.engine == "ray":
        return train_apex(args)
    torch.set_num_threads(1)
    seed_everything(args.seed)
    placements = EnvConfig().placements
    spec = {"window": args.window, "n_placements": len(placements), "hidden": 128, "placements": list(placements)}
    net = make_net(spec)
    target = make_net(spec)
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    replay = PrioritizedReplay(args.buffer, args.alpha, args.beta)
    env = env_dict(args)
    rng = np.random.default_rng(args.seed)
    eps = apex_epsilons(args.workers, args.epsilon)
    counter = {"updates": 0}
    run = new_run(args, "dqn")
    t0 = time.time()

    def make_task(seed: int, episodes: int) -> dict:
        return {"spec": spec, "state": numpy_state(net), "env": env, "seed": seed, "episodes": episodes, "epsilon": 0.0}

    def update(data: dict) -> dict:
        for tr in data["transition"]:
            replay.add(tr)
        progress = counter["updates"] / max(args.iterations * args.updates_per_iter, 1)
        if args.max_wall:
            progress = min(max(progress, (time.time() - t0) / args.max_wall), 1.0)
        replay.beta = args.beta + (1.0 - args.beta) * progress
        losses = []
        for _ in range(args.updates_per_iter):
            if len(replay) < args.batch:
                break
            idx, items, w = replay.sample(args.batch, rng)
            loss, td = dqn_step(net, target, opt, items, w, args.gamma, args.reward_scale)
            replay.update(idx, td)
            counter["updates"] += 1
            if counter["updates"] % args.target_every == 0:
                target.load_state_dict(net.state_dict())
            losses.append(loss)
        return {"loss": float(np.mean(losses)) if losses else float("nan"), "replay": len(replay), "beta": replay.beta}

    # actor k explores at eps[k] (Ape-X); the learner samples the shared replay
    run_iterations(
        args,
        run,
        collect_dqn_apex,
        lambda seed, n: make_task(seed, n) | {"epsilons": eps.tolist()},
        update,
        f"DQN (dueling, prioritized replay) on {args.trace}",
    )
    model = export_model(args, run, net, "dqn", spec, time.time() - t0)
    print(f"wrote {model}")
    return 0


def collect_dqn_apex(task: dict) -> dict:
    """An Ape-X actor: explores at the epsilon of its actor index."""
    eps = task["epsilons"]
    task = {**task, "epsilon": float(eps[task.get("actor", 0) % len(eps)])}
    return collect_dqn(task)


# ============================================================================ Ape-X on Ray
# Horgan et al., "Distributed Prioritized Experience Replay", ICLR 2018: actors that never
# wait for the learner, each acting with its own epsilon on a recent copy of the network,
# computing the initial priorities of their transitions themselves and sending them in
# batches to one central prioritized replay; one learner that samples it, sends the new
# priorities back and now and then publishes its weights, which the actors pull.
# Differences from the paper, all for this small setting: 1-step double-DQN targets (the
# paper uses 3-step returns), the replay also holds the published weights (the paper's
# learner serves them itself), and no replay eviction beyond the ring buffer.


class ReplayServer:
    """The central prioritized replay (a Ray actor under ``--engine ray``).

    It also keeps what the learner publishes (a reference to the latest weights and their
    version), the finished episodes the actors report, the weight version each actor
    last acted with, and counters for the learner's log. A slot's insertion number is
    kept so that a priority computed for a transition that has since been overwritten is
    dropped, not given to its successor."""

    def __init__(self, capacity: int, alpha: float, beta: float, seed: int) -> None:
        self.replay = PrioritizedReplay(capacity, alpha, beta)
        self.rng = np.random.default_rng(seed)
        self.slot_id = np.full(capacity, -1, dtype=np.int64)
        self.initial = np.zeros(capacity)
        self.added = 0
        self.by_actor: dict[int, int] = {}
        self.actor_version: dict[int, int] = {}
        self.episodes: list[dict] = []
        self.priority_updates = 0
        self.weights: list | None = None
        self.version = 0
        self.running = True

    def add(self, actor: int, version: int, items: list, priorities: np.ndarray, episodes: list[dict]) -> bool:
        """Store an actor's batch with its priorities; whether the actor should go on."""
        for it, p in zip(items, priorities):
            pos = self.replay.pos
            self.replay.add(it, float(p))
            self.slot_id[pos] = self.added
            self.initial[pos] = self.replay.tree.leaf(pos)
            self.added += 1
        self.by_actor[actor] = self.by_actor.get(actor, 0) + len(items)
        self.actor_version[actor] = version
        self.episodes.extend(episodes)
        return self.running

    def sample(self, batch: int, beta: float) -> tuple[np.ndarray, np.ndarray, list, np.ndarray]:
        """``(slots, insertion numbers, transitions, importance weights)``."""
        self.replay.beta = beta
        idx, items, w = self.replay.sample(batch, self.rng)
        return idx, self.slot_id[idx].copy(), items, w

    def update_priorities(self, idx: np.ndarray, ids: np.ndarray, td: np.ndarray) -> None:
        keep = self.slot_id[idx] == ids
        self.replay.update(idx[keep], np.asarray(td)[keep])
        self.priority_updates += int(keep.sum())

    def publish(self, weights: list, version: int) -> None:
        """``weights``: ``[ObjectRef]`` of the learner's ``ray.put`` (a list, so that Ray
        hands the reference over instead of the arrays)."""
        self.weights, self.version = weights, version

    def latest(self, have: int) -> tuple[int, list | None]:
        """The latest version and its weights' reference, or ``(have, None)`` if not newer."""
        return (self.version, self.weights) if self.version > have else (have, None)

    def take_episodes(self) -> list[dict]:
        out, self.episodes = self.episodes, []
        return out

    def stop(self) -> None:
        self.running = False

    def stats(self) -> dict:
        n = len(self.replay)
        changed = int(np.sum(~np.isclose(self.replay.tree.leaf(np.arange(n)), self.initial[:n]))) if n else 0
        return {"size": n, "added": self.added, "by_actor": dict(self.by_actor), "actor_version": dict(self.actor_version),
                "priority_updates": self.priority_updates, "priorities_changed": changed, "version": self.version}


class ApexActor:
    """One Ape-X actor (a Ray actor with one CPU): runs episodes without waiting for the
    learner, exploring at its own ``epsilon``; every ``push_every`` steps it computes the
    batch's priorities with its copy of the network (|TD| of :func:`td_error`, the copy
    serving as its own target) and sends them to the replay, keeping at most one batch in
    flight; every ``sync_every`` steps it pulls the latest published weights."""

    def __init__(self, index: int, epsilon: float, spec: dict, env: dict, seed: int, gamma: float, reward_scale: float,
                 push_every: int, sync_every: int) -> None:
        torch.set_num_threads(1)
        self.index, self.epsilon = index, float(epsilon)
        self.net = make_net(spec).eval()
        self.core = make_core(env)
        self.rng = np.random.default_rng(seed)
        self.gamma, self.reward_scale = gamma, reward_scale
        self.push_every, self.sync_every = max(int(push_every), 1), max(int(sync_every), 1)

    def run(self, replay) -> dict:
        """Act until the replay says stop; ``{"steps", "episodes", "versions"}``."""
        from .rollout import import_ray

        ray = import_ray()
        core, rng = self.core, self.rng
        version, versions, steps, n_episodes = 0, [], 0, 0
        batch: list = []
        finished: list[dict] = []
        pending = None

        def pull() -> None:
            nonlocal version
            v, ref = ray.get(replay.latest.remote(version))
            if ref is not None:
                load_state(self.net, {k: np.array(v) for k, v in ray.get(ref[0]).items()})  # Ray's arrays are read-only
                version = v
                versions.append(v)

        pull()
        while True:
            core.reset(train_seed(rng))
            obs, mask = core.gym_obs(), gym_mask(core)
            while not core.done:
                if rng.random() < self.epsilon:
                    a = int(rng.choice(np.flatnonzero(mask)))
                else:
                    with torch.no_grad():
                        q = self.net(stack_obs([obs]))[0].numpy()
                    a = int(np.argmax(np.where(mask, q, -np.inf)))
                r = apply_gym_action(core, a)
                nobs, nmask = core.gym_obs(), gym_mask(core)
                batch.append((obs, a, r, nobs, nmask, core.done))
                obs, mask = nobs, nmask
                steps += 1
                if len(batch) >= self.push_every:
                    with torch.no_grad():
                        q, y = td_error(self.net, self.net, batch, self.gamma, self.reward_scale)
                    if pending is not None and not ray.get(pending):
                        return {"steps": steps, "episodes": n_episodes, "versions": versions}
                    pending = replay.add.remote(self.index, version, batch, (y - q).abs().numpy(), finished)
                    batch, finished = [], []
                if steps % self.sync_every == 0:
                    pull()
            ret, jct, fee = episode_summary(core)
            n_episodes += 1
            finished.append({"actor": self.index, "version": version, "episode_return": ret, "episode_jct": jct, "episode_fee": fee})


def train_apex(args) -> int:
    """``rlsched train dqn --engine ray``: Ape-X with ``--workers`` actors (see above).

    The learner runs in this process; one CSV row per ``--updates-per-iter`` updates
    (the episodes the actors finished meanwhile, the replay's figures, the learner's
    loss, samples/s = transitions stored per second since the actors started), and one
    row per finished episode in ``episodes.csv`` (actor, weight version, figures)."""
    from .base import CSVLog, plot_curve
    from .rollout import RayRuntime, task_seeds

    if args.workers < 1:
        raise ValueError("Ape-X needs --workers >= 1 actors")
    torch.set_num_threads(1)
    seed_everything(args.seed)
    placements = EnvConfig().placements
    spec = {"window": args.window, "n_placements": len(placements), "hidden": 128, "placements": list(placements)}
    net, target = make_net(spec), make_net(spec)
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    env = env_dict(args)
    run = new_run(args, "dqn")
    logf = CSVLog(run.log)
    episodes_log = CSVLog(run.dir / "episodes.csv", ["wall_s", "actor", "version", "episode_return", "episode_jct", "episode_fee"])
    total = args.iterations * args.updates_per_iter
    runtime = RayRuntime(args.workers)  # one CPU per actor; the replay takes none, the learner is this process
    ray = runtime.ray
    actors: list = []
    replay = None
    summary: dict = {}
    try:
        replay = ray.remote(num_cpus=0)(ReplayServer).remote(args.buffer, args.alpha, args.beta, args.seed)
        version = 1
        weights_ref = ray.put(numpy_state(net))
        ray.get(replay.publish.remote([weights_ref], version))
        actor_cls = ray.remote(num_cpus=1)(ApexActor)
        eps = apex_epsilons(args.workers, args.epsilon, args.apex_alpha)
        seeds = task_seeds(args.seed, args.workers)
        actors = [actor_cls.remote(i, float(eps[i]), spec, env, seeds[i], args.gamma, args.reward_scale, args.push_every, args.sync_every)
                  for i in range(args.workers)]
        done = [a.run.remote(replay) for a in actors]
        t0 = time.time()

        def check_actors() -> None:
            ready, _ = ray.wait(done, num_returns=len(done), timeout=0)
            if ready:
                ray.get(ready)  # raises an actor's error
                raise RuntimeError("an Ape-X actor stopped before the learner")

        warmup = min(max(args.warmup, args.batch), args.buffer)
        while ray.get(replay.stats.remote())["size"] < warmup:
            check_actors()
            time.sleep(0.2)
        updates = 0
        sent: list = []  # priority updates and publications in flight: their errors are read at each row
        nxt = replay.sample.remote(args.batch, args.beta)
        for it in range(args.iterations):
            losses = []
            for _ in range(args.updates_per_iter):
                progress = max(updates / max(total, 1), (time.time() - t0) / args.max_wall if args.max_wall else 0.0)
                beta = args.beta + (1.0 - args.beta) * min(progress, 1.0)
                idx, ids, items, w = ray.get(nxt)
                nxt = replay.sample.remote(args.batch, beta)  # prefetched while this batch trains
                loss, td = dqn_step(net, target, opt, items, w, args.gamma, args.reward_scale)
                sent.append(replay.update_priorities.remote(idx, ids, td))
                losses.append(loss)
                updates += 1
                if updates % args.target_every == 0:
                    target.load_state_dict(net.state_dict())
                if updates % args.publish_every == 0:
                    version += 1
                    weights_ref = ray.put(numpy_state(net))
                    sent.append(replay.publish.remote([weights_ref], version))
            ray.get(sent)
            sent.clear()
            check_actors()
            st = ray.get(replay.stats.remote())
            eps_done = ray.get(replay.take_episodes.remote())
            wall = time.time() - t0
            for e in eps_done:
                episodes_log.write({"wall_s": wall, **e})
            row = {"iteration": it, "updates": updates, "loss": float(np.mean(losses)), "replay": st["size"], "transitions": st["added"],
                   "samples_per_s": st["added"] / wall, "episodes": len(eps_done), "weight_version": version,
                   "actor_version_min": min(st["actor_version"].values()), "beta": beta, "wall_s": wall}
            for col, key in (("episode_return", "episode_return"), ("episode_jct_mean", "episode_jct"), ("episode_fee", "episode_fee")):
                row[col] = float(np.mean([e[key] for e in eps_done])) if eps_done else float("nan")
            logf.write(row)
            print(f"iter {it} updates {updates} transitions {st['added']} ({row['samples_per_s']:.0f}/s) episodes {len(eps_done)} "
                  f"return {row['episode_return']:.2f} jct {row['episode_jct_mean']:.0f} loss {row['loss']:.4f}", flush=True)
            if args.max_wall and wall >= args.max_wall:
                break
        # the final weights, and the actors acting with them, before they stop
        version += 1
        weights_ref = ray.put(numpy_state(net))
        ray.get(replay.publish.remote([weights_ref], version))
        deadline = time.time() + 60.0
        while time.time() < deadline:
            check_actors()
            st = ray.get(replay.stats.remote())
            if len(st["actor_version"]) == len(actors) and min(st["actor_version"].values()) >= version:
                break
            time.sleep(0.1)
        ray.get(replay.stop.remote())
        per_actor = ray.get(done, timeout=120)
        st = ray.get(replay.stats.remote())
        wall = time.time() - t0
        summary = {"engine": "ray-apex", "actors": args.workers, "epsilons": eps.tolist(), "updates": updates, "wall_s": wall,
                   "transitions": st["added"], "samples_per_s": st["added"] / wall, "by_actor": st["by_actor"],
                   "actor_steps": [a["steps"] for a in per_actor], "actor_versions": [a["versions"][-1] for a in per_actor],
                   "weight_version": version, "priority_updates": st["priority_updates"], "priorities_changed": st["priorities_changed"],
                   "replay": st["size"]}
    finally:
        for a in actors + ([replay] if replay is not None else []):
            ray.kill(a)
        runtime.close()
    (run.dir / "apex.json").write_text(json.dumps(summary, indent=2) + "\n")
    rows = [r for r in logf.rows if r["episodes"] > 0]
    if rows:
        plot_curve(rows, run.curve, "wall_s", ["episode_return", "episode_jct_mean", "loss"], f"Ape-X DQN on Ray ({args.workers} actors) on {args.trace}")
    model = export_model(args, run, net, "dqn", spec, summary["wall_s"])
    print(f"wrote {model} ({summary['transitions']} transitions, {summary['samples_per_s']:.0f}/s, {summary['updates']} updates)")
    return 0


def evaluate(args) -> int:
    net, target = load_for_eval(args, "dqn", make_net)

    def factory(core):
        def step(c):
            with torch.no_grad():
                q = net(stack_obs([c.gym_obs()]))[0].numpy()
            return apply_gym_action(c, int(np.argmax(np.where(gym_mask(c), q, -np.inf))))

        return step

    return evaluate_against_seed_baselines(args, target, "DQN", factory)
