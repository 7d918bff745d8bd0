"""The ``rlsched`` command.

Each subsystem owns its subcommands: a module exposing ``register(subparsers)`` which
adds a parser whose ``func`` default takes the parsed namespace and returns an exit
code. Modules are imported lazily so ``rlsched sim`` never pays for torch or kopf.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module with register(subparsers)
_COMMANDS = {
    "sim": "rlsched.sim.cli",
    "extender": "rlsched.extender.cli",
    "operator": "rlsched.operator.cli",
    "why": "rlsched.operator.cli",
    "train": "rlsched.models.cli",
    "eval": "rlsched.models.cli",
    "models": "rlsched.models.cli",
    # the dev tooling: a separate distribution (rlsched-dev); absent when not installed
    "cluster": "rlsched_dev.cluster",
    "demo": "rlsched_dev.demo",
    "fake-trainer": "rlsched_dev.fake_trainer",
    "node-agent": "rlsched_dev.node_agent",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlsched", description=__doc__.splitlines()[0])
    from . import __version__

    parser.add_argument("--version", action="version", version=f"rlsched {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    seen: set[str] = set()
    for name, module in _COMMANDS.items():
        if only is not None and name != only:
            continue
        if module in seen:
            continue
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                continue  # subsystem not built yet
            if not module.startswith("rlsched_dev"):
                # `pip install rlsched` (or `rlsched[trainer]`) carries the trainer only
                raise SystemExit(f"rlsched {name}: the scheduler's dependencies are not installed "
                                 f"({exc.name} is missing); install them with: pip install 'rlsched[scheduler]'") from exc
            raise
        mod.register(sub)
        seen.add(module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first if first in _COMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
