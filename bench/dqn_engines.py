"""DQN on its two engines at one budget: Ape-X on Ray against the process pool.

Reads two training runs of ``rlsched train dqn`` (``--apex``: ``--engine ray``, with its
``apex.json``; ``--process``: ``--engine process``) and, when present, the tables their
``rlsched eval dqn --run RUN`` wrote into them (``dqn_table.json``). Writes one JSON of
the figures (wall time, transitions, samples/s, learner updates, the evaluation) and one
plot of both learning curves against wall time and against transitions collected.

    .venv/bin/python bench/dqn_engines.py --apex out/train/dqn_apex --process out/train/dqn_process \\
        --out docs/results/dqn_apex.json --plot docs/results/dqn_apex_learning_curve.png
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np


def _rows(run: Path) -> list[dict]:
    with (run / "train.csv").open() as f:
        return [{k: float(v) if v not in ("", "nan") else float("nan") for k, v in r.items()} for r in csv.DictReader(f)]


def _eval(run: Path) -> list[dict] | None:
    p = run / "dqn_table.json"
    return json.loads(p.read_text()) if p.is_file() else None


def summarize(apex: Path, process: Path) -> tuple[dict, dict]:
    """The figures of both runs and the curves to plot: ``{engine: (wall, transitions, return)}``."""
    a_rows, p_rows = _rows(apex), _rows(process)
    a_sum = json.loads((apex / "apex.json").read_text())
    p_opts = json.loads((process / "model.json").read_text())["training"]
    a_opts = json.loads((apex / "model.json").read_text())["training"]
    p_trans = np.cumsum([r["decisions"] for r in p_rows])
    p_wall = p_rows[-1]["wall_s"]
    out = {
        "machine": "CPU only, 2 cores shared with other training runs (timings are noisy), 1 torch thread per process",
        "ray-apex": {
            "run": apex.name, "actors": a_sum["actors"], "epsilons": a_sum["epsilons"], "wall_s": a_sum["wall_s"],
            "transitions": a_sum["transitions"], "samples_per_s": a_sum["samples_per_s"], "learner_updates": a_sum["updates"],
            "updates_per_s": a_sum["updates"] / a_sum["wall_s"], "weight_versions": a_sum["weight_version"],
            "by_actor": a_sum["by_actor"], "priority_updates": a_sum["priority_updates"],
            "model_wall_s": a_opts["wall_s"], "evaluation": _eval(apex),
        },
        "process": {
            "run": process.name, "workers": p_opts["workers"], "wall_s": p_wall, "transitions": int(p_trans[-1]),
            "samples_per_s": float(p_trans[-1] / p_wall), "rounds": len(p_rows),
            "learner_updates": len(p_rows) * int(p_opts["updates_per_iter"]),
            "updates_per_s": len(p_rows) * int(p_opts["updates_per_iter"]) / p_wall, "model_wall_s": p_opts["wall_s"],
            "evaluation": _eval(process),
        },
    }
    a_ep = [r for r in a_rows if r["episodes"] > 0]
    curves = {
        "Ape-X on Ray (2 actors)": ([r["wall_s"] for r in a_ep], [r["transitions"] for r in a_ep], [r["episode_return"] for r in a_ep]),
        "process pool (2 workers)": ([r["wall_s"] for r in p_rows], list(p_trans), [r["episode_return"] for r in p_rows]),
    }
    return out, curves


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, (wall, trans, ret) in curves.items():
        ret = np.asarray(ret, dtype=float)
        k = max(len(ret) // 20, 1)
        smooth = np.convolve(ret, np.ones(k) / k, mode="valid")
        for ax, x in zip(axes, (wall, trans)):
            (line,) = ax.plot(x, ret, lw=0.6, alpha=0.25)
            ax.plot(np.asarray(x)[k - 1:], smooth, lw=1.8, color=line.get_color(), label=f"{name} (mean of {k})")
    axes[0].set_xlabel("wall time (s)")
    axes[1].set_xlabel("transitions collected")
    for ax in axes:
        ax.set_ylabel("training episode return (both actors' epsilons)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("DQN (dueling, prioritized replay) on synthetic:medium, 100-job episodes: Ape-X on Ray vs process pool")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--apex", type=Path, required=True, help="run directory of `rlsched train dqn --engine ray`")
    p.add_argument("--process", type=Path, required=True, help="run directory of `rlsched train dqn --engine process`")
    p.add_argument("--out", type=Path, required=True, help="JSON of the figures")
    p.add_argument("--plot", type=Path, required=True, help="PNG of the learning curves")
    args = p.parse_args(argv)
    out, curves = summarize(args.apex, args.process)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    plot(curves, args.plot)
    print(json.dumps({k: {m: v for m, v in d.items() if m != "evaluation"} if isinstance(d, dict) else d for k, d in out.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
