"""rlsched[trainer] is light: what pip would install for it, and what importing it loads."""

import json
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("numpy", "scipy", "kopf", "aiohttp", "torch", "kubernetes", "pandas")


def _fresh(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_import_loads_no_heavy_module():
    got = _fresh(f"""
        import sys
        import rlsched.trainer
        print(",".join(m for m in {HEAVY!r} if m in sys.modules))
    """)
    assert got == "\n"


def test_every_name_but_torchs_functions_loads_no_heavy_module():
    """All public names resolve (each submodule imports) without numpy, torch or the
    Kubernetes client; the contract module is the only part of rlsched.core loaded."""
    got = _fresh(f"""
        import sys
        from rlsched.trainer import *
        import rlsched.trainer as t
        assert all(getattr(t, n) is not None for n in t.__all__)
        print(",".join(m for m in {HEAVY!r} if m in sys.modules))
        print(",".join(sorted(m for m in sys.modules if m.startswith("rlsched.core"))))
    """)
    heavy, core = got.splitlines()
    assert heavy == "" and core == "rlsched.core,rlsched.core.contract"


def test_base_and_trainer_requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == []
    # the Kubernetes client only, below 36 (from 36 on it requires aiohttp and pydantic)
    assert project["optional-dependencies"]["trainer"] == ["kubernetes>=29,<36"]
    assert "torch" not in str(project["optional-dependencies"]["scheduler"])


@pytest.mark.slow
def test_pip_would_install_nothing_heavy_for_the_trainer_extra(tmp_path):
    """Resolve ``pip install 'rlsched[trainer]'`` from scratch (--ignore-installed) with
    the venv's pip against the package index; needs the index (PyPI)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.safetensors")
    for folder in ("rlsched", "core", "sim", "extender", "operator", "models"):
        shutil.copytree(ROOT / folder, src / folder, symlinks=True, ignore=ignore)
    report = tmp_path / "report.json"
    out = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-build-isolation",
         "--quiet", "--report", str(report), f"{src}[trainer]"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    names = {item["metadata"]["name"].lower().replace("_", "-") for item in json.loads(report.read_text())["install"]}
    assert {"rlsched", "kubernetes"} <= names
    heavy = names & {"numpy", "scipy", "kopf", "aiohttp", "pandas", "torch", "matplotlib", "statsmodels",
                     "kubernetes-asyncio", "gymnasium", "pettingzoo", "safetensors", "orjson", "pydantic"}
    assert not heavy, f"rlsched[trainer] would install {sorted(heavy)}"
