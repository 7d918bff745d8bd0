"""The package layout contract of ../shared/DESIGN.md."""

import subprocess
import sys
import tomllib
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

    # a namespace portion, found through the link rlsched/operator -> ../operator
    assert ROOT / "operator" in [Path(p).resolve() for p in rlsched.operator.__path__]
    import rlsched_dev

    assert Path(rlsched_dev.__file__).parent == ROOT / "dev"


def test_rlsched_imports_only_its_own_subpackages(tmp_path):
    """The repository root is not on rlsched's search path: `rlsched.tests` does not
    import, `rlsched.operator` does, from any directory; and rlsched stays the regular
    package of rlsched/__init__.py beside the dev distribution (no namespace hides it)."""
    for cwd in (ROOT, tmp_path):
        pkg = subprocess.run([sys.executable, "-c", "import rlsched, rlsched_dev; print(rlsched.__file__, rlsched.__version__)"],
                             cwd=cwd, capture_output=True, text=True)
        assert pkg.returncode == 0, pkg.stderr
        assert pkg.stdout.split()[0] == str(ROOT / "rlsched" / "__init__.py")
        version = subprocess.run([sys.executable, "-m", "rlsched.cli", "--version"], cwd=cwd, capture_output=True, text=True)
        assert version.returncode == 0 and version.stdout.startswith("rlsched "), version.stderr
        bad = subprocess.run([sys.executable, "-c", "import rlsched.tests"], cwd=cwd, capture_output=True, text=True)
        assert bad.returncode != 0 and "No module named 'rlsched.tests'" in bad.stderr
        ok = subprocess.run([sys.executable, "-c", "import rlsched.operator.controller as c; print(c.__name__)"],
                            cwd=cwd, capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.strip() == "rlsched.operator.controller"
    import rlsched

    assert [Path(p).resolve() for p in rlsched.__path__] == [ROOT / "rlsched"]


def test_base_distribution_has_no_dev_package():
    """The rlsched wheel's package list (setuptools reads it from pyproject.toml) holds no
    dev tooling; the rlsched-dev distribution in dev/ provides exactly rlsched_dev."""
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())
    st = base["tool"]["setuptools"]
    assert not [p for p in st["packages"] if p.startswith(("rlsched_dev", "rlsched.dev"))]
    assert "dev" not in {d.strip("./") for d in st["package-dir"].values()}
    assert not [p for p in st.get("package-data", {}) if p.startswith(("rlsched_dev", "rlsched.dev"))]
    assert base["project"]["optional-dependencies"]["dev"] == ["rlsched-dev==" + base["project"]["version"]]
    dev = tomllib.loads((ROOT / "dev" / "pyproject.toml").read_text())
    assert dev["project"]["name"] == "rlsched-dev"
    assert dev["tool"]["setuptools"]["packages"] == ["rlsched_dev"]
    # the dev tooling drives the scheduler: the scheduler extra (rlsched itself requires nothing)
    assert f"rlsched[scheduler]=={base['project']['version']}" in dev["project"]["dependencies"]


def test_cli_without_the_dev_package_has_no_dev_commands():
    code = (
        "import sys; sys.modules['rlsched_dev'] = None\n"  # as if rlsched-dev were not installed
        "from rlsched.cli import build_parser\n"
        "sub = next(a for a in build_parser()._actions if a.dest == 'command')\n"
        "print(' '.join(sorted(sub.choices)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    commands = set(out.stdout.split())
    assert {"sim", "extender", "operator"} <= commands
    assert not commands & {"cluster", "demo", "fake-trainer"}
    from rlsched.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert {"cluster", "demo", "fake-trainer"} <= set(sub.choices)


def test_core_imports_nothing_heavy():
    code = (
        "import sys, rlsched.core as c; c.make_placement; "
        "bad=[m for m in ('torch','kubernetes','kubernetes_asyncio','aiohttp','kopf') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_subpackage_is_listed_for_the_wheel():
    """A package folder the wheel's list forgets installs fine in editable mode and is
    missing from built wheels and images."""
    st = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(st["packages"])
    for pkg, folder in st["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            sub = init.parent.relative_to(ROOT / folder).parts
            assert ".".join((pkg, *sub)) in listed, f"{init.parent.relative_to(ROOT)} is not in [tool.setuptools] packages"
