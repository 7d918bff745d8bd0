"""A2cScheduler: advantage actor-critic with a CNN over the cluster state image.

The state image is the environment's ``image`` — nodes x future time slots, the share
of each node's GPUs still busy at ``now + k * image_dt`` (DeepRM-style, Mao et al.,
HotNets 2016) — read by a small CNN with adaptive pooling (so any cluster size fits),
joined with the window's job features. One policy head over ``slot x placement
heuristic`` (:class:`rlsched.sim.envs.SchedulingEnv`'s action) and a value head,
trained with multi-step TD targets ``G_t = sum_{k<n} g^k r_{t+k} + g^n V(s_{t+n})``
(Mnih et al., ICML 2016).

Also the helpers HierRL and DQN share: torch modules rebuilt in rollout workers from
numpy state, and :func:`evaluate_against_seed_baselines` (the learned agent vs SJF,
Tetris and random on unseen synthetic traces).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from rlsched.core.das_agent import JOB_FEATURES
from rlsched.sim.envs import EnvConfig, SchedulingCore

from . import das as common
from .das import CLUSTER_DIM, CSVLog, RolloutPool, iteration_row, merge, plot_curve, seed_everything, split_episodes

__all__ = ["A2CNet", "add_arguments", "train", "evaluate", "SEED_BASELINES", "n_step_returns"]

RESULTS = common.RESULTS
#: baselines of the A2C / HierRL / DQN comparison (ordering/placement)
SEED_BASELINES = ("sjf/firstfit", "tetris/bestfit", "random/random")


class A2CNet(nn.Module):
    """CNN over the ``[nodes, time]`` image + MLP over the jobs -> policy and value.

    The policy head is shared by the job slots (each slot's logits over the placement
    heuristics come from that job's features and the cluster context), so a job is
    scored the same wherever it sits in the window."""

    def __init__(self, window: int, n_placements: int, hidden: int = 64) -> None:
        super().__init__()
        self.window, self.n_placements = window, n_placements
        self.conv = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d((4, 4))
        )
        self.jobs = nn.Sequential(nn.Linear(window * (len(JOB_FEATURES) + 1), hidden), nn.ReLU())
        self.body = nn.Sequential(nn.Linear(8 * 16 + hidden + CLUSTER_DIM, hidden), nn.ReLU())
        self.pi = nn.Sequential(nn.Linear(len(JOB_FEATURES) + hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_placements))
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        img = self.conv(obs["image"][:, None]).flatten(1)
        jobs = torch.cat([obs["jobs"], obs["valid"][..., None].float()], -1).flatten(1)
        h = self.body(torch.cat([img, self.jobs(jobs), obs["cluster"]], -1))
        per_slot = torch.cat([obs["jobs"], h[:, None, :].expand(-1, obs["jobs"].shape[1], -1)], -1)
        return self.pi(per_slot).flatten(1), self.v(h).squeeze(-1)


def n_step_returns(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, n: int, gamma: float) -> np.ndarray:
    """Multi-step TD targets ``G_t = sum_{k<m} g^k r_{t+k} + g^m V(s_{t+m})`` with
    ``m = min(n, steps to the episode end)``; nothing is bootstrapped past a ``done``
    (``dones[t] = 1`` when the episode ended after step ``t``). ``values[t] = V(s_t)``."""
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    dones = np.asarray(dones, dtype=bool)
    T = len(rewards)
    out = np.zeros(T)
    for t in range(T):
        g, disc, k = 0.0, 1.0, t
        while True:
            g += disc * rewards[k]
            disc *= gamma
            if dones[k]:
                break
            k += 1
            if k - t == n or k >= T:
                if k < T:
                    g += disc * values[k]
                break
        out[t] = g
    return out


# ============================================================================ shared
def stack_obs(obs: Sequence[dict]) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(np.stack([o[k] for o in obs]), dtype=torch.float32) for k in obs[0]}


def build(kind: str, spec: dict) -> nn.Module:
    """Rebuild a network in a rollout worker: ``kind`` in a2c / dqn / hierrl."""
    if kind == "a2c":
        return A2CNet(spec["window"], spec["n_placements"], spec.get("hidden", 64))
    if kind == "dqn":
        from .dqn import DuelingQNet

        return DuelingQNet(spec["window"], spec["n_placements"], spec.get("hidden", 128))
    if kind == "hierrl":
        from .hierrl import HierNet

        return HierNet(spec.get("hidden", 64), spec.get("state_dim", 0))
    raise ValueError(f"unknown network kind {kind!r}")


def load_net(kind: str, spec: dict, state: dict[str, np.ndarray]) -> nn.Module:
    net = build(kind, spec)
    net.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    return net.eval()


def load_for_eval(args, kind: str) -> nn.Module:
    """The trained ``kind`` network from ``--model`` (default ``--out``), on one torch
    thread, with ``args.window`` set to the window it was trained with."""
    torch.set_num_threads(1)
    from rlsched.core import nn as core_nn

    weights, meta = core_nn.load_policy_file(args.model or args.out, policy=kind)
    args.window = int(meta["architecture"]["window"])
    return load_net(kind, meta["architecture"], weights)


def numpy_state(net: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in net.state_dict().items()}


def env_dict(args) -> dict:
    return {
        "trace": args.trace,
        "episode_jobs": args.episode_jobs,
        "window": args.window,
        "fee_weight": args.fee_weight,
        "time_scale": args.time_scale,
        "workload": getattr(args, "workload", None),
    }


def make_core(env: dict) -> SchedulingCore:
    return SchedulingCore(common.make_workload(env), common._env_config(env))


def masked_sample(logits: np.ndarray, mask: np.ndarray, rng: np.random.Generator | None) -> int:
    z = np.where(mask, logits, -np.inf)
    if rng is None:
        return int(np.argmax(z))
    p = np.exp(z - z.max())
    p /= p.sum()
    return int(rng.choice(len(p), p=p))


def apply_gym_action(core: SchedulingCore, a: int) -> float:
    """Start the job of slot ``a // P`` with heuristic ``a % P``; the reward."""
    p = len(core.config.placements)
    slot, h = divmod(int(a), p)
    job = core.window_jobs()[slot]
    return core.start(slot, core.place_by_policy(job, core.config.placements[h]))


def gym_mask(core: SchedulingCore) -> np.ndarray:
    return np.repeat(core.mask(), len(core.config.placements))


def common_arguments(parser: argparse.ArgumentParser, tag: str, iterations: int) -> None:
    parser.add_argument("--trace", default="synthetic:small", help="training trace SPEC (fresh seed per episode)")
    parser.add_argument("--episode-jobs", type=int, default=60)
    parser.add_argument("--iterations", type=int, default=iterations)
    parser.add_argument("--episodes-per-iter", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="rollout processes")
    parser.add_argument("--engine", choices=("process", "ray"), default="process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--fee-weight", type=float, default=0.02)
    parser.add_argument("--time-scale", type=float, default=3600.0)
    parser.add_argument("--reward-scale", type=float, default=0.1)
    parser.add_argument("--out", type=Path, default=RESULTS / f"{tag}_model.safetensors", help="weights file")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--tag", default=tag)
    parser.add_argument("--eval-traces", default="synthetic:small;synthetic:medium;synthetic:large,jobs=5000",
                        help="';'-separated evaluation trace SPECs")
    parser.add_argument("--eval-seeds", type=int, default=3)
    parser.add_argument("--eval-jobs", type=int, default=None)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--model", type=Path, default=None, help="weights to evaluate (default --out)")


def run_iterations(args, collect: Callable[[dict], dict], make_task: Callable[[int, int], dict], update: Callable[[dict], dict], title: str) -> CSVLog:
    """The shared loop: parallel rollouts -> update -> CSV row, with a progress bar."""
    from tqdm import tqdm

    rng = np.random.default_rng(args.seed + 1)
    logf = CSVLog(args.results / f"{args.tag}_train.csv")
    t0 = time.time()
    with RolloutPool(collect, args.workers, args.engine) as pool:
        bar = tqdm(range(args.iterations), desc=f"train {args.tag}", unit="it")
        for it in bar:
            per = split_episodes(args.episodes_per_iter, pool.workers)
            tasks = [make_task(int(rng.integers(0, 2**31 - 1)), n) | {"actor": k, "iteration": it} for k, n in enumerate(per) if n > 0]
            data = merge(pool.map(tasks))
            stats = update(data)
            row = iteration_row(it, data, stats, t0)
            logf.write(row)
            bar.set_postfix(ret=f"{row['episode_return']:.2f}", jct=f"{row['episode_jct_mean']:.0f}")
    plot_curve(logf.rows, args.results / f"{args.tag}_learning_curve.png", "iteration", ["episode_return", "episode_jct_mean"], title)
    return logf


def episode_summary(core: SchedulingCore) -> tuple[float, float, float]:
    from rlsched.sim import compute_metrics

    m = compute_metrics(core.sim.result())
    return core.returns, m["jct_mean"], m["fee_total"]


def export(args, net: nn.Module, policy: str, spec: dict, wall: float, extra: dict | None = None) -> None:
    from .export import export_policy

    export_policy(
        args.out,
        numpy_state(net),
        policy=policy,
        version="1",
        observation={"env": "rlsched.sim.envs.SchedulingEnv", "job_features": list(JOB_FEATURES), "window": args.window, **(extra or {})},
        architecture=spec,
        training={**common._jsonable_args(args), "wall_s": wall, "torch_threads": 1, "device": "cpu"},
        trained_on={"trace": args.trace, "episode_jobs": args.episode_jobs, "episodes": args.iterations * args.episodes_per_iter},
    )


def evaluate_against_seed_baselines(args, name: str, act_factory: Callable[[SchedulingCore], Callable[[SchedulingCore], float]]) -> int:
    """Table: the learned agent (greedy) vs SJF, Tetris and random, mean JCT and fee,
    on evaluation traces never drawn in training. ``act_factory(core)`` returns
    ``step(core) -> reward`` that makes one decision (start or wait)."""
    from tqdm import tqdm

    from rlsched.sim import SimConfig, compute_metrics

    rows = []
    for label, seed, tr in tqdm(common.eval_traces(args), desc=f"eval {name}", unit="trace"):
        for b in SEED_BASELINES:
            o, p = b.split("/")
            m = common.run_heuristic(tr.jobs, tr.topology, o, p, seed)
            rows.append({"trace": label, "seed": seed, "system": b, "jct_mean": m["jct_mean"], "fee_total": m["fee_total"]})
        core = SchedulingCore(lambda _r: (tr.jobs, tr.topology), EnvConfig(window=args.window, fee_weight=args.fee_weight, time_scale=args.time_scale, sim=SimConfig()))
        core.reset(seed)
        step = act_factory(core)
        while not core.done:
            step(core)
        m = compute_metrics(core.sim.result())
        rows.append({"trace": label, "seed": seed, "system": name, "jct_mean": m["jct_mean"], "fee_total": m["fee_total"]})
    systems = list(SEED_BASELINES) + [name]
    table = common.summarize(rows, systems)
    md = common.write_table(table, systems, [name], list(SEED_BASELINES), args.results / f"{args.tag}_table", f"{name} vs SJF, Tetris and random")
    (args.results / f"{args.tag}_eval_runs.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(md)
    from .export import update_evaluation

    update_evaluation(args.model or args.out, {"table": table, "seeds": sorted({r["seed"] for r in rows})})
    return 0


# ============================================================================ A2C
def collect_a2c(task: dict) -> dict:
    torch.set_num_threads(1)
    net = load_net("a2c", task["spec"], task["state"])
    core = make_core(task["env"])
    rng = np.random.default_rng(task["seed"])
    out: dict[str, list] = {k: [] for k in ("obs", "mask", "action", "reward", "done", "episode_return", "episode_jct", "episode_fee")}
    for _ in range(task["episodes"]):
        core.reset(int(rng.integers(0, 2**30)))
        while not core.done:
            obs = core.gym_obs()
            mask = gym_mask(core)
            with torch.no_grad():
                logits, _ = net(stack_obs([obs]))
            a = masked_sample(logits[0].numpy(), mask, rng)
            r = apply_gym_action(core, a)
            for k, v in (("obs", obs), ("mask", mask), ("action", a), ("reward", r), ("done", core.done)):
                out[k].append(v)
        for k, v in zip(("episode_return", "episode_jct", "episode_fee"), episode_summary(core)):
            out[k].append(v)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common_arguments(parser, "a2c", 40)
    parser.add_argument("--n-step", type=int, default=5, help="TD steps")
    parser.add_argument("--ent-coef", type=float, default=0.01)
    parser.add_argument("--vf-coef", type=float, default=0.5)
    parser.add_argument("--minibatch", type=int, default=256)


def train(args) -> int:
    torch.set_num_threads(1)
    seed_everything(args.seed)
    placements = EnvConfig().placements
    spec = {"window": args.window, "n_placements": len(placements), "hidden": 64, "placements": list(placements)}
    net = build("a2c", spec)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    env = env_dict(args)
    rng = np.random.default_rng(args.seed)
    t0 = time.time()

    def make_task(seed: int, episodes: int) -> dict:
        return {"spec": spec, "state": numpy_state(net), "env": env, "seed": seed, "episodes": episodes}

    def update(data: dict) -> dict:
        obs = stack_obs(data["obs"])
        with torch.no_grad():
            _, values = net(obs)
        targets = n_step_returns(np.asarray(data["reward"]) * args.reward_scale, values.numpy(), np.asarray(data["done"]), args.n_step, args.gamma)
        tgt = torch.as_tensor(targets, dtype=torch.float32)
        adv_all = tgt - values
        adv_all = (adv_all - adv_all.mean()) / (adv_all.std() + 1e-8) if len(adv_all) > 1 else adv_all
        act = torch.as_tensor(data["action"])
        mask = torch.as_tensor(np.stack(data["mask"]))
        n = len(act)
        stats = {"loss_policy": [], "loss_value": [], "entropy": []}
        for idx in np.array_split(rng.permutation(n), max(n // args.minibatch, 1)):
            i = torch.as_tensor(idx)
            logits, v = net({k: t[i] for k, t in obs.items()})
            logits = logits.masked_fill(~mask[i], float("-inf"))
            logp = torch.log_softmax(logits, -1)
            adv = adv_all[i]
            lp = -(logp.gather(1, act[i][:, None]).squeeze(1) * adv).mean()
            lv = 0.5 * ((tgt[i] - v) ** 2).mean()
            p = logp.exp()
            ent = -(p * torch.where(mask[i], logp, torch.zeros_like(logp))).sum(-1).mean()
            loss = lp + args.vf_coef * lv - args.ent_coef * ent
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            opt.step()
            stats["loss_policy"].append(float(lp.detach()))
            stats["loss_value"].append(float(lv.detach()))
            stats["entropy"].append(float(ent.detach()))
        return {k: float(np.mean(v)) for k, v in stats.items()}

    run_iterations(args, collect_a2c, make_task, update, f"A2C (CNN, {args.n_step}-step TD) on {args.trace}")
    export(args, net, "a2c", spec, time.time() - t0, {"image": "nodes x image_steps busy share"})
    print(f"wrote {args.out}")
    return 0


def evaluate(args) -> int:
    net = load_for_eval(args, "a2c")

    def factory(core):
        def step(c):
            with torch.no_grad():
                logits, _ = net(stack_obs([c.gym_obs()]))
            return apply_gym_action(c, masked_sample(logits[0].numpy(), gym_mask(c), None))

        return step

    return evaluate_against_seed_baselines(args, "A2C", factory)
