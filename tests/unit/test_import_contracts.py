"""Import direction of ../shared/DESIGN.md, checked on the source (every import
statement, including ones inside functions), for every package of the repository.

    extender, operator, sim -> core;  models -> core, sim;  the top-level rlsched
    package (CLI, trainer helper) -> core;  the dev package rlsched_dev (local control
    plane, demo, fake trainer; dev/) may import anything and nothing imports it;
    nothing else imports extender or operator; core imports no Kubernetes client, web,
    operator framework or torch.

And no import cycle among the repository's modules (function-level imports count).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: source folder -> import name of the package it installs as
PACKAGES = {
    "core": "rlsched.core",
    "sim": "rlsched.sim",
    "extender": "rlsched.extender",
    "operator": "rlsched.operator",
    "models": "rlsched.models",
    "dev": "rlsched_dev",
    "rlsched": "rlsched",
}
K8S = {"kubernetes", "kubernetes_asyncio", "kopf"}
OURS = {"rlsched.core", "rlsched.sim", "rlsched.extender", "rlsched.operator", "rlsched.models", "rlsched_dev"}

#: what each package may import of ours (besides itself); every other package of ours is forbidden
ALLOWED_OURS = {
    "core": set(),
    "sim": {"rlsched.core"},
    "extender": {"rlsched.core"},
    "operator": {"rlsched.core"},
    "models": {"rlsched.core", "rlsched.sim"},
    "rlsched": {"rlsched.core"},
    "dev": OURS,
}
#: third-party packages each one must not import
FORBIDDEN_THIRD_PARTY = {
    "core": K8S | {"aiohttp", "torch"},
    "sim": K8S | {"aiohttp", "torch"},
    "extender": {"kopf", "torch"},
    "operator": {"torch"},
    "models": K8S,
    "rlsched": {"torch", "kopf", "aiohttp"},
    "dev": set(),
}
#: files a forbidden third-party import is allowed in, by path prefix: the trainer library
#: imports torch inside the functions that need it (tests/trainer/test_light_install.py
#: holds `import rlsched.trainer` free of torch)
ALLOWED_THIRD_PARTY = {"rlsched/trainer/": {"torch"}}
FORBIDDEN = {
    folder: {p for p in OURS if p != PACKAGES[folder] and p not in ALLOWED_OURS[folder]} | FORBIDDEN_THIRD_PARTY[folder]
    for folder in PACKAGES
}


def _files(folder: str, root: Path):
    base = root / folder
    for path in sorted(base.rglob("*.py")):
        if folder == "rlsched" or "__pycache__" not in path.parts:
            yield path


def _module_name(path: Path, folder: str, root: Path) -> str:
    parts = list(path.relative_to(root / folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PACKAGES[folder]] + parts)


def _imports(path: Path, package: str, root: Path):
    """``(line, module, names)`` for every import statement in ``path``: ``names`` are
    the module itself and, for ``from M import n``, each ``M.n`` (it may be a submodule)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    name = _module_name(path, package, root)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, [alias.name]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                base = here[: len(here) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield node.lineno, mod, [mod] + [f"{mod}.{alias.name}" for alias in node.names]


def _violations(folder: str, root: Path = ROOT):
    bad = []
    for path in _files(folder, root):
        rel = path.relative_to(root).as_posix()
        allowed = set().union(*(m for prefix, m in ALLOWED_THIRD_PARTY.items() if rel.startswith(prefix)))
        forbidden = FORBIDDEN[folder] - allowed
        for lineno, mod, names in _imports(path, folder, root):
            hit = next((n for n in names for f in forbidden if n == f or n.startswith(f + ".")), None)
            if hit is not None:
                bad.append(f"{path.relative_to(root)}:{lineno} imports {hit}")
    return bad


def _cycles(root: Path = ROOT) -> list[list[str]]:
    """Strongly connected components (size > 1) of the module import graph."""
    mods = {}
    for folder in PACKAGES:
        if (root / folder).is_dir():
            for path in _files(folder, root):
                mods[_module_name(path, folder, root)] = (path, folder)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, (path, folder) in mods.items():
        for _, _, names in _imports(path, folder, root):
            for target in names:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != m and not m.startswith(target + "."):
                    graph[m].add(target)  # a module importing its own package's __init__ is not a cycle
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_code_folder_is_checked():
    mapped = {"rlsched", "core", "sim", "extender", "operator", "models", "dev"}
    # tools/: build scripts and the released Pollux's bridge, run by its own environment
    # (tests/sim/test_pollux_peer.py). examples/: users' training scripts (torch and
    # rlsched.trainer), outside the package. out/: run outputs (git-ignored), never code
    folders = {p.parent.name for p in ROOT.glob("*/*.py")} - {"tests", "bench", "tools", "docs", "deploy", "helm",
                                                              "examples", "out"}
    assert folders <= mapped | {"files"}, f"unchecked code folders: {sorted(folders - mapped)}"
    for folder in PACKAGES:
        assert (ROOT / folder).is_dir(), f"{folder}/ is missing"


@pytest.mark.parametrize("folder", sorted(PACKAGES))
def test_import_direction(folder):
    assert _violations(folder) == []


def test_no_import_cycles():
    assert _cycles() == []


def test_checker_catches_a_violation(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "bad.py").write_text("def f():\n    import torch\n    from ..extender import app\n")
    assert _violations("core", tmp_path) == [
        "core/bad.py:2 imports torch",
        "core/bad.py:3 imports rlsched.extender",
    ]


def test_operator_may_not_import_the_simulator(tmp_path):
    (tmp_path / "operator").mkdir()
    (tmp_path / "operator" / "bad.py").write_text("from rlsched.sim.convergence import ConvergenceModel\n")
    assert _violations("operator", tmp_path) == ["operator/bad.py:1 imports rlsched.sim.convergence"]


def test_checker_catches_a_cycle(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "a.py").write_text("def f():\n    from .b import g\n")
    (tmp_path / "models" / "b.py").write_text("from rlsched.models.a import f\n")
    (tmp_path / "models" / "c.py").write_text("from . import a\n")
    assert _cycles(tmp_path) == [["rlsched.models.a", "rlsched.models.b"]]


def test_only_the_trainer_may_import_torch(tmp_path):
    (tmp_path / "rlsched" / "trainer").mkdir(parents=True)
    (tmp_path / "rlsched" / "trainer" / "ok.py").write_text("def f():\n    import torch\n")
    (tmp_path / "rlsched" / "cli.py").write_text("def f():\n    import torch.nn\n")
    assert _violations("rlsched", tmp_path) == ["rlsched/cli.py:2 imports torch.nn"]


def test_nothing_in_the_product_imports_the_dev_package(tmp_path):
    (tmp_path / "rlsched").mkdir()
    (tmp_path / "rlsched" / "cli.py").write_text("def f():\n    from rlsched_dev.demo import register\n")
    assert _violations("rlsched", tmp_path) == ["rlsched/cli.py:2 imports rlsched_dev.demo"]
