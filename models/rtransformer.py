"""R-Transformer: LocalRNN + multi-head attention + feed-forward (Wang et al., 2019).

Reference: ../shared/papers/r-transformer.txt.

- LocalRNN (Sec. 3.1, Eq. 2-3): for every position t a shared GRU reads the local window
  x_{t-M+1..t} and its last hidden state is h_t; the sequence is left-padded with M - 1 zero
  positions, so h_t never sees the future.
- Layer (Eq. 8), post-norm as in the paper:
  h = LocalRNN(x); h^ = LN(h + x); u = MHA(h^); u^ = LN(u + h^); m = FFN(u^); x' = LN(m + u^).
- No positional embedding: the LocalRNN carries order.
- ``RTransformerForecaster``: the same channel-independent patch shell as RSA
  (models/forecast_stream.py). Attention is unmasked by default because the look-back is
  known as a whole; ``causal=True`` gives the paper's autoregressive masking.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.forecast_stream import PatchForecaster


@dataclass
class RTransformerConfig:
    n_vars: int = 7  # variables of the series (channel-independent: only recorded)
    lookback: int = 96  # L, rows of history the forecaster reads
    horizon: int = 24  # H, rows it forecasts
    patch_len: int = 8  # rows per token
    stride: int = 8  # rows between token starts
    d_model: int = 32  # token width
    n_layers: int = 2  # R-Transformer layers
    n_heads: int = 4  # attention heads per layer
    window: int = 3  # M, LocalRNN window (tokens)
    d_ff: int = 64  # feed-forward width
    causal: bool = False  # mask attention to the past (the paper's autoregressive setting)
    dropout: float = 0.1


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


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, causal: bool, dropout: float):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by {n_heads} heads")
        self.n_heads, self.causal = n_heads, causal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape  # (B, T, d)
        hs = width // self.n_heads
        q, k, v = (t.view(batch, length, self.n_heads, hs).transpose(1, 2) for t in self.qkv(x).split(width, 2))
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T)
        if self.causal:
            mask = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        y = self.dropout(F.softmax(scores, dim=-1)) @ v  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


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
        super().__init__(
            config.lookback, config.horizon, config.patch_len, config.stride, config.d_model, config.dropout
        )
        self.config = config
        self.layers = nn.ModuleList(RTransformerLayer(config) for _ in range(config.n_layers))

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:  # (B*C, N, d)
        for layer in self.layers:
            tokens = layer(tokens)
        return tokens
