"""What every training script shares: seeding, CSV learning-curve logs and their plots,
the run's options as JSON, and the evaluation tables.

Importing this module does not import torch or matplotlib (both are imported by the
functions that need them).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

__all__ = ["seed_everything", "CSVLog", "iteration_row", "plot_curve", "jsonable_options", "summarize", "write_table"]


# ============================================================================ seeding
def seed_everything(seed: int) -> np.random.Generator:
    """Seed torch's global generator; the run's numpy generator."""
    import torch

    torch.manual_seed(seed)
    return np.random.default_rng(seed)


# ============================================================================ logs
class CSVLog:
    """Appends one row per iteration to a CSV file.

    The header is ``fields`` when given (rows may then lack some of them, e.g. the
    validation columns between validations, and extra keys are left out), else the keys
    of the first row. ``rows`` keeps every row written, for :func:`plot_curve`."""

    def __init__(self, path: Path, fields: Sequence[str] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fields: list[str] | None = list(fields) if fields is not None else None
        self._started = False
        self.rows: list[dict] = []

    def write(self, row: dict) -> None:
        self.rows.append(row)
        new = not self._started
        if self._fields is None:
            self._fields = list(row)
        with self.path.open("w" if new else "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self._fields, extrasaction="ignore")
            if new:
                w.writeheader()
            w.writerow(row)
        self._started = True


def iteration_row(it: int, data: dict, stats: dict, t0: float) -> dict:
    """One learning-curve CSV row: rollout figures of the iteration, update statistics
    and wall time since ``t0``."""
    return {
        "iteration": it,
        "decisions": len(data["reward"]),
        "episode_return": float(np.mean(data["episode_return"])),
        "episode_jct_mean": float(np.mean(data["episode_jct"])),
        "episode_fee": float(np.mean(data["episode_fee"])),
        **stats,
        "wall_s": time.time() - t0,
    }


def plot_curve(rows: Sequence[dict], path: Path, x: str, ys: Sequence[str], title: str) -> None:
    """One panel per column of ``ys`` against ``x``, with a running mean when long."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(ys), figsize=(4.2 * len(ys), 3.2))
    axes = np.atleast_1d(axes)
    xs = [r[x] for r in rows]
    k = max(len(rows) // 15, 1)
    for ax, y in zip(axes, ys):
        v = np.array([r[y] for r in rows], dtype=float)
        ax.plot(xs, v, lw=0.8, alpha=0.4, label="per iteration")
        if k > 1:
            smooth = np.convolve(v, np.ones(k) / k, mode="valid")
            ax.plot(xs[k - 1 :], smooth, lw=1.8, label=f"mean of {k}")
            ax.legend(fontsize=7)
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def jsonable_options(args) -> dict:
    """The run's options as JSON values (paths as strings, callables left out)."""
    out = {}
    for k, v in vars(args).items():
        if callable(v):
            continue
        out[k] = str(v) if isinstance(v, Path) else v
    return out


# ============================================================================ tables
def summarize(rows: list[dict], systems: Sequence[str]) -> list[dict]:
    """Mean JCT and fee per (trace, system), averaged over seeds."""
    table = []
    for spec in dict.fromkeys(r["trace"] for r in rows):
        line: dict[str, Any] = {"trace": spec}
        for sys_ in systems:
            sel = [r for r in rows if r["trace"] == spec and r["system"] == sys_]
            if sel:
                line[sys_] = {"jct_mean": float(np.mean([r["jct_mean"] for r in sel])), "fee_total": float(np.mean([r["fee_total"] for r in sel]))}
        table.append(line)
    return table


def write_table(table: list[dict], systems: Sequence[str], learned: Sequence[str], heuristics: Sequence[str], path_stem: Path, title: str,
                clairvoyant: Sequence[str] = ()) -> str:
    """Markdown + JSON table in the papers' shape — one row per system, a "JCT / fee"
    column per trace — then the best heuristic per trace (lowest mean JCT, then fee) and each
    learned system's change against it. Systems in ``clairvoyant`` saw the jobs' true
    run times: labelled "(clairvoyant reference)" and never the best heuristic."""
    traces_ = [line["trace"] for line in table]
    lines = [f"# {title}", "", "Mean JCT (s) / total fee ($) per trace, averaged over its evaluation seeds.", ""]
    lines += ["| system | " + " | ".join(traces_) + " |", "|---|" + "---|" * len(traces_)]
    for sys_ in systems:
        cells = [f"{line[sys_]['jct_mean']:.0f} / {line[sys_]['fee_total']:.1f}" if sys_ in line else "—" for line in table]
        name = f"**{sys_}**" if sys_ in learned else (sys_ if sys_ in heuristics and sys_ not in clairvoyant else f"{sys_} (reference, not a Table 1 baseline)")
        if sys_ in clairvoyant:
            name = f"{sys_} (clairvoyant reference, not a baseline)"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Against the best heuristic of each trace (negative = better):", ""]
    lines += ["| trace | best heuristic | " + " | ".join(f"{l}: JCT / fee" for l in learned) + " |", "|---|---|" + "---|" * len(learned)]
    for line in table:
        hs = [h for h in heuristics if h in line and h not in clairvoyant]
        # lowest mean JCT; ties (e.g. a trace that never queues) go to the lower fee
        best = min(hs, key=lambda h: (round(line[h]["jct_mean"], 6), line[h]["fee_total"])) if hs else None
        line["best_heuristic"] = best
        deltas = []
        for l in learned:
            if best and l in line:
                dj = line[l]["jct_mean"] / line[best]["jct_mean"] - 1
                df = line[l]["fee_total"] / line[best]["fee_total"] - 1
                line[f"{l} vs best"] = {"jct": dj, "fee": df}
                deltas.append(f"{dj:+.1%} / {df:+.1%}")
            else:
                deltas.append("—")
        lines.append(f"| {line['trace']} | {best} | " + " | ".join(deltas) + " |")
    md = "\n".join(lines) + "\n"
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    path_stem.with_suffix(".md").write_text(md)
    path_stem.with_suffix(".json").write_text(json.dumps(table, indent=2) + "\n")
    return md
