"""LSP: the GRU that forecasts tomorrow's task volume from the last 7 days (RLPTO §IV).

``rlsched train lsp`` builds a daily task-volume series — pods created per day in the
Alibaba GPU 2023 trace (``$RLSCHED_DATA_DIR/alibaba-gpu-2023/openb_pod_list_default.csv``,
``creation_time``) when ``RLSCHED_DATA_DIR`` is set, else a seeded synthetic series
(weekly cycle, trend, noise) — trains ``nn.GRU(1, hidden)`` + ``nn.Linear(hidden, 1)``
on z-scored windows, holds out the last ``--test-days`` days, and exports the run's
model (``out/train/<run>/model.safetensors`` + ``.json``; :mod:`rlsched.models.runs`) in
the layout :class:`rlsched.core.forecast.GRUForecaster` reads (tensors ``gru.*`` and
``head.*``; metadata ``mean``, ``std``, ``window``); ``rlsched models promote <run>``
serves it as ``core/weights/lsp_gru.*``. ``rlsched eval lsp`` reports the held-out error
of the GRU, ARIMA, their LSP mix and naive baselines.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path

import numpy as np

from .runs import add_run_arguments, eval_target, new_run, served_dir

__all__ = ["add_arguments", "train", "evaluate", "daily_volume", "synthetic_volume", "windows"]

#: the served forecaster's file name in core/weights/
SERVED = "lsp_gru.safetensors"
TRACE = Path("alibaba-gpu-2023") / "openb_pod_list_default.csv"


def daily_volume(csv_path: str | Path, min_tasks: int = 20) -> np.ndarray:
    """Tasks created per day (``creation_time // 86400``) of an Alibaba 2023 pod list.

    The sparse leading days (fewer than ``min_tasks`` creations, before the trace
    window proper) and the last, partial day are dropped; empty days inside count 0.
    """
    import pandas as pd

    t = pd.read_csv(csv_path, usecols=["creation_time"])["creation_time"].to_numpy()
    if t.size == 0:
        raise ValueError(f"{csv_path}: no pods")
    day = (t // 86400).astype(np.int64)
    counts = np.bincount(day - day.min()).astype(float)
    busy = np.flatnonzero(counts >= min_tasks)
    if busy.size < 2:
        raise ValueError(f"{csv_path}: fewer than two days with {min_tasks}+ tasks")
    return counts[busy[0] : busy[-1]]  # busy[-1] is the last (partial) day


def synthetic_volume(rng: np.random.Generator, days: int = 365, base: float = 200.0) -> np.ndarray:
    """A daily task-volume series: slow trend × weekly cycle (weekends lower) × noise."""
    d = np.arange(days)
    trend = base * (1.0 + 0.5 * d / days)
    weekly = np.where(d % 7 >= 5, 0.6, 1.0) * (1.0 + 0.1 * np.sin(2 * np.pi * d / 7))
    noise = rng.lognormal(0.0, 0.12, days)
    return np.round(trend * weekly * noise)


def windows(series: np.ndarray, window: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Sliding ``(x[t-window:t], x[t])`` pairs: ``X [n, window]``, ``y [n]``."""
    s = np.asarray(series, dtype=float)
    if s.size <= window:
        raise ValueError(f"series of {s.size} days is too short for a {window}-day window")
    idx = np.arange(window, s.size)
    return np.stack([s[i - window : i] for i in idx]), s[idx]


def load_series(args) -> tuple[np.ndarray, str]:
    data = args.data_dir or os.environ.get("RLSCHED_DATA_DIR")
    if data and args.source != "synthetic":
        path = Path(data) / TRACE
        if not path.is_file():
            raise SystemExit(f"lsp: {path} not found (RLSCHED_DATA_DIR={data})")
        return daily_volume(path), f"alibaba-gpu-2023 {TRACE.name} creation_time per day"
    if args.source == "alibaba":
        raise SystemExit("lsp: --source alibaba needs RLSCHED_DATA_DIR or --data-dir")
    return synthetic_volume(np.random.default_rng(args.seed), args.days), f"synthetic_volume(seed={args.seed}, days={args.days})"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--source", choices=("auto", "alibaba", "synthetic"), default="auto",
                   help="auto: the Alibaba trace when RLSCHED_DATA_DIR is set, else synthetic")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--days", type=int, default=365, help="synthetic series length")
    p.add_argument("--window", type=int, default=7)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--epochs", type=int, default=400)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--test-days", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    add_run_arguments(p, served=Path(SERVED))


def _split(series: np.ndarray, window: int, test_days: int):
    X, y = windows(series, window)
    if test_days >= len(y):
        raise SystemExit(f"lsp: {len(y)} windows, cannot hold out {test_days}")
    return X[:-test_days], y[:-test_days], X[-test_days:], y[-test_days:]


def train(args) -> int:
    import torch
    from tqdm import tqdm

    from .export import export_policy

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    series, source = load_series(args)
    Xtr, ytr, Xte, yte = _split(series, args.window, args.test_days)
    train_part = series[: len(series) - args.test_days]
    mean, std = float(train_part.mean()), float(train_part.std() or 1.0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gru = torch.nn.GRU(1, args.hidden, num_layers=args.layers, batch_first=True)
            self.head = torch.nn.Linear(args.hidden, 1)

        def forward(self, x):
            _, h = self.gru(x.unsqueeze(-1))
            return self.head(h[-1]).squeeze(-1)

    net = Net()
    opt = torch.optim.Adam(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    xt = torch.tensor((Xtr - mean) / std, dtype=torch.float32)
    yt = torch.tensor((ytr - mean) / std, dtype=torch.float32)
    run = new_run(args, "lsp")
    t0 = time.time()
    with open(run.log, "w", newline="") as fh:
        log = csv.writer(fh)
        log.writerow(["epoch", "train_mse_z"])
        for ep in tqdm(range(1, args.epochs + 1), desc="lsp", unit="epoch", dynamic_ncols=True):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(net(xt), yt)
            loss.backward()
            opt.step()
            log.writerow([ep, float(loss.detach())])
    wall = time.time() - t0
    with torch.no_grad():
        pred = net(torch.tensor((Xte - mean) / std, dtype=torch.float32)).numpy() * std + mean
    mae = float(np.mean(np.abs(pred - yte)))
    export_policy(
        run.model,
        {k: v for k, v in net.state_dict().items()},
        policy="lsp_gru",
        version="1",
        observation={"input": f"last {args.window} daily task volumes, oldest first, z-scored with mean/std",
                     "output": "next day's task volume (de-normalised)"},
        architecture={"gru_layers": args.layers, "hidden": args.hidden, "head": "linear", "reader": "rlsched.core.forecast.GRUForecaster"},
        training={"seed": args.seed, "epochs": args.epochs, "lr": args.lr, "weight_decay": args.weight_decay,
                  "wall_s": round(wall, 2), "train_windows": len(ytr), "torch": torch.__version__},
        trained_on={"series": source, "days": len(series), "test_days": args.test_days},
        evaluation={"test_mae_tasks": mae},
        extra={"mean": mean, "std": std, "window": args.window},
    )
    print(f"lsp: exported {run.model}; held-out MAE {mae:.1f} tasks/day over {args.test_days} days ({source})")
    return 0


def evaluate(args) -> int:
    """Held-out MAE of the exported GRU (numpy), ARIMA, the LSP mix and naive forecasts."""
    from rlsched.core.forecast import GRUForecaster, arima_forecast, combine

    model, results, _ = eval_target(args, "lsp", served=served_dir() / SERVED)
    series, source = load_series(args)
    gru = GRUForecaster.from_file(model)
    n = len(series)
    rows = []
    for t in range(n - args.test_days, n):
        hist = series[:t]
        g = gru.predict(hist[-gru.window :])
        a = arima_forecast(hist)
        rows.append({"day": t, "actual": series[t], "gru": g, "arima": a, "lsp": combine(g, a),
                     "last_value": hist[-1], "mean_7": float(hist[-7:].mean()), "same_day_last_week": hist[-7]})
    res = {k: float(np.mean([abs(r[k] - r["actual"]) for r in rows])) for k in ("gru", "arima", "lsp", "last_value", "mean_7", "same_day_last_week")}
    summary = {"source": source, "test_days": args.test_days, "mae_tasks_per_day": res,
               "mean_actual": float(np.mean([r["actual"] for r in rows]))}
    results.mkdir(parents=True, exist_ok=True)
    tag = "alibaba" if source.startswith("alibaba") else "synthetic"
    (results / f"lsp_eval_{tag}.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0
