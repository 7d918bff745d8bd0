"""Commit messages after the rule's base: subject <= 72 characters, a blank line
before the body (tools/check_commits.py)."""

import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_commits", ROOT / "tools" / "check_commits.py")
check_commits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_commits)


def test_every_commit_after_the_rule_has_a_short_subject():
    bad = [(sha[:12], p) for sha, msg in check_commits.commits_to_check(ROOT) for p in check_commits.problems(msg)]
    assert not bad, f"commit messages breaking the rule (subject <= 72, blank line): {bad}"


def test_the_rule_judges_subjects_and_bodies():
    assert check_commits.problems("fix: a short subject\n\nwhy, with figures\n") == []
    assert check_commits.problems("x" * 72) == []
    assert check_commits.problems("x" * 73) == ["subject of 73 characters (at most 72)"]
    assert check_commits.problems("subject\nbody glued on") == ["no blank line between the subject and the body"]


def test_a_long_subject_in_a_new_commit_fails_the_check(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base")
    base = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "y" * 80)
    assert check_commits.main(["--repo", str(tmp_path), "--since", base]) == 1
    assert check_commits.main(["--repo", str(tmp_path), "--since", "HEAD"]) == 0
