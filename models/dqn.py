"""DQN with dueling heads and prioritized replay, Ape-X style actors.

* Dueling architecture (Wang et al., ICML 2016, eq. 9):
  ``Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a')`` (mean over all actions).
* Prioritized replay, proportional variant (Schaul et al., ICLR 2016):
  ``P(i) = p_i^alpha / sum_k p_k^alpha`` with ``p_i = |delta_i| + eps``; importance
  weights ``w_i = (N P(i))^-beta / max_j w_j``; new transitions get the largest
  priority seen so far. A sum tree makes sampling and updates O(log N).
* Double-DQN targets (van Hasselt et al., AAAI 2016) over the valid actions of the
  next state; a target network copied every ``--target-every`` updates.
* Actors (Horgan et al., "Distributed Prioritized Experience Replay", ICLR 2018):
  ``--workers`` processes (or Ray actors with ``--engine ray``) run episodes with the
  latest weights, actor ``i`` of ``N`` exploring with ``eps_i = eps^(1 + 7 i / (N-1))``;
  the learner samples the shared replay.

Action = ``slot x placement heuristic`` of :class:`rlsched.sim.envs.SchedulingEnv`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch import nn

from rlsched.core.das_agent import JOB_FEATURES
from rlsched.sim.envs import EnvConfig

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

__all__ = ["DuelingQNet", "make_net", "dueling_aggregate", "SumTree", "PrioritizedReplay", "apex_epsilons", "add_arguments", "train", "evaluate"]


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

    def add(self, item) -> None:
        self.data[self.pos] = item
        self.tree.update(np.array([self.pos]), np.array([self.max_priority**self.alpha]))
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
        self.max_priority = max(self.max_priority, float(pr.max()))
        self.tree.update(idx, pr**self.alpha)


def apex_epsilons(n: int, eps: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Ape-X per-actor exploration: ``eps^(1 + alpha i / (n - 1))``."""
    if n == 1:
        return np.array([eps])
    return eps ** (1.0 + alpha * np.arange(n) / (n - 1))


def collect_dqn(task: dict) -> dict:
    torch.set_num_threads(1)
    net = load_state(make_net(task["spec"]), task["state"])
    core = make_core(task["env"])
    rng = np.random.default_rng(task["seed"])
    eps = task["epsilon"]
    out: dict[str, list] = {k: [] for k in ("transition", "reward", "episode_return", "episode_jct", "episode_fee")}
    for _ in range(task["episodes"]):
        core.reset(int(rng.integers(0, 2**30)))
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


def train(args) -> int:
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
        replay.beta = args.beta + (1.0 - args.beta) * progress
        losses = []
        for _ in range(args.updates_per_iter):
            if len(replay) < args.batch:
                break
            idx, items, w = replay.sample(args.batch, rng)
            obs = stack_obs([it[0] for it in items])
            nobs = stack_obs([it[3] for it in items])
            act = torch.as_tensor([it[1] for it in items])
            rew = torch.as_tensor([it[2] * args.reward_scale for it in items], dtype=torch.float32)
            done = torch.as_tensor([float(it[5]) for it in items])
            nmask = torch.as_tensor(np.stack([it[4] for it in items]))
            with torch.no_grad():
                q_next = net(nobs).masked_fill(~nmask, float("-inf"))
                a_star = q_next.argmax(-1, keepdim=True)
                q_t = target(nobs).gather(1, a_star).squeeze(1)
                q_t = torch.where(done > 0, torch.zeros_like(q_t), q_t)
                y = rew + args.gamma * q_t
            q = net(obs).gather(1, act[:, None]).squeeze(1)
            td = y - q
            loss = (torch.as_tensor(w, dtype=torch.float32) * torch.nn.functional.smooth_l1_loss(q, y, reduction="none")).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 10.0)
            opt.step()
            replay.update(idx, td.detach().numpy())
            counter["updates"] += 1
            if counter["updates"] % args.target_every == 0:
                target.load_state_dict(net.state_dict())
            losses.append(float(loss.detach()))
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


def evaluate(args) -> int:
    net, target = load_for_eval(args, "dqn", make_net)

    def factory(core):
        def step(c):
            with torch.no_grad():
                q = net(stack_obs([c.gym_obs()]))[0].numpy()
            return apply_gym_action(c, int(np.argmax(np.where(gym_mask(c), q, -np.inf))))

        return step

    return evaluate_against_seed_baselines(args, target, "DQN", factory)
