"""The forecaster families by name, and a checkpoint's streaming segment model.

One place that knows every forecasting family (RSA, R-Transformer, the vanilla Transformer and
the ridge baseline), shared by the training recipe (``models.training.forecasters``) and the
serving adapter (``models.serving.forecasters``), so serving never imports a training script.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from models.checkpoint import load_checkpoint
from models.forecast_stream import ForecastStream, LinearConfig, LinearForecaster
from models.rsa import RSAConfig, RSAForecaster
from models.rtransformer import RTransformerConfig, RTransformerForecaster
from models.vanilla import VanillaConfig, VanillaForecaster

# family -> (config dataclass, model class)
FAMILIES: dict[str, tuple[type, type]] = {
    "rsa": (RSAConfig, RSAForecaster),
    "rtransformer": (RTransformerConfig, RTransformerForecaster),
    "vanilla": (VanillaConfig, VanillaForecaster),
    "linear": (LinearConfig, LinearForecaster),
}


def build_forecaster(family: str, config: dict[str, Any] | Any) -> nn.Module:
    """A forecaster of ``family`` from its config dataclass or that dataclass as a dict."""
    config_class, model_class = FAMILIES[family]
    if not dataclasses.is_dataclass(config):
        names = {f.name for f in dataclasses.fields(config_class)}
        config = config_class(**{key: value for key, value in config.items() if key in names})
    return model_class(config)


def load_stream(folder: str | Path) -> ForecastStream:
    """The streaming segment model of a checkpoint folder: forecaster + its scaler, eval mode."""
    checkpoint = load_checkpoint(folder)
    model = build_forecaster(checkpoint.family, checkpoint.config)
    model.load_state_dict(checkpoint.state_dict)
    scaler = checkpoint.extras["scaler"]
    stream = ForecastStream(model, len(scaler["mean"]), torch.tensor(scaler["mean"]), torch.tensor(scaler["std"]))
    return stream.eval()
