"""The ridge baseline forecaster (family "linear"): one linear map from the look-back to the horizon.

Channel-independent like the patch forecasters (``models/patch_forecaster.py``): every variable is its own
series, read minus the window's last value, and one map is shared by all. Its weights are fitted in closed
form (``models/training/forecasters.py``), not by SGD.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn


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
