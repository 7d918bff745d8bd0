"""DAS: the dual-agent scheduler (Xing et al., KDD 2023), trained with MAPPO.

An ordering agent (:class:`OrderingNet`, a transformer over the window of pending jobs)
and a placement agent (:class:`PlacementRWGP`, node scores under the Random-Walk GP of
:mod:`rlsched.core.das`), both updated with PPO on the advantage of one centralized
critic. Rollouts run in processes or on Ray; ``rlsched eval das`` writes Table 1.
Details: docs/training.md, docs/design-notes.md.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from rlsched.core import das as core_das
from rlsched.core import make_ordering, make_placement
from rlsched.core.das import PLACEMENT_FEATURES
from rlsched.core.ordering import DRF, Tiresias
from rlsched.core.das_agent import CLUSTER_FEATURES, DEFAULT_WEIGHTS, DASAgentPlacement, DASOrdering, JOB_FEATURES, NODE_FEATURES, OBSERVATION_LAYOUT, das_logits, positional_encoding
from rlsched.sim import SimConfig, Simulator, compute_metrics
from rlsched.sim.envs import EnvConfig, SchedulingCore
from rlsched.sim.protocol import paired_bootstrap, seeds

from .base import CSVLog, iteration_row, jsonable_options, plot_curve, seed_everything, summarize, write_table
from .ppo import gae
from .rollout import make_pool, merge, split_episodes
from .runs import Run, eval_target, new_run
from .scheduling import (
    CLUSTER_DIM,
    add_env_arguments,
    add_eval_arguments,
    add_loop_arguments,
    env_config,
    env_dict,
    eval_traces,
    make_workload,
    run_heuristic,
)

__all__ = [
    "OrderingNet",
    "PlacementRWGP",
    "Critic",
    "DASAgent",
    "collect_das",
    "add_arguments",
    "train",
    "evaluate",
    "TABLE1_BASELINES",
    "PROTOCOL_POOL",
    "PROTOCOL_CELLS",
    "LASDRF",
    "parse_candidate",
    "run_cell",
    "protocol_summary",
    "protocol_table",
    "protocol_main",
]

VERSION = "2"  # observation layout 2 (core.das_agent.OBSERVATION_LAYOUT): attained service, epochs

#: DAS Table 1 baselines (ordering/placement); Tetris packs by alignment: tetris/bestfit.
TABLE1_BASELINES = ("fifo/firstfit", "fifo/loadbalance", "drf/firstfit", "drf/loadbalance", "tetris/bestfit")
#: References shown beside Table 1 but not among the paper's baselines (so never the
#: "best heuristic"): shortest-job-first with backfilling, run clairvoyant (it is shown
#: every true run time; labelled so in the table).
REFERENCE_BASELINES = ("sjf/firstfit+backfill", "sjf/bestfit+backfill")


# ============================================================================ networks
class OrderingNet(nn.Module):
    """Transformer ordering policy; parameter names are what core/das_agent.py reads."""

    def __init__(self, d_model: int = 32, num_heads: int = 2, num_layers: int = 1, window: int = 16) -> None:
        super().__init__()
        self.d_model, self.num_heads, self.num_layers, self.window = d_model, num_heads, num_layers, window
        self.embed = nn.Linear(len(JOB_FEATURES), d_model)
        self.gate = nn.Linear(CLUSTER_DIM, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, num_heads, 2 * d_model, dropout=0.0, batch_first=True)
            for _ in range(num_layers)
        )
        self.head = nn.Linear(d_model, 1)
        self.register_buffer("pe", torch.from_numpy(positional_encoding(window, d_model)), persistent=False)

    def forward(self, jobs: torch.Tensor, cluster: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, W]`` (``-inf`` on padding)."""
        h = self.embed(jobs) + self.pe[None, : jobs.shape[1]]
        h = h * torch.sigmoid(self.gate(cluster))[:, None, :]
        pad = ~valid
        pad = torch.where(pad.all(dim=1, keepdim=True), torch.zeros_like(pad), pad)
        for layer in self.layers:
            h = layer(h, src_key_padding_mask=pad)
        out = self.head(h).squeeze(-1)
        return out.masked_fill(~valid, float("-inf"))

    def architecture(self) -> dict:
        return {"d_model": self.d_model, "num_heads": self.num_heads, "num_layers": self.num_layers, "window": self.window}


class PlacementRWGP(nn.Module):
    """RWGP placement policy over the nodes of one topology.

    A linear score ``a_i = w . x_i + b`` of each node's features is treated as a noisy
    observation of the node's utility; the Random-Walk GP (kernel ``K``: core.das's
    normalised random-walk kernel over the topology, noise ``noise``) turns it into the
    posterior mean ``mu = K (K + noise I)^-1 a`` — nodes near good nodes (same rack)
    score up together — and the posterior covariance
    ``Sigma = K - K (K + noise I)^-1 K``. Actions ``s ~ N(mu, tau^2 Sigma)``;
    evaluation and serving use ``mu``.
    """

    def __init__(self, lam: float = 0.5, noise: float = 1.0, init_log_std: float = -0.5) -> None:
        super().__init__()
        self.lam, self.noise = lam, noise
        self.score = nn.Linear(len(PLACEMENT_FEATURES), 1)
        self.log_std = nn.Parameter(torch.tensor(float(init_log_std)))
        self._cache: dict[int, tuple[object, np.ndarray, np.ndarray]] = {}

    def gp(self, topology) -> tuple[np.ndarray, np.ndarray]:
        """``(S, L)``: the smoother ``S = K (K + noise I)^-1`` (posterior mean
        ``mu = S a``) and the Cholesky factor of the posterior covariance (+ jitter),
        both from core.das's kernel and :func:`~rlsched.core.das.gp_posterior`;
        cached per topology."""
        hit = self._cache.get(id(topology))
        if hit is not None and hit[0] is topology:
            return hit[1], hit[2]
        k = core_das.TopologyKernel(topology, self.lam).matrix(normalised=True)
        n = len(k)
        # observing every node: k_oo = k_co = k_cc = K; the mean of y = e_j is S's column j
        smoother, cov = core_das.gp_posterior(k, k, k, np.eye(n), self.noise)
        chol = np.linalg.cholesky((cov + cov.T) / 2 + 1e-3 * np.eye(n))
        self._cache[id(topology)] = (topology, smoother, chol)
        return smoother, chol

    def mean(self, feats: torch.Tensor, smoother: torch.Tensor) -> torch.Tensor:
        """``mu = S a`` for ``feats`` ``[B, N, F]`` and ``smoother`` ``[B, N, N]``."""
        a = self.score(feats).squeeze(-1)
        return torch.einsum("bij,bj->bi", smoother, a)

    def log_prob(self, feats: torch.Tensor, smoother: torch.Tensor, scores: torch.Tensor, white: torch.Tensor) -> torch.Tensor:
        """Log-density of ``scores`` ``[B, N]``; ``white`` ``[B, N, N]`` is the inverse
        Cholesky factor of the posterior covariance (zero rows/cols on padding)."""
        mu = self.mean(feats, smoother)
        z = torch.einsum("bij,bj->bi", white, scores - mu) / self.log_std.exp()
        n = (white.abs().sum(-1) > 0).sum(-1).to(z.dtype)
        logdet = torch.log(torch.diagonal(white, dim1=1, dim2=2).abs().clamp_min(1e-12)).sum(-1)
        return -0.5 * (z**2).sum(-1) - n * self.log_std + logdet - 0.5 * n * math.log(2 * math.pi)


class Critic(nn.Module):
    """Centralized critic over the environment's fixed-size global state."""

    def __init__(self, state_dim: int, hidden: int = 128) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(state_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        return self.net(s).squeeze(-1)


class DASAgent(nn.Module):
    def __init__(self, state_dim: int, d_model: int = 32, num_heads: int = 2, num_layers: int = 1, window: int = 16, lam: float = 0.5, gp_noise: float = 1.0) -> None:
        super().__init__()
        self.ordering = OrderingNet(d_model, num_heads, num_layers, window)
        self.placement = PlacementRWGP(lam, gp_noise)
        self.critic = Critic(state_dim)

    def numpy_weights(self) -> dict[str, np.ndarray]:
        w = {k: v.detach().cpu().numpy().astype(np.float32) for k, v in self.ordering.state_dict().items()}
        for k, v in self.placement.state_dict().items():
            w[f"placement.{k}"] = v.detach().cpu().numpy().astype(np.float32).reshape(v.shape)
        return w


# ============================================================================ rollouts
def teacher_slot(core: SchedulingCore, ordering, mask: np.ndarray) -> int:
    """The window slot a heuristic ``ordering`` (a core Ordering) would start: its
    highest-ranked job among those that fit now."""
    window = core.window_jobs()
    slot_of = {id(j): k for k, j in enumerate(window)}
    for job in ordering.rank(window, core.sim.state):
        k = slot_of[id(job)]
        if mask[k]:
            return k
    raise ValueError("no job of the window fits now")


def das_act(
    core: SchedulingCore,
    weights: dict[str, np.ndarray],
    arch: dict,
    rng: np.random.Generator | None,
    gp: tuple[np.ndarray, np.ndarray],
) -> dict:
    """One DAS decision with numpy inference: sample (``rng``) or act greedily (None).
    ``gp`` is :meth:`PlacementRWGP.gp` of the episode's topology."""
    jobs, clus, valid = core.ordering_obs()
    mask = core.mask()
    logits = das_logits(weights, jobs[None], clus[None], valid[None], num_heads=arch["num_heads"], num_layers=arch["num_layers"])[0]
    logits = np.where(mask, logits, -np.inf)
    if rng is None:
        slot = int(np.argmax(logits))
    else:
        p = np.exp(logits - logits.max())
        p /= p.sum()
        slot = int(rng.choice(len(p), p=p))
    job = core.window_jobs()[slot]
    feats, feasible = core.placement_obs(job)
    smoother, chol = gp
    mu = smoother @ (feats @ weights["placement.score.weight"][0] + weights["placement.score.bias"][0])
    if rng is None:
        scores = mu
    else:
        std = float(np.exp(weights["placement.log_std"]))
        scores = mu + std * (chol @ rng.standard_normal(len(mu)))
    return {"jobs": jobs, "cluster": clus, "valid": valid, "mask": mask, "slot": slot, "pfeats": feats, "scores": scores.astype(np.float32), "job": job}


def collect_das(task: dict) -> dict:
    """Run whole episodes with the given numpy weights; the per-decision transitions.

    A picklable top-level function so that it runs in worker processes."""
    torch.set_num_threads(1)
    core = SchedulingCore(make_workload(task["env"]), env_config(task["env"]))
    rng = np.random.default_rng(task["seed"])
    placement = PlacementRWGP(task["arch"]["lam"], task["arch"]["gp_noise"])
    teacher = make_ordering(task["teacher"]) if task.get("teacher") else None
    pteacher = make_placement(task["pteacher"]) if task.get("pteacher") else None
    out: dict[str, list] = {k: [] for k in ("jobs", "cluster", "valid", "mask", "slot", "pfeats", "scores", "smoother", "white", "state", "reward", "done", "ptarget")}
    returns, jcts, fees = [], [], []
    for _ in range(task["episodes"]):
        core.reset(int(rng.integers(0, 2**30)))
        smoother, chol = placement.gp(core.topology)
        white = np.linalg.inv(chol).astype(np.float32)
        smoother32 = smoother.astype(np.float32)
        while not core.done:
            d = das_act(core, task["weights"], task["arch"], rng, (smoother, chol))
            if teacher is not None:  # behaviour cloning: the heuristic picks the job
                d["slot"] = teacher_slot(core, teacher, d["mask"])
                d["job"] = core.window_jobs()[d["slot"]]
                d["pfeats"], _ = core.placement_obs(d["job"])
            st = core.state_vector(0, obs=(d["jobs"], d["cluster"], d["valid"]), mask=d["mask"])
            target = np.zeros(len(d["scores"]), dtype=np.float32)
            if pteacher is not None:  # behaviour cloning: the heuristic places the job
                nodes = pteacher.place(d["job"], core.sim.state)
                if nodes is None:
                    raise ValueError(f"placement teacher {task['pteacher']} cannot place a job that fits")
                target[list(nodes)] = 1.0
            else:
                nodes = core.place_by_scores(d["job"], d["scores"])
            r = core.start(d["slot"], nodes)
            for k in ("jobs", "cluster", "valid", "mask", "slot", "pfeats", "scores"):
                out[k].append(d[k])
            out["white"].append(white)
            out["smoother"].append(smoother32)
            out["state"].append(st)
            out["ptarget"].append(target)
            out["reward"].append(r)
            out["done"].append(core.done)
        res = compute_metrics(core.sim.result())
        returns.append(core.returns)
        jcts.append(res["jct_mean"])
        fees.append(res["fee_total"])
    out["episode_return"] = returns
    out["episode_jct"] = jcts
    out["episode_fee"] = fees
    return out


# ============================================================================ training
def _tensor(xs, dtype=torch.float32) -> torch.Tensor:
    return torch.as_tensor(np.asarray(xs), dtype=dtype)


def _pad_nodes(arrs: Sequence[np.ndarray], n: int) -> np.ndarray:
    first = arrs[0]
    out = np.zeros((len(arrs), n) + first.shape[1:], dtype=np.float32)
    for k, a in enumerate(arrs):
        out[k, : a.shape[0]] = a
    return out


def _pad_white(arrs: Sequence[np.ndarray], n: int) -> np.ndarray:
    out = np.zeros((len(arrs), n, n), dtype=np.float32)
    for k, a in enumerate(arrs):
        out[k, : a.shape[0], : a.shape[1]] = a
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_env_arguments(parser)
    add_loop_arguments(parser, iterations=50, lr=3e-4)
    parser.add_argument("--gae-lambda", type=float, default=0.95)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--minibatch", type=int, default=256)
    parser.add_argument("--ent-coef", type=float, default=0.01)
    parser.add_argument("--window-select", choices=("oldest", "mixed", "shortest"), default="oldest", help="which pending jobs fill the window (core.das_agent.select_window)")
    parser.add_argument("--bc-teacher", default=None, help="core ordering to imitate first (e.g. sjf); with --bc-iterations")
    parser.add_argument("--bc-iterations", type=int, default=0, help="behaviour-cloning iterations before MAPPO")
    parser.add_argument("--placement-lr", type=float, default=None,
                        help="learning rate of the placement agent in the behaviour-cloning iterations (default: --lr)")
    parser.add_argument("--bc-placement", default=None,
                        help="core placement the placement agent imitates in the behaviour-cloning iterations (e.g. topology)")
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--rw-lambda", type=float, default=0.5, help="random-walk kernel decay")
    parser.add_argument("--gp-noise", type=float, default=1.0, help="RWGP observation noise variance")
    parser.add_argument("--init", type=Path, default=None, help="start from an exported DAS model (ordering + placement)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="export the weights every N iterations (0: only at the end)")
    parser.add_argument("--loads", default=None, help="LO,HI: each episode's offered load drawn uniformly from [LO, HI] (synthetic specs)")
    parser.add_argument("--las-thresholds", default=None,
                        help="comma list of attained-service thresholds (GPU-seconds) recorded in the model: the served "
                             "ordering then ranks by these queues first and preempts across them (extension of DAS)")
    add_eval_arguments(parser, "das", served=DEFAULT_WEIGHTS)


def train(args) -> int:
    torch.set_num_threads(1)
    rng = seed_everything(args.seed)
    env = env_dict(args)
    probe = SchedulingCore(make_workload(env), env_config(env))
    agent = DASAgent(probe.state_size(), args.d_model, args.heads, args.layers, args.window, args.rw_lambda, args.gp_noise)
    if getattr(args, "init", None):
        from rlsched.core.nn import load_policy_file

        init, _ = load_policy_file(args.init, policy="das")
        agent.ordering.load_state_dict({k: torch.as_tensor(v) for k, v in init.items() if not k.startswith("placement.")})
        agent.placement.load_state_dict({k[len("placement.") :]: torch.as_tensor(v) for k, v in init.items() if k.startswith("placement.")})
    # the placement agent's own learning rate while it clones a placement teacher (its
    # linear score needs large weights through the GP smoother; --placement-lr)
    bc_plr = float(getattr(args, "placement_lr", None) or args.lr)
    opt = torch.optim.Adam(
        [{"params": list(agent.ordering.parameters()) + list(agent.critic.parameters())},
         {"params": list(agent.placement.parameters())}],
        lr=args.lr,
    )
    arch = {**agent.ordering.architecture(), "window_select": env["window_select"], "lam": args.rw_lambda, "gp_noise": args.gp_noise,
            "las_thresholds": list(_las(getattr(args, "las_thresholds", None)))}
    bc_iters = int(getattr(args, "bc_iterations", 0) or 0)
    teacher = getattr(args, "bc_teacher", None)
    pteacher = getattr(args, "bc_placement", None)
    if bc_iters and not (teacher or pteacher):
        raise ValueError("--bc-iterations needs --bc-teacher or --bc-placement")
    run = new_run(args, "das")
    logf = CSVLog(run.log)
    title = f"DAS (MAPPO) on {args.trace}"
    curve = ["episode_return", "episode_jct_mean", "episode_fee"]
    t0 = time.time()
    from tqdm import tqdm

    with make_pool(args.engine, args.workers, args.seed) as pool:
        bar = tqdm(range(bc_iters + args.iterations), desc=f"train {args.tag}", unit="it")
        for it in bar:
            bc = it < bc_iters
            opt.param_groups[1]["lr"] = bc_plr if bc else args.lr
            weights = agent.numpy_weights()
            per = split_episodes(args.episodes_per_iter, args.workers)
            tasks = [
                {"weights": weights, "arch": arch, "env": env, "seed": int(rng.integers(0, 2**31 - 1)), "episodes": n, "teacher": teacher if bc else None,
                 "pteacher": pteacher if bc else None}
                for n in per
                if n > 0
            ]
            data = merge(pool.map(collect_das, tasks))
            stats = _bc_update(agent, opt, data, args, rng) if bc else _mappo_update(agent, opt, data, args, rng)
            row = {"phase": f"bc:{teacher or '-'}/{pteacher or '-'}" if bc else "mappo", **iteration_row(it, data, stats, t0)}
            logf.write(row)
            bar.set_postfix(ret=f"{row['episode_return']:.2f}", jct=f"{row['episode_jct_mean']:.0f}")
            if args.checkpoint_every and (it + 1) % args.checkpoint_every == 0 and it + 1 < bc_iters + args.iterations:
                _export_das(args, run, agent, arch, time.time() - t0, it + 1)
                plot_curve(logf.rows, run.curve, "iteration", curve, title)
    wall = time.time() - t0
    plot_curve(logf.rows, run.curve, "iteration", curve, title)
    _export_das(args, run, agent, arch, wall, bc_iters + args.iterations)
    print(f"wrote {run.model} ({wall:.0f} s)")
    return 0


def _las(value) -> tuple[float, ...]:
    """``--las-thresholds`` (comma string or list) -> validated thresholds."""
    from rlsched.core.das_agent import las_thresholds

    if value is None or value == "":
        return ()
    parts = value.split(",") if isinstance(value, str) else value
    return las_thresholds([float(x) for x in parts])


def _export_das(args, run: Run, agent: DASAgent, arch: dict, wall: float, iterations: int) -> None:
    from .export import export_policy

    export_policy(
        run.model,
        agent.numpy_weights(),
        policy="das",
        version=VERSION,
        observation={
            "job_features": list(JOB_FEATURES),
            "node_features": list(NODE_FEATURES),
            "cluster_features": list(CLUSTER_FEATURES),
            "placement_features": list(PLACEMENT_FEATURES),
            "layout": OBSERVATION_LAYOUT,
            "non_clairvoyant": True,
            "window": args.window,
            "action": "ordering: index of the window job to start (jobs that fit); placement: score per node, workers fill the best nodes",
        },
        architecture={**arch, "placement": "mu = S (w . x + b), S = K (K + gp_noise I)^-1 with K core.das's normalised random-walk kernel; sampling covariance exp(2 log_std) x GP posterior covariance"},
        training={**jsonable_options(args), "iterations_done": iterations, "wall_s": wall, "torch_threads": 1, "device": "cpu"},
        trained_on={"trace": args.trace, "episode_jobs": args.episode_jobs, "episodes": iterations * args.episodes_per_iter, "seeds": "trace seeds drawn from the train split (rlsched.sim.protocol, 0..9,999) with --seed",
                    "loads": getattr(args, "loads", None)},
    )


def _mappo_update(agent: DASAgent, opt, data: dict, args, rng) -> dict:
    rewards = np.asarray(data["reward"], dtype=np.float64) * args.reward_scale
    dones = np.asarray(data["done"], dtype=np.float64)
    states = _tensor(data["state"])
    with torch.no_grad():
        values = agent.critic(states).numpy().astype(np.float64)
    adv, ret = gae(rewards, values, dones, 0.0, args.gamma, args.gae_lambda)
    n_max = max(a.shape[0] for a in data["pfeats"])
    batch = {
        "jobs": _tensor(data["jobs"]),
        "cluster": _tensor(data["cluster"]),
        "valid": _tensor(data["valid"], torch.bool),
        "mask": _tensor(data["mask"], torch.bool),
        "slot": _tensor(data["slot"], torch.long),
        "pfeats": _tensor(_pad_nodes(data["pfeats"], n_max)),
        "scores": _tensor(_pad_nodes([s[:, None] for s in data["scores"]], n_max)[..., 0]),
        "white": _tensor(_pad_white(data["white"], n_max)),
        "smoother": _tensor(_pad_white(data["smoother"], n_max)),
        "state": states,
        "adv": _tensor(adv),
        "ret": _tensor(ret),
    }
    with torch.no_grad():
        lo_old, lp_old = _log_probs(agent, batch)
    batch["lo_old"], batch["lp_old"] = lo_old, lp_old
    n = len(rewards)
    hist: dict[str, list[float]] = {"loss_ordering": [], "loss_placement": [], "loss_value": [], "entropy": [], "approx_kl": []}
    for _ in range(args.epochs):
        perm = rng.permutation(n)
        for s in range(0, n, args.minibatch):
            idx = torch.as_tensor(perm[s : s + args.minibatch])
            mb = {k: v[idx] for k, v in batch.items()}
            a = mb["adv"]
            a = (a - a.mean()) / (a.std() + 1e-8) if len(a) > 1 else a
            lo, lp = _log_probs(agent, mb)
            ro, rp = (lo - mb["lo_old"]).exp(), (lp - mb["lp_old"]).exp()
            loss_o = -torch.min(ro * a, ro.clamp(1 - args.clip, 1 + args.clip) * a).mean()
            loss_p = -torch.min(rp * a, rp.clamp(1 - args.clip, 1 + args.clip) * a).mean()
            v = agent.critic(mb["state"])
            loss_v = 0.5 * ((v - mb["ret"]) ** 2).mean()
            logits = agent.ordering(mb["jobs"], mb["cluster"], mb["valid"]).masked_fill(~mb["mask"], float("-inf"))
            p = torch.softmax(logits, -1)
            ent = -(p * torch.where(mb["mask"], torch.log_softmax(logits, -1), torch.zeros_like(p))).sum(-1).mean()
            loss = loss_o + loss_p + 0.5 * loss_v - args.ent_coef * ent
            opt.zero_grad()
            loss.backward()
            # clip each agent and the critic on its own: the critic's large value
            # gradients must not shrink the policies' steps
            for part in (agent.ordering, agent.placement, agent.critic):
                torch.nn.utils.clip_grad_norm_(part.parameters(), 0.5)
            opt.step()
            hist["loss_ordering"].append(float(loss_o.detach()))
            hist["loss_placement"].append(float(loss_p.detach()))
            hist["loss_value"].append(float(loss_v.detach()))
            hist["entropy"].append(float(ent.detach()))
            hist["approx_kl"].append(float(((ro - 1) - (lo - mb["lo_old"])).mean().detach()))
    out = {k: float(np.mean(v)) for k, v in hist.items()}
    out["placement_std"] = float(agent.placement.log_std.detach().exp())
    out["bc_accuracy"] = math.nan
    return out


def _bc_update(agent: DASAgent, opt, data: dict, args, rng) -> dict:
    """Behaviour cloning of the teachers' choices: cross-entropy on the ordering
    logits (over the jobs that fit; with ``--bc-teacher``), cross-entropy of the
    placement agent's posterior-mean node scores (softmax over the feasible nodes)
    against the nodes the placement teacher chose (with ``--bc-placement``), and the
    critic regressed on the discounted returns of the teachers' episodes (so MAPPO
    starts with a fitted critic). An agent without a teacher is not changed."""
    rewards = np.asarray(data["reward"], dtype=np.float64) * args.reward_scale
    dones = np.asarray(data["done"], dtype=np.float64)
    _, ret = gae(rewards, np.zeros_like(rewards), dones, 0.0, args.gamma, 1.0)
    jobs, clus = _tensor(data["jobs"]), _tensor(data["cluster"])
    valid, mask = _tensor(data["valid"], torch.bool), _tensor(data["mask"], torch.bool)
    slot, states, ret_t = _tensor(data["slot"], torch.long), _tensor(data["state"]), _tensor(ret)
    clone_order = bool(getattr(args, "bc_teacher", None))
    clone_place = bool(getattr(args, "bc_placement", None))
    if clone_place:
        n_max = max(a.shape[0] for a in data["pfeats"])
        pfeats = _tensor(_pad_nodes(data["pfeats"], n_max))
        smoother = _tensor(_pad_white(data["smoother"], n_max))
        ptarget = _tensor(_pad_nodes([t[:, None] for t in data["ptarget"]], n_max)[..., 0])
        feasible = pfeats[..., 0] > 0.5
    n = len(rewards)
    hist: dict[str, list[float]] = {"loss_ordering": [], "loss_placement": [], "loss_value": [], "bc_accuracy": []}
    for _ in range(args.epochs):
        perm = rng.permutation(n)
        for s in range(0, n, args.minibatch):
            idx = torch.as_tensor(perm[s : s + args.minibatch])
            loss = 0.5 * ((agent.critic(states[idx]) - ret_t[idx]) ** 2).mean()
            hist["loss_value"].append(float(loss.detach()) * 2)
            if clone_order:
                logits = agent.ordering(jobs[idx], clus[idx], valid[idx]).masked_fill(~mask[idx], float("-inf"))
                loss_o = nn.functional.cross_entropy(logits, slot[idx])
                loss = loss + loss_o
                hist["loss_ordering"].append(float(loss_o.detach()))
                hist["bc_accuracy"].append(float((logits.argmax(-1) == slot[idx]).float().mean()))
            if clone_place:
                mu = agent.placement.mean(pfeats[idx], smoother[idx]).masked_fill(~feasible[idx], float("-inf"))
                logp = torch.log_softmax(mu, -1).masked_fill(~feasible[idx], 0.0)
                tgt = ptarget[idx]
                loss_p = -((logp * tgt).sum(-1) / tgt.sum(-1).clamp_min(1.0)).mean()
                loss = loss + loss_p
                hist["loss_placement"].append(float(loss_p.detach()))
            opt.zero_grad()
            loss.backward()
            for part in (agent.ordering, agent.placement, agent.critic):
                torch.nn.utils.clip_grad_norm_(part.parameters(), 0.5)
            opt.step()
    out = {k: (float(np.mean(v)) if v else math.nan) for k, v in hist.items()}
    # the same columns as a MAPPO iteration, so one CSV holds both phases
    return {"loss_ordering": out["loss_ordering"], "loss_placement": out["loss_placement"], "loss_value": out["loss_value"], "entropy": math.nan, "approx_kl": math.nan, "placement_std": float(agent.placement.log_std.detach().exp()), "bc_accuracy": out["bc_accuracy"]}


def _log_probs(agent: DASAgent, b: dict) -> tuple[torch.Tensor, torch.Tensor]:
    logits = agent.ordering(b["jobs"], b["cluster"], b["valid"]).masked_fill(~b["mask"], float("-inf"))
    lo = torch.log_softmax(logits, -1).gather(1, b["slot"][:, None]).squeeze(1)
    lp = agent.placement.log_prob(b["pfeats"], b["smoother"], b["scores"], b["white"])
    return lo, lp


# ============================================================================ evaluation
def run_policy_in_env(jobs, topology, act: Callable[[SchedulingCore], tuple[int, list[int]]], env_cfg: EnvConfig, seed: int) -> dict:
    """Drive one fixed trace decision by decision with ``act(core) -> (slot, nodes)``."""
    core = SchedulingCore(lambda _rng: (jobs, topology), EnvConfig(**{**env_cfg.__dict__, "sim": SimConfig()}))
    core.reset(seed)
    while not core.done:
        slot, nodes = act(core)
        core.start(slot, nodes)
    return compute_metrics(core.sim.result())


def evaluate(args) -> int:
    torch.set_num_threads(1)
    from tqdm import tqdm

    from rlsched.core import nn as core_nn
    from rlsched.core.das_agent import DASOrdering

    model, results, record = eval_target(args, "das", served=DEFAULT_WEIGHTS)
    weights, meta = core_nn.load_policy_file(model, policy="das")
    arch = meta["architecture"]
    env_cfg = EnvConfig(window=int(arch["window"]), window_select=str(arch.get("window_select", "oldest")), fee_weight=args.fee_weight, time_scale=args.time_scale)

    rwgp = PlacementRWGP(float(arch["lam"]), float(arch.get("gp_noise", 1.0)))

    def das_policy(core: SchedulingCore):
        d = das_act(core, weights, arch, None, rwgp.gp(core.topology))
        return d["slot"], core.place_by_scores(d["job"], d["scores"])

    traces_ = eval_traces(args)
    rows = []
    heur = [f"{b}" for b in TABLE1_BASELINES] + [f"{b}+backfill" for b in TABLE1_BASELINES]
    refs = list(REFERENCE_BASELINES)
    learned = ["DAS (MAPPO)", "DAS ordering + das-agent placement", "DAS ordering + firstfit", "DAS ordering + das placement"]
    for label, seed, tr in tqdm(traces_, desc="eval das", unit="trace"):
        for h in heur + refs:
            o, p = h.replace("+backfill", "").split("/")
            m = run_heuristic(tr.jobs, tr.topology, o, p, seed, backfill=h.endswith("+backfill"), clairvoyant=h in refs)
            rows.append({"trace": label, "seed": seed, "system": h, "clairvoyant": h in refs,
                         **{k: m[k] for k in ("jct_mean", "fee_total", "ideal_runtime_mean")}})
        m = run_policy_in_env(tr.jobs, tr.topology, das_policy, env_cfg, seed)
        rows.append({"trace": label, "seed": seed, "system": learned[0], "jct_mean": m["jct_mean"], "fee_total": m["fee_total"]})
        # what serving runs: the numpy ordering agent in the engine's own scheduling loop
        for name, served_placement, kw in ((learned[1], "das-agent", {"model": model}), (learned[2], "firstfit", {}), (learned[3], "das", {})):
            sim = Simulator(tr.jobs, tr.topology, ordering=DASOrdering(model), placement=make_placement(served_placement, **kw), seed=seed)
            m = compute_metrics(sim.run())
            rows.append({"trace": label, "seed": seed, "system": name, "jct_mean": m["jct_mean"], "fee_total": m["fee_total"]})
    systems = heur + refs + learned
    table = summarize(rows, systems)
    bounds = {}
    for line in table:
        sel = [r["ideal_runtime_mean"] for r in rows if r["trace"] == line["trace"] and "ideal_runtime_mean" in r and r["system"] == heur[0]]
        if sel:
            line["jct_lower_bound"] = bounds[line["trace"]] = float(np.mean(sel))
    md = write_table(table, systems, learned, heur, results / f"{args.tag}_table1", "DAS Table 1: mean JCT and fee against the heuristics",
                     clairvoyant=refs)
    if bounds:
        md += "\nLower bound on mean JCT (every job starts on arrival at its ideal placement) and the most any scheduler could gain on the best heuristic:\n\n"
        md += "| trace | lower bound (s) | best possible vs best heuristic |\n|---|---|---|\n"
        for line in table:
            if line["trace"] in bounds and line.get("best_heuristic"):
                lb = bounds[line["trace"]]
                md += f"| {line['trace']} | {lb:.0f} | {lb / line[line['best_heuristic']]['jct_mean'] - 1:+.1%} |\n"
        (results / f"{args.tag}_table1.md").write_text(md)
        (results / f"{args.tag}_table1.json").write_text(json.dumps(table, indent=2) + "\n")
    (results / f"{args.tag}_eval_runs.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(md)
    if record:
        from .export import update_evaluation

        key = "table1" if args.tag == "das" else f"table1:{args.tag}"
        update_evaluation(model, {key: table, f"{key}:seeds": sorted({r["seed"] for r in rows})})
    return 0

# ============================================================================ protocol evaluation
# DAS on the evaluation protocol (docs/training.md): validation choice and test judgement.
#
# ``python -m rlsched.models.das protocol --split validation|test ...`` runs, for every cell
# (a workload at one offered load) and every seed of the split, the heuristic pool, the DAS
# candidates and the references in the simulator, and writes per-run rows plus paired
# bootstrap 95% intervals (:func:`rlsched.sim.protocol.paired_bootstrap`) of each DAS
# candidate against each heuristic and against the best heuristic of the cell.
#
# Cells:
#
# * ``synthetic``: ``synthetic:medium,jobs=1000,load=L,runtime_sigma=1.5`` — heavy-tailed
#   run times (log-normal, shape 1.5: mean 3.1 x the median), 64 nodes x 8 GPUs; one trace
#   per seed of the split (:func:`rlsched.sim.protocol.seeds`).
# * ``alibaba``: ``alibaba2023:default,nodes=100,load=L`` — the real Alibaba 2023 pods
#   replayed on 100 of its nodes with arrivals compressed to offered load ``L``. The replay
#   is deterministic (a seed changes nothing), so it is one run per system, and its paired
#   bootstrap resamples the *jobs* (each job's JCT under both systems), which says how
#   much the mean rests on a few jobs, not how it would vary over other traces.
#
# Systems: the pool (all non-clairvoyant) ``fifo``, ``drf``, ``tiresias`` orderings with the
# ``topology`` placement, each with and without backfill; DAS candidates
# ``NAME=MODEL[@TH1:TH2...]`` (ordering ``das`` + placement ``das-agent`` of that model file;
# ``@`` overrides the model's attained-service thresholds, ``@-`` switches them off); the
# ablation ``las-drf`` (the same attained-service queues with DRF inside instead of the
# learned ordering, and topology placement; not in the pool); and the references, never
# baselines: ``srtf/topology`` run clairvoyant (it sees the true run times) and the lower
# bound ``ideal`` (every job starts on arrival at its ideal placement).

#: the heuristic pool judged against (ordering/placement[+backfill]), all non-clairvoyant
PROTOCOL_POOL = tuple(f"{o}/topology{b}" for o in ("fifo", "drf", "tiresias") for b in ("", "+backfill"))
#: reference rows (never baselines)
CLAIRVOYANT = "srtf/topology (clairvoyant reference)"
IDEAL = "lower bound (start on arrival, ideal placement)"
ABLATION = "las-drf/topology (ablation)"

PROTOCOL_CELLS = {
    "synthetic": "synthetic:medium,jobs=1000,load={load:g},runtime_sigma=1.5",
    "alibaba": "alibaba2023:default,nodes=100,load={load:g}",
}


class LASDRF(Tiresias):
    """Ablation: attained-service queues (Tiresias' discretized LAS with the given
    thresholds) and DRF's dominant share inside a queue, where DAS puts its learned
    ordering. Preemptive across queues, as Tiresias."""

    name = "las-drf"

    def __init__(self, thresholds=(3600.0, 36000.0)) -> None:
        super().__init__(thresholds)
        self._drf = DRF()

    def _keys(self, pending, state):
        return [(self.queue_of(j, state.time),) + k for j, k in zip(pending, self._drf._keys(pending, state))]


def _protocol_sim(trace, ordering, placement, seed: int, *, backfill: bool = False, clairvoyant: bool = False) -> dict:
    sim = Simulator(trace.jobs, trace.topology, ordering=ordering, placement=placement, seed=seed,
                    config=SimConfig(backfill=backfill, clairvoyant=clairvoyant, record_series=False))
    res = sim.run()
    m = compute_metrics(res)
    recs = sorted(res.records, key=lambda r: r.id)
    return {"jct_mean": float(m["jct_mean"]), "fee_total": float(m["fee_total"]),
            "jcts": [float(r.jct) for r in recs], "ideal_mean": float(np.mean([r.ideal_runtime for r in recs]))}


def parse_candidate(text: str) -> tuple[str, Path, tuple[float, ...] | None, str]:
    """``NAME=MODEL[@TH1:TH2|@-][#PLACEMENT]`` -> (name, model path, thresholds override
    or None, placement: ``das-agent`` (the model's own) unless a core placement is named)."""
    name, _, rest = text.partition("=")
    if not name or not rest:
        raise ValueError(f"candidate must be NAME=MODEL[@TH1:TH2|@-][#PLACEMENT], got {text!r}")
    rest, _, placement = rest.partition("#")
    model, _, th = rest.partition("@")
    over = None if not th else (() if th == "-" else tuple(float(x) for x in th.split(":")))
    return name, Path(model), over, placement or "das-agent"


def run_cell(trace, seed: int, candidates, *, pool=PROTOCOL_POOL, references: bool = True, ablation: bool = True,
             done: frozenset = frozenset()) -> dict[str, dict]:
    """Every system on one trace but those in ``done``: ``{system: metrics}``."""
    out: dict[str, dict] = {}
    ideal = None
    pool = [h for h in pool if h not in done]
    candidates = [c for c in candidates if c[0] not in done]
    references = references and CLAIRVOYANT not in done
    ablation = ablation and ABLATION not in done
    for h in pool:
        base, bf = h.replace("+backfill", ""), h.endswith("+backfill")
        o, p = base.split("/")
        m = _protocol_sim(trace, make_ordering(o), make_placement(p), seed, backfill=bf)
        ideal = m["ideal_mean"]
        out[h] = m
    for name, model, over, pname in candidates:
        ordering = DASOrdering(model, las_thresholds=over)
        placement = DASAgentPlacement(model) if pname == "das-agent" else make_placement(pname)
        reason = ordering.fallback_reason or getattr(placement, "fallback_reason", None)
        if reason:
            raise RuntimeError(f"candidate {name}: model {model} does not load: {reason}")
        out[name] = _protocol_sim(trace, ordering, placement, seed)
    if ablation:
        out[ABLATION] = _protocol_sim(trace, LASDRF(), make_placement("topology"), seed)
    if references:
        out[CLAIRVOYANT] = _protocol_sim(trace, make_ordering("srtf"), make_placement("topology"), seed, clairvoyant=True)
        if ideal is None:
            ideal = out[CLAIRVOYANT]["ideal_mean"]
        out[IDEAL] = {"jct_mean": ideal, "fee_total": float("nan"), "jcts": [], "ideal_mean": ideal}
    return out


def protocol_summary(rows: list[dict], learned: list[str], pool=PROTOCOL_POOL) -> list[dict]:
    """Per cell and load: the best heuristic (lowest mean JCT over the runs) and each
    learned system's paired bootstrap against it and against every pool member."""
    out = []
    for cell, load in sorted({(r["cell"], r["load"]) for r in rows}):
        sel = [r for r in rows if r["cell"] == cell and r["load"] == load]
        seeds_ = sorted({r["seed"] for r in sel})
        by = {(r["system"], r["seed"]): r for r in sel}
        mean = {s: float(np.mean([by[(s, k)]["jct_mean"] for k in seeds_])) for s in {r["system"] for r in sel}}
        best = min(pool, key=lambda s: mean[s])
        per_job = len(seeds_) == 1

        def vec(s):
            return by[(s, seeds_[0])]["jcts"] if per_job else [by[(s, k)]["jct_mean"] for k in seeds_]

        line = {"cell": cell, "load": load, "n": len(vec(best)), "unit": "job" if per_job else "seed",
                "seeds": seeds_, "mean_jct": mean, "best_heuristic": best, "vs_best": {}, "vs_pool": {}}
        # resampling thousands of jobs: 2,000 resamples keep it to seconds
        bs = {"resamples": 2_000} if per_job else {}
        for s in learned + ([ABLATION] if ABLATION in mean else []) + ([CLAIRVOYANT] if CLAIRVOYANT in mean else []):
            if s not in mean:
                continue
            line["vs_best"][s] = paired_bootstrap(vec(s), vec(best), **bs).to_dict()
            line["vs_pool"][s] = {h: paired_bootstrap(vec(s), vec(h), **bs).to_dict() for h in pool}
        out.append(line)
    return out


def _protocol_ci(d: dict) -> str:
    return f"{d['rel']:+.1%} [{d['rel_lo']:+.1%}, {d['rel_hi']:+.1%}]"


def protocol_table(summary: list[dict], system: str) -> str:
    """Markdown table of ``system`` against the best heuristic of every cell, with the
    ablation and the references (relative change of mean JCT, paired bootstrap 95% CI)."""
    head = ("| cell | load | n | best heuristic (mean JCT s) | DAS mean JCT s | DAS vs best [95% CI] | 10% target | "
            "las-drf ablation vs best | srtf clairvoyant ref. vs best | lower bound vs best | share of the gap to the bound DAS closes |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for line in summary:
        if system not in line["vs_best"]:
            continue
        best = line["best_heuristic"]
        mb = line["mean_jct"][best]
        d = line["vs_best"][system]
        if max(abs(d["rel_lo"]), abs(d["rel_hi"])) < 5e-4:
            met = "equal"
        else:
            met = "met" if d["rel"] <= -0.10 and d["diff_hi"] < 0 else ("below, CI < 0" if d["diff_hi"] < 0 else ("above, CI > 0" if d["diff_lo"] > 0 else "not separated"))
        abl = _protocol_ci(line["vs_best"][ABLATION]) if ABLATION in line["vs_best"] else "—"
        clv = _protocol_ci(line["vs_best"][CLAIRVOYANT]) if CLAIRVOYANT in line["vs_best"] else "—"
        lb = line["mean_jct"].get(IDEAL)
        lbs = f"{lb / mb - 1:+.1%}" if lb else "—"
        # where DAS stands between the best heuristic (0%) and the bound (100%); only
        # where the bound leaves at least 1% of room
        gap = f"{(mb - d['mean_a']) / (mb - lb):.0%}" if lb and mb - lb >= 0.01 * mb else "— (no room)"
        rows.append(f"| {line['cell']} | {line['load']:g} | {line['n']} {line['unit']}s | {best} ({mb:,.0f}) | {d['mean_a']:,.0f} | "
                    f"{_protocol_ci(d)} | {met} | {abl} | {clv} | {lbs} | {gap} |")
    return head + "\n".join(rows) + "\n"


def protocol_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlsched.models.das protocol", description="DAS on the evaluation protocol (see protocol_main)")
    ap.add_argument("--split", choices=("validation", "test"), required=True)
    ap.add_argument("--seeds", type=int, default=5, help="seeds of the split per synthetic cell")
    ap.add_argument("--loads", default="1.0,1.5,2.0")
    ap.add_argument("--cells", default="synthetic,alibaba")
    ap.add_argument("--candidate", action="append", default=[], help="NAME=MODEL[@TH1:TH2|@-] (repeatable)")
    ap.add_argument("--no-references", action="store_true")
    ap.add_argument("--no-ablation", action="store_true")
    ap.add_argument("--no-pool", action="store_true", help="run only the candidates (merge the pool's runs later)")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--merge", type=Path, action="append", default=[], help="earlier output whose runs are reused (same split)")
    ap.add_argument("--out", type=Path, required=True, help="JSON file of rows and summaries")
    args = ap.parse_args(argv)
    from rlsched.sim.traces import default_topology, load_trace

    cands = [parse_candidate(c) for c in args.candidate]
    rows: list[dict] = []
    for f in args.merge:
        old = json.loads(f.read_text())  # an output, or its .rows.json
        if old["split"] != args.split:
            raise SystemExit(f"{f}: split {old['split']!r}, not {args.split!r}")
        rows.extend(old["rows"])
    t0 = time.time()
    for cell in [c.strip() for c in args.cells.split(",") if c.strip()]:
        for load in [float(x) for x in args.loads.split(",")]:
            spec = PROTOCOL_CELLS[cell].format(load=load)
            ss = seeds(args.split, args.seeds) if cell == "synthetic" else [seeds(args.split, 1)[0]]
            for seed in ss:
                tr = load_trace(spec, seed=seed, data_dir=args.data_dir) if cell == "alibaba" else load_trace(spec, seed=seed)
                if tr.topology is None:
                    tr.topology = default_topology(tr.jobs)
                done = frozenset(r["system"] for r in rows if (r["cell"], r["load"], r["seed"]) == (cell, load, seed))
                res = run_cell(tr, seed, cands, references=not args.no_references, ablation=not args.no_ablation, done=done,
                               pool=() if args.no_pool else PROTOCOL_POOL)
                for system, m in res.items():
                    rows.append({"cell": cell, "load": load, "spec": spec, "seed": seed, "system": system, **m})
                # the rows so far, after every trace: a stopped run loses none of them
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.with_suffix(".rows.json").write_text(json.dumps({"split": args.split, "rows": rows}) + "\n")
                print(f"[{time.time() - t0:6.0f}s] {cell} load {load:g} seed {seed}: "
                      + ", ".join(f"{k.split(' ')[0]} {v['jct_mean']:.0f}" for k, v in res.items()), flush=True)
    learned = sorted({r["system"] for r in rows} - set(PROTOCOL_POOL) - {CLAIRVOYANT, IDEAL, ABLATION})
    summary = protocol_summary(rows, learned) if not args.no_pool else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"split": args.split, "candidates": [[n, str(m), o, p] for n, m, o, p in cands],
                                    "summary": summary, "rows": rows}, indent=1) + "\n")
    for line in summary:
        print(f"{line['cell']} load {line['load']:g} (n={line['n']} {line['unit']}s): best heuristic {line['best_heuristic']} "
              f"{line['mean_jct'][line['best_heuristic']]:.0f} s")
        for s, d in line["vs_best"].items():
            print(f"   {s:45s} {d['mean_a']:8.0f} s  {d['rel']:+.1%} [{d['rel_lo']:+.1%}, {d['rel_hi']:+.1%}]")
    print(f"wrote {args.out} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":  # pragma: no cover - python -m rlsched.models.das protocol ...
    import sys

    if sys.argv[1:2] != ["protocol"]:
        raise SystemExit("usage: python -m rlsched.models.das protocol --split validation|test ... (training: rlsched train das)")
    raise SystemExit(protocol_main(sys.argv[2:]))
