"""Vanilla Transformer forecaster: the RSA forecaster's baseline of the same size.

Softmax multi-head attention (Vaswani et al., 2017) with sinusoidal absolute positions added
to the patch tokens, in the same shell as ``RSAForecaster`` (models/patch_forecaster.py): the
only difference from RSA is the attention (no REMs, no gate) and the positional encoding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from models.patch_forecaster import MultiHeadAttention, PatchConfig, PatchForecaster, PreNormBlock


@dataclass
class VanillaConfig(PatchConfig):
    """The shell's configuration alone: the vanilla Transformer adds nothing to it."""


def sinusoidal_positions(length: int, width: int) -> torch.Tensor:
    """(T, d) sin/cos positional encoding of Vaswani et al. (2017), Sec. 3.5."""
    position = torch.arange(length, dtype=torch.float32)[:, None]  # (T, 1)
    frequency = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: width // 2])
    return table


class VanillaForecaster(PatchForecaster):
    """(B, L, C) standardized look-back -> (B, H, C) forecast, softmax-attention encoder."""

    def __init__(self, config: VanillaConfig):
        super().__init__(config)
        self.register_buffer("positions", sinusoidal_positions(self.n_tokens, config.d_model), persistent=False)
        self.blocks = nn.ModuleList(
            PreNormBlock(MultiHeadAttention(config.d_model, config.n_heads, False, config.dropout), config.d_model,
                         config.d_ff, config.dropout)
            for _ in range(config.n_layers)
        )

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:  # (B*C, N, d)
        return super().encode(tokens + self.positions)
