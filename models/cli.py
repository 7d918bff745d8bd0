"""``rlsched train <algo>``, ``rlsched eval <algo>`` and ``rlsched models promote RUN``.

Each algorithm lives in ``rlsched.models.<algo>`` and exposes ``add_arguments(parser)``,
``train(args) -> int`` and ``evaluate(args) -> int``. The module is imported only when
its subcommand runs, so ``rlsched --help`` never imports torch. ``--config F`` (YAML or
JSON mapping of option names to values) sets defaults; options on the command line win.
Training writes into ``out/train/<run>/``; ``rlsched models promote`` copies a run's
model into ``core/weights/`` (:mod:`rlsched.models.runs`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from .rollout import EngineUnavailable
from .runs import RUNS_DIR, RunError, promote

__all__ = ["ALGORITHMS", "register", "build_algo_parser", "run"]

#: algorithm name -> module implementing it
ALGORITHMS = {
    "rlpto": "rlsched.models.rlpto",
    "das": "rlsched.models.das",
    "a2c": "rlsched.models.a2c",
    "hierrl": "rlsched.models.hierrl",
    "dqn": "rlsched.models.dqn",
    "lsp": "rlsched.models.lsp",
    "growth": "rlsched.models.growth",
}


def register(subparsers) -> None:
    for command, helptext in (("train", "train a learned policy"), ("eval", "evaluate a learned policy against baselines")):
        p = subparsers.add_parser(
            command,
            help=helptext,
            description=f"{helptext}. Run `rlsched {command} ALGO --help` for the algorithm's options.",
            add_help=True,
        )
        choices = sorted(ALGORITHMS) + (["protocol"] if command == "eval" else [])
        p.add_argument("algo", choices=choices,
                       help="which policy" + ("; `protocol`: candidates against the strongest baselines "
                                              "(rlsched eval protocol --help)" if command == "eval" else ""))
        p.add_argument("rest", nargs=argparse.REMAINDER, help="the algorithm's options (--config F, --seed N, ...)")
        p.set_defaults(func=lambda args, _c=command: run(_c, args.algo, args.rest))
    models = subparsers.add_parser("models", help="manage trained models", description="manage trained models")
    msub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    p = msub.add_parser(
        "promote",
        help="serve a training run's model: copy it into core/weights/",
        description="Check the model of out/train/RUN/ and copy it (safetensors + JSON metadata) into core/weights/ "
        "as NAME.safetensors, recording the promotion (run, time, figures) in the metadata.",
    )
    p.add_argument("run", help="training run name (a folder of --runs-dir)")
    p.add_argument("--name", default=None, help="file stem in core/weights/ (default: the model's policy name, e.g. das, rlpto, lsp_gru)")
    p.add_argument("--runs-dir", type=Path, default=RUNS_DIR, help="parent of the run directories")
    p.add_argument("--weights-dir", type=Path, default=None, help="where served models live (default: core/weights/ of rlsched.core)")
    p.add_argument("--checkpoint", default=None,
                   help="another .safetensors file of the run chosen on validation (default: model.safetensors)")
    p.set_defaults(func=_promote)


def _promote(args) -> int:
    try:
        dst = promote(args.run, args.name, args.runs_dir, args.weights_dir, checkpoint=args.checkpoint)
    except RunError as exc:
        raise SystemExit(f"rlsched models promote: {exc}") from None
    print(f"promoted run {args.run!r}: {dst} (+ {dst.with_suffix('.json').name})")
    return 0


def _load_module(algo: str):
    name = ALGORITHMS[algo]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            raise SystemExit(f"rlsched: algorithm {algo!r} is not available ({name} is not built)") from None
        raise


def read_config(path: str | Path) -> dict:
    """A YAML or JSON mapping of option names (``lr`` or ``--lr``, ``-`` or ``_``) to values."""
    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"rlsched: config file not found: {path}")
    text = path.read_text()
    if path.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SystemExit(f"rlsched: config {path} must be a mapping of option names to values")
    return {str(k).lstrip("-").replace("-", "_"): v for k, v in data.items()}


def build_algo_parser(command: str, algo: str, module) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"rlsched {command} {algo}")
    parser.add_argument("--config", type=Path, default=None, help="YAML/JSON file of option defaults")
    module.add_arguments(parser)
    return parser


def run(command: str, algo: str, argv: list[str]) -> int:
    """Parse ``argv`` with the algorithm's own parser (config file first) and run it.
    ``rlsched eval protocol`` runs the evaluation protocol (:mod:`rlsched.sim.evaluate`;
    numpy only, no torch)."""
    if command == "eval" and algo == "protocol":
        from rlsched.sim.evaluate import cli

        return cli(argv)
    module = _load_module(algo)
    parser = build_algo_parser(command, algo, module)
    pre, _ = parser.parse_known_args(argv)
    if pre.config is not None:
        config = read_config(pre.config)
        known = {a.dest for a in parser._actions}
        unknown = sorted(set(config) - known)
        if unknown:
            parser.error(f"config {pre.config}: unknown option(s) {', '.join(unknown)}")
        parser.set_defaults(**config)
    args = parser.parse_args(argv)
    args.command = command
    args.algo = algo
    fn = module.train if command == "train" else module.evaluate
    try:
        return int(fn(args) or 0)
    except (RunError, EngineUnavailable) as exc:
        raise SystemExit(f"rlsched {command} {algo}: {exc}") from None


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - convenience
    parser = argparse.ArgumentParser(prog="rlsched")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return args.func(args)
