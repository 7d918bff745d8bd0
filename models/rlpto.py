"""RLPTO: PPO elastic scaling of training jobs (Lu et al., IEEE TPDS 34(12):3266–3279, 2023).

Training (``rlsched train rlpto``): one actor-critic shared by every running job of
:class:`~rlsched.sim.scaling_env.ScalingEnv`, PPO-Clip or adaptive-KL, rollouts in
processes, the best greedy policy on held-out seeds exported. Evaluation (``rlsched eval
rlpto``): RLPTO's Tables II/III against FS, FCFS and Optimus-, SLAQ- and TRADL-style
baselines. Details: docs/training.md, docs/design-notes.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from rlsched.core import ClusterState, JobView
from rlsched.core.learned import DEFAULT_WEIGHTS, RLPTO_FEATURES, RLPTO_LAYOUT, RLPTOActor, RLPTOScaling
from rlsched.core.nn import log_softmax
from rlsched.core.ordering import remaining_time
from rlsched.sim import protocol as P
from rlsched.sim.scaling_env import BUDGETS, K_W, OVERPROVISION, REWARDS, ScalingEnv, ScalingEnvConfig

from .base import CSVLog
from .rollout import make_pool, split_episodes
from .runs import add_run_arguments, eval_target, new_run

__all__ = ["add_arguments", "train", "evaluate", "protocol", "SLAQScaling", "LeastRemainingWork", "BASELINES", "BETAS",
           "rollout"]

BETAS = (0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.001)
NODES = (12, 16)
#: policy label in the tables -> how it is built (see :func:`make_policy`)
BASELINES = ("FS", "FCFS", "Optimus", "SLAQ", "TRADL", "beta-rule", "FS+beta")
#: baselines that read a job's future (its noise-free curve): clairvoyant references
CLAIRVOYANT = ("Optimus", "SLAQ")
#: policies whose jobs stop by RLPTO's β rule; the others train for the epoch budget
BETA_STOP = {"RLPTO", "beta-rule", "FS+beta", "Optimus+beta", "LRW+beta", "GrowQ+beta", "Oracle-LRW", "Oracle-Optimus",
             "Oracle-GrowQ"}
#: oracle references of the protocol: run with ``clairvoyant`` views (true remaining time)
ORACLES = ("Oracle-LRW", "Oracle-Optimus", "Oracle-GrowQ")
VERSION = "2"
EVAL_SEED_BASE = 1_000_000  # the Tables II/III workloads (older runs); the protocol uses sim.protocol's test split
VAL_SEED_BASE = 500_000
#: mean gaps between arrivals (s) of the training and protocol workloads: several loads
INTERARRIVALS = (150.0, 300.0, 600.0)


# ---------------------------------------------------------------------- baselines
class SLAQScaling:
    """SLAQ-style allocation (Zhang et al., SoCC'17): all worker slots go, one at a time,
    to the job whose *predicted loss reduction* over the next interval grows most.

    The prediction uses the job's noise-free loss curve (an oracle stand-in for SLAQ's
    online curve fitting) and the engine's throughput at the best placement, over one
    decision cycle, so this needs the :class:`ScalingEnv` it decides in. Returns
    multi-worker moves (target − current); the planner applies one worker of each per
    evaluation.
    """

    name = "slaq"

    def __init__(self, env: ScalingEnv) -> None:
        self.env = env

    def _reduction(self, jid: str, w: int) -> float:
        if w <= 0:
            return 0.0
        sim = self.env.sim
        conv, eff = sim.training_curve(jid)
        thr = sim.ideal_throughput(jid, w)
        d_eff = thr * self.env.config.interval / conv.samples_per_epoch * conv.efficiency(w)
        return float(conv.loss_at(eff) - conv.loss_at(eff + d_eff))

    def decide(self, running: Sequence[JobView], state: ClusterState) -> dict[str, int]:
        jobs = list(running)
        if not jobs:
            return {}
        slots = state.free_gpus // self.env.config.gpus_per_node + sum(j.workers for j in jobs)
        target = {j.id: j.min_workers for j in jobs}
        slots -= sum(target.values())
        while slots > 0:
            best, best_gain = None, 0.0
            for j in jobs:
                w = target[j.id]
                if w >= j.max_workers:
                    continue
                g = self._reduction(j.id, w + 1) - self._reduction(j.id, w)
                if g > best_gain:
                    best, best_gain = j, g
            if best is None:
                break
            target[best.id] += 1
            slots -= 1
        return {j.id: target[j.id] - j.workers for j in jobs if target[j.id] != j.workers}


class LeastRemainingWork:
    """Workers to the least remaining work first (SRPT-style elastic allocation).

    Every elastic running job gets its ``min_workers``; the rest of the GPUs (free plus
    held by elastic jobs) go, job after job in order of remaining work (remaining time
    × GPUs held, :func:`~rlsched.core.ordering.remaining_time`; unknown last), up to each
    job's ``max_workers``. Each job decided on moves one worker towards its target.
    On non-clairvoyant views it reads core's estimate from progress (a heuristic); in a
    ``clairvoyant`` environment the true remaining time, and is then the issue's oracle
    scaler (a labelled reference, never a baseline)."""

    name = "lrw"

    def decide(self, running: Sequence[JobView], state: ClusterState) -> dict[str, int]:
        jobs = [j for j in state.running.values() if j.min_workers < j.max_workers]

        def key(j: JobView) -> tuple:
            r = remaining_time(j)
            return ((0, r * j.gpus) if r > 0 else (1, 0.0), j.submit_time, j.id)

        jobs.sort(key=key)
        pool = state.free_gpus + sum(j.gpus for j in jobs) - sum(j.min_workers * j.gpus_per_worker for j in jobs)
        target = {}
        for j in jobs:
            add = min(j.max_workers - j.min_workers, max(pool, 0) // j.gpus_per_worker)
            target[j.id] = j.min_workers + add
            pool -= add * j.gpus_per_worker
        return {j.id: int(np.sign(target[j.id] - j.workers)) for j in running
                if j.id in target and target[j.id] != j.workers}


class QueueAwareGrow:
    """Grow while a node is free; while jobs wait, the jobs with the most remaining work
    give a worker back so the queue is admitted sooner.

    Per job decided on: ``-1`` when the queue asks for GPUs, the job holds more than its
    ``min_workers`` and its rank in remaining work
    (:func:`~rlsched.core.learned.remaining_rank`) is at least ``threshold``; else ``+1``
    (the planner grants it only where a node is free and the blocked head's GPUs stay
    free). A function of RLPTO's layout-2 observation (:func:`teacher_actions`), so a
    policy can imitate it. On non-clairvoyant views the rank comes from core's estimate
    (a heuristic baseline); in a ``clairvoyant`` environment from the true remaining time
    (an oracle reference)."""

    name = "growq"

    def __init__(self, threshold: float = 0.9) -> None:
        self.threshold = threshold

    def decide(self, running: Sequence[JobView], state: ClusterState) -> dict[str, int]:
        from rlsched.core.learned import remaining_rank

        queued = bool(state.pending)
        out = {}
        for j in running:
            if queued and j.workers > j.min_workers and remaining_rank(j, state) >= self.threshold:
                out[j.id] = -1
            elif j.workers < j.max_workers:
                out[j.id] = 1
        return out


def teacher_actions(obs: np.ndarray, threshold: float = 0.9) -> np.ndarray:
    """:class:`QueueAwareGrow`'s action indices (0: −1, 2: +1) read off layout-2
    observations ``[B, 11]`` (jobs at ``min_workers`` = 1 have ``w = 1/16``)."""
    f = {k: i for i, k in enumerate(RLPTO_FEATURES)}
    shrink = (obs[:, f["n"]] > 0) & (obs[:, f["r"]] >= threshold) & (obs[:, f["w"]] > 1.5 / 16)
    return np.where(shrink, 0, 2)


def make_policy(label: str, env: ScalingEnv, weights: Path | None = None):
    """A scaling policy of the tables by its label."""
    from rlsched.core import make_scaling

    if label in ("FS", "FS+beta"):
        return make_scaling("fs")
    if label == "FCFS":
        return make_scaling("fcfs")
    if label in ("Optimus", "Optimus+beta", "Oracle-Optimus"):
        return make_scaling("optimus")
    if label in ("LRW+beta", "Oracle-LRW"):
        return LeastRemainingWork()
    if label in ("GrowQ+beta", "Oracle-GrowQ"):
        return QueueAwareGrow()
    if label == "SLAQ":
        return SLAQScaling(env)
    if label == "TRADL":
        # traditional training: every task keeps the workers it asked for
        return make_scaling("none")
    if label == "beta-rule":
        return make_scaling("beta")
    if label == "RLPTO":
        pol = RLPTOScaling(path=weights)
        if pol.fallback_reason:
            raise SystemExit(f"rlpto: cannot evaluate, {pol.fallback_reason}")
        return pol
    raise ValueError(f"unknown policy label {label!r}")


# ---------------------------------------------------------------------- rollouts
def _env_for(cfg: dict, nodes: int, beta: float, stop: str = "beta", clairvoyant: bool = False,
             interarrival: float | None = None) -> ScalingEnv:
    cfg = dict(cfg)
    if interarrival is not None:
        cfg["mean_interarrival"] = interarrival
    return ScalingEnv(ScalingEnvConfig(nodes=nodes, beta=beta, stop=stop, clairvoyant=clairvoyant, **cfg))


def rollout(payload: dict, seed: int) -> dict:
    """Run ``payload["episodes"]`` episodes with the numpy actor, sampling actions.

    A job acts in the cycles where it decides (``infos[job]["decides"]``: a new
    evaluation); each decision is one transition whose reward is the sum of the job's
    rewards until its next decision or its end (rewards before its first decision are
    no decision's). Returns per-job trajectories (obs, actions, log-probs, rewards) and
    episode stats. Runs in a worker process: numpy only.
    """
    rng = np.random.default_rng(seed)
    actor = RLPTOActor(payload["weights"], payload["meta"])
    trajs, stats = [], []
    for _ in range(payload["episodes"]):
        nodes = int(rng.choice(payload["nodes"]))
        beta = float(rng.choice(payload["betas"]))
        ia = float(rng.choice(payload.get("interarrivals", INTERARRIVALS)))
        env = _env_for(payload["env"], nodes, beta, interarrival=ia)
        lo, hi = P.SPLITS["train"]
        obs, infos = env.reset(seed=int(rng.integers(lo, hi)))  # training workloads: the protocol's train split only
        buf: dict[str, dict[str, list]] = {}
        while env.agents:
            actions = {}
            ids = [j for j in env.agents if infos[j]["decides"]]
            if ids:
                x = np.stack([obs[j] for j in ids])
                logp_all = log_softmax(actor.logits(x))
                p = np.exp(logp_all)
                u = rng.random(len(ids))
                acts = np.minimum((p.cumsum(axis=1) < u[:, None]).sum(axis=1), 2)
                for k, j in enumerate(ids):
                    b = buf.setdefault(j, {"obs": [], "act": [], "logp": [], "rew": []})
                    b["obs"].append(x[k])
                    b["act"].append(int(acts[k]))
                    b["logp"].append(float(logp_all[k, acts[k]]))
                    b["rew"].append(0.0)
                    actions[j] = int(acts[k])
            obs, rewards, _, _, infos = env.step(actions)
            for j, rwd in rewards.items():
                if j in buf:  # credited to the job's last decision
                    buf[j]["rew"][-1] += rwd
        res = env.result()
        stats.append({"nodes": nodes, "beta": beta, "interarrival": ia, "total_time": res.total_time, "sum_jct": res.mean_jct * len(res.finish),
                      "mean_accuracy": res.mean_accuracy})
        for b in buf.values():
            trajs.append({k: np.asarray(v) for k, v in b.items()})
    return {"trajs": trajs, "stats": stats}


def run_episode(label: str, nodes: int, beta: float, seed: int, env_cfg: dict, weights: Path | None = None,
                interarrival: float | None = None) -> dict:
    """One evaluation episode of a labelled policy (greedy); oracle labels run on
    clairvoyant views."""
    env = _env_for(env_cfg, nodes, beta, "beta" if label in BETA_STOP else "epochs", clairvoyant=label in ORACLES,
                   interarrival=interarrival)
    env.reset(seed)
    res = env.run_policy(make_policy(label, env, weights))
    return {
        "policy": label, "nodes": nodes, "beta": beta, "seed": seed, "interarrival": env.config.mean_interarrival,
        "rescales": res.rescales,
        "total_time_h": res.total_time / 3600, "sum_jct_h": res.mean_jct * len(res.finish) / 3600,
        "mean_jct_h": res.mean_jct / 3600, "mean_accuracy": res.mean_accuracy, "gpu_hours": res.gpu_seconds / 3600,
    }


def _eval_task(payload: dict, seed: int) -> list[dict]:
    del seed  # evaluation seeds are explicit
    return [run_episode(payload["label"], *cell[:3], payload["env"], payload.get("weights"),
                        interarrival=cell[3] if len(cell) > 3 else None) for cell in payload["grid"]]


# ---------------------------------------------------------------------- arguments
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="rollout processes (0 or 1: in the learner's process)")
    p.add_argument("--engine", choices=("process", "ray"), default="process", help="rollout engine (ray: optional extra)")
    add_run_arguments(p, served=DEFAULT_WEIGHTS)
    # environment
    p.add_argument("--nodes", type=int, nargs="+", default=list(NODES))
    p.add_argument("--betas", type=float, nargs="+", default=list(BETAS))
    p.add_argument("--n-jobs", type=int, default=16)
    p.add_argument("--interval", type=float, default=60.0, help="decision cycle, seconds of simulated time")
    p.add_argument("--step", type=int, default=1, choices=(1,),
                   help="i: workers per +/- action (the planner moves one worker per evaluation)")
    p.add_argument("--restart-cost", type=float, default=30.0, help="seconds without progress after a resize (the engine's)")
    p.add_argument("--k-w", type=float, default=K_W)
    p.add_argument("--beta0", type=float, default=None, help="reward threshold β0 (default: each job's β)")
    p.add_argument("--reward", choices=REWARDS, default="paper",
                   help="paper: RLPTO's per-job reward; cluster: -(jobs in system x seconds)/3600 per cycle, "
                        "split among the cycle's jobs (an episode's return is -(sum of JCTs)/3600)")
    p.add_argument("--interarrivals", type=float, nargs="+", default=list(INTERARRIVALS),
                   help="mean seconds between arrivals, one drawn per training episode (the load); "
                        "validation and the protocol use every one")
    p.add_argument("--budget", choices=BUDGETS, default="oracle",
                   help="jobs' epoch budget: 'oracle' (epochs the curve needs to converge) or 'recipe' "
                        f"(a user's budget: oracle x U{OVERPROVISION} per job)")
    # PPO
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--episodes", type=int, default=8, help="episodes per iteration")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lam", type=float, default=0.95)
    p.add_argument("--objective", choices=("clip", "kl"), default="clip")
    p.add_argument("--clip", type=float, default=0.2)
    p.add_argument("--kl-target", type=float, default=0.01)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minibatch", type=int, default=1024)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--reward-scale", type=float, default=10.0, help="rewards are multiplied by this for learning")
    p.add_argument("--init", choices=("random", "imitate-growq"), default="random",
                   help="initial actor: random (near-uniform), or imitate-growq: behaviour cloning of QueueAwareGrow on "
                        "train-split episodes before PPO (an extension of the paper's design)")
    p.add_argument("--bc-episodes", type=int, default=24, help="imitate-growq: teacher episodes")
    p.add_argument("--val-every", type=int, default=10)
    p.add_argument("--val-seeds", type=int, default=4)
    p.add_argument("--time-budget", type=float, default=None, help="stop training after this many minutes")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    # evaluation
    p.add_argument("--eval-seeds", type=int, default=5, help="workloads per (nodes, β) cell")
    p.add_argument("--policies", nargs="+", default=["RLPTO", *BASELINES])
    p.add_argument("--no-update-metadata", action="store_true", help="eval: do not record results in the weights' metadata")
    p.add_argument("--protocol", action="store_true",
                   help="eval: the evaluation protocol instead of Tables II/III: --test-seeds test seeds per cell, paired "
                        "bootstrap of RLPTO against FS+beta, beta-rule, FS, Optimus, with the clairvoyant oracle bound")
    p.add_argument("--test-seeds", type=int, default=20, help="protocol: seeds of the test split per cell")
    p.add_argument("--reuse-rows", type=Path, default=None,
                   help="protocol: a previous run's rlpto_protocol_episodes.csv; its rows of policies other than RLPTO "
                        "are reused (same cells and seeds) instead of run again")
    p.add_argument("--protocol-betas", type=float, nargs="+", default=[0.0003], help="protocol: β of its cells")
    p.add_argument("--protocol-budgets", choices=BUDGETS, nargs="+", default=list(BUDGETS), help="protocol: budget models of its cells")


def _env_cfg(args) -> dict:
    return {"n_jobs": args.n_jobs, "interval": args.interval, "k_w": args.k_w, "beta0": args.beta0, "budget": args.budget,
            "restart_cost": args.restart_cost, "reward": getattr(args, "reward", "paper")}


# ---------------------------------------------------------------------- training
def _build(args):
    import torch

    class ActorCritic(torch.nn.Module):
        def __init__(self, hidden: int) -> None:
            super().__init__()
            d = len(RLPTO_FEATURES)
            self.actor = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                             torch.nn.Tanh(), torch.nn.Linear(hidden, 3))
            self.critic = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                              torch.nn.Tanh(), torch.nn.Linear(hidden, 1))
            with torch.no_grad():  # near-uniform initial policy, small initial values
                self.actor[-1].weight.mul_(0.01)
                self.actor[-1].bias.zero_()
                self.critic[-1].weight.mul_(0.1)

    return ActorCritic(args.hidden)


def _meta(args) -> dict:
    return {
        "observation": {
            "features": list(RLPTO_FEATURES),
            "layout": RLPTO_LAYOUT,
            "encoding": "rlsched.core.learned.rlpto_observation",
            "actions": ["-i", "0", "+i"],
            "action_step": args.step,
        },
        "architecture": {"actor_layers": 3, "hidden": args.hidden, "activation": "tanh", "critic_exported": False},
    }


def _actor_state(model) -> dict:
    return {f"actor.{k}": v.detach().cpu().numpy().astype(np.float32) for k, v in model.actor.state_dict().items()}


def _export(args, model, path: Path, training: dict, evaluation: dict | None = None) -> None:
    from .export import export_policy

    m = _meta(args)
    export_policy(
        path, _actor_state(model), policy="rlpto", version=VERSION, observation=m["observation"],
        architecture=m["architecture"], training=training,
        trained_on={
            "environment": "rlsched.sim.scaling_env.ScalingEnv: PettingZoo parallel env on the Simulator engine "
                           "(ScalingPlanner, FIFO admission, restart cost)",
            "workload": f"make_jobs: {args.n_jobs} jobs, Poisson arrivals with mean gaps {list(args.interarrivals)} s, "
                        f"seeds of the protocol's train split {list(P.SPLITS['train'])}",
            "budget": _budget_text(args.budget),
            "nodes": list(args.nodes), "betas": list(args.betas), "interval_s": args.interval,
            "reward": (f"v_a + sign(v_a - beta0)*T*w*k_w per cycle, k_w={args.k_w}, T*w in worker-minutes"
                       if args.reward == "paper" else
                       "cluster: -(jobs in system x seconds)/3600 per cycle, split equally among the cycle's jobs"),
            "selection": "validation split of rlsched.sim.protocol, sum of JCTs relative to FS+beta",
        },
        evaluation=evaluation,
    )


def _budget_text(budget: str) -> str:
    if budget == "oracle":
        return "oracle: epochs the noise-free curve needs to reach 0.1 points below its plateau"
    return f"recipe: oracle epochs x U{OVERPROVISION} per job (a user's budget set before training)"


def _validate(args, weights_path: Path, pool) -> dict:
    """Greedy policy vs FS+beta on the protocol's validation seeds (every load, the
    smallest, middle and largest β): ratios of sum of JCTs and of makespans, and the
    accuracy difference (RLPTO − FS+beta). Models are chosen on this only."""
    vals = P.seeds("validation", args.val_seeds)
    bs = sorted({min(args.betas), 0.0003, max(args.betas)})
    grid = [(n, b, s, ia) for n in args.nodes for b in bs for ia in args.interarrivals for s in vals]
    env = _env_cfg(args)
    res = pool.run(_eval_task, [{"label": lab, "grid": grid, "env": env, "weights": weights_path} for lab in ("RLPTO", "FS+beta")])
    r, f = res[0], res[1]
    return {
        "val_jct_ratio": float(np.mean([a["sum_jct_h"] / b["sum_jct_h"] for a, b in zip(r, f)])),
        "val_makespan_ratio": float(np.mean([a["total_time_h"] / b["total_time_h"] for a, b in zip(r, f)])),
        "val_acc_diff": float(np.mean([a["mean_accuracy"] - b["mean_accuracy"] for a, b in zip(r, f)])),
    }


def train(args) -> int:
    import torch
    from tqdm import tqdm

    from .export import to_numpy_state
    from .ppo import AdaptiveKL, PPOConfig, gae, ppo_update

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    run = new_run(args, "rlpto")
    out = run.dir
    model = _build(args).to(args.device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    cfg = PPOConfig(objective=args.objective, clip=args.clip, kl_target=args.kl_target, epochs=args.epochs,
                    minibatch_size=args.minibatch, ent_coef=args.ent_coef)
    kl = AdaptiveKL(target=args.kl_target) if args.objective == "kl" else None
    meta = _meta(args)
    if getattr(args, "init", "random") == "imitate-growq":
        bc = _imitate(args, model, rng)
        print(f"rlpto: imitation of QueueAwareGrow: {bc['samples']} decisions ({100 * bc['shrink_share']:.1f}% shrinks), "
              f"agreement {bc['agreement']:.3f}, on shrinks {bc['agreement_shrink']:.3f}")
    hyper = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("func",)}
    hyper.pop("config", None)
    fields = ["iter", "samples", "wall_s", "mean_reward", "episode_sum_jct_h", "episode_makespan_h", "episode_acc",
              "policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac", "p_minus", "p_zero", "p_plus",
              "val_jct_ratio", "val_makespan_ratio", "val_acc_diff"]
    ckpt = out / "candidate.safetensors"
    best = (math.inf, None)
    t0 = time.time()
    samples = 0
    log = CSVLog(run.log, fields)
    with make_pool(args.engine, args.workers, args.seed) as pool:
        bar = tqdm(range(1, args.iterations + 1), desc="rlpto", unit="it", dynamic_ncols=True)
        for it in bar:
            weights = to_numpy_state(_actor_state(model))
            per = split_episodes(args.episodes, args.workers)
            payloads = [{"weights": weights, "meta": meta, "episodes": e, "nodes": args.nodes, "betas": args.betas,
                         "interarrivals": args.interarrivals, "env": _env_cfg(args)} for e in per if e > 0]
            results = pool.run(rollout, payloads)
            trajs = [t for r in results for t in r["trajs"] if len(t["act"])]
            stats = [s for r in results for s in r["stats"]]
            obs = np.concatenate([t["obs"] for t in trajs]).astype(np.float32)
            with torch.no_grad():
                vals = model.critic(torch.from_numpy(obs)).squeeze(-1).numpy().astype(np.float64)
            advs, rets, k = [], [], 0
            for t in trajs:
                n = len(t["act"])
                v = vals[k : k + n]
                k += n
                d = np.zeros(n)
                d[-1] = 1.0  # every job trajectory ends with the job finishing
                a, r = gae(t["rew"] * args.reward_scale, v, d, 0.0, args.gamma, args.lam)
                advs.append(a)
                rets.append(r)
            batch = {
                "obs": torch.from_numpy(obs),
                "act": torch.from_numpy(np.concatenate([t["act"] for t in trajs])).long(),
                "logp": torch.from_numpy(np.concatenate([t["logp"] for t in trajs])).float(),
                "adv": torch.from_numpy(np.concatenate(advs)).float(),
                "ret": torch.from_numpy(np.concatenate(rets)).float(),
                "val": torch.from_numpy(vals).float(),
            }

            def evaluate_fn(mb):
                dist = torch.distributions.Categorical(logits=model.actor(mb["obs"]))
                return dist.log_prob(mb["act"]), dist.entropy(), model.critic(mb["obs"]).squeeze(-1)

            upd = ppo_update(evaluate_fn, [list(model.actor.parameters()), list(model.critic.parameters())], opt, batch, cfg, rng, kl)
            samples += len(obs)
            acts = batch["act"].numpy()
            row = {
                "iter": it, "samples": samples, "wall_s": round(time.time() - t0, 1),
                "mean_reward": float(np.mean(np.concatenate([t["rew"] for t in trajs]))),
                "episode_sum_jct_h": float(np.mean([s["sum_jct"] for s in stats])) / 3600,
                "episode_makespan_h": float(np.mean([s["total_time"] for s in stats])) / 3600,
                "episode_acc": float(np.mean([s["mean_accuracy"] for s in stats])),
                "p_minus": float(np.mean(acts == 0)), "p_zero": float(np.mean(acts == 1)), "p_plus": float(np.mean(acts == 2)),
                **upd,
            }
            if it % args.val_every == 0 or it == args.iterations:
                _export(args, model, ckpt, {**hyper, "iteration": it})
                row.update(_validate(args, ckpt, pool))
                score = row["val_jct_ratio"]
                if score < best[0]:
                    best = (score, it)
                    torch.save(model.state_dict(), out / "best.pt")
                    ckpt.replace(out / "best.safetensors")
                    ckpt.with_suffix(".json").replace(out / "best.json")
                bar.set_postfix(val_jct=f"{row['val_jct_ratio']:.3f}", best=f"{best[0]:.3f}@{best[1]}")
            log.write(row)
            if args.time_budget is not None and time.time() - t0 > args.time_budget * 60:
                break
    wall = time.time() - t0
    if best[1] is not None:
        model.load_state_dict(torch.load(out / "best.pt"))
    training = {**hyper, "iterations_run": it, "best_iteration": best[1], "best_val_jct_ratio": best[0],
                "samples": samples, "wall_s": round(wall, 1), "torch": torch.__version__, "device": args.device,
                "ppo": cfg.as_dict()}
    _export(args, model, run.model, training)
    _plot_learning_curve(run.log, run.curve)
    print(f"rlpto: exported {run.model} (best validation iteration {best[1]}, sum-JCT ratio vs FS+beta {best[0]:.3f}) "
          f"after {it} iterations, {samples} samples, {wall / 60:.1f} min")
    return 0


def _imitate(args, model, rng: np.random.Generator) -> dict:
    """Behaviour cloning of :class:`QueueAwareGrow` (:func:`teacher_actions`): the actor
    learns the teacher's action on the observations of ``--bc-episodes`` teacher episodes
    (train split, cells drawn as in training); cross-entropy, Adam 1e-3."""
    import torch

    xs = []
    lo, hi = P.SPLITS["train"]
    for _ in range(args.bc_episodes):
        env = _env_for(_env_cfg(args), int(rng.choice(args.nodes)), float(rng.choice(args.betas)),
                       interarrival=float(rng.choice(args.interarrivals)))
        obs, infos = env.reset(seed=int(rng.integers(lo, hi)))
        while env.agents:
            ids = [j for j in env.agents if infos[j]["decides"]]
            acts = {}
            if ids:
                x = np.stack([obs[j] for j in ids])
                xs.append(x)
                acts = {j: int(a) for j, a in zip(ids, teacher_actions(x))}
            obs, _, _, _, infos = env.step(acts)
    x = torch.from_numpy(np.concatenate(xs).astype(np.float32))
    y = torch.from_numpy(teacher_actions(x.numpy())).long()
    # the teacher shrinks rarely (a few % of decisions): classes weighted by inverse
    # frequency, or the actor learns "always +1" and drops the shrinks that matter
    counts = torch.bincount(y, minlength=3).float()
    weight = torch.where(counts > 0, counts.sum() / (counts.clamp(min=1) * int((counts > 0).sum())), torch.zeros(3))
    opt = torch.optim.Adam(model.actor.parameters(), lr=3e-3)
    for _ in range(1500):
        idx = torch.from_numpy(rng.integers(0, len(x), size=min(2048, len(x))))
        loss = torch.nn.functional.cross_entropy(model.actor(x[idx]), y[idx], weight=weight)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = model.actor(x).argmax(-1)
    agree = float((pred == y).float().mean())
    shrink = y == 0
    agree_shrink = float((pred[shrink] == 0).float().mean()) if bool(shrink.any()) else float("nan")
    return {"samples": len(x), "agreement": agree, "agreement_shrink": agree_shrink, "shrink_share": float(shrink.float().mean())}


def _plot_learning_curve(log_path: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    df = pd.read_csv(log_path)
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    ax[0].plot(df["iter"], df["mean_reward"])
    ax[0].set(title="mean reward per decision", xlabel="iteration")
    ax[1].plot(df["iter"], df["episode_sum_jct_h"], label="sum of JCTs")
    ax[1].plot(df["iter"], df["episode_makespan_h"], label="makespan")
    ax[1].set(title="training episodes (h)", xlabel="iteration")
    ax[1].legend()
    v = df.dropna(subset=["val_jct_ratio"])
    ax[2].plot(v["iter"], v["val_jct_ratio"], "o-", label="sum JCT / FS+beta")
    ax[2].plot(v["iter"], v["val_makespan_ratio"], "s-", label="makespan / FS+beta")
    ax[2].axhline(1.0, color="grey", lw=0.8)
    ax[2].set(title="validation (greedy) vs FS+beta", xlabel="iteration")
    ax[2].legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def plot_runs(runs: dict[str, Path], png: Path) -> None:
    """Validation curves (sum of JCTs relative to FS+beta, validation split) of several
    training runs in one figure: ``runs`` maps a label to a run directory."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    fig, ax = plt.subplots(1, 2, figsize=(12, 3.8))
    for label, d in runs.items():
        df = pd.read_csv(Path(d) / "train.csv")
        v = df.dropna(subset=["val_jct_ratio"])
        ax[0].plot(v["wall_s"] / 60, v["val_jct_ratio"], "o-", ms=3, label=label)
        ax[1].plot(df["wall_s"] / 60, df["p_minus"], label=label)
    ax[0].axhline(1.0, color="grey", lw=0.8)
    ax[0].set(title="validation: sum of JCTs / FS+beta (greedy)", xlabel="wall minutes")
    ax[1].set(title="share of -1 actions in training rollouts", xlabel="wall minutes")
    ax[0].legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------- evaluation
def evaluate(args) -> int:
    if args.protocol:
        return protocol(args)
    labels = list(args.policies)
    grid = [(n, b, EVAL_SEED_BASE + k) for n in args.nodes for b in args.betas for k in range(args.eval_seeds)]
    env = _env_cfg(args)
    weights, res_dir, record = eval_target(args, "rlpto", served=DEFAULT_WEIGHTS)
    t0 = time.time()
    from tqdm import tqdm

    rows: list[dict] = []
    with make_pool(args.engine, args.workers, args.seed) as pool:
        chunks = [grid[k::max(args.workers, 1)] for k in range(max(args.workers, 1))]
        for lab in tqdm(labels, desc="eval rlpto", unit="policy"):
            res = pool.run(_eval_task, [{"label": lab, "grid": c, "env": env, "weights": weights} for c in chunks if c])
            rows.extend(r for part in res for r in part)
    res_dir.mkdir(parents=True, exist_ok=True)
    with open(res_dir / f"rlpto_eval_episodes_{args.budget}.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summary = _summarize(rows, labels, args)
    stem = f"rlpto_tables_{args.budget}"
    (res_dir / f"{stem}.json").write_text(json.dumps(summary, indent=2) + "\n")
    md = _markdown(summary, labels, args)
    (res_dir / f"{stem}.md").write_text(md)
    _plot_tables(summary, labels, args, res_dir / f"{stem}.png")
    print(md)
    if "RLPTO" in labels and record and not args.no_update_metadata:
        from .export import update_evaluation

        update_evaluation(weights, {f"rlpto_tables_{args.budget}": {
            "budget": _budget_text(args.budget), "vs_fs": summary["headline"], "eval_seeds": args.eval_seeds,
            "eval_wall_s": round(time.time() - t0, 1)}})
    return 0


#: the protocol's rows: the learned policy, the non-clairvoyant baselines, a non-clairvoyant
#: least-remaining-work heuristic, and the clairvoyant oracles (references, never baselines)
PROTOCOL_POLICIES = ("RLPTO", "FS+beta", "beta-rule", "FS", "Optimus+beta", "LRW+beta", "GrowQ+beta", *ORACLES)
#: baselines RLPTO is judged against (all non-clairvoyant)
PROTOCOL_BASELINES = ("FS+beta", "beta-rule", "FS", "Optimus+beta", "LRW+beta", "GrowQ+beta")
#: the must-show: sum of JCTs at least this much below FS+beta ...
TARGET_REL = -0.10
#: ... at a mean final accuracy within this many points of it
TARGET_ACC_POINTS = 0.3


def protocol(args) -> int:
    """The evaluation protocol for RLPTO: the protocol's test seeds (``--test-seeds``) in
    every cell (nodes × β × load × budget model), each policy greedy on the same
    workloads; paired bootstrap 95% intervals of RLPTO − baseline per cell and over all
    cells, on the sum of JCTs (h) and the mean final accuracy (points); the oracle bound
    (clairvoyant) per cell. Writes ``rlpto_protocol.{json,md}`` and the per-episode rows."""
    from tqdm import tqdm

    weights, res_dir, record = eval_target(args, "rlpto", served=DEFAULT_WEIGHTS)
    test = P.seeds("test", args.test_seeds)
    labels = [lab for lab in args.policies if lab in PROTOCOL_POLICIES] if args.policies != ["RLPTO", *BASELINES] \
        else list(PROTOCOL_POLICIES)
    cells = [(b, n, ia, beta) for b in args.protocol_budgets for n in args.nodes for ia in args.interarrivals
             for beta in args.protocol_betas]
    t0 = time.time()
    rows: list[dict] = []
    reused: set[str] = set()
    if args.reuse_rows is not None:
        rows, reused = _reuse(args.reuse_rows, labels, cells, test)
    with make_pool(args.engine, args.workers, args.seed) as pool:
        for budget in args.protocol_budgets:
            env = {**_env_cfg(args), "budget": budget}
            grid = [(n, beta, s, ia) for (b, n, ia, beta) in cells if b == budget for s in test]
            chunks = [grid[k::max(args.workers, 1)] for k in range(max(args.workers, 1))]
            for lab in tqdm([lab for lab in labels if lab not in reused], desc=f"protocol rlpto ({budget})", unit="policy"):
                res = pool.run(_eval_task, [{"label": lab, "grid": c, "env": env, "weights": weights} for c in chunks if c])
                rows.extend({**r, "budget": budget} for part in res for r in part)
    wall = time.time() - t0
    res_dir.mkdir(parents=True, exist_ok=True)
    with open(res_dir / "rlpto_protocol_episodes.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summary = _protocol_summary(rows, labels, cells, test)
    summary.update({"model": str(weights), "model_training": _model_training(weights), "wall_s": round(wall, 1),
                    "test_seeds": [test[0], test[-1]], "n_seeds": len(test), "engine": args.engine, "workers": args.workers})
    (res_dir / "rlpto_protocol.json").write_text(json.dumps(summary, indent=2) + "\n")
    md = _protocol_markdown(summary)
    (res_dir / "rlpto_protocol.md").write_text(md)
    if "RLPTO" in labels and "FS+beta" in labels and record and not args.no_update_metadata:
        from .export import update_evaluation

        a = summary["all"]
        update_evaluation(weights, {"rlpto_protocol": {
            "test_seeds": summary["test_seeds"], "cells": list(summary["cells"]),
            "vs_fs_beta": a["rlpto_vs"]["FS+beta"], "beats_fs_beta": a["beats_fs_beta"], "must_show": a["must_show"],
            "oracle_bound": a.get("oracle_bound"), "position": a.get("rlpto_position")}})
    print(md)
    print(f"rlpto protocol: {len(rows)} episodes in {wall:.0f} s; written to {res_dir}")
    return 0


def _reuse(path: Path, labels: list[str], cells: list[tuple], test: list[int]) -> tuple[list[dict], set[str]]:
    """Rows of a previous protocol run for the non-RLPTO policies that cover every cell
    and seed asked for now (the episodes are deterministic: same cell and seed, same run)."""
    with open(path, newline="") as fh:
        old = list(csv.DictReader(fh))
    num = {"nodes": int, "seed": int, "rescales": int}
    rows = [{k: (num[k](v) if k in num else v if k in ("policy", "budget") else float(v)) for k, v in r.items()} for r in old]
    want = {(b, n, ia, beta, s) for (b, n, ia, beta) in cells for s in test}
    out, reused = [], set()
    for lab in labels:
        if lab == "RLPTO":
            continue
        mine = [r for r in rows if r["policy"] == lab and (r["budget"], r["nodes"], r["interarrival"], r["beta"], r["seed"]) in want]
        if len(mine) == len(want):
            out.extend(mine)
            reused.add(lab)
    return out, reused


def _model_training(weights: Path) -> dict:
    from rlsched.core.nn import PolicyFileError, load_policy_file

    try:
        _, meta = load_policy_file(weights, policy="rlpto")
    except PolicyFileError as exc:
        return {"error": str(exc)}
    t = meta.get("training", {})
    keep = ("reward", "budget", "iterations_run", "best_iteration", "best_val_jct_ratio", "samples", "wall_s", "engine",
            "workers", "interarrivals", "seed")
    return {k: t[k] for k in keep if k in t}


def _pd(a: Sequence[float], b: Sequence[float]) -> dict:
    d = P.paired_bootstrap(a, b)
    return {"n": d.n, "mean_a": d.mean_a, "mean_b": d.mean_b, "diff": d.diff, "diff_lo": d.diff_lo, "diff_hi": d.diff_hi,
            "rel": d.rel, "rel_lo": d.rel_lo, "rel_hi": d.rel_hi}


def _protocol_summary(rows: list[dict], labels: list[str], cells: list[tuple], test: list[int]) -> dict:
    def series(lab: str, key: str, cell: tuple | None) -> list[float]:
        out = []
        for c in ([cell] if cell else cells):
            b, n, ia, beta = c
            by_seed = {r["seed"]: r[key] for r in rows if r["policy"] == lab and r["budget"] == b and r["nodes"] == n
                       and r["interarrival"] == ia and r["beta"] == beta}
            out.extend(by_seed[s] for s in test)
        return out

    def block(cell: tuple | None) -> dict:
        out = {"means": {lab: {"sum_jct_h": float(np.mean(series(lab, "sum_jct_h", cell))),
                               "mean_accuracy_pct": 100 * float(np.mean(series(lab, "mean_accuracy", cell))),
                               "rescales": float(np.mean(series(lab, "rescales", cell)))} for lab in labels}}
        if "RLPTO" in labels:
            out["rlpto_vs"] = {}
            for lab in labels:
                if lab == "RLPTO":
                    continue
                jct = _pd(series("RLPTO", "sum_jct_h", cell), series(lab, "sum_jct_h", cell))
                acc = _pd([100 * x for x in series("RLPTO", "mean_accuracy", cell)],
                          [100 * x for x in series(lab, "mean_accuracy", cell)])
                out["rlpto_vs"][lab] = {"sum_jct_h": jct, "accuracy_points": acc}
        if "FS+beta" in labels:
            out["vs_fs_beta"] = {lab: _pd(series(lab, "sum_jct_h", cell), series("FS+beta", "sum_jct_h", cell))
                                 for lab in labels if lab != "FS+beta"}
            oracles = [lab for lab in ORACLES if lab in labels]
            if oracles:
                best = min(oracles, key=lambda lab: out["means"][lab]["sum_jct_h"])
                fb = out["means"]["FS+beta"]["sum_jct_h"]
                bound = out["means"][best]["sum_jct_h"]
                out["oracle_bound"] = {"policy": best, "sum_jct_h": bound, "rel_vs_fs_beta": bound / fb - 1}
                if "RLPTO" in labels and fb > bound:
                    out["rlpto_position"] = (fb - out["means"]["RLPTO"]["sum_jct_h"]) / (fb - bound)
        if "RLPTO" in labels and "FS+beta" in labels:
            v = out["rlpto_vs"]["FS+beta"]
            out["must_show"] = bool(v["sum_jct_h"]["rel_hi"] <= TARGET_REL and v["sum_jct_h"]["diff_hi"] < 0
                                    and abs(v["accuracy_points"]["diff"]) <= TARGET_ACC_POINTS)
            out["beats_fs_beta"] = bool(v["sum_jct_h"]["diff_hi"] < 0)
        return out

    return {"policies": labels, "clairvoyant": list(ORACLES),
            "cells": {f"{b}|{n}|{ia:g}|{beta:g}": {"budget": b, "nodes": n, "interarrival": ia, "beta": beta, **block(c)}
                      for c in cells for (b, n, ia, beta) in [c]},
            "all": block(None)}


def _protocol_markdown(s: dict) -> str:
    labels = s["policies"]
    show = lambda lab: f"{lab} (clairvoyant reference)" if lab in s["clairvoyant"] else lab  # noqa: E731
    out = [f"<!-- generated by `rlsched eval rlpto --protocol` ({s['n_seeds']} test seeds {s['test_seeds'][0]}-"
           f"{s['test_seeds'][1]} per cell, {s['wall_s']:.0f} s) -->\n",
           "Sum of JCTs in hours (mean over the test seeds), mean final accuracy in %. Oracle rows read every job's "
           "true remaining time: clairvoyant references, never baselines. Paired bootstrap 95% intervals of "
           "RLPTO − baseline over the same seeds; negative sum of JCTs = RLPTO better.\n",
           "### Means per cell\n",
           "| budget | nodes | mean gap (s) | β | " + " | ".join(show(lab) for lab in labels) + " | oracle bound vs FS+beta |",
           "|---" * (len(labels) + 5) + "|"]
    for c in s["cells"].values():
        ob = c.get("oracle_bound")
        out.append(f"| {c['budget']} | {c['nodes']} | {c['interarrival']:g} | {c['beta']:g} | "
                   + " | ".join(f"{c['means'][lab]['sum_jct_h']:.2f} h / {c['means'][lab]['mean_accuracy_pct']:.2f}%" for lab in labels)
                   + (f" | {100 * ob['rel_vs_fs_beta']:+.1f}% ({ob['policy']}) |" if ob else " | – |"))
    if "RLPTO" in labels:
        out += ["", "### RLPTO − baseline, paired over test seeds (sum of JCTs: relative, 95% CI; accuracy: points, 95% CI)\n",
                "| cell | " + " | ".join(lab for lab in labels if lab != "RLPTO") + " | must-show | RLPTO between FS+beta (0) and the bound (1) |",
                "|---" * (len(labels) + 2) + "|"]
        for name, c in [*s["cells"].items(), ("all cells", s["all"])]:
            cells = []
            for lab in labels:
                if lab == "RLPTO":
                    continue
                v = c["rlpto_vs"][lab]
                j, a = v["sum_jct_h"], v["accuracy_points"]
                cells.append(f"{100 * j['rel']:+.1f}% [{100 * j['rel_lo']:+.1f}, {100 * j['rel_hi']:+.1f}]; "
                             f"{a['diff']:+.2f} [{a['diff_lo']:+.2f}, {a['diff_hi']:+.2f}]")
            pos = c.get("rlpto_position")
            out.append(f"| {name} | " + " | ".join(cells) + f" | {'met' if c.get('must_show') else 'missed'} | "
                       + (f"{pos:.2f}" if pos is not None else "–") + " |")
    out.append("")
    return "\n".join(out)


def _summarize(rows: list[dict], labels: list[str], args) -> dict:
    cells: dict = {}
    for lab in labels:
        for n in args.nodes:
            for b in args.betas:
                rs = [r for r in rows if r["policy"] == lab and r["nodes"] == n and r["beta"] == b]
                cells[f"{lab}|{n}|{b}"] = {
                    "mean_accuracy": float(np.mean([r["mean_accuracy"] for r in rs])),
                    "sum_jct_h": float(np.mean([r["sum_jct_h"] for r in rs])),
                    "total_time_h": float(np.mean([r["total_time_h"] for r in rs])),
                    "gpu_hours": float(np.mean([r["gpu_hours"] for r in rs])),
                }
    headline = {}
    if "RLPTO" in labels and "FS" in labels:
        for n in args.nodes:
            for b in args.betas:
                r, f = cells[f"RLPTO|{n}|{b}"], cells[f"FS|{n}|{b}"]
                h = headline[f"{n}nodes_beta{b}"] = {
                    "sum_jct_vs_fs_pct": 100 * (r["sum_jct_h"] / f["sum_jct_h"] - 1),
                    "makespan_vs_fs_pct": 100 * (r["total_time_h"] / f["total_time_h"] - 1),
                    "accuracy_vs_fs_points": 100 * (r["mean_accuracy"] - f["mean_accuracy"]),
                }
                if "FS+beta" in labels:  # the saving of the β stop alone, and what scaling adds to it
                    fb = cells[f"FS+beta|{n}|{b}"]
                    h["fs_beta_sum_jct_vs_fs_pct"] = 100 * (fb["sum_jct_h"] / f["sum_jct_h"] - 1)
                    h["fs_beta_makespan_vs_fs_pct"] = 100 * (fb["total_time_h"] / f["total_time_h"] - 1)
                    h["fs_beta_accuracy_vs_fs_points"] = 100 * (fb["mean_accuracy"] - f["mean_accuracy"])
                    h["sum_jct_vs_fs_beta_pct"] = 100 * (r["sum_jct_h"] / fb["sum_jct_h"] - 1)
    return {"cells": cells, "headline": headline, "budget": args.budget, "policies": labels, "nodes": list(args.nodes),
            "betas": list(args.betas), "eval_seeds": args.eval_seeds, "seed_base": EVAL_SEED_BASE}


def _markdown(summary: dict, labels: list[str], args) -> str:
    cells = summary["cells"]
    out = [f"<!-- generated by `rlsched eval rlpto --budget {args.budget}` ({args.eval_seeds} workloads per cell, "
           f"seeds {EVAL_SEED_BASE}+) -->\n",
           f"Epoch budget of the jobs: **{_budget_text(args.budget)}**. FS, FCFS, Optimus, SLAQ and TRADL train "
           "every job for its budget; RLPTO, beta-rule and FS+beta stop it by the β rule or at the budget. "
           "Optimus and SLAQ read each job's noise-free curve (its future): clairvoyant references, not baselines.\n"]
    for title, key, fmt in (
        ("Table II — mean final accuracy (%)", "mean_accuracy", lambda v: f"{100 * v:.2f}"),
        ("Table III — total training time: sum of task completion times (h)", "sum_jct_h", lambda v: f"{v:.1f}"),
        ("Table III (b) — total training time: makespan of the task set (h)", "total_time_h", lambda v: f"{v:.2f}"),
    ):
        for n in args.nodes:
            out.append(f"### {title}, {n} nodes\n")
            out.append("| policy | " + " | ".join(f"β={b:g}" for b in args.betas) + " |")
            out.append("|---" * (len(args.betas) + 1) + "|")
            for lab in labels:
                shown = f"{lab} (clairvoyant reference)" if lab in CLAIRVOYANT else lab
                out.append(f"| {shown} | " + " | ".join(fmt(cells[f'{lab}|{n}|{b}'][key]) for b in args.betas) + " |")
            out.append("")
    if summary["headline"]:

        def per_cell(title: str, columns: list[str], row) -> None:
            out.append(f"### {title}\n")
            out.append("| nodes | β | " + " | ".join(columns) + " |")
            out.append("|---" * (len(columns) + 2) + "|")
            for n in args.nodes:
                for b in args.betas:
                    out.append(f"| {n} | {b:g} | " + " | ".join(row(summary["headline"][f"{n}nodes_beta{b}"])) + " |")
            out.append("")

        per_cell("RLPTO vs FS", ["sum of JCTs", "makespan", "accuracy (points)"],
                 lambda h: [f"{h['sum_jct_vs_fs_pct']:+.1f}%", f"{h['makespan_vs_fs_pct']:+.1f}%", f"{h['accuracy_vs_fs_points']:+.2f}"])
        if "FS+beta" in labels:
            per_cell("Decomposition: the β stop alone (FS+beta vs FS) and RLPTO's scaling on top (RLPTO vs FS+beta)",
                     ["FS+beta vs FS: sum of JCTs", "makespan", "accuracy (points)", "RLPTO vs FS+beta: sum of JCTs"],
                     lambda h: [f"{h['fs_beta_sum_jct_vs_fs_pct']:+.1f}%", f"{h['fs_beta_makespan_vs_fs_pct']:+.1f}%",
                                f"{h['fs_beta_accuracy_vs_fs_points']:+.2f}", f"{h['sum_jct_vs_fs_beta_pct']:+.1f}%"])
    return "\n".join(out)


def _plot_tables(summary: dict, labels: list[str], args, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = summary["cells"]
    fig, ax = plt.subplots(2, len(args.nodes), figsize=(6 * len(args.nodes), 7), squeeze=False)
    for c, n in enumerate(args.nodes):
        for lab in labels:
            ax[0, c].plot(args.betas, [100 * cells[f"{lab}|{n}|{b}"]["mean_accuracy"] for b in args.betas], "o-", label=lab)
            ax[1, c].plot(args.betas, [cells[f"{lab}|{n}|{b}"]["sum_jct_h"] for b in args.betas], "o-", label=lab)
        ax[0, c].set(xscale="log", title=f"{n} nodes, {args.budget} budget: mean final accuracy (%)", xlabel="β")
        ax[1, c].set(xscale="log", title=f"{n} nodes, {args.budget} budget: sum of JCTs (h)", xlabel="β")
    ax[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
