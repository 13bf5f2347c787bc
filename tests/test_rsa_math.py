"""The RSA math of "Encoding Recurrence into Transformers" (ICLR 2023), checked numerically.

An RSA layer with Q = K = 0 and gate sigmoid(mu) = 1 is a sum of REM heads (Eq. 4 with the
softmax term switched off); Prop. 1-2 and 4 say such heads reproduce linear RNNs. Every check
uses fresh random inputs and float64, tolerance 1e-5.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from models.rsa import CYCLIC_COS, CYCLIC_SIN, IDENTITY, REGULAR, RSAAttention, RSAConfig, RSAForecaster, rem

TOL = 1e-5


def rem_layer(kinds, dilations, value_blocks, lam=None, gamma=None, theta=None, masked=True):
    """RSAAttention with Q = K = 0, gate = 1, head h's value weight = value_blocks[h] (hs, d_in),
    and an output projection that sums the heads (W_o = (I, ..., I)' of Prop. 2)."""
    n_heads = len(kinds)
    hs, d_in = value_blocks[0].shape
    width = max(hs, math.ceil(d_in / n_heads))  # head width; rows beyond hs stay zero
    d_model = n_heads * width
    layer = RSAAttention(d_model, kinds, dilations, masked=masked).double()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.zero_()
        value = torch.zeros(d_model, d_model, dtype=torch.float64)
        for head, block in enumerate(value_blocks):
            value[head * width : head * width + hs, :d_in] = torch.as_tensor(block)
        layer.qkv.weight[2 * d_model :] = value  # W_V; W_Q = W_K = 0
        summing = torch.zeros(hs, width, dtype=torch.float64)
        summing[:, :hs] = torch.eye(hs, dtype=torch.float64)
        layer.proj.weight[:hs] = torch.cat([summing] * n_heads, dim=1)  # W_o = (I, ..., I)'
        layer.mu.fill_(50.0)  # sigmoid(50) == 1.0 in float64: the softmax term vanishes
        ones = torch.ones(n_heads, dtype=torch.float64)
        layer.eta.copy_(torch.atanh(torch.as_tensor(lam if lam is not None else 0.5 * ones)))
        layer.nu.copy_(torch.logit(torch.as_tensor(gamma if gamma is not None else 0.5 * ones)))
        layer.theta.copy_(torch.as_tensor(theta if theta is not None else 0.3 * ones))
    assert float(1 - torch.sigmoid(layer.mu.detach())) == 0.0
    return layer, hs, d_model


def run_layer(layer, x, hs, d_model):
    padded = torch.zeros(x.shape[0], x.shape[1], d_model, dtype=torch.float64)
    padded[..., : x.shape[-1]] = x
    return layer(padded)[..., :hs]


def linear_rnn(w_h, w_x, x, dilation=1):
    """Reference: h_t = W_h h_{t-d} + W_x x_t, h_t = 0 for t <= 0. x: (B, T, d_in) -> (B, T, d)."""
    batch, length, _ = x.shape
    h = torch.zeros(batch, length, w_h.shape[0], dtype=torch.float64)
    for t in range(length):
        previous = h[:, t - dilation] if t - dilation >= 0 else torch.zeros_like(h[:, 0])
        h[:, t] = previous @ w_h.T + x[:, t] @ w_x.T
    return h


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(1234)


def test_regular_rem_head_is_scalar_linear_rnn(generator):
    # Prop. 1-2 with one real eigenvalue: h_t = sum_{j>=0} lambda^j W x_{t-j} = REM head + identity head
    d_in, hs, length, lam = 5, 3, 40, -0.83
    w = torch.randn(hs, d_in, generator=generator, dtype=torch.float64)
    x = torch.randn(2, length, d_in, generator=generator, dtype=torch.float64)
    layer, hs, d_model = rem_layer([REGULAR, IDENTITY], [1, 1], [w, w], lam=torch.tensor([lam, 0.0]))
    expected = linear_rnn(lam * torch.eye(hs, dtype=torch.float64), w, x)
    torch.testing.assert_close(run_layer(layer, x, hs, d_model), expected, atol=TOL, rtol=0)


def test_cyclical_pair_is_rotation_block_rnn(generator):
    # Complex pair gamma e^{+-i theta}: W_h = gamma [[cos, sin], [-sin, cos]], W_h^j = gamma^j (cos(j theta) I
    # + sin(j theta) S), S = [[0, 1], [-1, 0]]: the C1 head carries W_x, the C2 head S W_x.
    d_in, length, gamma, theta = 4, 50, 0.93, 0.7
    w_x = torch.randn(2, d_in, generator=generator, dtype=torch.float64)
    x = torch.randn(3, length, d_in, generator=generator, dtype=torch.float64)
    rotation = torch.tensor([[math.cos(theta), math.sin(theta)], [-math.sin(theta), math.cos(theta)]])
    s = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    layer, hs, d_model = rem_layer(
        [CYCLIC_COS, CYCLIC_SIN, IDENTITY],
        [1, 1, 1],
        [w_x, s @ w_x, w_x],
        gamma=torch.full((3,), gamma),
        theta=torch.full((3,), theta),
    )
    expected = linear_rnn(gamma * rotation.double(), w_x, x)
    torch.testing.assert_close(run_layer(layer, x, hs, d_model), expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("dilation", [2, 5])
def test_dilated_rem_is_dilated_linear_rnn(generator, dilation):
    # Prop. 4: h_t = W_h h_{t-d} + W_x x_t with W_h = diag block of a real eigenvalue and a complex pair
    d_in, length, lam, gamma, theta = 3, 60, 0.9, 0.95, 1.1
    w_r = torch.randn(1, d_in, generator=generator, dtype=torch.float64)
    w_c = torch.randn(2, d_in, generator=generator, dtype=torch.float64)
    x = torch.randn(2, length, d_in, generator=generator, dtype=torch.float64)
    s = torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    # real eigenvalue: one output row
    layer, hs, d_model = rem_layer([REGULAR, IDENTITY], [dilation, 1], [w_r, w_r], lam=torch.tensor([lam, 0.0]))
    expected = linear_rnn(torch.tensor([[lam]], dtype=torch.float64), w_r, x, dilation)
    torch.testing.assert_close(run_layer(layer, x, hs, d_model), expected, atol=TOL, rtol=0)
    # complex pair
    layer, hs, d_model = rem_layer(
        [CYCLIC_COS, CYCLIC_SIN, IDENTITY],
        [dilation, dilation, 1],
        [w_c, s @ w_c, w_c],
        gamma=torch.full((3,), gamma),
        theta=torch.full((3,), theta),
    )
    rotation = gamma * torch.tensor([[math.cos(theta), math.sin(theta)], [-math.sin(theta), math.cos(theta)]])
    expected = linear_rnn(rotation.double(), w_c, x, dilation)
    torch.testing.assert_close(run_layer(layer, x, hs, d_model), expected, atol=TOL, rtol=0)


def test_real_jordan_decomposition_into_rem_heads_reproduces_linear_rnn():
    # Prop. 1-2: W_h with distinct eigenvalues (2 real, 1 complex pair) = B J B^{-1}; split by np.linalg.eig
    rng = np.random.default_rng(7)
    d, d_in, length = 4, 6, 45
    gamma, theta = 0.9, 0.8
    j_true = np.zeros((d, d))
    j_true[0, 0], j_true[1, 1] = 0.75, -0.6
    j_true[2:, 2:] = gamma * np.array([[np.cos(theta), np.sin(theta)], [-np.sin(theta), np.cos(theta)]])
    basis = rng.normal(size=(d, d)) + 2 * np.eye(d)
    w_h = basis @ j_true @ np.linalg.inv(basis)
    w_x = rng.normal(size=(d, d_in))

    eigenvalues, right = np.linalg.eig(w_h)
    left = np.linalg.inv(right)  # rows: left eigenvectors, so W_h^j = sum_k mu_k^j right_k left_k
    kinds, lams, gammas, thetas, blocks = [], [], [], [], []
    for k, mu in enumerate(eigenvalues):
        outer = np.outer(right[:, k], left[k])  # (d, d)
        if abs(mu.imag) < 1e-12:  # real eigenvalue -> regular REM, G^R = v w'
            kinds.append(REGULAR)
            lams.append(mu.real), gammas.append(0.5), thetas.append(0.0)
            blocks.append(outer.real @ w_x)
        elif mu.imag > 0:  # pair gamma e^{+-i theta} -> C1 (G = 2 Re M) and C2 (G = -2 Im M)
            for kind, g in ((CYCLIC_COS, 2 * outer.real), (CYCLIC_SIN, -2 * outer.imag)):
                kinds.append(kind)
                lams.append(0.5), gammas.append(abs(mu)), thetas.append(np.angle(mu))
                blocks.append(g @ w_x)
    assert kinds.count(REGULAR) == 2 and kinds.count(CYCLIC_COS) == 1
    kinds.append(IDENTITY)  # h_{0,t} = W_x x_t
    lams.append(0.5), gammas.append(0.5), thetas.append(0.0)
    blocks.append(w_x)
    layer, hs, d_model = rem_layer(
        kinds,
        [1] * len(kinds),
        [torch.tensor(b) for b in blocks],
        lam=torch.tensor(lams),
        gamma=torch.tensor(gammas),
        theta=torch.tensor(thetas),
    )
    x = torch.from_numpy(rng.normal(size=(2, length, d_in)))
    expected = linear_rnn(torch.from_numpy(w_h), torch.from_numpy(w_x), x)
    torch.testing.assert_close(run_layer(layer, x, hs, d_model), expected, atol=TOL, rtol=0)


def rem_one(kind, masked, dilation=1, power_cap=200, query=None, key=None, length=9):
    positions = torch.arange(length)
    return rem(
        torch.tensor([kind]),
        torch.tensor([0.7], dtype=torch.float64),
        torch.tensor([0.8], dtype=torch.float64),
        torch.tensor([0.5], dtype=torch.float64),
        torch.tensor([dilation]),
        positions if query is None else query,
        positions if key is None else key,
        masked,
        power_cap,
    )[0]


def test_rem_forms():
    masked = rem_one(REGULAR, True)
    # Eq. (3): strictly lower triangular Toeplitz with f_n = lambda^n
    assert torch.equal(masked, masked.tril(-1))
    assert masked[5, 2] == pytest.approx(0.7**3)
    # unmasked = P + P'
    torch.testing.assert_close(rem_one(REGULAR, False), masked + masked.T)
    # cyclical: gamma^n cos(n theta), gamma^n sin(n theta)
    assert rem_one(CYCLIC_COS, True)[6, 2] == pytest.approx(0.8**4 * math.cos(4 * 0.5))
    assert rem_one(CYCLIC_SIN, True)[6, 2] == pytest.approx(0.8**4 * math.sin(4 * 0.5))
    # dilated: nonzero only at lags divisible by d, exponent lag / d (App. D.1)
    dilated = rem_one(REGULAR, True, dilation=3)
    assert dilated[7, 1] == pytest.approx(0.7**2) and dilated[7, 2] == 0 and dilated[7, 4] == pytest.approx(0.7)
    # power cap K: exponents above K are masked
    capped = rem_one(REGULAR, True, power_cap=2)
    assert capped[5, 3] == pytest.approx(0.7**2) and capped[5, 2] == 0
    # non-square (App. D.2): queries at T-K..T+L, keys at 1..T, entry f_{|i - j|}
    query, key = torch.arange(6, 12), torch.arange(1, 9)
    wide = rem_one(REGULAR, False, query=query, key=key)
    assert wide.shape == (6, 8)
    assert wide[0, 0] == pytest.approx(0.7**5) and wide[2, 7] == 0
    assert wide[5, 7] == pytest.approx(0.7**3)


def test_gate_one_and_zero_qk_ignore_future_in_masked_rsa(generator):
    # with masked REMs, causal softmax and any gate, output at t depends only on x_{<=t}
    layer = RSAAttention(8, [REGULAR, CYCLIC_COS], [1, 2], masked=True).double()
    x = torch.randn(1, 12, 8, generator=generator, dtype=torch.float64)
    y = layer(x)
    x2 = x.clone()
    x2[:, 7] += 1.0
    torch.testing.assert_close(layer(x2)[:, :7], y[:, :7], atol=1e-12, rtol=0)


def test_forecaster_shapes_and_head_layout():
    config = RSAConfig(
        lookback=32,
        horizon=8,
        patch_len=8,
        stride=4,
        d_model=24,
        n_layers=1,
        n_heads=6,
        head_types=[1, 1, 1, 1, 1, 1],
        dilations=[2, 3],
    )
    model = RSAForecaster(config)
    assert model.blocks[0].attn.kinds.tolist() == [REGULAR, CYCLIC_COS, CYCLIC_SIN, REGULAR, CYCLIC_COS, CYCLIC_SIN]
    assert model.blocks[0].attn.dilations.tolist() == [1, 1, 1, 2, 3, 2]
    assert model(torch.randn(3, 32, 7)).shape == (3, 8, 7)
