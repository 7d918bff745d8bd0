"""Import direction of ../shared/DESIGN.md, checked on the source (every import
statement, including ones inside functions).

extender, operator, sim -> core; models -> core, sim; nothing imports extender or
operator; core imports no Kubernetes, web, operator framework or torch.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FORBIDDEN = {
    "core": {"kubernetes", "kubernetes_asyncio", "aiohttp", "kopf", "torch",
             "rlsched.sim", "rlsched.extender", "rlsched.operator", "rlsched.models"},
    "sim": {"torch", "kubernetes", "kubernetes_asyncio", "aiohttp", "kopf",
            "rlsched.extender", "rlsched.operator", "rlsched.models"},
    "models": {"rlsched.extender", "rlsched.operator", "kubernetes", "kubernetes_asyncio", "kopf"},
    "extender": {"rlsched.operator", "rlsched.models", "torch", "kopf"},
    "operator": {"rlsched.extender", "rlsched.models", "torch"},
}


def _imports(path: Path, package: str, root: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the subpackage
                parts = ["rlsched", package] + list(path.relative_to(root / package).parent.parts)
                base = parts[: len(parts) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield node.lineno, mod


def _violations(folder: str, root: Path = ROOT):
    bad = []
    for path in sorted((root / folder).rglob("*.py")):
        for lineno, mod in _imports(path, folder, root):
            for f in FORBIDDEN[folder]:
                if mod == f or mod.startswith(f + "."):
                    bad.append(f"{path.relative_to(root)}:{lineno} imports {mod}")
    return bad


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_import_direction(folder):
    assert _violations(folder) == []


def test_checker_catches_a_violation(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "bad.py").write_text("def f():\n    import torch\n    from ..extender import app\n")
    assert _violations("core", tmp_path) == [
        "core/bad.py:2 imports torch",
        "core/bad.py:3 imports rlsched.extender",
    ]
