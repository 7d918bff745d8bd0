"""Numpy forward passes of the layers the learned policies use, and the policy-file reader.

Serving runs trained policies with numpy only; training (``rlsched.models``) uses
PyTorch. Every function takes weights in PyTorch's layout and reproduces the matching
``torch.nn`` module (a test holds them equal to 1e-5). :func:`load_policy_file` reads a
``.safetensors`` + ``.json`` pair and raises :class:`PolicyFileError` when either is bad.
The layer table: docs/design-notes.md.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from scipy.special import erf as _erf

__all__ = [
    "FORMAT",
    "PolicyFileError",
    "PolicyFileNotFound",
    "linear",
    "relu",
    "tanh",
    "gelu",
    "sigmoid",
    "ACTIVATIONS",
    "layer_norm",
    "softmax",
    "log_softmax",
    "multi_head_attention",
    "transformer_encoder_layer",
    "gru_cell",
    "gru",
    "mlp",
    "load_weights",
    "load_policy_file",
    "metadata_path",
]

#: Format tag written into every exported policy's metadata (``metadata["format"]``).
FORMAT = "rlsched-policy/1"


class PolicyFileError(ValueError):
    """A policy's model file (weights, metadata or parameters) is missing, unreadable,
    corrupt or not for this policy: the one error every policy loader raises."""


class PolicyFileNotFound(PolicyFileError, FileNotFoundError):
    """The weights or the metadata file of a policy does not exist."""


# ---------------------------------------------------------------------- elementwise
def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def tanh(x: np.ndarray) -> np.ndarray:
    return np.tanh(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    # split by sign so that exp never overflows
    x = np.asarray(x)
    out = np.empty_like(x, dtype=np.result_type(x, np.float32))
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """GELU as ``torch.nn.functional.gelu``: exact ``x·Φ(x)`` or the ``"tanh"`` form."""
    if approximate == "none":
        return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', not {approximate!r}")


ACTIVATIONS = {"relu": relu, "tanh": tanh, "gelu": gelu, "sigmoid": sigmoid}


def _activation(name: str):
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"unknown activation {name!r}; known: {', '.join(ACTIVATIONS)}") from None


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - np.max(x, axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


# ---------------------------------------------------------------------- layers
def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """``x @ weight.T + bias`` with ``weight`` of shape ``[out, in]`` (``nn.Linear``)."""
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input has {x.shape[-1]} features, weight expects {weight.shape[1]}")
    y = x @ weight.T
    return y if bias is None else y + bias


def layer_norm(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float = 1e-5) -> np.ndarray:
    """Layer normalisation over the last axis (``nn.LayerNorm(d)``)."""
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def multi_head_attention(
    x: np.ndarray,
    in_proj_weight: np.ndarray,
    in_proj_bias: np.ndarray | None,
    out_proj_weight: np.ndarray,
    out_proj_bias: np.ndarray | None,
    num_heads: int,
    key_padding_mask: np.ndarray | None = None,
) -> np.ndarray:
    """Multi-head self-attention, ``nn.MultiheadAttention(d, h, batch_first=True)(x, x, x)``.

    ``x``: ``[batch, seq, d]`` (or ``[seq, d]``). ``in_proj_weight``: ``[3d, d]`` stacking
    the query, key and value projections. ``key_padding_mask``: ``[batch, seq]``, True
    where a position is padding and must not be attended to.
    """
    squeeze = x.ndim == 2
    if squeeze:
        x = x[None]
        if key_padding_mask is not None:
            key_padding_mask = np.asarray(key_padding_mask)[None]
    b, s, d = x.shape
    if d % num_heads:
        raise ValueError(f"multi_head_attention: d_model {d} not divisible by {num_heads} heads")
    hd = d // num_heads
    qkv = linear(x, in_proj_weight, in_proj_bias)  # [b, s, 3d]
    q, k, v = (qkv[..., i * d : (i + 1) * d].reshape(b, s, num_heads, hd).transpose(0, 2, 1, 3) for i in range(3))
    scores = (q / np.sqrt(hd)) @ k.transpose(0, 1, 3, 2)  # [b, h, s, s]
    if key_padding_mask is not None:
        mask = np.asarray(key_padding_mask, dtype=bool)[:, None, None, :]
        scores = np.where(mask, -np.inf, scores)
    attn = softmax(scores, axis=-1)
    out = (attn @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
    out = linear(out, out_proj_weight, out_proj_bias)
    return out[0] if squeeze else out


def transformer_encoder_layer(
    x: np.ndarray,
    weights: Mapping[str, np.ndarray],
    num_heads: int,
    *,
    prefix: str = "",
    norm_first: bool = False,
    activation: str = "relu",
    eps: float = 1e-5,
    key_padding_mask: np.ndarray | None = None,
) -> np.ndarray:
    """One ``nn.TransformerEncoderLayer(batch_first=True)`` in inference mode (no dropout).

    Post-norm (torch's default, ``norm_first=False``)::

        x = norm1(x + self_attn(x));  x = norm2(x + ff(x))

    Pre-norm (``norm_first=True``)::

        x = x + self_attn(norm1(x));  x = x + ff(norm2(x))

    with ``ff(x) = linear2(activation(linear1(x)))``. ``weights`` uses the layer's
    ``state_dict`` names (``self_attn.in_proj_weight``, ``linear1.weight``,
    ``norm1.weight``, ...) after ``prefix``.
    """
    w = lambda name: weights[prefix + name]  # noqa: E731
    act = _activation(activation)

    def sa(h):
        return multi_head_attention(
            h,
            w("self_attn.in_proj_weight"),
            weights.get(prefix + "self_attn.in_proj_bias"),
            w("self_attn.out_proj.weight"),
            weights.get(prefix + "self_attn.out_proj.bias"),
            num_heads,
            key_padding_mask,
        )

    def ff(h):
        return linear(act(linear(h, w("linear1.weight"), weights.get(prefix + "linear1.bias"))),
                      w("linear2.weight"), weights.get(prefix + "linear2.bias"))

    def norm(h, i):
        return layer_norm(h, weights.get(f"{prefix}norm{i}.weight"), weights.get(f"{prefix}norm{i}.bias"), eps)

    if norm_first:
        x = x + sa(norm(x, 1))
        return x + ff(norm(x, 2))
    x = norm(x + sa(x), 1)
    return norm(x + ff(x), 2)


def gru_cell(
    x: np.ndarray,
    h: np.ndarray,
    weight_ih: np.ndarray,
    weight_hh: np.ndarray,
    bias_ih: np.ndarray | None = None,
    bias_hh: np.ndarray | None = None,
) -> np.ndarray:
    """One GRU step as ``nn.GRUCell``; weights stack the gates in torch's order r, z, n::

        r = σ(W_ir x + b_ir + W_hr h + b_hr)
        z = σ(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r ⊙ (W_hn h + b_hn))
        h' = (1 − z) ⊙ n + z ⊙ h
    """
    hs = weight_hh.shape[1]
    gi = linear(x, weight_ih, bias_ih)
    gh = linear(h, weight_hh, bias_hh)
    r = sigmoid(gi[..., :hs] + gh[..., :hs])
    z = sigmoid(gi[..., hs : 2 * hs] + gh[..., hs : 2 * hs])
    n = np.tanh(gi[..., 2 * hs :] + r * gh[..., 2 * hs :])
    return (1.0 - z) * n + z * h


def gru(
    x: np.ndarray,
    weights: Mapping[str, np.ndarray],
    num_layers: int = 1,
    *,
    prefix: str = "",
    h0: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A unidirectional ``nn.GRU(batch_first=True)``: returns ``(output, h_n)``.

    ``x``: ``[batch, seq, in]``; ``weights`` uses torch's names ``weight_ih_l{k}``,
    ``weight_hh_l{k}``, ``bias_ih_l{k}``, ``bias_hh_l{k}`` after ``prefix``.
    ``output``: ``[batch, seq, hidden]`` (last layer); ``h_n``: ``[layers, batch, hidden]``.
    """
    if x.ndim != 3:
        raise ValueError(f"gru: expected [batch, seq, features], got shape {x.shape}")
    b = x.shape[0]
    hidden = weights[f"{prefix}weight_hh_l0"].shape[1]
    if h0 is None:
        h0 = np.zeros((num_layers, b, hidden), dtype=x.dtype)
    out = x
    finals = []
    for k in range(num_layers):
        wi, wh = weights[f"{prefix}weight_ih_l{k}"], weights[f"{prefix}weight_hh_l{k}"]
        bi, bh = weights.get(f"{prefix}bias_ih_l{k}"), weights.get(f"{prefix}bias_hh_l{k}")
        h = h0[k]
        steps = []
        for t in range(out.shape[1]):
            h = gru_cell(out[:, t], h, wi, wh, bi, bh)
            steps.append(h)
        out = np.stack(steps, axis=1)
        finals.append(h)
    return out, np.stack(finals)


def mlp(
    x: np.ndarray,
    layers: Sequence[tuple[np.ndarray, np.ndarray | None]],
    activation: str = "tanh",
    final_activation: str | None = None,
) -> np.ndarray:
    """Linear layers with ``activation`` between them (none after the last unless
    ``final_activation``); ``layers`` is a list of ``(weight, bias)``."""
    act = _activation(activation)
    for i, (wt, bs) in enumerate(layers):
        x = linear(x, wt, bs)
        if i < len(layers) - 1:
            x = act(x)
    return x if final_activation is None else _activation(final_activation)(x)


# ---------------------------------------------------------------------- files
def metadata_path(weights_path: str | Path) -> Path:
    """The JSON metadata file that goes with a ``.safetensors`` weights file."""
    return Path(weights_path).with_suffix(".json")


def load_weights(path: str | Path) -> dict[str, np.ndarray]:
    """Read a safetensors file into numpy arrays (no torch needed)."""
    path = Path(path)
    if not path.is_file():
        raise PolicyFileNotFound(f"policy weights not found: {path}")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise PolicyFileError(f"policy weights {path} are corrupt or not safetensors: {exc}") from exc


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_policy_file(path: str | Path, policy: str | None = None) -> tuple[dict[str, np.ndarray], dict]:
    """Load an exported policy: ``(weights, metadata)``.

    ``path`` is the ``.safetensors`` file; its metadata is the ``.json`` beside it. When
    ``policy`` is given the metadata must name that policy. The weights' SHA-256 recorded
    at export is checked, so a truncated or swapped file is caught here rather than as a
    shape error deep inside a forward pass.
    """
    path = Path(path)
    meta_file = metadata_path(path)
    if not meta_file.is_file():
        raise PolicyFileNotFound(f"policy metadata not found: {meta_file} (expected beside {path.name})")
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PolicyFileError(f"policy metadata {meta_file} is not valid JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise PolicyFileError(f"policy metadata {meta_file} must be a JSON object")
    if meta.get("format") != FORMAT:
        raise PolicyFileError(f"policy metadata {meta_file}: format {meta.get('format')!r}, expected {FORMAT!r}")
    if policy is not None and meta.get("policy") != policy:
        raise PolicyFileError(f"policy file {path} holds policy {meta.get('policy')!r}, not {policy!r}")
    weights = load_weights(path)
    digest = meta.get("sha256")
    if digest and digest != _sha256(path):
        raise PolicyFileError(f"policy weights {path} do not match the SHA-256 in {meta_file.name}")
    shapes = meta.get("tensors")
    if shapes:
        for name, shape in shapes.items():
            if name not in weights:
                raise PolicyFileError(f"policy weights {path}: tensor {name!r} missing")
            if list(weights[name].shape) != list(shape):
                raise PolicyFileError(
                    f"policy weights {path}: tensor {name!r} has shape {list(weights[name].shape)}, metadata says {shape}"
                )
    return weights, meta
