"""Export a trained policy for serving: safetensors weights + JSON metadata.

The pair ``<stem>.safetensors`` / ``<stem>.json`` is what
:func:`rlsched.core.nn.load_policy_file` reads with numpy only; the metadata records the
format, policy, version, observation, architecture, training, evaluation, tensor shapes
and the weights' SHA-256. The keys: docs/training.md, docs/design-notes.md.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import save_file

from rlsched.core.nn import FORMAT, load_policy_file, metadata_path

__all__ = ["export_policy", "load_policy_file", "to_numpy_state"]


def to_numpy_state(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A ``state_dict`` (torch tensors or arrays) as contiguous float32 numpy arrays."""
    out = {}
    for name, value in state.items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        arr = np.ascontiguousarray(np.asarray(value))
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float32)
        out[name] = arr
    return out


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    return obj


def export_policy(
    path: str | Path,
    state: Mapping[str, Any],
    *,
    policy: str,
    version: str,
    observation: Mapping[str, Any],
    architecture: Mapping[str, Any],
    training: Mapping[str, Any],
    trained_on: Mapping[str, Any],
    evaluation: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> tuple[Path, Path]:
    """Write ``path`` (``.safetensors``) and its ``.json`` metadata; returns both paths.

    ``extra`` adds top-level keys a reader expects (e.g. the LSP forecaster's ``mean``,
    ``std`` and ``window``); it may not override the standard ones."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"export path must end in .safetensors, got {path}")
    if not state:
        raise ValueError("export_policy: empty state")
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = to_numpy_state(state)
    save_file(arrays, str(path), metadata={"format": FORMAT, "policy": policy, "version": str(version)})
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    meta = {
        "format": FORMAT,
        "policy": policy,
        "version": str(version),
        "observation": _jsonable(observation),
        "architecture": _jsonable(architecture),
        "training": _jsonable(training),
        "trained_on": _jsonable(trained_on),
        "evaluation": _jsonable(evaluation or {}),
        "tensors": {k: list(v.shape) for k, v in arrays.items()},
        "sha256": digest,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    for k, v in (extra or {}).items():
        if k in meta:
            raise ValueError(f"export_policy: extra key {k!r} would override a standard metadata key")
        meta[k] = _jsonable(v)
    meta_file = metadata_path(path)
    meta_file.write_text(json.dumps(meta, indent=2, sort_keys=False) + "\n")
    return path, meta_file


def update_evaluation(path: str | Path, evaluation: Mapping[str, Any]) -> None:
    """Merge ``evaluation`` into an exported policy's metadata (weights untouched)."""
    _, meta = load_policy_file(path)
    meta["evaluation"] = {**meta.get("evaluation", {}), **_jsonable(evaluation)}
    metadata_path(path).write_text(json.dumps(meta, indent=2) + "\n")
