"""Module docstrings say what, why and which paper in a few lines; figures of results and
their history live in docs/ (docs/design-notes.md, docs/results/)."""

import ast
import re

from .test_no_history_in_code import ROOT, issue_mentions, shipped_files

#: the packages whose modules this holds (the dev tooling is not shipped in the wheel)
PACKAGES = ("core", "sim", "extender", "operator", "models", "rlsched")
MAX_LINES = 12

#: a result figure: a signed percentage (``+2.2%``, ``−1.4 %``), a percentage followed by
#: an interval (``31.4% [28.7, 33.6]``) or a bracketed interval of percentages
FIGURE = re.compile(r"(?<![\w.])[+\-−]\d+(?:\.\d+)?\s?%"
                    r"|\d\s?%\s*\["
                    r"|\[\s*[+\-−]?\d+(?:\.\d+)?%?\s*,\s*[+\-−]?\d+(?:\.\d+)?%\s*\]")


def figures(text: str) -> list[str]:
    return [m.group(0) for m in FIGURE.finditer(text)]


def module_docstrings():
    for path in shipped_files(PACKAGES):
        rel = path.relative_to(ROOT).as_posix()
        yield rel, ast.get_docstring(ast.parse(path.read_text(), filename=rel))


def test_every_module_has_a_short_docstring_without_figures():
    problems = []
    for rel, doc in module_docstrings():
        if not doc:
            problems.append(f"{rel}: no module docstring")
            continue
        n = len(doc.splitlines())
        if n > MAX_LINES:
            problems.append(f"{rel}: {n} lines (at most {MAX_LINES}; move the rest to docs/)")
        if found := figures(doc) + issue_mentions(doc):
            problems.append(f"{rel}: figures or history {found} (they belong in docs/results/)")
    assert problems == [], "module docstrings:\n" + "\n".join(problems)


def test_the_walk_sees_every_package():
    seen = {rel.split("/")[0] for rel, _ in module_docstrings()}
    assert seen == set(PACKAGES)
    assert any(rel == "rlsched/trainer/__init__.py" for rel, _ in module_docstrings())


def test_the_figure_pattern_finds_what_it_should():
    assert figures("+2.2% [+1.9, +2.8] and −1.4 % then 31.4% [28.7, 33.6]") == ["+2.2%", "−1.4 %", "4% ["]
    assert figures("an interval [−4.7%, −1.3%]") == ["[−4.7%, −1.3%]"]
    assert figures("a 95% interval, 50 %, values in [0, 1], a 5-10% range, x-3%") == []
