"""The forecasting segment model (docs/architecture.md): observations stream in, forecasts come out.

``ForecastStream`` wraps any forecaster (a patch forecaster, ``models/patch_forecaster.py``, or the ridge
baseline, ``models/linear.py``). Its state is a fixed-size look-back buffer and a row counter, so it is
bounded by the configuration, never by the stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn as nn

from models.segment import State, TensorSpec


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
