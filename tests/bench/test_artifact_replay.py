"""bench/artifact_replay.py, the side-by-side check of our interval engine against the
Pollux OSDI'21 artifact's simulator: its comparison by hand, and a log in the
artifact's format replayed in our engine (the artifact itself is not needed here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("RLSCHED_DATA_DIR") or REPO.parent / "shared" / "data")
needs_data = pytest.mark.skipif(not (DATA / "pollux-osdi21").is_dir(), reason=f"no Pollux data under {DATA}")


@pytest.fixture(scope="module")
def ar(bench_module):
    return bench_module("artifact_replay")


def test_compare_by_hand(ar):
    jobs = {
        "a-0": {"application": "a", "submit": 0.0, "ours": 100.0, "theirs": 200.0},
        "a-1": {"application": "a", "submit": 50.0, "ours": 350.0, "theirs": 150.0},
        "b-2": {"application": "b", "submit": 0.0, "ours": 90.0, "theirs": None},
        "b-3": {"application": "b", "submit": 10.0, "ours": None, "theirs": 20.0},
    }
    c = ar.compare(jobs)
    assert (c["jobs"], c["both_finished"]) == (4, 2)
    assert c["unfinished_ours"] == ["b-3"] and c["unfinished_theirs"] == ["b-2"]
    assert c["jct_mean_ours"] == pytest.approx(200.0) and c["jct_mean_theirs"] == pytest.approx(150.0)
    assert c["ratio_ours_over_theirs"] == pytest.approx(200.0 / 150.0)
    assert c["per_application"] == {"a": {"n": 2, "median": pytest.approx(1.75), "mean": pytest.approx(1.75)}}


@needs_data
def test_an_artifact_log_is_replayed_as_it_decided(ar, tmp_path):
    """Two decisions in the artifact's log format give ncf-6 (submitted at 1,585 s) one
    GPU on node 3 from 1,620 s: our engine restarts it once (30 s) and trains it at its
    fixed batch of 32,768 (46 s: the ncf test of tests/sim/test_measured.py), so it ends at
    1,695.9 s; no other job of workload 6 gets GPUs, so none finishes."""
    rec = {"name": "ncf-6", "submission_time": 1585, "allocation": [3], "batch_size": 32768, "accum_steps": 1,
           "completion_time": 1696}
    log = tmp_path / "artifact.log"
    log.write_text("".join(json.dumps({"timestamp": t, "submitted_jobs": [rec]}) + "\n" for t in (1620, 1680)))
    out = ar.replay_theirs_in_ours(str(log), 6, str(DATA))
    j = out["jobs"]["ncf-6"]
    assert j["ours"] == pytest.approx(1620 + 75.935, abs=1e-3) and j["theirs"] == 1696
    assert len(out["unfinished_in_ours"]) == 159 and "ncf-6" not in out["unfinished_in_ours"]
