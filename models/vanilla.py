"""Vanilla Transformer forecaster: the RSA forecaster's baseline of the same size.

Softmax multi-head attention (Vaswani et al., 2017) with sinusoidal absolute positions added
to the patch tokens, in the same shell as ``RSAForecaster`` (models/forecast_stream.py): the
only difference from RSA is the attention (no REMs, no gate) and the positional encoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.forecast_stream import PatchForecaster
from models.rsa import FeedForward


@dataclass
class VanillaConfig:
    n_vars: int = 7  # variables of the series (channel-independent: only recorded)
    lookback: int = 96  # L, rows of history the forecaster reads
    horizon: int = 24  # H, rows it forecasts
    patch_len: int = 8  # rows per token
    stride: int = 8  # rows between token starts
    d_model: int = 32  # token width
    n_layers: int = 2  # transformer blocks
    n_heads: int = 4  # attention heads per layer
    d_ff: int = 64  # feed-forward width
    dropout: float = 0.1


def sinusoidal_positions(length: int, width: int) -> torch.Tensor:
    """(T, d) sin/cos positional encoding of Vaswani et al. (2017), Sec. 3.5."""
    position = torch.arange(length, dtype=torch.float32)[:, None]  # (T, 1)
    frequency = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: width // 2])
    return table


class SelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by {n_heads} heads")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape  # (B, T, d)
        hs = width // self.n_heads
        q, k, v = (t.view(batch, length, self.n_heads, hs).transpose(1, 2) for t in self.qkv(x).split(width, 2))
        att = F.softmax(q @ k.transpose(-2, -1) / math.sqrt(hs), dim=-1)  # (B, nh, T, T)
        y = self.dropout(att) @ v  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, config: VanillaConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config.d_model, config.n_heads, config.dropout)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.ln1(x)))
        return x + self.ffn(self.ln2(x))


class VanillaForecaster(PatchForecaster):
    """(B, L, C) standardized look-back -> (B, H, C) forecast, softmax-attention encoder."""

    def __init__(self, config: VanillaConfig):
        super().__init__(
            config.lookback, config.horizon, config.patch_len, config.stride, config.d_model, config.dropout
        )
        self.config = config
        self.register_buffer("positions", sinusoidal_positions(self.n_tokens, config.d_model), persistent=False)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:  # (B*C, N, d)
        tokens = tokens + self.positions
        for block in self.blocks:
            tokens = block(tokens)
        return tokens
