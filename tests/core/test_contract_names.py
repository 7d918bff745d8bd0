"""The Kubernetes contract is written once: ``core/contract.py`` holds every name and the
one parser of pod and node shapes; the rest of the code imports them. Checked on the
source (every string constant and definition of every .py file outside tests), and
the CRD manifests are held to the same names."""

import ast
import os
from pathlib import Path

import pytest
import yaml

from rlsched.core import contract

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = Path("core") / "contract.py"

#: contract values that are also ordinary words elsewhere (the scheduler profile and the
#: Helm release are both "rlsched"; "chief"/"worker" name roles and processes; "privileged"
#: is a level of the Pod Security Standards and a field of a container's securityContext)
NOT_SCANNED = {"DEFAULT_SCHEDULER_NAME", "SHORT_NAME", "SINGULAR", "VERSION", "ROLE_CHIEF", "ROLE_WORKER",
               "MANAGED_BY_OPERATOR", "POD_SECURITY_PRIVILEGED"}
#: one definition each, in core: the pod/node shape parser, the bad-shape and bad-model-file errors
DEFINED_ONCE = {
    "pod_gpus": CONTRACT, "node_gpus": CONTRACT, "node_shape": CONTRACT, "parse_quantity": CONTRACT,
    "gpu_count": CONTRACT, "container_gpus": CONTRACT, "ShapeError": CONTRACT,
    "PolicyFileError": Path("core") / "nn.py", "PLACEMENT_FEATURES": Path("core") / "das.py",
    "PRIORITY_CLASSES": CONTRACT, "class_rank": CONTRACT, "BatchBounds": Path("core") / "batch.py",
}
#: the duplicates this module replaced must not come back
GONE = {"parse_quantity_int", "gpu_quantity", "_gpus_of", "ModelError", "CLASS_RANK", "_CLASSES", "AppLimits"}


def _sources():
    """Every .py file outside tests/, build/, out/ and hidden folders; the walk prunes
    those folders instead of listing their files (a virtualenv holds tens of thousands,
    a training run's out/ may too)."""
    paths = []
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder).relative_to(ROOT)
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "out")
                   and not (here == Path(".") and d == "tests")]
        paths += [here / f for f in files if f.endswith(".py")]
    for rel in sorted(paths):
        yield rel, ast.parse((ROOT / rel).read_text(), filename=str(rel))


def _names() -> dict[str, str]:
    return {
        getattr(contract, n): n
        for n in contract.__all__
        if isinstance(getattr(contract, n), str) and n not in NOT_SCANNED
    }


def _definitions(tree: ast.Module):
    """``(name, line)`` of every function and class, and of every module-level name."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node.lineno
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    yield n.id, node.lineno


def test_contract_names_are_spelled_only_in_core_contract():
    names = _names()
    assert {"GROUP", "PLURAL", "KIND", "LABEL_JOB", "RESOURCE_GPU"} <= set(names.values())
    found = []
    for rel, tree in _sources():
        if rel == CONTRACT:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                found.append(f"{rel}:{node.lineno} spells {node.value!r}; import {names[node.value]} from rlsched.core.contract")
    assert found == []


def test_parser_errors_and_features_are_defined_once():
    where: dict[str, list[str]] = {}
    for rel, tree in _sources():
        for name, line in _definitions(tree):
            if name in DEFINED_ONCE or name in GONE:
                where.setdefault(name, []).append(f"{rel}:{line}")
    assert {n: where.get(n, []) for n in GONE} == {n: [] for n in GONE}
    for name, home in DEFINED_ONCE.items():
        assert [w.rsplit(":", 1)[0] for w in where.get(name, [])] == [str(home)], (name, where.get(name))


def test_the_scan_sees_a_spelled_name():
    parser = "pod_gpus"
    tree = ast.parse(f"LABEL = {contract.LABEL_JOB!r}\n\ndef {parser}(p):\n    return 0\n")
    assert any(isinstance(n, ast.Constant) and n.value in _names() for n in ast.walk(tree))
    assert [name for name, _ in _definitions(tree)] == ["pod_gpus", "LABEL"]


@pytest.mark.parametrize("crd", ["operator/crd/trainingjob.yaml", "deploy/helm/rlsched/files/crds/trainingjob.yaml"])
def test_crd_manifests_use_the_contract_names(crd):
    doc = yaml.safe_load((ROOT / crd).read_text())
    spec, names = doc["spec"], doc["spec"]["names"]
    assert doc["metadata"]["name"] == contract.CRD_NAME
    assert spec["group"] == contract.GROUP
    assert (names["plural"], names["singular"], names["kind"]) == (contract.PLURAL, contract.SINGULAR, contract.KIND)
    assert contract.SHORT_NAME in names["shortNames"]
    assert contract.VERSION in [v["name"] for v in spec["versions"] if v.get("served")]
    served = next(v for v in spec["versions"] if v["name"] == contract.VERSION)
    klass = served["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["priority"]["properties"]["class"]
    assert sorted(klass["enum"]) == sorted(contract.PRIORITY_CLASSES)
