"""The speed figures issue 15 asks for, gathered from the benchmarks' own JSON.

Each benchmark measures its baseline in the same run and writes its ratios; this reads
them back and writes one small JSON (and a table on stdout) with each figure, its target
and whether it was met. A benchmark that did not run is listed as missing, not guessed.

    python bench/summary.py --results bench/results --out bench/results/summary.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

__all__ = ["FIGURES", "summarise"]


def _at(doc: dict, *path: str) -> Any:
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


#: (name, file, how to read it from that file's JSON, target, test)
FIGURES: list[tuple[str, str, Callable[[dict], Any], str, Callable[[Any], bool]]] = [
    ("end-to-end pods/s ratio, rlsched/stock, raised client limit (500/1000)", "scheduling.json",
     lambda d: d.get("ratio_raised_limit"), ">= 0.9", lambda v: v >= 0.9),
    ("end-to-end pods/s ratio, rlsched/stock, default client limit (50/100)", "scheduling.json",
     lambda d: d.get("ratio_default_limit"), "~ 1.0 (>= 0.95)", lambda v: v >= 0.95),
    ("end-to-end pods/s ratio, rlsched/stock, the chart's recommended setting", "scheduling.json",
     lambda d: d.get("ratio_recommended"), ">= 0.9", lambda v: v >= 0.9),
    ("1,000 kwok nodes Ready after creation, s", "scheduling.json",
     lambda d: _at(d, "nodes_ready", "ready_after_creation_s"), "< 30", lambda v: v < 30),
    ("/prioritize req/s vs aiohttp+orjson constant server, 1,000 nodes, 1 client", "extender.json",
     lambda d: _at(d, "ratios", "prioritize_1000_ratio_vs_aiohttp"), ">= 0.9", lambda v: v >= 0.9),
    ("/prioritize p99 ms, 1,000 nodes, 1 client", "extender.json",
     lambda d: _at(d, "ratios", "prioritize_1000_p99_ms"), "<= 2", lambda v: v <= 2.0),
    ("/prioritize req/s vs aiohttp+orjson constant server, 5,000 nodes, 1 client", "extender.json",
     lambda d: _at(d, "ratios", "prioritize_5000_ratio_vs_aiohttp"), ">= 0.7", lambda v: v >= 0.7),
    ("/prioritize req/s grows with concurrent clients, 1,000 nodes", "extender.json",
     lambda d: _at(d, "ratios", "prioritize_1000_throughput_grows_with_clients"), "true", lambda v: v is True),
    ("learned DAS ordering+placement sim time / FIFO+FirstFit, worst size", "sim_scaling.json",
     lambda d: d.get("max_ratio"), "<= 4", lambda v: v <= 4.0),
    ("learned DAS ordering+placement sim time, growth exponent (1,000 -> 16,000 jobs)", "sim_scaling.json",
     lambda d: _at(d, "slope", d.get("policy", ""), "fit"), "~ 1 (<= 1.2)", lambda v: v <= 1.2),
    ("served allocator, 3 GPU types, 64 GPUs / 160 jobs: steady decision s", "hetero_decision_time.json",
     lambda d: _hetero(d, 64, "steady_median_s"), "< 0.1", lambda v: v < 0.1),
    ("served allocator, 3 GPU types, 64 GPUs / 160 jobs: fresh decision s", "hetero_decision_time.json",
     lambda d: _hetero(d, 64, "median_s"), "< 0.1", lambda v: v < 0.1),
    ("served allocator, 3 GPU types, 2,048 GPUs / 1,000 jobs: steady decision s", "hetero_decision_time.json",
     lambda d: _hetero(d, 2048, "steady_median_s"), "< 1", lambda v: v < 1.0),
    ("served allocator, 3 GPU types, 2,048 GPUs / 1,000 jobs: fresh decision s", "hetero_decision_time.json",
     lambda d: _hetero(d, 2048, "median_s"), "< 1", lambda v: v < 1.0),
]


def _hetero(doc: dict, gpus: int, key: str) -> Any:
    """``key`` of the served allocator's row at ``gpus`` in hetero_decision_time.json."""
    rows = [r for r in doc.get("rows", []) if r.get("gpus") == gpus and r.get("policy") == doc.get("driver")]
    return rows[0].get(key) if rows else None


def summarise(results: Path) -> list[dict[str, Any]]:
    """One row per figure: its value, target and whether it was met (``None``: the
    benchmark's JSON is missing or lacks the figure)."""
    docs: dict[str, dict | None] = {}
    rows = []
    for name, file, read, target, ok in FIGURES:
        if file not in docs:
            path = results / file
            docs[file] = json.loads(path.read_text()) if path.exists() else None
        doc = docs[file]
        value = read(doc) if doc is not None else None
        rows.append({"figure": name, "file": file, "value": value, "target": target,
                     "met": None if value is None else bool(ok(value))})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="bench/results", help="where the benchmarks wrote their JSON")
    ap.add_argument("--out", default=None, help="write the rows here as JSON")
    args = ap.parse_args(argv)
    rows = summarise(Path(args.results))
    for r in rows:
        verdict = {True: "met", False: "MISSED", None: "missing"}[r["met"]]
        value = r["value"]
        text = "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)
        print(f"{verdict:8} {text:>6}  (target {r['target']})  {r['figure']}")
    if args.out:
        Path(args.out).write_text(json.dumps({"benchmark": "summary", "figures": rows}, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
