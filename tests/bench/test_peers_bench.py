"""bench/peers.py, the fidelity table: its JSON, its plot and the comparison rules."""

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("RLSCHED_DATA_DIR") or REPO.parent / "shared" / "data")


def _peers():
    spec = importlib.util.spec_from_file_location("rlsched_bench_peers", REPO / "bench" / "peers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


peers = _peers()


def test_the_published_mean_is_compared_only_over_all_eight_workloads():
    runs = [{"policy": "tiresias-2q", "load": 1.0, "workload": w, "jct_mean": 4000.0 + w, "clairvoyant": False,
             "wall_s": 0.1} for w in range(1, 9)]
    full = peers.summarise(runs)[0]
    assert full["ratio"] == pytest.approx(4004.5 / 4038.0) and full["within_tolerance"] is True
    part = peers.summarise(runs[5:6])[0]
    assert part["ratio"] is None and part["workload6"]["ratio"] == pytest.approx(4006.0 / 3470.0)


@pytest.mark.skipif(not (DATA / "pollux-osdi21").is_dir(), reason=f"no Pollux data under {DATA}")
def test_bench_writes_the_table_and_the_plot(tmp_path):
    out = tmp_path / "peers.json"
    assert peers.main(["--policies", "tiresias-2q", "--loads", "1.0", "--workloads", "6", "--generated", "7",
                       "--procs", "1", "--data-dir", str(DATA), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (row,) = report["summary"]
    assert abs(row["workload6"]["ratio"] - 1) <= 0.15
    assert report["held_out"][0]["seeds"] == [7]
    assert out.with_suffix(".png").stat().st_size > 0


def test_merge_makes_one_report_of_runs_measured_apart_and_refuses_a_run_twice(tmp_path, capsys):
    def out(name, workloads, machine):
        runs = [{"policy": "tiresias-2q", "load": 1.0, "workload": w, "jct_mean": 4000.0 + w, "clairvoyant": False,
                 "wall_s": 1.0, "generated": False} for w in workloads]
        (tmp_path / name).write_text(json.dumps({"runs": runs, "procs": 1, "wall_s": 2.0, "machine": machine}))
        return str(tmp_path / name)

    a, b = out("a.json", range(1, 6), {"cpus": 2}), out("b.json", range(6, 9), {"cpus": 16})
    merged = tmp_path / "m.json"
    assert peers.main(["--merge", f"{a},{b}", "--out", str(merged)]) == 0
    rep = json.loads(merged.read_text())
    (row,) = rep["summary"]
    assert row["workloads"] == list(range(1, 9)) and row["ratio"] == pytest.approx(4004.5 / 4038.0)
    assert [m["machine"]["cpus"] for m in rep["merged_from"]] == [2, 16] and merged.with_suffix(".png").is_file()
    assert peers.main(["--merge", f"{a},{a}", "--out", str(tmp_path / "x.json")]) == 2
    assert "more than one" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
