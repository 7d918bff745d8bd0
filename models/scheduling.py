"""What the cluster-scheduling agents (DAS, A2C, DQN, HierRL) share.

The environment of a run from a picklable options dict, the ``SchedulingEnv`` action
helpers, the common command-line options and iteration loop (:func:`run_iterations`),
and evaluation against SJF, Tetris and random on traces training never draws.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

from rlsched.core import make_ordering, make_placement
from rlsched.core.das_agent import CLUSTER_FEATURES, JOB_FEATURES, NODE_FEATURES
from rlsched.sim import SimConfig, Simulator, compute_metrics
from rlsched.sim.envs import EnvConfig, SchedulingCore, trace_workload

from .base import CSVLog, iteration_row, jsonable_options, plot_curve, summarize, write_table
from .rollout import make_pool, merge, split_episodes
from .runs import Run, add_run_arguments, eval_target

log = logging.getLogger(__name__)

__all__ = [
    "CLUSTER_DIM",
    "SEED_BASELINES",
    "make_workload",
    "parse_loads",
    "env_config",
    "env_dict",
    "make_core",
    "stack_obs",
    "masked_sample",
    "apply_gym_action",
    "gym_mask",
    "episode_summary",
    "numpy_state",
    "load_state",
    "add_env_arguments",
    "add_loop_arguments",
    "add_eval_arguments",
    "common_arguments",
    "run_iterations",
    "export_model",
    "load_for_eval",
    "eval_traces",
    "run_heuristic",
    "evaluate_against_seed_baselines",
]

#: length of the cluster context vector (node features pooled + cluster scalars)
CLUSTER_DIM = len(NODE_FEATURES) + len(CLUSTER_FEATURES)
#: baselines of the A2C / HierRL / DQN comparison (ordering/placement)
SEED_BASELINES = ("sjf/firstfit", "tetris/bestfit", "random/random")


# ============================================================================ environment
def make_workload(env: dict) -> Callable:
    """The episode workload of an env dict: ``env["workload"]`` (a callable, e.g. in
    tests) or a trace SPEC ``env["trace"]`` with ``env["episode_jobs"]`` jobs."""
    if env.get("workload") is not None:
        return env["workload"]
    return trace_workload(env["trace"], env.get("episode_jobs"), loads=parse_loads(env.get("loads")))


def parse_loads(value) -> tuple[float, float] | None:
    """``--loads``: ``"LO,HI"`` (or a two-item list, from a config file) -> ``(LO, HI)``;
    None/empty -> None (the trace's own load)."""
    if value is None or value == "" or value == []:
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    try:
        lo, hi = (float(x) for x in parts)
    except (TypeError, ValueError):
        raise ValueError(f"loads must be 'LO,HI' (offered loads), got {value!r}") from None
    if not 0 < lo <= hi:
        raise ValueError(f"loads must satisfy 0 < LO <= HI, got {value!r}")
    return lo, hi


def env_config(env: dict) -> EnvConfig:
    return EnvConfig(
        window=int(env["window"]),
        window_select=str(env.get("window_select", "oldest")),
        fee_weight=float(env["fee_weight"]),
        time_scale=float(env["time_scale"]),
    )


def env_dict(args) -> dict:
    """The environment options of a run, as sent to the rollout workers."""
    return {
        "trace": args.trace,
        "episode_jobs": args.episode_jobs,
        "window": args.window,
        "window_select": getattr(args, "window_select", "oldest"),
        "fee_weight": args.fee_weight,
        "time_scale": args.time_scale,
        "workload": getattr(args, "workload", None),
        "loads": getattr(args, "loads", None),
    }


def make_core(env: dict) -> SchedulingCore:
    return SchedulingCore(make_workload(env), env_config(env))


def stack_obs(obs: Sequence[dict]) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(np.stack([o[k] for o in obs]), dtype=torch.float32) for k in obs[0]}


def masked_sample(logits: np.ndarray, mask: np.ndarray, rng: np.random.Generator | None) -> int:
    """Sample from the softmax over the allowed actions (``rng``) or take the best (None)."""
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


def episode_summary(core: SchedulingCore) -> tuple[float, float, float]:
    """``(return, mean JCT, total fee)`` of a finished episode."""
    m = compute_metrics(core.sim.result())
    return core.returns, m["jct_mean"], m["fee_total"]


def numpy_state(net: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in net.state_dict().items()}


def load_state(net: nn.Module, state: dict[str, np.ndarray]) -> nn.Module:
    """``net`` with the numpy ``state`` loaded, in eval mode (rollout workers, evaluation)."""
    net.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    return net.eval()


# ============================================================================ options
def add_env_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", default="synthetic:small", help="training trace SPEC (a fresh seed per episode)")
    parser.add_argument("--episode-jobs", type=int, default=60, help="jobs per training episode")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--fee-weight", type=float, default=0.02, help="reward units per dollar")
    parser.add_argument("--time-scale", type=float, default=3600.0, help="seconds per JCT reward unit")


def add_loop_arguments(parser: argparse.ArgumentParser, iterations: int, lr: float) -> None:
    parser.add_argument("--iterations", type=int, default=iterations)
    parser.add_argument("--episodes-per-iter", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="rollout processes (0 or 1: in the learner's process)")
    parser.add_argument("--engine", choices=("process", "ray"), default="process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--reward-scale", type=float, default=0.1)


def add_eval_arguments(parser: argparse.ArgumentParser, tag: str, served: Path | None = None) -> None:
    parser.add_argument("--tag", default=tag, help="file stem of the evaluation tables")
    parser.add_argument(
        "--eval-traces",
        default="synthetic:small;synthetic:medium;synthetic:large,jobs=5000",
        help="';'-separated evaluation trace SPECs (large capped at 5,000 jobs by default)",
    )
    parser.add_argument("--eval-seeds", type=int, default=3, help="eval traces per cluster size")
    parser.add_argument("--eval-jobs", type=int, default=None, help="jobs per eval trace (default: the generator's)")
    parser.add_argument("--data-dir", type=Path, default=None, help="RLSCHED_DATA_DIR for the Alibaba 2023 trace")
    add_run_arguments(parser, served)


def common_arguments(parser: argparse.ArgumentParser, tag: str, iterations: int) -> None:
    """The options of A2C, DQN and HierRL (each adds its own after these)."""
    add_env_arguments(parser)
    add_loop_arguments(parser, iterations, lr=1e-3)
    add_eval_arguments(parser, tag)


# ============================================================================ training
def run_iterations(args, run: Run, collect: Callable[[dict], dict], make_task: Callable[[int, int], dict], update: Callable[[dict], dict], title: str) -> CSVLog:
    """The shared loop: parallel rollouts -> update -> CSV row, with a progress bar."""
    from tqdm import tqdm

    rng = np.random.default_rng(args.seed + 1)
    logf = CSVLog(run.log)
    t0 = time.time()
    with make_pool(args.engine, args.workers, args.seed) as pool:
        bar = tqdm(range(args.iterations), desc=f"train {args.tag}", unit="it")
        for it in bar:
            per = split_episodes(args.episodes_per_iter, args.workers)
            tasks = [make_task(int(rng.integers(0, 2**31 - 1)), n) | {"actor": k, "iteration": it} for k, n in enumerate(per) if n > 0]
            data = merge(pool.map(collect, tasks))
            stats = update(data)
            row = iteration_row(it, data, stats, t0)
            logf.write(row)
            bar.set_postfix(ret=f"{row['episode_return']:.2f}", jct=f"{row['episode_jct_mean']:.0f}")
            if getattr(args, "max_wall", 0) and row["wall_s"] >= args.max_wall:  # a wall-clock budget (DQN's --max-wall)
                break
    plot_curve(logf.rows, run.curve, "iteration", ["episode_return", "episode_jct_mean"], title)
    return logf


def export_model(args, run: Run, net: nn.Module, policy: str, spec: dict, wall: float, extra: dict | None = None) -> Path:
    """Export an A2C / DQN / HierRL network as the run's model."""
    from .export import export_policy

    export_policy(
        run.model,
        numpy_state(net),
        policy=policy,
        version="1",
        observation={"env": "rlsched.sim.envs.SchedulingEnv", "job_features": list(JOB_FEATURES), "window": args.window, **(extra or {})},
        architecture=spec,
        training={**jsonable_options(args), "wall_s": wall, "torch_threads": 1, "device": "cpu"},
        trained_on={"trace": args.trace, "episode_jobs": args.episode_jobs, "episodes": args.iterations * args.episodes_per_iter},
    )
    return run.model


# ============================================================================ evaluation
def load_for_eval(args, policy: str, make_net: Callable[[dict], nn.Module]) -> tuple[nn.Module, tuple[Path, Path, bool]]:
    """The trained ``policy`` network to evaluate (see :func:`rlsched.models.runs.eval_target`),
    on one torch thread, with ``args.window`` set to the window it was trained with; and
    the evaluation target ``(model, results folder, record)``."""
    from rlsched.core.nn import load_policy_file

    torch.set_num_threads(1)
    target = eval_target(args, policy)
    weights, meta = load_policy_file(target[0], policy=policy)
    args.window = int(meta["architecture"]["window"])
    return load_state(make_net(meta["architecture"]), weights), target


def eval_traces(args) -> list[tuple[str, int, Any]]:
    """``(label, seed, trace)`` for every evaluation trace. ``--eval-traces`` is a
    ``;``-separated list of SPECs; synthetic ones get seeds ``2**30 + ...`` that
    training (episode seeds below ``2**30``) never draws. The Alibaba 2023 trace is
    added when the data folder has it."""
    from rlsched.sim.traces import TraceError, data_dir, load_trace

    out = []
    for spec in [s.strip() for s in args.eval_traces.split(";") if s.strip()]:
        if not spec.startswith("synthetic:"):
            out.append((spec, 0, load_trace(spec, data_dir=args.data_dir)))
            continue
        for k in range(args.eval_seeds):
            seed = 2**30 + 7919 * k + 1
            s = spec + (f",jobs={args.eval_jobs}" if args.eval_jobs else "")
            out.append((spec, seed, load_trace(s, seed=seed)))
    ddir = data_dir(args.data_dir)
    if ddir is not None and (ddir / "alibaba-gpu-2023").is_dir() and not any(l.startswith("alibaba2023") for l, _, _ in out):
        try:
            out.append(("alibaba2023:default", 0, load_trace("alibaba2023:default", data_dir=ddir)))
        except TraceError as exc:  # reported in the log; the table then lacks the row
            log.warning("Alibaba 2023 trace not evaluated: %s", exc)
    for label, _, tr in out:
        if tr.topology is None:
            from rlsched.sim.traces import default_topology

            tr.topology = default_topology(tr.jobs)
    return out


def run_heuristic(jobs, topology, ordering: str, placement: str, seed: int, backfill: bool = False,
                  clairvoyant: bool = False) -> dict:
    """Metrics of one heuristic on a trace; ``clairvoyant``: it sees the true run times
    (a labelled reference, never a baseline)."""
    sim = Simulator(
        jobs,
        topology,
        ordering=make_ordering(ordering, rng=np.random.default_rng(seed)),
        placement=make_placement(placement, rng=np.random.default_rng(seed + 1)),
        seed=seed,
        config=SimConfig(backfill=backfill, clairvoyant=clairvoyant),
    )
    res = sim.run()
    m = compute_metrics(res)
    m["ideal_runtime_mean"] = float(np.mean([r.ideal_runtime for r in res.records])) if res.records else float("nan")
    return m


def evaluate_against_seed_baselines(args, target: tuple[Path, Path, bool], name: str, act_factory: Callable[[SchedulingCore], Callable[[SchedulingCore], float]]) -> int:
    """Table: the learned agent (greedy) vs SJF, Tetris and random, mean JCT and fee,
    on evaluation traces never drawn in training. ``act_factory(core)`` returns
    ``step(core) -> reward`` that makes one decision (start or wait). ``target`` is
    :func:`load_for_eval`'s ``(model, results folder, record)``."""
    from tqdm import tqdm

    model, results, record = target
    rows = []
    for label, seed, tr in tqdm(eval_traces(args), desc=f"eval {name}", unit="trace"):
        for b in SEED_BASELINES:
            o, p = b.split("/")
            m = run_heuristic(tr.jobs, tr.topology, o, p, seed)
            rows.append({"trace": label, "seed": seed, "system": b, "jct_mean": m["jct_mean"], "fee_total": m["fee_total"]})
        core = SchedulingCore(lambda _r: (tr.jobs, tr.topology), EnvConfig(window=args.window, fee_weight=args.fee_weight, time_scale=args.time_scale, sim=SimConfig()))
        core.reset(seed)
        step = act_factory(core)
        while not core.done:
            step(core)
        m = compute_metrics(core.sim.result())
        rows.append({"trace": label, "seed": seed, "system": name, "jct_mean": m["jct_mean"], "fee_total": m["fee_total"]})
    systems = list(SEED_BASELINES) + [name]
    table = summarize(rows, systems)
    md = write_table(table, systems, [name], list(SEED_BASELINES), results / f"{args.tag}_table", f"{name} vs SJF, Tetris and random")
    (results / f"{args.tag}_eval_runs.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(md)
    if record:
        from .export import update_evaluation

        update_evaluation(model, {"table": table, "seeds": sorted({r["seed"] for r in rows})})
    return 0
