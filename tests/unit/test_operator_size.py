"""The operator's control loop stays small enough to read: the controller keeps the
cycle (list, observe, decide, act) and its collaborators the rest."""

import ast

from .test_no_history_in_code import ROOT

MAX_CONTROLLER_LINES = 700
MAX_FUNCTION_LINES = 80


def long_functions(source: str, filename: str = "<src>") -> list[str]:
    """``file:line name (n lines)`` of every function or method over the bound."""
    out = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out.append(f"{filename}:{node.lineno} {node.name} ({n} lines)")
    return out


def test_the_controller_is_at_most_700_lines():
    n = len((ROOT / "operator/controller.py").read_text().splitlines())
    assert n <= MAX_CONTROLLER_LINES, f"operator/controller.py has {n} lines"


def test_no_operator_function_is_over_80_lines():
    files = sorted((ROOT / "operator").glob("*.py"))
    assert any(p.name == "controller.py" for p in files)
    bad = [hit for p in files for hit in long_functions(p.read_text(), p.relative_to(ROOT).as_posix())]
    assert bad == []


def test_the_checker_counts_a_long_method():
    body = "\n".join(f"        x = {i}" for i in range(80))
    src = f"class C:\n    def short(self):\n        pass\n\n    async def long(self):\n{body}\n"
    assert long_functions(src) == ["<src>:5 long (81 lines)"]
