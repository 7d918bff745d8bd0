"""Training runs: where training writes, what evaluation reads, and promotion.

Every ``rlsched train <algo>`` writes one run directory (``out/train/<run>/``), never
the source tree; ``rlsched eval <algo>`` evaluates a model file, a run's model or the
served one; ``rlsched models promote RUN`` (:func:`promote`) checks a run's model and
copies it into ``core/weights/`` with a promotion record.
Layout: docs/training.md, docs/design-notes.md.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "RunError",
    "Run",
    "RUNS_DIR",
    "EVAL_DIR",
    "add_run_arguments",
    "new_run",
    "open_run",
    "eval_target",
    "served_dir",
    "promote",
]

#: default parent of the run directories (relative to the working directory)
RUNS_DIR = Path("out") / "train"
#: where an evaluation of a model outside any run writes its tables by default
EVAL_DIR = Path("out") / "eval"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]*$")


class RunError(RuntimeError):
    """A training run cannot be used as asked: it does not exist (or already does), or
    its model or metadata is missing or corrupt."""


@dataclass(frozen=True)
class Run:
    """One run directory and the fixed names inside it."""

    name: str
    dir: Path

    @property
    def model(self) -> Path:
        return self.dir / "model.safetensors"

    @property
    def log(self) -> Path:
        return self.dir / "train.csv"

    @property
    def curve(self) -> Path:
        return self.dir / "learning_curve.png"


def _stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")


def _check_name(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise RunError(f"{what} {name!r} is not a plain name (letters, digits, '_', '-', '.', starting with a letter or digit)")
    return name


def served_dir() -> Path:
    """``core/weights/``: the served models shipped with ``rlsched.core``."""
    import rlsched.core

    return Path(rlsched.core.__file__).resolve().parent / "weights"


def add_run_arguments(parser, served: Path | None = None) -> None:
    """``--run``, ``--runs-dir``, ``--model`` and ``--results`` (module docstring)."""
    parser.add_argument("--run", default=None, help="run name: train writes <runs-dir>/RUN/ (default <algo>-<UTC time>); eval reads its model")
    parser.add_argument("--runs-dir", type=Path, default=RUNS_DIR, help="parent of the run directories")
    default = f"; without --run, the served {served.name}" if served is not None else ""
    parser.add_argument("--model", type=Path, default=None, help=f"eval: the model to evaluate (default: the run's model{default})")
    parser.add_argument("--results", type=Path, default=None,
                        help=f"eval: folder for the tables (default: the run's folder, else {EVAL_DIR}/<algo>-<UTC time>)")


def new_run(args, algo: str) -> Run:
    """Create the run directory of a training (``args.run`` is set to its name)."""
    if getattr(args, "model", None) is not None:
        raise RunError("--model names a model to evaluate; training writes <runs-dir>/<run>/model.safetensors")
    name = _check_name(args.run or f"{algo}-{_stamp()}", "run name")
    run = Run(name, Path(args.runs_dir) / name)
    if run.dir.exists() and any(run.dir.iterdir()):
        raise RunError(f"run {name!r} already exists in {args.runs_dir}; give another --run")
    run.dir.mkdir(parents=True, exist_ok=True)
    args.run = name
    return run


def open_run(name: str, runs_dir: Path = RUNS_DIR, need_model: bool = True) -> Run:
    """An existing run, with its model and metadata in place when ``need_model``."""
    run = Run(_check_name(name, "run name"), Path(runs_dir) / name)
    if not run.dir.is_dir():
        raise RunError(f"no training run {name!r} in {runs_dir}")
    for f in (run.model, run.model.with_suffix(".json")) if need_model else ():
        if not f.is_file():
            raise RunError(f"run {name!r} has no {f.name} in {run.dir} (did its training finish?)")
    return run


def eval_target(args, algo: str, served: Path | None = None) -> tuple[Path, Path, bool]:
    """``(model, results folder, record)`` of an evaluation (module docstring).
    ``record`` is False for a served model of ``core/weights/``."""
    run = open_run(args.run, args.runs_dir, need_model=args.model is None) if args.run else None
    if args.model is not None:
        model = Path(args.model)
    elif run is not None:
        model = run.model
    elif served is not None:
        model = served
    else:
        raise RunError(f"rlsched eval {algo}: give --run RUN (a training run in {args.runs_dir}) or --model FILE")
    results = Path(args.results) if args.results else (run.dir if run else EVAL_DIR / f"{algo}-{_stamp()}")
    record = model.resolve().parent != served_dir()
    if not record:
        print(f"{model} is a served model: its metadata changes only through `rlsched models promote`; the tables are in {results}")
    return model, results, record


def promote(run: str, name: str | None = None, runs_dir: Path = RUNS_DIR, weights_dir: Path | None = None,
            checkpoint: str | None = None) -> Path:
    """Copy the model of ``run`` into ``weights_dir`` (default ``core/weights/``) as
    ``<name>.safetensors`` + ``.json`` with a ``promotion`` record; the new weights path.
    ``checkpoint``: another ``.safetensors`` file of the run (e.g. ``last.safetensors``)
    chosen on validation instead of ``model.safetensors``."""
    from rlsched.core.nn import PolicyFileError, load_policy_file

    src = open_run(run, runs_dir)
    model = src.model
    if checkpoint is not None:
        model = src.dir / _check_name(checkpoint, "checkpoint")
        if model.suffix != ".safetensors" or not model.is_file():
            raise RunError(f"run {run!r} has no checkpoint {checkpoint!r} (a .safetensors file in {src.dir})")
    try:
        _, meta = load_policy_file(model)
    except PolicyFileError as exc:
        raise RunError(f"run {run!r}: {exc}") from None
    name = _check_name(name or meta["policy"], "model name")
    weights_dir = Path(weights_dir) if weights_dir is not None else served_dir()
    dst = weights_dir / f"{name}.safetensors"
    dst_meta = dst.with_suffix(".json")
    if dst_meta.is_file():
        try:
            old = json.loads(dst_meta.read_text()).get("policy")
        except ValueError as exc:
            raise RunError(f"{dst_meta} is not valid JSON ({exc}); remove it to promote into its place") from None
        if old != meta["policy"]:
            raise RunError(f"{dst_meta} holds policy {old!r}; run {run!r} has a {meta['policy']!r} model (give another --name)")
    training = meta.get("training", {})
    meta["promotion"] = {
        "run": run,
        "source": str(model),
        "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "validation": {k: v for k, v in training.items() if k.startswith("best_")},
        "evaluation": sorted(meta.get("evaluation", {})),
    }
    weights_dir.mkdir(parents=True, exist_ok=True)
    # each file is written beside its target, then renamed over it
    tmp = dst.with_name(f".{dst.name}.promote")
    shutil.copyfile(model, tmp)
    os.replace(tmp, dst)
    tmp = dst_meta.with_name(f".{dst_meta.name}.promote")
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, dst_meta)
    return dst
