"""The serving core holds what serves, and every allocation policy is named in one
registry: benchmark peers and test oracles stay out of rlsched.core, the served
allocator loads nothing of the simulator, and core's registry knows which policies
may run live and which are clairvoyant references."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core"


def _core_modules() -> dict[str, Path]:
    out = {}
    for path in sorted(CORE.rglob("*.py")):
        parts = list(path.relative_to(CORE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(["rlsched.core", *parts])] = path
    return out


def _imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of rlsched that ``path`` imports (any statement, function-level too)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            mod = ".".join(p for p in (base, node.module or "") if p)
            found |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    out = set()
    for target in found:
        if not target.startswith("rlsched"):
            continue
        while target not in modules and "." in target and target.startswith("rlsched.core."):
            target = target.rpartition(".")[0]
        out.add(target)
    return out


def test_the_wheel_ships_no_peer_or_oracle_in_core():
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    in_core = [p for p in packages if p.startswith("rlsched.core")]
    assert in_core and not [p for p in in_core if "peers" in p], in_core
    names = _core_modules()
    assert not [n for n in names if "peers" in n or "reference" in n or "oracle" in n], sorted(names)


def test_the_served_allocator_imports_nothing_outside_core():
    """Walk the import graph from the modules the served allocator is built from: it
    stays inside rlsched.core, and none of it is a benchmark peer or a test oracle."""
    modules = _core_modules()
    seen, todo = set(), ["rlsched.core.live_allocation", "rlsched.core.goodput_allocator",
                         "rlsched.core.growth_weight", "rlsched.core.rlpto_weight", "rlsched.core.policy"]
    outside = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for target in _imports_of(name, modules[name], modules):
            if target in modules:
                todo.append(target)
            else:
                outside.add(f"{name} imports {target}")
    assert outside == set()
    assert "rlsched.core.packing" in seen and "rlsched.core.ordering" in seen  # what it shared with the peers


def test_building_the_served_allocator_loads_no_simulator_module():
    code = ("import sys; from rlsched.core.served import SERVED; "
            "from rlsched.core.live_allocation import make_live_allocator; "
            "a = make_live_allocator(SERVED.allocator); "
            "print(a.name, ','.join(sorted(m for m in sys.modules if m.startswith('rlsched.sim'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["goodput"], out.stdout


# ------------------------------------------------------------------ the one registry
def test_one_registry_names_every_allocation_policy():
    import rlsched.sim.allocators  # noqa: F401  (registers the simulator's peers)
    from rlsched.core.policy import allocator_names

    assert set(allocator_names()) == {"tiresias-2q", "optimus-oracle", "pollux", "pollux-paper", "sia",
                                      "gavel", "goodput", "goodput-learned", "goodput-rlpto"}
    assert allocator_names(live=True) == ("goodput", "goodput-learned", "goodput-rlpto")


def test_each_entry_knows_what_its_allocator_is(tmp_path):
    """The registry's flags are the built allocators' own: a live policy is core's and
    not clairvoyant, the one clairvoyant reference says so (nothing is started)."""
    from rlsched.core.policy import ALLOCATORS, make_allocator
    from rlsched.sim.allocators import make_allocator as make_by_policy_name

    for name, entry in ALLOCATORS.items():
        alloc = make_allocator(name)
        assert bool(getattr(alloc, "clairvoyant", False)) == entry.clairvoyant, name
        if entry.live:
            assert type(alloc).__module__.startswith("rlsched.core."), name
        assert type(make_by_policy_name(name)) is type(alloc), name
    assert [n for n, e in ALLOCATORS.items() if e.clairvoyant] == ["optimus-oracle"]


def test_the_operator_runs_only_live_policies():
    import rlsched.sim.allocators  # noqa: F401
    from rlsched.core.live_allocation import make_live_allocator
    from rlsched.core.served import parse_policy_name

    with pytest.raises(ValueError, match="unknown live allocator 'tiresias-2q'; choose one of goodput, "):
        make_live_allocator("tiresias-2q")
    assert parse_policy_name("goodput-learned/das").allocator == "goodput-learned"
    with pytest.raises(ValueError, match="expected ordering/placement"):
        parse_policy_name("tiresias-2q/das/x/y")
    assert parse_policy_name("tiresias-2q/das").allocator == ""  # a peer is no <allocator>/<placement>


def test_registering_refuses_a_name_twice_and_a_live_reference():
    from rlsched.core.policy import register_allocator

    with pytest.raises(ValueError, match="registered twice"):
        register_allocator("goodput")(lambda **o: None)
    with pytest.raises(ValueError, match="cannot run live"):
        register_allocator("x-live-oracle", live=True, clairvoyant=True)
