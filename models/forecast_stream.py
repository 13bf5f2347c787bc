"""The forecasting shell every forecaster family shares, and its streaming segment model.

- ``PatchForecaster``: look-back window (B, L, C) -> forecast (B, H, C). Channel-independent
  (each variable is its own series, one model shared by all), normalized per window by
  subtracting the window's last value, a direct linear path from the look-back to the horizon
  plus an encoder over patch tokens with a flattened linear head. Families (RSA,
  R-Transformer, vanilla) supply only the encoder's blocks (``PatchConfig`` configures the shell).
- What the families' encoders share: ``MultiHeadAttention`` (softmax, optionally causal),
  ``FeedForward`` and the pre-norm residual block ``PreNormBlock`` around a family's attention.
- ``LinearForecaster``: the channel-independent ridge baseline in the same shape.
- ``ForecastStream``: the segment model of docs/architecture.md. Its state is a fixed-size look-back
  buffer and a row counter, so it is bounded by the configuration, never by the stream.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.segment import State, TensorSpec


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


@dataclass
class LinearConfig:
    n_vars: int = 7  # variables of the series (channel-independent: only recorded)
    lookback: int = 96  # L, rows of history
    horizon: int = 24  # H, rows forecast
    alpha: float = 1.0  # ridge penalty the weights were fitted with (closed form, not SGD)


class LinearForecaster(nn.Module):
    """Ridge baseline: one linear map, shared by all variables, from window minus its last value."""

    def __init__(self, config: LinearConfig):
        super().__init__()
        self.config = config
        self.lookback, self.horizon = config.lookback, config.horizon
        self.linear = nn.Linear(config.lookback, config.horizon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = x[:, -1:, :]  # (B, 1, C)
        y = self.linear((x - last).transpose(1, 2))  # (B, C, H)
        return y.transpose(1, 2) + last  # (B, H, C)


class ForecastStream(nn.Module):
    """Segment model for forecasting: observations arrive in chunks of any size.

    state:   ``window`` (B, L, C) float32, the last L rows seen (zeros before they exist);
             ``rows_seen`` (B,) int64.
    segment: ``values`` (B, T, C) float32 in data units, T >= 1.
    output:  ``forecast`` (B, H, K) in data units of the K ``targets`` (column indices; default all C),
             valid where ``ready`` (rows_seen >= L).
    ``step`` is tensor ops only (concatenate, keep the last L rows), so it exports as one graph
    with a dynamic batch and chunk axis. The scaler lives in the module as constants.
    """

    def __init__(self, forecaster: nn.Module, n_vars: int, mean: torch.Tensor, std: torch.Tensor,
                 targets: Sequence[int] | None = None):
        super().__init__()
        self.forecaster = forecaster
        self.lookback, self.horizon, self.n_vars = forecaster.lookback, forecaster.horizon, n_vars
        self.register_buffer("mean", torch.as_tensor(mean, dtype=torch.float32).reshape(1, 1, n_vars))
        self.register_buffer("std", torch.as_tensor(std, dtype=torch.float32).reshape(1, 1, n_vars))
        # every column is read; only the targets are answered (None: all, and the graph has no gather)
        self.targets = None if targets is None or list(targets) == list(range(n_vars)) else list(targets)
        self.n_targets = n_vars if self.targets is None else len(self.targets)

    def state_spec(self) -> list[TensorSpec]:
        return [
            TensorSpec("window", "float32", ("batch", self.lookback, self.n_vars)),
            TensorSpec("rows_seen", "int64", ("batch",)),
        ]

    def init_state(self, batch: int) -> State:
        return {
            "window": torch.zeros(batch, self.lookback, self.n_vars, dtype=self.mean.dtype),
            "rows_seen": torch.zeros(batch, dtype=torch.int64),
        }

    def step(self, state: Mapping[str, torch.Tensor], segment: Mapping[str, torch.Tensor]) -> tuple[State, State]:
        values = segment["values"].to(self.mean.dtype)  # (B, T, C)
        window = torch.cat([state["window"], values], dim=1)[:, -self.lookback :]  # (B, L, C)
        rows_seen = state["rows_seen"] + values.shape[1]  # (B,)
        forecast = self.forecaster((window - self.mean) / self.std) * self.std + self.mean  # (B, H, C)
        if self.targets is not None:
            forecast = forecast[:, :, self.targets]  # (B, H, K)
        output = {"forecast": forecast, "ready": rows_seen >= self.lookback}
        return {"window": window, "rows_seen": rows_seen}, output

    def readout(self, state: Mapping[str, torch.Tensor], output: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The forecast of the next H rows (B, H, K); NaN for sessions that have seen fewer than L rows."""
        ready = output["ready"].reshape(-1, 1, 1)
        return torch.where(ready, output["forecast"], torch.full_like(output["forecast"], float("nan")))
