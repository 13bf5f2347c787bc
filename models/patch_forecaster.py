"""The forecasting shell the neural forecaster families share (RSA, R-Transformer, vanilla).

- ``PatchForecaster``: look-back window (B, L, C) -> forecast (B, H, C). Channel-independent
  (each variable is its own series, one model shared by all), normalized per window by
  subtracting the window's last value, a direct linear path from the look-back to the horizon
  plus an encoder over patch tokens with a flattened linear head. Families supply only the
  encoder's blocks (``PatchConfig`` configures the shell).
- What the families' encoders share: ``MultiHeadAttention`` (softmax, optionally causal),
  ``FeedForward`` and the pre-norm residual block ``PreNormBlock`` around a family's attention.

The ridge baseline in the same shape is ``models/linear.py``; the segment model that streams any of
them is ``models/forecast_stream.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class PatchConfig:
    n_vars: int = 7  # variables of the series (channel-independent: only recorded)
    lookback: int = 96  # L, rows of history the forecaster reads
    horizon: int = 24  # H, rows it forecasts
    patch_len: int = 8  # rows per token
    stride: int = 8  # rows between token starts
    d_model: int = 32  # token width
    n_layers: int = 2  # encoder blocks
    n_heads: int = 4  # attention heads per layer
    d_ff: int = 64  # feed-forward width
    dropout: float = 0.1


class MultiHeadAttention(nn.Module):
    """Softmax multi-head self-attention (Vaswani et al., 2017), optionally causal."""

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


class FeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class PreNormBlock(nn.Module):
    """Pre-norm transformer block around a family's attention: x + attn(LN(x)), then x + FFN(LN(x))."""

    def __init__(self, attn: nn.Module, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = attn
        self.ln2 = nn.LayerNorm(d_model)
        self.ffn = FeedForward(d_model, d_ff, dropout)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.ln1(x)))
        return x + self.ffn(self.ln2(x))


class PatchForecaster(nn.Module):
    """Shell: normalize, patch, encode (the family's ``blocks``, in order), head; plus a direct linear path."""

    blocks: nn.ModuleList  # the family's encoder, set by its constructor

    def __init__(self, config: PatchConfig):
        super().__init__()
        lookback, horizon, patch_len, stride = config.lookback, config.horizon, config.patch_len, config.stride
        if patch_len > lookback or (lookback - patch_len) % stride:
            raise ValueError(f"patches of {patch_len} every {stride} do not tile a look-back of {lookback}")
        self.config = config
        self.lookback, self.horizon, self.patch_len, self.stride = lookback, horizon, patch_len, stride
        self.n_tokens = (lookback - patch_len) // stride + 1
        self.linear = nn.Linear(lookback, horizon)  # direct path: window minus last value -> horizon
        self.embed = nn.Linear(patch_len, config.d_model)  # patch -> token
        self.norm = nn.LayerNorm(config.d_model)
        self.head_dropout = nn.Dropout(config.dropout)
        self.head = nn.Linear(self.n_tokens * config.d_model, horizon)

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:  # (B*C, N, d) -> (B*C, N, d)
        for block in self.blocks:
            tokens = block(tokens)
        return tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, lookback, n_vars = x.shape  # (B, L, C), standardized values
        last = x[:, -1:, :]  # (B, 1, C)
        z = (x - last).transpose(1, 2).reshape(batch * n_vars, lookback)  # (B*C, L)
        tokens = self.embed(z.unfold(-1, self.patch_len, self.stride))  # (B*C, N, d)
        h = self.norm(self.encode(tokens))  # (B*C, N, d)
        y = self.linear(z) + self.head(self.head_dropout(h.flatten(1)))  # (B*C, H)
        return y.reshape(batch, n_vars, self.horizon).transpose(1, 2) + last  # (B, H, C)
