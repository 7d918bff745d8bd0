"""The event engine stays small enough to read: ``Simulator`` keeps the clock, the heap,
the state and the job transitions, its parts (``sim/engine_*.py``) the rest."""

import ast

from .test_no_history_in_code import ROOT
from .test_operator_size import long_functions

MAX_SIMULATOR_LINES = 600


def class_lines(source: str, name: str) -> int:
    """Lines of class ``name``'s definition in ``source`` (0 when absent)."""
    return max((node.end_lineno - node.lineno + 1 for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.ClassDef) and node.name == name), default=0)


def test_the_simulator_is_at_most_600_lines():
    n = class_lines((ROOT / "sim/engine.py").read_text(), "Simulator")
    assert 0 < n <= MAX_SIMULATOR_LINES, f"Simulator has {n} lines"


def test_no_engine_function_is_over_80_lines():
    files = sorted((ROOT / "sim").glob("engine*.py"))
    assert len(files) > 1 and any(p.name == "engine.py" for p in files)
    bad = [hit for p in files for hit in long_functions(p.read_text(), p.relative_to(ROOT).as_posix())]
    assert bad == []


def test_the_checker_counts_a_long_class():
    body = "\n".join(f"    x{i} = {i}" for i in range(600))
    assert class_lines(f"import os\n\nclass Simulator:\n{body}\n", "Simulator") == 601
    assert class_lines("class Other:\n    pass\n", "Simulator") == 0
