"""What ``import rlsched.trainer`` costs a training script, against ``import json``.

The trainer library is imported by every worker process of every generation (a
rescale restarts them all), so its import must stay light: the standard library only
(``tests/trainer/test_light_install.py`` asserts which modules load; speed is never
asserted by a test). This measures it: ``--runs`` fresh interpreters (default 20)
alternate between ``import rlsched.trainer`` and the baseline ``import json``, each
timing its own import with ``time.perf_counter`` (interpreter start-up excluded, so the
figure is the import alone); the machine may be shared, so both are measured in the
same run, interleaved, and medians are reported. Each child also reports the
modules the import added, so a heavy dependency that creeps in shows by name.

    python bench/trainer_import.py --out bench/results/trainer_import.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import sys, time
before = set(sys.modules)
t0 = time.perf_counter()
import {module}
dt = time.perf_counter() - t0
added = sorted(set(sys.modules) - before)
import json
print(json.dumps({{"seconds": dt, "modules": added}}))
"""
HEAVY = ("numpy", "scipy", "kopf", "aiohttp", "torch", "kubernetes", "pandas")


def _once(module: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(module=module)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout)


def measure(runs: int) -> dict:
    samples: dict[str, list[float]] = {"rlsched.trainer": [], "json": []}
    added: dict[str, list[str]] = {}
    for _ in range(runs):
        for module in samples:  # interleaved: a load spike hits both alike
            r = _once(module)
            samples[module].append(r["seconds"])
            added[module] = r["modules"]
    med = {m: statistics.median(v) for m, v in samples.items()}
    trainer_mods = added["rlsched.trainer"]
    return {
        "benchmark": "trainer_import",
        "runs": runs,
        "median_seconds": med,
        "min_seconds": {m: min(v) for m, v in samples.items()},
        "ratio_trainer_to_json": med["rlsched.trainer"] / med["json"] if med["json"] > 0 else None,
        "trainer_extra_seconds": med["rlsched.trainer"] - med["json"],
        "modules_added": {m: len(v) for m, v in added.items()},
        "heavy_modules_loaded": [m for m in HEAVY if m in trainer_mods],
        "rlsched_modules_loaded": [m for m in trainer_mods if m.startswith("rlsched")],
        "host": {"python": sys.version.split()[0], "machine": platform.machine()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="fresh interpreters per module (default 20)")
    p.add_argument("--out", type=Path, default=Path("bench/results/trainer_import.json"))
    args = p.parse_args(argv)
    result = measure(args.runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_seconds", "ratio_trainer_to_json", "heavy_modules_loaded")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
