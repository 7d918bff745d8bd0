"""Check commit messages: a subject of at most 72 characters, then (when there is more)
a blank line before the body — git's own convention (git-commit(1), "DISCUSSION").

Only commits that are not ancestors of ``--since`` (the last commit before the rule)
are checked, so history written before it is left alone. In a shallow clone that lacks
``--since``, every commit present is checked (the clone's boundary lies after it).

    python tools/check_commits.py [--since REV] [--repo DIR]   # exit 1 on a violation
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

#: the last commit on main before the rule; everything after it is checked
RULE_BASE = "0c6126b5d8a788d05145d004ef5fc187efa598b9"
MAX_SUBJECT = 72


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def commits_to_check(repo: Path, since: str = RULE_BASE) -> list[tuple[str, str]]:
    """``(sha, message)`` of every commit of HEAD after ``since``."""
    have_base = _git(repo, "cat-file", "-e", f"{since}^{{commit}}").returncode == 0
    spec = [f"{since}..HEAD"] if have_base else ["HEAD"]
    out = _git(repo, "log", "--format=%H%x1f%B%x1e", *spec)
    if out.returncode != 0:
        raise RuntimeError(f"git log failed in {repo}: {out.stderr.strip()}")
    rows = []
    for record in out.stdout.split("\x1e"):
        if record.strip():
            sha, _, message = record.strip("\n").partition("\x1f")
            rows.append((sha, message))
    return rows


def problems(message: str) -> list[str]:
    """What is wrong with one commit message (empty: nothing)."""
    lines = message.rstrip("\n").split("\n")
    subject = lines[0]
    out = []
    if not subject.strip():
        out.append("empty subject")
    if len(subject) > MAX_SUBJECT:
        out.append(f"subject of {len(subject)} characters (at most {MAX_SUBJECT})")
    if len(lines) > 1 and lines[1].strip():
        out.append("no blank line between the subject and the body")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--since", default=RULE_BASE)
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args(argv)
    bad = [(sha, p) for sha, msg in commits_to_check(args.repo, args.since) for p in problems(msg)]
    for sha, p in bad:
        print(f"{sha[:12]}: {p}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
