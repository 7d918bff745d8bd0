"""Fixtures of the benchmark scripts' tests: ``bench_module(name)`` imports
``bench/<name>.py`` (the scripts are not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="session")
def bench_module():
    def load(name: str):
        key = f"rlsched_bench_{name}"
        if key not in sys.modules:
            spec = importlib.util.spec_from_file_location(key, BENCH / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[key] = module
            spec.loader.exec_module(module)
        return sys.modules[key]

    return load
