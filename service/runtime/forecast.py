"""Forecasting: series rows in, the next H rows out.

State (bounded by the configuration): the last L rows (``window``) and the
count of rows seen. Each piece of rows is one ``step`` of the exported graph.

**The values a model takes.** The graph standardizes each variable with the training scaler (``(x - mean) / std``)
and computes in float32, squaring its activations (LayerNorm's variance): past about 1.8e19, the square root of
float32's largest value, a square is infinite. A value is therefore taken within :data:`STANDARD_DEVIATIONS` of its
variable's training mean (``value_range``, in GET /models), which leaves the network a gain of ten million before
that; a row outside is refused (422, naming it). The forecast is checked as well: one that is not finite (e.g. a
model run at a lower precision) is refused too, never answered with nulls.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from service.runtime.batcher import DynamicBatcher
from service.runtime.pipeline import Arrays, Consumed, FinalResult, InputError, load_initial_state

STANDARD_DEVIATIONS = 1e12  # how far from its training mean a value may lie, in its variable's standard deviations


class ForecastPipeline:
    task = "forecast"
    input_kind = "rows"
    max_tokens = None
    generated_text = generated_tokens = None

    def __init__(self, manifest: Mapping[str, Any], entry: Path, graphs: Mapping[str, DynamicBatcher]) -> None:
        self.manifest = manifest
        self.step = graphs["step"]
        self.initial_state = load_initial_state(entry)
        settings = manifest["settings"]
        self.lookback, self.horizon = int(settings["lookback"]), int(settings["horizon"])
        self.variables = list(settings["variables"])  # the columns of a row
        self.targets = list(settings.get("targets", self.variables))  # the columns of the forecast
        mean, std = np.asarray(settings["scaler"]["mean"]), np.asarray(settings["scaler"]["std"])
        self.lowest, self.highest = mean - STANDARD_DEVIATIONS * std, mean + STANDARD_DEVIATIONS * std  # (C,)

    @property
    def value_range(self) -> dict[str, list[float]]:
        """Per variable, the lowest and highest value the model takes."""
        return {name: [float(low), float(high)]
                for name, low, high in zip(self.variables, self.lowest, self.highest, strict=True)}

    @property
    def row_width(self) -> int:
        return len(self.variables)

    @property
    def example(self) -> list[list[float]]:
        """A look-back's rows (for /docs' "Try it out"): each variable its training mean plus a daily swing of one
        standard deviation, so that the example forecasts."""
        scaler = self.manifest["settings"]["scaler"]
        return [[round(m + s * math.sin(2 * math.pi * t / 24 + j), 3)
                 for j, (m, s) in enumerate(zip(scaler["mean"], scaler["std"], strict=True))]
                for t in range(self.lookback)]

    def new_state(self) -> Arrays:
        return dict(self.initial_state)

    def rows_to_array(self, rows: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
        """The rows as the graph reads them, ``(1, T, C)`` float32; :class:`InputError` naming the first row or value
        the model cannot take. ``rows``: lists of numbers, or a float64 array of them (a fast path's)."""
        if len(rows) == 0:
            raise InputError("`rows` is empty: send at least one row")
        width = len(self.variables)
        try:
            values = np.asarray(rows, dtype=np.float64)  # (T, C)
        except ValueError:  # ragged rows
            values = None
        if values is None or values.ndim != 2 or values.shape[1] != width:
            for index, row in enumerate(rows):
                if len(row) != width:
                    raise InputError(
                        f"row {index} has {len(row)} values; this model reads {width} per row, in the order "
                        f"{self.variables}"
                    )
            raise InputError(f"`rows` must be a list of rows of {width} numbers each")
        inside = (values >= self.lowest) & (values <= self.highest)  # False for NaN too: one pass when all is well
        if inside.all():
            return values.astype(np.float32)[None]  # (1, T, C)
        if not np.isfinite(values).all():
            raise InputError("`rows` holds NaN or infinite values; fill or drop missing observations first")
        outside = np.argwhere(~inside)
        row, column = (int(i) for i in outside[0])
        raise InputError(
            f"rows[{row}][{column}] ({self.variables[column]}) is {values[row, column]:g}, outside what this "
            f"model takes: {self.lowest[column]:g} to {self.highest[column]:g} (its training mean ± "
            f"{STANDARD_DEVIATIONS:g} standard deviations, where its float32 arithmetic stays finite; GET /models: "
            f"value_range){f' ({len(outside)} values in all)' if len(outside) > 1 else ''}",
            loc=("body", "rows", row, column), kind="value_range",
        )

    async def consume(self, state: Mapping[str, np.ndarray], piece: Sequence[Sequence[float]]) -> Consumed:
        values = self.rows_to_array(piece)
        out = await self.step.submit({"window": state["window"], "rows_seen": state["rows_seen"], "values": values})
        new_state = {"window": out["next_window"], "rows_seen": out["next_rows_seen"]}
        return Consumed(new_state, self._result(out), units_read=values.shape[1], segments=1)

    async def finish(
        self, state: Mapping[str, np.ndarray], chunks: list[Arrays], last_result: Mapping[str, Any] | None,
        stream: bool = False, options: Mapping[str, Any] | None = None,
    ) -> FinalResult:
        """The forecast after the last piece: every step already produced it, nothing to recompute. With fewer
        rows than the look-back it is null and ``rows_needed`` says how many more (not an error: the schema
        allows any number of rows, and the answer says what is missing)."""
        if last_result is None:  # a session finished before any rows
            rows_seen = int(state["rows_seen"][0])
            return FinalResult({"forecast": None, "horizon": self.horizon, "variables": self.targets,
                             "rows_seen": rows_seen, "rows_needed": max(0, self.lookback - rows_seen)})
        return FinalResult(dict(last_result))

    def _result(self, out: Mapping[str, np.ndarray]) -> dict[str, Any]:
        rows_seen = int(out["next_rows_seen"][0])
        ready = bool(out["ready"][0])
        if ready and not np.isfinite(out["forecast"][0]).all():
            raise InputError(
                "the model's arithmetic overflowed on these rows and the look-back before them (its forecast is not "
                "finite): send values nearer the series' usual range", loc=("body", "rows"), kind="value_range",
            )
        return {
            # a float64 array (as JSON: the digits of the Python floats), not a Python float per value
            "forecast": np.ascontiguousarray(out["forecast"][0], dtype=np.float64) if ready else None,
            "horizon": self.horizon,
            "variables": self.targets,
            "rows_seen": rows_seen,
            "rows_needed": max(0, self.lookback - rows_seen),
        }
