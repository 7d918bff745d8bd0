"""core/nn.py numpy layers equal their torch.nn counterparts (atol 1e-5)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rlsched.core import nn as cnn

ATOL = 1e-5


def sd(module):
    return {k: v.detach().numpy() for k, v in module.state_dict().items()}


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def rand(*shape):
    return torch.randn(*shape)


def test_linear_and_activations():
    lin = torch.nn.Linear(5, 3)
    x = rand(4, 5)
    w = sd(lin)
    np.testing.assert_allclose(cnn.linear(x.numpy(), w["weight"], w["bias"]), lin(x).detach().numpy(), atol=ATOL)
    z = rand(6, 7) * 3
    np.testing.assert_allclose(cnn.relu(z.numpy()), F.relu(z).numpy(), atol=ATOL)
    np.testing.assert_allclose(cnn.tanh(z.numpy()), torch.tanh(z).numpy(), atol=ATOL)
    np.testing.assert_allclose(cnn.sigmoid(z.numpy() * 20), torch.sigmoid(z * 20).numpy(), atol=ATOL)
    np.testing.assert_allclose(cnn.gelu(z.numpy()), F.gelu(z).numpy(), atol=ATOL)
    np.testing.assert_allclose(cnn.gelu(z.numpy(), "tanh"), F.gelu(z, approximate="tanh").numpy(), atol=ATOL)
    np.testing.assert_allclose(cnn.softmax(z.numpy()), torch.softmax(z, -1).numpy(), atol=ATOL)
    np.testing.assert_allclose(cnn.log_softmax(z.numpy(), 0), torch.log_softmax(z, 0).numpy(), atol=ATOL)
    with pytest.raises(ValueError, match="features"):
        cnn.linear(x.numpy(), w["weight"].T, None)
    with pytest.raises(ValueError, match="approximate"):
        cnn.gelu(z.numpy(), "erf")


def test_layer_norm():
    ln = torch.nn.LayerNorm(8)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    x = rand(3, 4, 8) * 5 + 2
    w = sd(ln)
    np.testing.assert_allclose(cnn.layer_norm(x.numpy(), w["weight"], w["bias"]), ln(x).detach().numpy(), atol=ATOL)


def test_multi_head_attention_with_padding():
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    mha.eval()
    x = rand(3, 5, 8)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    mask[1, 3:] = True
    mask[2, 1:] = True
    with torch.no_grad():
        ref, _ = mha(x, x, x, key_padding_mask=mask, need_weights=False)
    w = sd(mha)
    got = cnn.multi_head_attention(
        x.numpy(), w["in_proj_weight"], w["in_proj_bias"], w["out_proj.weight"], w["out_proj.bias"], 2, mask.numpy()
    )
    np.testing.assert_allclose(got, ref.numpy(), atol=ATOL)
    # unbatched input
    got1 = cnn.multi_head_attention(
        x[0].numpy(), w["in_proj_weight"], w["in_proj_bias"], w["out_proj.weight"], w["out_proj.bias"], 2
    )
    np.testing.assert_allclose(got1, ref[0].numpy(), atol=ATOL)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer(norm_first, activation):
    layer = torch.nn.TransformerEncoderLayer(
        16, 4, dim_feedforward=32, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first
    )
    layer.eval()
    enc = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    enc.eval()
    x = rand(2, 6, 16)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[1, 4:] = True
    with torch.no_grad():
        ref = enc(x, src_key_padding_mask=mask).numpy()
    w = sd(enc)
    h = x.numpy()
    for i in range(2):
        h = cnn.transformer_encoder_layer(
            h, w, 4, prefix=f"layers.{i}.", norm_first=norm_first, activation=activation, key_padding_mask=mask.numpy()
        )
    valid = ~mask.numpy()  # torch's fast path may zero padded positions; compare the rest
    np.testing.assert_allclose(h[valid], ref[valid], atol=ATOL)


def test_gru_cell_and_two_layer_gru():
    cell = torch.nn.GRUCell(3, 5)
    x, h = rand(4, 3), rand(4, 5)
    w = sd(cell)
    ref = cell(x, h).detach().numpy()
    got = cnn.gru_cell(x.numpy(), h.numpy(), w["weight_ih"], w["weight_hh"], w["bias_ih"], w["bias_hh"])
    np.testing.assert_allclose(got, ref, atol=ATOL)

    g = torch.nn.GRU(3, 6, num_layers=2, batch_first=True)
    xs = rand(2, 7, 3)
    h0 = rand(2, 2, 6)
    with torch.no_grad():
        out, hn = g(xs, h0)
    o2, h2 = cnn.gru(xs.numpy(), sd(g), num_layers=2, h0=h0.numpy())
    np.testing.assert_allclose(o2, out.numpy(), atol=ATOL)
    np.testing.assert_allclose(h2, hn.numpy(), atol=ATOL)
    with pytest.raises(ValueError, match="batch, seq"):
        cnn.gru(xs[0].numpy(), sd(g))


def test_mlp_matches_sequential():
    seq = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x = rand(5, 4)
    w = sd(seq)
    layers = [(w[f"{i}.weight"], w[f"{i}.bias"]) for i in (0, 2, 4)]
    np.testing.assert_allclose(cnn.mlp(x.numpy(), layers, "tanh"), seq(x).detach().numpy(), atol=ATOL)
    with pytest.raises(ValueError, match="unknown activation"):
        cnn.mlp(x.numpy(), layers, "swish")
