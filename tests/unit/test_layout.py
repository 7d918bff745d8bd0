"""The package layout contract of ../shared/DESIGN.md."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_operator_from_repo_root_is_stdlib():
    out = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.itemgetter.__module__)"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip() == "operator"
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_subpackages_map_to_top_level_folders():
    import rlsched.core

    assert Path(rlsched.core.__file__).parent == ROOT / "core"
    import rlsched.operator

    assert ROOT / "operator" in [Path(p) for p in rlsched.operator.__path__]


def test_core_imports_nothing_heavy():
    code = (
        "import sys, rlsched.core as c; c.make_placement; "
        "bad=[m for m in ('torch','kubernetes','kubernetes_asyncio','aiohttp','kopf') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
