"""Text that ages lives in docs/, not in shipped code: no issue numbers in the Python
files of the packages (``rlsched`` and its subpackages, the dev tooling)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("core", "sim", "extender", "operator", "models", "rlsched", "dev")
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def issue_mentions(text: str) -> list[str]:
    return [m.group(0) for m in ISSUE.finditer(text)]


def shipped_files(folders=SHIPPED):
    """The Python files of the shipped packages under ``folders``, in path order."""
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" not in path.parts and not path.is_symlink():
                yield path


def test_shipped_code_names_no_issue_numbers():
    found = []
    for path in shipped_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if issue_mentions(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert found == [], "issue numbers in shipped code (history belongs in docs/):\n" + "\n".join(found)


def test_the_pattern_finds_what_it_should():
    assert issue_mentions("as before issue 15 made them linear; Issue #7") == ["issue 15", "Issue #7"]
    assert issue_mentions("the issue with 3 workers; tissue 4") == []
