"""examples/: the training script's data and contract handling, and its TrainingJob."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _example():
    spec = importlib.util.spec_from_file_location("ddp_digits", ROOT / "examples" / "ddp_digits.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_digits_are_scikit_learns():
    """The script reads the digits committed beside it (examples/data) with the
    standard library; they are exactly what scikit-learn's load_digits returns."""
    np = pytest.importorskip("numpy")
    datasets = pytest.importorskip("sklearn.datasets")
    x, y = _example().read_digits()
    want_x, want_y = datasets.load_digits(return_X_y=True)
    assert np.array_equal(np.array(x), want_x) and np.array_equal(np.array(y), want_y)


def test_outside_the_operator_the_script_says_so():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RLSCHED_JOB_NAME", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "ddp_digits.py"), "--epochs", "1"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "not run by the rlsched operator" in out.stderr and "is not set" in out.stderr


def _crd_schema():
    crd = yaml.safe_load((ROOT / "operator" / "crd" / "trainingjob.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_the_example_trainingjob_fits_the_crd():
    jsonschema = pytest.importorskip("jsonschema")
    job = yaml.safe_load((ROOT / "examples" / "trainingjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("rlsched.dev/v1alpha1", "TrainingJob")
    # the structural schema, as JSON Schema (x-kubernetes-* keywords are ignored by the validator)
    jsonschema.Draft4Validator(_crd_schema()).validate(job)  # OpenAPI 3.0 schemas are draft-4 style
    spec = job["spec"]
    assert spec["minWorkers"] <= spec["maxWorkers"]  # the CRD's CEL rule
    assert spec["checkpoint"]["volume"]["persistentVolumeClaim"]["claimName"]
    command = spec["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["python", "examples/ddp_digits.py"]
    _example().parse_args(command[2:])  # the flags exist
