"""Growth: the goodput allocator's growth weight, learned by evolution strategies.

``rlsched train growth`` learns the weight ``exp(w · φ(job))`` of
:mod:`rlsched.core.growth_weight` (with ``--form rlpto``, RLPTO's network of
:mod:`rlsched.core.rlpto_weight`) by evolution strategies (Salimans et al., 2017) on
workloads generated from the Philly list, train seeds only, starting from the service
weight. Which is served is chosen on validation seeds, never here.
Method and outputs: docs/design-notes.md.
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from .runs import add_run_arguments, new_run

__all__ = ["add_arguments", "train", "evaluate", "es_gradient", "Adam", "run_workload", "make_weight", "FORMS"]

#: the weights ES can learn (``--form``)
FORMS = ("linear", "rlpto")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--generations", type=int, default=16)
    parser.add_argument("--pairs", type=int, default=8, help="antithetic pairs per generation")
    parser.add_argument("--sigma", type=float, default=0.25, help="perturbation scale of w")
    parser.add_argument("--lr", type=float, default=0.1, help="Adam step size")
    parser.add_argument("--loads", default="0.5,1.5", help="LO,HI: each generation's load, drawn uniformly")
    parser.add_argument("--form", choices=FORMS, default="linear",
                        help="linear: exp(w . features) (core/growth_weight.py); rlpto: RLPTO's network on the "
                             "promoted growth weight (core/rlpto_weight.py)")
    parser.add_argument("--hidden", type=int, default=8, help="hidden units of --form rlpto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--data-dir", default=None, help="default: $RLSCHED_DATA_DIR")
    add_run_arguments(parser)


def make_weight(form: str, w, base_coef=None, hidden: int = 0):
    """The growth weight of ES's vector ``w``: ``exp(w · φ)`` (``linear``), or RLPTO's
    network of ``hidden`` units on the growth weight ``base_coef`` (``rlpto``)."""
    if form == "linear":
        from rlsched.core.growth_weight import LearnedGrowthWeight

        return LearnedGrowthWeight(np.asarray(w, dtype=float))
    if form == "rlpto":
        from rlsched.core.rlpto_weight import RLPTOGrowthWeight

        return RLPTOGrowthWeight.from_vector(w, base_coef, hidden)
    raise ValueError(f"unknown form {form!r}; known: {', '.join(FORMS)}")


def run_workload(coef, seed: int, load: float, data_dir: str | None, form: str = "linear", base_coef=None,
                 hidden: int = 0) -> float:
    """Mean JCT (s) of the goodput allocator weighted by ``coef`` (:func:`make_weight`)
    on the pollux-gen workload of train ``seed`` at ``load``."""
    from rlsched.core.goodput_allocator import GoodputAllocator
    from rlsched.sim.interval import IntervalConfig, IntervalSimulator
    from rlsched.sim.metrics import compute_metrics
    from rlsched.sim.protocol import split_of
    from rlsched.sim.traces import load_trace

    if split_of(seed) != "train":
        raise ValueError(f"seed {seed} is not a train seed: the growth weight learns on train seeds only")
    trace = load_trace(f"pollux-gen:seed={seed},load={load:.3f}", data_dir=data_dir)
    cfg = IntervalConfig(interval=trace.interval, restart_cost=trace.restart_cost)
    alloc = GoodputAllocator(growth=make_weight(form, coef, base_coef, hidden))
    sim = IntervalSimulator(trace.jobs, trace.apps, alloc, nodes=trace.nodes, gpus_per_node=trace.gpus_per_node,
                            config=cfg)
    return float(compute_metrics(sim.run())["jct_mean"])


def es_gradient(eps: np.ndarray, plus: np.ndarray, minus: np.ndarray, base: float, sigma: float) -> np.ndarray:
    """The antithetic ES estimate of the gradient of ``F = −JCT/base`` at ``w``:
    ``Σ_i (F(w + σε_i) − F(w − σε_i)) ε_i / (2 σ P)`` for ``P`` pairs."""
    eps = np.asarray(eps, dtype=float)
    diff = -(np.asarray(plus, dtype=float) - np.asarray(minus, dtype=float)) / base
    return (diff[:, None] * eps).sum(axis=0) / (2.0 * sigma * len(eps))


class Adam:
    """Adam ascent on a numpy vector (Kingma & Ba, 2015)."""

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
        self.lr, self.b1, self.b2, self.eps = lr, beta1, beta2, eps
        self.m = self.v = None
        self.t = 0

    def step(self, grad: np.ndarray) -> np.ndarray:
        """The step to add to the parameters (ascent along ``grad``)."""
        if self.m is None:
            self.m, self.v = np.zeros_like(grad), np.zeros_like(grad)
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * grad
        self.v = self.b2 * self.v + (1 - self.b2) * grad * grad
        mh = self.m / (1 - self.b1 ** self.t)
        vh = self.v / (1 - self.b2 ** self.t)
        return self.lr * mh / (np.sqrt(vh) + self.eps)


def _export(path: Path, coef: np.ndarray, args, note: str, history: list[dict], base_coef=None) -> None:
    from rlsched.core.growth_weight import CURVE_WINDOW, GROWTH_FEATURES

    from .base import jsonable_options
    from .export import export_policy

    if args.form == "rlpto":
        from rlsched.core import rlpto_weight as rw

        net = rw.RLPTOGrowthWeight.from_vector(coef, base_coef, args.hidden)
        tensors = {k: np.asarray(getattr(net, k), dtype=np.float32) for k in ("w1", "b1", "w2")}
        tensors["base_coef"] = np.asarray(base_coef, dtype=np.float32)
        policy, observation = rw.POLICY, {"features": list(rw.RLPTO_GOODPUT_FEATURES), "encoding":
                                          "rlsched.core.rlpto_weight.rlpto_views", "base_features": list(GROWTH_FEATURES),
                                          "curve_window": CURVE_WINDOW}
        architecture = {"form": "exp(base_coef . growth_features + w2 . tanh(w1 o + b1))", "hidden": args.hidden}
    else:
        tensors = {"coef": np.asarray(coef, dtype=np.float32)}
        policy, observation = "growth", {"features": list(GROWTH_FEATURES), "curve_window": CURVE_WINDOW}
        architecture = {"form": "exp(coef . features)"}
    export_policy(
        path, tensors, policy=policy, version="1", observation=observation, architecture=architecture,
        training={"method": "antithetic evolution strategies + Adam", "which": note, **jsonable_options(args),
                  "generations_run": len(history),
                  "final_relative_jct": history[-1]["pop_relative_jct"] if history else None},
        trained_on={"trace": "pollux-gen", "split": "train", "loads": args.loads,
                    "seeds": [h["seed"] for h in history]},
    )


def train(args) -> int:
    from tqdm import tqdm

    from rlsched.core.growth_weight import DEFAULT_COEF, GROWTH_FEATURES, LearnedGrowthWeight
    from rlsched.sim.protocol import SPLITS

    from .base import CSVLog, plot_curve

    lo, hi = (float(x) for x in args.loads.split(","))
    if not (0 < lo <= hi) or args.generations < 1 or args.pairs < 1 or args.sigma <= 0 or args.lr <= 0:
        raise SystemExit("need 0 < LO <= HI, generations >= 1, pairs >= 1, sigma > 0, lr > 0")
    if args.form == "rlpto" and args.hidden < 1:
        raise SystemExit("--hidden must be >= 1")
    run = new_run(args, "growth")
    rng = np.random.default_rng(args.seed)
    lo_seed, hi_seed = SPLITS["train"]
    base_coef = None
    if args.form == "rlpto":
        from rlsched.core.rlpto_weight import RLPTO_GOODPUT_FEATURES, RLPTOGrowthWeight

        promoted = LearnedGrowthWeight()  # the promoted growth weight, the network's base
        if promoted.fallback_reason:
            raise SystemExit(f"--form rlpto builds on the promoted growth weight: {promoted.fallback_reason}")
        base_coef = promoted.coef
        k, h = len(RLPTO_GOODPUT_FEATURES), args.hidden
        w = np.zeros(RLPTOGrowthWeight.size(h))
        w[:h * k] = rng.standard_normal(h * k) / np.sqrt(k)  # W random; c, v zero: the promoted weight exactly
        names = [f"w_{i}" for i in range(len(w))]
    else:
        w = DEFAULT_COEF.astype(float).copy()
        names = [f"w_{n}" for n in GROWTH_FEATURES]
    opt = Adam(args.lr)
    log = CSVLog(run.log)
    history: list[dict] = []
    ws: list[np.ndarray] = []
    t0 = time.time()
    with ProcessPoolExecutor(max(args.procs, 1)) as ex:
        for g in tqdm(range(1, args.generations + 1), desc=f"growth ES ({args.form})", unit="generation",
                      dynamic_ncols=True):
            seed = int(rng.integers(lo_seed, hi_seed))
            load = float(rng.uniform(lo, hi))
            eps = rng.standard_normal((args.pairs, len(w)))
            cands = [w] + [w + args.sigma * e for e in eps] + [w - args.sigma * e for e in eps]
            n = len(cands)
            jct = list(ex.map(run_workload, cands, [seed] * n, [load] * n, [args.data_dir] * n, [args.form] * n,
                              [base_coef] * n, [args.hidden] * n))
            base, plus, minus = jct[0], np.array(jct[1:1 + args.pairs]), np.array(jct[1 + args.pairs:])
            grad = es_gradient(eps, plus, minus, base, args.sigma)
            w = w + opt.step(grad)
            ws.append(w.copy())
            row = {"generation": g, "seed": seed, "load": round(load, 3), "base_jct": base,
                   "pop_relative_jct": float(np.mean(np.r_[plus, minus]) / base),
                   "best_relative_jct": float(np.min(np.r_[plus, minus]) / base),
                   "grad_norm": float(np.linalg.norm(grad)), "w_norm": float(np.linalg.norm(w)),
                   "wall_s": time.time() - t0, **dict(zip(names, map(float, w)))}
            log.write(row)
            history.append(row)
    avg = np.mean(ws[len(ws) // 2:], axis=0)
    _export(run.model, avg, args, "mean of the second half of the generations", history, base_coef)
    _export(run.dir / "last.safetensors", w, args, "the last generation", history, base_coef)
    shown = ["w_service", "w_age", "w_curve"] if args.form == "linear" else ["w_norm"]
    plot_curve(history, run.curve, "generation", ["pop_relative_jct", "best_relative_jct"] + shown,
               f"growth weight ({args.form}): ES on train seeds")
    print(f"growth ({args.form}): {run.dir}: |w| (mean of the second half) = {np.linalg.norm(avg):.3f}, "
          f"last = {np.linalg.norm(w):.3f}; choose on validation with bench/goodput_select.py")
    return 0


def evaluate(args) -> int:
    raise SystemExit("rlsched eval growth: the growth weight is evaluated on validation seeds with "
                     "bench/goodput_select.py --settings '[{}, {\"growth_model\": \"out/train/RUN/model.safetensors\"}]' "
                     "(or {\"rlpto_model\": ...} for --form rlpto) and on the protocol's test split with "
                     "rlsched eval protocol --policies goodput-learned (goodput-rlpto)")
