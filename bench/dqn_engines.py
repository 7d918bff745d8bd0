"""DQN on its two engines at one budget: Ape-X on Ray against the process pool.

Reads two training runs of ``rlsched train dqn`` (``--apex``: ``--engine ray``, with its
``apex.json``; ``--process``: ``--engine process``) and, when present, the tables their
``rlsched eval dqn --run RUN`` wrote into them (``dqn_table.json``, ``dqn_eval_runs.json``).
Writes one JSON of the figures (wall time, transitions, samples/s, learner updates, the
evaluation and paired per-seed differences with 95% bootstrap intervals) and one
plot of both learning curves against wall time and against transitions collected.

    .venv/bin/python bench/dqn_engines.py --apex out/train/dqn_apex --also-apex out/train/dqn_apex_first \\
        --process out/train/dqn_process --out docs/results/dqn_apex.json --plot docs/results/dqn_apex_learning_curve.png
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


def paired(apex: Path, process: Path) -> list[dict]:
    """Per evaluation trace: Ape-X's DQN against the process engine's and each against the
    best heuristic of that trace, paired over the same evaluation seeds (mean JCT;
    :func:`rlsched.sim.protocol.paired_bootstrap`, 95% interval)."""
    from rlsched.sim.protocol import paired_bootstrap

    pa, pp = apex / "dqn_eval_runs.json", process / "dqn_eval_runs.json"
    if not (pa.is_file() and pp.is_file()):
        return []
    ra, rp = json.loads(pa.read_text()), json.loads(pp.read_text())
    out = []
    for trace in dict.fromkeys(r["trace"] for r in ra):
        def jct(rows, system):
            sel = sorted((r for r in rows if r["trace"] == trace and r["system"] == system), key=lambda r: r["seed"])
            return [r["seed"] for r in sel], [r["jct_mean"] for r in sel]

        seeds, a = jct(ra, "DQN")
        seeds_p, b = jct(rp, "DQN")
        if seeds != seeds_p or len(seeds) < 2:
            continue
        line = {"trace": trace, "seeds": seeds, "apex_vs_process": paired_bootstrap(a, b).to_dict()}
        systems = sorted({r["system"] for r in ra if r["system"] != "DQN"})
        means = {h: float(np.mean(jct(ra, h)[1])) for h in systems}
        best = min(means, key=means.get)
        line["best_heuristic"] = best
        line["apex_vs_best"] = paired_bootstrap(a, jct(ra, best)[1]).to_dict()
        line["process_vs_best"] = paired_bootstrap(b, jct(rp, best)[1]).to_dict()
        out.append(line)
    return out


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
    out["paired_jct"] = paired(apex, process)
    a_ep = [r for r in a_rows if r["episodes"] > 0]
    curves = {
        "Ape-X on Ray (2 actors)": ([r["wall_s"] for r in a_ep], [r["transitions"] for r in a_ep], [r["episode_return"] for r in a_ep],
                                    [r["wall_s"] for r in a_rows], [r["loss"] for r in a_rows]),
        "process pool (2 workers)": ([r["wall_s"] for r in p_rows], list(p_trans), [r["episode_return"] for r in p_rows],
                                     [r["wall_s"] for r in p_rows], [r["loss"] for r in p_rows]),
    }
    per_actor = {}
    if (apex / "episodes.csv").is_file():
        for e in _rows_of(apex / "episodes.csv"):
            per_actor.setdefault(int(e["actor"]), []).append((e["wall_s"], e["episode_return"]))
    return out, {"curves": curves, "per_actor": per_actor, "epsilons": a_sum["epsilons"]}


def _rows_of(path: Path) -> list[dict]:
    with path.open() as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, per_actor = data["curves"], data["per_actor"]
    fig, axes = plt.subplots(1, 4 if per_actor else 3, figsize=(17 if per_actor else 13, 3.8))
    for name, (wall, trans, ret, lwall, loss) in curves.items():
        ret = np.asarray(ret, dtype=float)
        k = max(len(ret) // 20, 1)
        smooth = np.convolve(ret, np.ones(k) / k, mode="valid")
        for ax, x in zip(axes, (wall, trans)):
            (line,) = ax.plot(x, ret, lw=0.6, alpha=0.25)
            ax.plot(np.asarray(x)[k - 1:], smooth, lw=1.8, color=line.get_color(), label=f"{name}, mean of {k} rows")
        axes[2].plot(lwall, loss, lw=1.2, color=line.get_color(), label=name)
    axes[0].set_xlabel("wall time (s)")
    axes[1].set_xlabel("transitions collected")
    axes[1].ticklabel_format(axis="x", style="sci", scilimits=(3, 3))
    axes[2].set_xlabel("wall time (s)")
    axes[2].set_ylabel("learner loss (weighted Huber)")
    axes[2].set_yscale("log")
    for actor, pts in sorted(per_actor.items()):
        wall, ret = np.array(pts).T
        k = max(len(ret) // 15, 1)
        axes[3].plot(wall, ret, lw=0.6, alpha=0.25, color=f"C{2 + actor}")
        axes[3].plot(wall[k - 1:], np.convolve(ret, np.ones(k) / k, mode="valid"), lw=1.8, color=f"C{2 + actor}",
                     label=f"actor {actor}, epsilon {data['epsilons'][actor]:.2g}, mean of {k}")
    if per_actor:
        axes[3].set_xlabel("wall time (s)")
        axes[3].set_title("Ape-X: each actor's episodes", fontsize=9)
    for ax in axes[:2] if not per_actor else [*axes[:2], axes[3]]:
        ax.set_ylabel("training episode return")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("DQN on synthetic:medium (100-job episodes), CPU: Ape-X on Ray vs the process pool, same 8-minute budget", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--apex", type=Path, required=True, help="run directory of `rlsched train dqn --engine ray`")
    p.add_argument("--also-apex", type=Path, nargs="*", default=[], help="other Ape-X runs of the same configuration, reported beside")
    p.add_argument("--process", type=Path, required=True, help="run directory of `rlsched train dqn --engine process`")
    p.add_argument("--out", type=Path, required=True, help="JSON of the figures")
    p.add_argument("--plot", type=Path, required=True, help="PNG of the learning curves")
    args = p.parse_args(argv)
    out, data = summarize(args.apex, args.process)
    # further Ape-X runs of the same configuration: asynchronous, so no two are the same
    out["ray-apex-other-runs"] = []
    for other in args.also_apex:
        o, _ = summarize(other, args.process)
        out["ray-apex-other-runs"].append({**o["ray-apex"], "paired_jct": o["paired_jct"]})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    plot(data, args.plot)
    print(json.dumps({k: {m: v for m, v in d.items() if m != "evaluation"} if isinstance(d, dict) else d for k, d in out.items()
                      if k not in ("paired_jct", "ray-apex-other-runs")}, indent=2))
    for run, lines in [(args.apex.name, out["paired_jct"])] + [(o["run"], o["paired_jct"]) for o in out["ray-apex-other-runs"]]:
        for line in lines:
            d = line["apex_vs_process"]
            print(f"{run} {line['trace']}: Ape-X vs process JCT {d['rel']:+.1%} [{d['rel_lo']:+.1%}, {d['rel_hi']:+.1%}] over {d['n']} seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
