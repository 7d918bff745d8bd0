"""RLPTO: PPO elastic scaling of training jobs (Lu et al., IEEE TPDS 34(12):3266–3279, 2023).

Training (``rlsched train rlpto``): one actor-critic shared by every running job
(parameter sharing) of :class:`~rlsched.sim.scaling_env.ScalingEnv`, a PettingZoo
parallel environment on the simulator engine; per job the state is RLPTO's
``(m, e, l, n, a, c, w)`` (:mod:`rlsched.core.learned`), the action ``−1 / 0 / +1``
worker, taken when the job has a new evaluation (the planner's rule; one transition per
decision, credited with the rewards ``r = v_a + sign(v_a − β0)·T·w·k_w`` of the cycles
until its next decision), γ = 0.99. The
objective is PPO-Clip, or adaptive-KL PPO with ``--objective kl``. Rollouts run in
``--workers`` processes (numpy actor, no torch there); each training episode draws its
cluster size and β from the evaluation grid. The greedy policy is validated against
fair share on held-out seeds every ``--val-every`` iterations and the best one is
exported as the run's model (``out/train/<run>/model.safetensors`` + ``.json``;
:mod:`rlsched.models.runs`); ``rlsched models promote <run>`` serves it.

Evaluation (``rlsched eval rlpto``): RLPTO Tables II/III — mean final accuracy and total
training time of RLPTO vs FS, FCFS, Optimus-style, SLAQ-style and TRADL-style for
β ∈ {0.00005 … 0.001} on 12 and 16 nodes, on workloads the policy never trained on.
``--budget oracle|recipe`` picks the jobs' epoch budget (:func:`rlsched.sim.scaling_env.make_jobs`)
in training and evaluation; the tables are written per budget.
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
from rlsched.core.learned import DEFAULT_WEIGHTS, RLPTO_FEATURES, RLPTOActor, RLPTOScaling
from rlsched.core.nn import log_softmax
from rlsched.sim.scaling_env import BUDGETS, K_W, OVERPROVISION, ScalingEnv, ScalingEnvConfig

from .base import CSVLog
from .rollout import make_pool, split_episodes
from .runs import add_run_arguments, eval_target, new_run

__all__ = ["add_arguments", "train", "evaluate", "SLAQScaling", "BASELINES", "BETAS", "rollout"]

BETAS = (0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.001)
NODES = (12, 16)
#: policy label in the tables -> how it is built (see :func:`make_policy`)
BASELINES = ("FS", "FCFS", "Optimus", "SLAQ", "TRADL", "beta-rule", "FS+beta")
#: baselines that read a job's future (its noise-free curve): clairvoyant references
CLAIRVOYANT = ("Optimus", "SLAQ")
#: policies whose jobs stop by RLPTO's β rule; the others train for the epoch budget
BETA_STOP = {"RLPTO", "beta-rule", "FS+beta"}
VERSION = "1"
EVAL_SEED_BASE = 1_000_000  # evaluation workloads: never drawn in training
VAL_SEED_BASE = 500_000


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


def make_policy(label: str, env: ScalingEnv, weights: Path | None = None):
    """A scaling policy of the tables by its label."""
    from rlsched.core import make_scaling

    if label in ("FS", "FS+beta"):
        return make_scaling("fs")
    if label == "FCFS":
        return make_scaling("fcfs")
    if label == "Optimus":
        return make_scaling("optimus")
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
def _env_for(cfg: dict, nodes: int, beta: float, stop: str = "beta") -> ScalingEnv:
    return ScalingEnv(ScalingEnvConfig(nodes=nodes, beta=beta, stop=stop, **cfg))


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
        env = _env_for(payload["env"], nodes, beta)
        obs, infos = env.reset(seed=int(rng.integers(VAL_SEED_BASE)))
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
        stats.append({"nodes": nodes, "beta": beta, "total_time": res.total_time, "sum_jct": res.mean_jct * len(res.finish),
                      "mean_accuracy": res.mean_accuracy})
        for b in buf.values():
            trajs.append({k: np.asarray(v) for k, v in b.items()})
    return {"trajs": trajs, "stats": stats}


def run_episode(label: str, nodes: int, beta: float, seed: int, env_cfg: dict, weights: Path | None = None) -> dict:
    """One evaluation episode of a labelled policy (greedy)."""
    env = _env_for(env_cfg, nodes, beta, "beta" if label in BETA_STOP else "epochs")
    env.reset(seed)
    res = env.run_policy(make_policy(label, env, weights))
    return {
        "policy": label, "nodes": nodes, "beta": beta, "seed": seed,
        "total_time_h": res.total_time / 3600, "sum_jct_h": res.mean_jct * len(res.finish) / 3600,
        "mean_jct_h": res.mean_jct / 3600, "mean_accuracy": res.mean_accuracy, "gpu_hours": res.gpu_seconds / 3600,
    }


def _eval_task(payload: dict, seed: int) -> list[dict]:
    del seed  # evaluation seeds are explicit
    return [run_episode(payload["label"], n, b, s, payload["env"], payload.get("weights")) for (n, b, s) in payload["grid"]]


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
    p.add_argument("--val-every", type=int, default=10)
    p.add_argument("--val-seeds", type=int, default=4)
    p.add_argument("--time-budget", type=float, default=None, help="stop training after this many minutes")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    # evaluation
    p.add_argument("--eval-seeds", type=int, default=5, help="workloads per (nodes, β) cell")
    p.add_argument("--policies", nargs="+", default=["RLPTO", *BASELINES])
    p.add_argument("--no-update-metadata", action="store_true", help="eval: do not record results in the weights' metadata")


def _env_cfg(args) -> dict:
    return {"n_jobs": args.n_jobs, "interval": args.interval, "k_w": args.k_w, "beta0": args.beta0, "budget": args.budget,
            "restart_cost": args.restart_cost}


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
            "workload": f"make_jobs: {args.n_jobs} jobs, Poisson arrivals, seeds < {VAL_SEED_BASE}",
            "budget": _budget_text(args.budget),
            "nodes": list(args.nodes), "betas": list(args.betas), "interval_s": args.interval,
            "reward": f"v_a + sign(v_a - beta0)*T*w*k_w per cycle, k_w={args.k_w}, T*w in worker-minutes",
        },
        evaluation=evaluation,
    )


def _budget_text(budget: str) -> str:
    if budget == "oracle":
        return "oracle: epochs the noise-free curve needs to reach 0.1 points below its plateau"
    return f"recipe: oracle epochs x U{OVERPROVISION} per job (a user's budget set before training)"


def _validate(args, weights_path: Path, pool) -> dict:
    """Greedy policy vs FS on held-out validation seeds: ratios of sum of JCTs and of
    makespans, and accuracy difference (RLPTO − FS)."""
    grid = [(n, b, VAL_SEED_BASE + k) for n in args.nodes for b in (min(args.betas), 0.0003, max(args.betas)) for k in range(args.val_seeds)]
    env = _env_cfg(args)
    res = pool.run(_eval_task, [{"label": lab, "grid": grid, "env": env, "weights": weights_path} for lab in ("RLPTO", "FS")])
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
                         "env": _env_cfg(args)} for e in per if e > 0]
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
    print(f"rlpto: exported {run.model} (best validation iteration {best[1]}, sum-JCT ratio vs FS {best[0]:.3f}) "
          f"after {it} iterations, {samples} samples, {wall / 60:.1f} min")
    return 0


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
    ax[2].plot(v["iter"], v["val_jct_ratio"], "o-", label="sum JCT / FS")
    ax[2].plot(v["iter"], v["val_makespan_ratio"], "s-", label="makespan / FS")
    ax[2].axhline(1.0, color="grey", lw=0.8)
    ax[2].set(title="validation (greedy) vs fair share", xlabel="iteration")
    ax[2].legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------- evaluation
def evaluate(args) -> int:
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
