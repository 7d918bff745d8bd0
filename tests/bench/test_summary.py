"""bench/summary.py reads the benchmarks' figures back and judges them against their targets."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("bench_summary", ROOT / "bench" / "summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_missing_benchmarks_are_missing_not_guessed(tmp_path):
    rows = _module().summarise(tmp_path)
    assert rows and all(r["value"] is None and r["met"] is None for r in rows)


def test_figures_are_judged_against_their_targets(tmp_path):
    (tmp_path / "scheduling.json").write_text(json.dumps({
        "ratio_raised_limit": 0.91, "ratio_default_limit": 0.94, "ratio_recommended": 0.5,
        "nodes_ready": {"ready_after_creation_s": 12.0}}))
    (tmp_path / "sim_scaling.json").write_text(json.dumps({
        "policy": "das/das-agent", "max_ratio": 4.2, "slope": {"das/das-agent": {"fit": 1.05}}}))
    mod = _module()
    met = {r["figure"]: r["met"] for r in mod.summarise(tmp_path)}
    assert met["end-to-end pods/s ratio, rlsched/stock, raised client limit (500/1000)"] is True
    assert met["end-to-end pods/s ratio, rlsched/stock, default client limit (50/100)"] is False
    assert met["end-to-end pods/s ratio, rlsched/stock, the chart's recommended setting"] is False
    assert met["1,000 kwok nodes Ready after creation, s"] is True
    assert met["learned DAS ordering+placement sim time / FIFO+FirstFit, worst size"] is False
    assert met["learned DAS ordering+placement sim time, growth exponent (1,000 -> 16,000 jobs)"] is True
    # the extender's JSON is absent: its figures are missing
    assert all(ok is None for name, ok in met.items() if "/prioritize" in name)


def test_main_writes_json(tmp_path, capsys):
    out = tmp_path / "summary.json"
    assert _module().main(["--results", str(tmp_path), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "summary" and len(doc["figures"]) >= 10
    assert "missing" in capsys.readouterr().out


def test_decision_time_on_three_types_is_read_for_the_served_allocator(tmp_path):
    rows = [{"gpus": 64, "policy": "fifo/bestfit", "median_s": 0.001, "steady_median_s": 0.001},
            {"gpus": 64, "policy": "goodput-rlpto", "median_s": 0.2, "steady_median_s": 0.05},
            {"gpus": 2048, "policy": "goodput-rlpto", "median_s": 1.2, "steady_median_s": 0.6}]
    (tmp_path / "hetero_decision_time.json").write_text(json.dumps({"driver": "goodput-rlpto", "rows": rows}))
    got = {r["figure"]: (r["value"], r["met"]) for r in _module().summarise(tmp_path) if "3 GPU types" in r["figure"]}
    assert got == {
        "served allocator, 3 GPU types, 64 GPUs / 160 jobs: steady decision s": (0.05, True),
        "served allocator, 3 GPU types, 64 GPUs / 160 jobs: fresh decision s": (0.2, False),
        "served allocator, 3 GPU types, 2,048 GPUs / 1,000 jobs: steady decision s": (0.6, True),
        "served allocator, 3 GPU types, 2,048 GPUs / 1,000 jobs: fresh decision s": (1.2, False),
    }
