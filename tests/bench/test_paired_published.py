"""bench/paired_published.py and bench/jct_vs_load.py on small made-up outputs: the
pairing is per workload, the bootstrap is the protocol's, the plot's means are over
the same 8 workloads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _protocol(path: Path, load: float, rows: dict[str, list[float]]) -> Path:
    cells = [{"cell": "published", "load": load, "rows": [
        {"policy": pol, "per_unit": {f"workload-{i + 1}": v for i, v in enumerate(vals)}} for pol, vals in rows.items()]},
        {"cell": "generated", "load": load, "rows": [{"policy": "goodput", "per_unit": {"seed-20000": 1.0}}]}]
    path.write_text(json.dumps({"cells": cells}))
    return path


def _peers(path: Path, load: float, pol: str, vals: list[float], workloads=None) -> Path:
    ws = workloads or range(1, len(vals) + 1)
    path.write_text(json.dumps({"runs": [{"policy": pol, "load": load, "workload": w, "jct_mean": v, "generated": False}
                                         for w, v in zip(ws, vals)]}))
    return path


def _run(script: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(REPO / "bench" / script), *args], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_pairs_per_workload_with_the_protocols_bootstrap(tmp_path):
    from rlsched.sim.protocol import paired_bootstrap

    cand = [100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0]
    tires = [150.0, 260.0, 330.0, 390.0, 580.0, 690.0, 720.0, 900.0]
    peer = [120.0, 210.0, 350.0, 420.0]  # workloads 1-4 only, measured in another order below
    proto = _protocol(tmp_path / "p.json", 1.0, {"goodput": cand, "tiresias-2q": tires})
    peers = _peers(tmp_path / "q.json", 1.0, "pollux-paper", peer[::-1], workloads=[4, 3, 2, 1])
    _run("paired_published.py", "--protocol", str(proto), "--peers", str(peers), "--candidate", "goodput",
         "--out", str(tmp_path / "out.json"))
    pairs = {p["peer"]: p for p in json.loads((tmp_path / "out.json").read_text())["pairs"]}
    assert set(pairs) == {"tiresias-2q", "pollux-paper"}
    pp = pairs["pollux-paper"]
    assert pp["units"] == ["workload-1", "workload-2", "workload-3", "workload-4"] and pp["n"] == 4
    assert pp["peer_jct"] == peer and pp["candidate_jct"] == cand[:4]
    want = paired_bootstrap(cand[:4], peer)
    assert pp["diff"] == pytest.approx(want.diff) and pp["diff_lo"] == pytest.approx(want.diff_lo)
    assert pp["at_or_below_on_every_unit"] is True
    assert pairs["tiresias-2q"]["at_or_below_on_every_unit"] is False  # 400 > 390 on workload 4


def test_the_plot_averages_over_the_eight_workloads_only(tmp_path):
    proto = _protocol(tmp_path / "p.json", 1.0, {"goodput": [float(i) for i in range(1, 9)],
                                                  "tiresias-2q": [10.0] * 8})
    partial = _peers(tmp_path / "q.json", 1.0, "pollux", [5.0, 6.0, 7.0], workloads=[1, 3, 6])
    out = tmp_path / "plot.png"
    _run("jct_vs_load.py", "--protocol", str(proto), "--peers", str(partial), "--out", str(out))
    assert out.stat().st_size > 1000
    means = json.loads(out.with_suffix(".json").read_text())["mean_jct"]
    assert means["goodput"] == {"1.0": 4.5} and means["tiresias-2q"] == {"1.0": 10.0}
    assert "pollux" not in means  # 3 of 8 workloads: no point
    assert means["pollux (published)"]["1.0"] == 2751.0


def test_two_protocol_runs_pair_on_their_seeds_with_a_rename(tmp_path):
    """An earlier run's candidate, read under another name, pairs seed by seed with
    today's on a suite of one cell per load (seed=N units, ordered by number)."""
    from rlsched.sim.protocol import paired_bootstrap

    def proto(path: Path, per: dict[str, float], drf: float) -> Path:
        path.write_text(json.dumps({"cells": [{"cell": "", "load": 2.0, "rows": [
            {"policy": "rlsched", "per_unit": per}, {"policy": "drf", "per_unit": dict.fromkeys(per, drf)}]}]}))
        return path

    new = {"seed=20010": 90.0, "seed=20002": 110.0, "seed=20001": 100.0}
    old = {"seed=20001": 95.0, "seed=20002": 120.0, "seed=20010": 80.0, "seed=20011": 1.0}
    # the baseline's rows differ between the files: only the renamed rows of b are read
    a, b = proto(tmp_path / "a.json", new, 100.0), proto(tmp_path / "b.json", old, 999.0)
    _run("paired_published.py", "--cell", "", "--candidate", "rlsched", "--protocol", str(a),
         "--protocol", f"{b}@rlsched=goodput", "--out", str(tmp_path / "out.json"))
    pairs = {p["peer"]: p for p in json.loads((tmp_path / "out.json").read_text())["pairs"]}
    assert set(pairs) == {"goodput", "drf"} and pairs["drf"]["peer_jct"] == [100.0] * 3
    pair = pairs["goodput"]
    assert pair["peer"] == "goodput" and pair["units"] == ["seed=20001", "seed=20002", "seed=20010"]
    assert pair["candidate_jct"] == [100.0, 110.0, 90.0] and pair["peer_jct"] == [95.0, 120.0, 80.0]
    assert pair["diff"] == pytest.approx(paired_bootstrap([100.0, 110.0, 90.0], [95.0, 120.0, 80.0]).diff)
    assert pair["at_or_below_on_every_unit"] is False
    # the published cells are the default: this output has none
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "paired_published.py"), "--candidate", "rlsched",
                          "--protocol", str(a), "--out", str(tmp_path / "x.json")], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert bad.returncode != 0 and "no cell 'published'" in bad.stderr


def test_a_unit_two_outputs_disagree_on_is_an_error_naming_both(tmp_path):
    """Two peer outputs with another figure for the same workload (a rerun beside a stale
    record): refused, never the last one read silently; the same figure twice is fine."""
    proto = _protocol(tmp_path / "p.json", 0.5, {"goodput": [100.0] * 8})
    new = _peers(tmp_path / "new.json", 0.5, "pollux-paper", [120.0] * 8)
    same = _peers(tmp_path / "same.json", 0.5, "pollux-paper", [120.0 + 4e-6] * 8)  # a file that rounds
    old = _peers(tmp_path / "old.json", 0.5, "pollux-paper", [120.0] * 7 + [130.0])
    _run("paired_published.py", "--protocol", str(proto), "--peers", str(new), "--peers", str(same),
         "--candidate", "goodput", "--out", str(tmp_path / "ok.json"))
    bad = subprocess.run([sys.executable, str(REPO / "bench" / "paired_published.py"), "--protocol", str(proto),
                          "--peers", str(new), "--peers", str(old), "--candidate", "goodput",
                          "--out", str(tmp_path / "x.json")], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bad.returncode != 0 and "workload-8" in bad.stderr and "new.json" in bad.stderr and "old.json" in bad.stderr
    assert not (tmp_path / "x.json").exists()
