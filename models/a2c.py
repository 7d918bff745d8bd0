"""A2cScheduler: advantage actor-critic with a CNN over the cluster state image.

The state image is the environment's ``image`` — nodes x future time slots, the share
of each node's GPUs still busy at ``now + k * image_dt`` (DeepRM-style, Mao et al.,
HotNets 2016) — read by a small CNN with adaptive pooling (so any cluster size fits),
joined with the window's job features. One policy head over ``slot x placement
heuristic`` (:class:`rlsched.sim.envs.SchedulingEnv`'s action) and a value head,
trained with multi-step TD targets ``G_t = sum_{k<n} g^k r_{t+k} + g^n V(s_{t+n})``
(Mnih et al., ICML 2016): :func:`rlsched.models.ppo.n_step_returns`.
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
from .ppo import n_step_returns
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
    masked_sample,
    numpy_state,
    run_iterations,
    stack_obs,
)

__all__ = ["A2CNet", "make_net", "collect_a2c", "add_arguments", "train", "evaluate"]


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


def make_net(spec: dict) -> A2CNet:
    """The network of an exported or training ``spec`` (its architecture metadata)."""
    return A2CNet(spec["window"], spec["n_placements"], spec.get("hidden", 64))


# ============================================================================ A2C
def collect_a2c(task: dict) -> dict:
    torch.set_num_threads(1)
    net = load_state(make_net(task["spec"]), task["state"])
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
    net = make_net(spec)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    env = env_dict(args)
    rng = np.random.default_rng(args.seed)
    run = new_run(args, "a2c")
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

    run_iterations(args, run, collect_a2c, make_task, update, f"A2C (CNN, {args.n_step}-step TD) on {args.trace}")
    model = export_model(args, run, net, "a2c", spec, time.time() - t0, {"image": "nodes x image_steps busy share"})
    print(f"wrote {model}")
    return 0


def evaluate(args) -> int:
    net, target = load_for_eval(args, "a2c", make_net)

    def factory(core):
        def step(c):
            with torch.no_grad():
                logits, _ = net(stack_obs([c.gym_obs()]))
            return apply_gym_action(c, masked_sample(logits[0].numpy(), gym_mask(c), None))

        return step

    return evaluate_against_seed_baselines(args, target, "A2C", factory)
