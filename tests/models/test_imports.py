"""Imports inside rlsched.models: no cycle, algorithms import only the shared base.

Every import statement counts, including the ones inside functions (an import done
lazily still ties the modules together)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rlsched.models
from rlsched.models.cli import ALGORITHMS

MODELS = Path(rlsched.models.__file__).resolve().parent
#: the shared base every algorithm may import
BASE = {"base", "rollout", "runs", "scheduling", "ppo", "export"}
ALGOS = {name.rsplit(".", 1)[1] for name in ALGORITHMS.values()}


def models_imports(path: Path) -> set[str]:
    """The modules of rlsched.models that the file at ``path`` imports."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level >= 1:  # from .x import y / from . import x
                out |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif node.module == "rlsched.models":
                out |= {a.name for a in node.names}
            elif node.module and node.module.startswith("rlsched.models."):
                out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[2] for a in node.names if a.name.startswith("rlsched.models.")}
    return out


def import_graph() -> dict[str, set[str]]:
    return {p.stem: models_imports(p) - {p.stem} for p in MODELS.glob("*.py") if p.stem != "__init__"}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_the_import_reader_sees_lazy_relative_and_absolute_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("from .base import x\nfrom . import runs\nimport rlsched.models.das\n"
                 "def f():\n    from rlsched.models.a2c import y\n    from rlsched.models import dqn\n")
    assert models_imports(f) == {"base", "runs", "das", "a2c", "dqn"}


def test_no_import_cycle_inside_models():
    graph = import_graph()
    assert ALGOS <= set(graph)
    assert find_cycle(graph) is None, f"import cycle in rlsched.models: {' -> '.join(find_cycle(graph))}"


def test_every_module_is_an_algorithm_the_base_or_the_cli():
    assert set(import_graph()) == ALGOS | BASE | {"cli"}


@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_an_algorithm_imports_only_the_base(algo):
    imported = models_imports(MODELS / f"{algo}.py")
    assert imported <= BASE, f"{algo} imports {sorted(imported - BASE)} (an algorithm imports only the base)"


@pytest.mark.parametrize("module", sorted(BASE))
def test_the_base_imports_no_algorithm_and_not_the_cli(module):
    assert not models_imports(MODELS / f"{module}.py") & (ALGOS | {"cli"})
