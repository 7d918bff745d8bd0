"""Export -> load round trip and clear errors for missing or corrupt policy files."""

import json

import numpy as np
import pytest
import torch

from rlsched.core.nn import PolicyFileError, PolicyFileNotFound, load_policy_file, load_weights, mlp
from rlsched.models.export import export_policy, update_evaluation


def _export(tmp_path, name="p"):
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    path, meta = export_policy(
        tmp_path / f"{name}.safetensors",
        net.state_dict(),
        policy="toy",
        version="1",
        observation={"features": ["a", "b", "c"]},
        architecture={"hidden": [4]},
        training={"seed": 1, "lr": np.float32(0.1)},
        trained_on={"env": "none"},
    )
    return net, path, meta


def test_round_trip_equals_torch(tmp_path):
    net, path, meta_file = _export(tmp_path)
    weights, meta = load_policy_file(path, policy="toy")
    assert meta["policy"] == "toy" and meta["version"] == "1"
    assert meta["observation"]["features"] == ["a", "b", "c"]
    assert meta["tensors"]["0.weight"] == [4, 3]
    assert meta["training"]["lr"] == pytest.approx(0.1)
    for k, v in net.state_dict().items():
        np.testing.assert_array_equal(weights[k], v.numpy())
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    got = mlp(x, [(weights["0.weight"], weights["0.bias"]), (weights["2.weight"], weights["2.bias"])])
    np.testing.assert_allclose(got, net(torch.from_numpy(x)).detach().numpy(), atol=1e-5)
    update_evaluation(path, {"score": 3})
    assert load_policy_file(path)[1]["evaluation"] == {"score": 3}


def test_missing_files(tmp_path):
    with pytest.raises(PolicyFileNotFound, match="metadata not found"):
        load_policy_file(tmp_path / "nope.safetensors")
    with pytest.raises(FileNotFoundError):  # PolicyFileNotFound is also a FileNotFoundError
        load_weights(tmp_path / "nope.safetensors")
    _, path, _ = _export(tmp_path)
    path.unlink()
    with pytest.raises(PolicyFileNotFound, match="weights not found"):
        load_policy_file(path)


def test_corrupt_weights(tmp_path):
    _, path, _ = _export(tmp_path)
    path.write_bytes(b"\x00garbage that is not a safetensors header")
    with pytest.raises(PolicyFileError, match="corrupt"):
        load_policy_file(path)


def test_tampered_weights_fail_the_digest(tmp_path):
    _, path, _ = _export(tmp_path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x55  # flip bits in the last float, header stays valid
    path.write_bytes(bytes(data))
    load_weights(path)  # still parses ...
    with pytest.raises(PolicyFileError, match="SHA-256"):
        load_policy_file(path)  # ... but the digest catches it


def test_corrupt_or_wrong_metadata(tmp_path):
    _, path, meta_file = _export(tmp_path)
    with pytest.raises(PolicyFileError, match="holds policy 'toy'"):
        load_policy_file(path, policy="rlpto")
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "format": "other/9"}))
    with pytest.raises(PolicyFileError, match="format"):
        load_policy_file(path)
    meta_file.write_text(json.dumps({**meta, "tensors": {"0.weight": [9, 9]}}))
    with pytest.raises(PolicyFileError, match="shape"):
        load_policy_file(path)
    meta_file.write_text("{not json")
    with pytest.raises(PolicyFileError, match="not valid JSON"):
        load_policy_file(path)


def test_export_rejects_bad_path(tmp_path):
    with pytest.raises(ValueError, match=".safetensors"):
        export_policy(tmp_path / "x.pt", {"w": np.zeros(2)}, policy="p", version="1", observation={},
                      architecture={}, training={}, trained_on={})
