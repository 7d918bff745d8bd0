"""Core describes a training job with three types: the spec, the live view (what the
policies, admission, the scaling planner and the live allocation read of a job, waiting
or running) and the allocators' view. A new
class that carries a job's submit time, gang or spec is one more translation on every
decision path: this test fails until it replaces one of these."""

from __future__ import annotations

import ast

from .test_no_history_in_code import ROOT

#: the job types of core, one per role
JOB_TYPES = {"TrainingSpec", "JobView", "AllocJob"}
#: fields only a class describing a training job declares
JOB_FIELDS = {"submit_time", "min_workers", "gpus_per_worker"}


def job_classes(source: str) -> set[str]:
    """Names of the classes of ``source`` that declare a field of :data:`JOB_FIELDS`."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            fields = {a.target.id for a in node.body if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)}
            if fields & JOB_FIELDS:
                out.add(node.name)
    return out


def test_core_has_one_type_per_job_role():
    found = set().union(*(job_classes(p.read_text()) for p in (ROOT / "core").rglob("*.py")))
    assert found == JOB_TYPES


def test_the_checker_finds_a_new_job_type():
    src = "class HolderEntry:\n    key: str\n    submit_time: float\n\nclass Node:\n    gpus: int\n"
    assert job_classes(src) == {"HolderEntry"}
