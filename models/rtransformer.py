"""R-Transformer: LocalRNN + multi-head attention + feed-forward (Wang et al., 2019).

Reference: ../shared/papers/r-transformer.txt.

- LocalRNN (Sec. 3.1, Eq. 2-3): for every position t a shared GRU reads the local window
  x_{t-M+1..t} and its last hidden state is h_t; the sequence is left-padded with M - 1 zero
  positions, so h_t never sees the future.
- Layer (Eq. 8), post-norm as in the paper:
  h = LocalRNN(x); h^ = LN(h + x); u = MHA(h^); u^ = LN(u + h^); m = FFN(u^); x' = LN(m + u^).
- No positional embedding: the LocalRNN carries order.
- ``RTransformerForecaster``: the same channel-independent patch shell as RSA
  (models/patch_forecaster.py). Attention is unmasked by default because the look-back is
  known as a whole; ``causal=True`` gives the paper's autoregressive masking.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.patch_forecaster import MultiHeadAttention, PatchConfig, PatchForecaster


@dataclass
class RTransformerConfig(PatchConfig):
    """The patch shell's configuration (``n_layers``: R-Transformer layers) and the LocalRNN's window."""

    window: int = 3  # M, LocalRNN window (tokens)
    causal: bool = False  # mask attention to the past (the paper's autoregressive setting)


class LocalRNN(nn.Module):
    """Eq. (2)-(3): h_t = GRU(x_{t-M+1}, ..., x_t), one GRU shared by all positions."""

    def __init__(self, d_model: int, window: int):
        super().__init__()
        self.window = window
        self.rnn = nn.GRU(d_model, d_model, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape  # (B, T, d)
        padded = F.pad(x, (0, 0, self.window - 1, 0))  # (B, T+M-1, d): M-1 zero positions on the left
        local = padded.unfold(1, self.window, 1)  # (B, T, d, M)
        local = local.permute(0, 1, 3, 2).reshape(batch * length, self.window, width)  # (B*T, M, d)
        _, last = self.rnn(local)  # (1, B*T, d)
        return last.reshape(batch, length, width)


class RTransformerLayer(nn.Module):
    """Eq. (8): LocalRNN, attention and feed-forward, each with a residual and a LayerNorm."""

    def __init__(self, config: RTransformerConfig):
        super().__init__()
        self.local_rnn = LocalRNN(config.d_model, config.window)
        self.ln_rnn = nn.LayerNorm(config.d_model)
        self.attn = MultiHeadAttention(config.d_model, config.n_heads, config.causal, config.dropout)
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.ffn = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff), nn.ReLU(), nn.Linear(config.d_ff, config.d_model)
        )
        self.ln_ffn = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_rnn(self.local_rnn(x) + x)  # h^ = LN(h + x)
        u = self.ln_attn(self.dropout(self.attn(h)) + h)  # u^ = LN(u + h^)
        return self.ln_ffn(self.dropout(self.ffn(u)) + u)  # x' = LN(m + u^)


class RTransformerForecaster(PatchForecaster):
    """(B, L, C) standardized look-back -> (B, H, C) forecast, R-Transformer encoder."""

    def __init__(self, config: RTransformerConfig):
        super().__init__(config)
        self.layers = nn.ModuleList(RTransformerLayer(config) for _ in range(config.n_layers))

    @property
    def blocks(self) -> nn.ModuleList:  # type: ignore[override]
        """The encoder: the paper's layers, under the name checkpoints give them (``layers``)."""
        return self.layers
