"""R-Transformer (Wang et al., 2019): LocalRNN locality and the Eq. (8) layer."""

from __future__ import annotations

import pytest
import torch

from models.rtransformer import LocalRNN, RTransformerConfig, RTransformerForecaster, RTransformerLayer


@pytest.mark.parametrize("window", [1, 3, 5])
def test_local_rnn_output_depends_only_on_its_window(window):
    # h_t = LocalRNN(x_{t-M+1..t}): perturbing x_s changes h_t exactly for s <= t <= s + M - 1
    torch.manual_seed(0)
    rnn = LocalRNN(6, window).double()
    x = torch.randn(2, 16, 6, dtype=torch.float64)
    base = rnn(x)
    for s in (0, 5, 15):
        perturbed = x.clone()
        perturbed[:, s] += torch.randn(2, 6, dtype=torch.float64)
        changed = (rnn(perturbed) - base).abs().amax(dim=(0, 2)) > 1e-12  # (T,)
        expected = torch.zeros(16, dtype=torch.bool)
        expected[s : s + window] = True
        assert torch.equal(changed, expected), (s, changed.tolist())


def test_local_rnn_equals_gru_on_each_padded_window():
    torch.manual_seed(1)
    rnn = LocalRNN(4, 3).double()
    x = torch.randn(1, 7, 4, dtype=torch.float64)
    padded = torch.cat([torch.zeros(1, 2, 4, dtype=torch.float64), x], dim=1)
    for t in range(7):
        _, last = rnn.rnn(padded[:, t : t + 3])
        torch.testing.assert_close(rnn(x)[:, t], last[0], atol=1e-12, rtol=0)


def test_causal_layer_ignores_the_future():
    torch.manual_seed(2)
    config = RTransformerConfig(d_model=8, n_heads=2, window=3, causal=True, dropout=0.0)
    layer = RTransformerLayer(config).double().eval()
    x = torch.randn(1, 10, 8, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 6] += 1.0
    torch.testing.assert_close(layer(x2)[:, :6], layer(x)[:, :6], atol=1e-12, rtol=0)


def test_forecaster_shape():
    config = RTransformerConfig(lookback=32, horizon=8, patch_len=8, stride=8, d_model=8, n_heads=2, n_layers=1)
    assert RTransformerForecaster(config)(torch.randn(2, 32, 7)).shape == (2, 8, 7)
