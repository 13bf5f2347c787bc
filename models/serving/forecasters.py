"""Forecasters (RSA, R-Transformer, vanilla, linear) as one servable graph: the ``ForecastStream`` step.

The step *is* the exported graph, so a series streamed in pieces equals the series posted whole
by construction (docs/architecture.md, "The segment contract").
"""

from __future__ import annotations

import torch
import torch.nn as nn

from models.checkpoint import Checkpoint
from models.families import family
from models.forecast_stream import ForecastStream
from models.serving.servable import Graph, Servable
from models.tensor_spec import TensorSpec


def columns_and_targets(checkpoint: Checkpoint) -> tuple[list[str], list[str]]:
    """The columns a forecaster reads, in row order, and the ones it forecasts (all, unless it was trained on
    a chosen target set)."""
    n_vars = len(checkpoint.extras["scaler"]["mean"])
    columns = list(checkpoint.extras.get("variables", [f"x{i}" for i in range(n_vars)]))
    return columns, list(checkpoint.extras.get("targets", columns))


def load_stream(checkpoint: Checkpoint) -> ForecastStream:
    """The streaming segment model of a forecaster checkpoint: the family's model + the checkpoint's scaler,
    answering its targets."""
    model = family(checkpoint.family).build_model(checkpoint.config)
    model.load_state_dict(checkpoint.state_dict)
    scaler = checkpoint.extras["scaler"]
    columns, targets = columns_and_targets(checkpoint)
    stream = ForecastStream(model, len(scaler["mean"]), torch.tensor(scaler["mean"]), torch.tensor(scaler["std"]),
                            [columns.index(name) for name in targets])
    return stream.eval()


class ForecastStep(nn.Module):
    """(window, rows_seen, values) -> (window', rows_seen', forecast, ready)."""

    def __init__(self, stream: nn.Module) -> None:
        super().__init__()
        self.stream = stream

    def forward(
        self, window: torch.Tensor, rows_seen: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        state, output = self.stream.step({"window": window, "rows_seen": rows_seen}, {"values": values})
        return state["window"], state["rows_seen"], output["forecast"], output["ready"]


def forecast_servable(checkpoint: Checkpoint) -> Servable:
    stream = load_stream(checkpoint)
    lookback, horizon, n_vars = stream.lookback, stream.horizon, stream.n_vars
    columns, targets = columns_and_targets(checkpoint)
    scaler = checkpoint.extras["scaler"]

    def sample_inputs(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        mean = torch.tensor(scaler["mean"], dtype=torch.float32)
        std = torch.tensor(scaler["std"], dtype=torch.float32)
        window = torch.randn(batch, lookback, n_vars, generator=generator) * std + mean
        rows_seen = torch.randint(0, 3 * lookback, (batch,), generator=generator)
        length = int(torch.randint(2, lookback + 8, (1,), generator=generator))  # >= 2: no 0/1 specialization
        values = torch.randn(batch, length, n_vars, generator=generator) * std + mean
        return window, rows_seen, values

    window_spec = TensorSpec("window", "float32", ("batch", lookback, n_vars))
    rows_spec = TensorSpec("rows_seen", "int64", ("batch",))
    graph = Graph(
        name="step",
        module=ForecastStep(stream),
        inputs=[window_spec, rows_spec, TensorSpec("values", "float32", ("batch", "rows", n_vars))],
        outputs=[
            TensorSpec("next_window", "float32", ("batch", lookback, n_vars)),
            TensorSpec("next_rows_seen", "int64", ("batch",)),
            TensorSpec("forecast", "float32", ("batch", horizon, len(targets))),
            TensorSpec("ready", "bool", ("batch",)),
        ],
        sample_inputs=sample_inputs,
        state_outputs={"window": "next_window", "rows_seen": "next_rows_seen"},
    )
    return Servable(
        name="",
        task="forecast",
        family=checkpoint.family,
        graphs=[graph],
        state_spec=[window_spec, rows_spec],
        settings={
            "lookback": lookback,
            "horizon": horizon,
            "variables": columns,  # what a row holds, in order
            "targets": targets,  # what the forecast holds, in order
            "protocol": checkpoint.extras.get("protocol", "informer"),  # how `rtserve eval` cuts a --data file
            "scaler": scaler,
            "metrics": checkpoint.extras.get("metrics", {}),
        },
    )
