"""ETTh1 under the Informer protocol (Zhou et al., AAAI 2021; see ../shared/data/README.md).

- Split: 12/4/4 months of hourly rows, borders [0, 8640), [8640 - L, 11520), [11520 - L, 14400),
  where L is the look-back, so the first val/test window's input may reach back into the
  previous split while every target row lies inside its own split.
- Scaler: per-variable mean and std fitted on the training rows only; MSE and MAE are
  reported on standardized values (all 7 variables).
- Windows: every start t with x = rows[t : t + L] and y = rows[t + L : t + L + H].
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

TRAIN_END = 12 * 30 * 24  # 8640 rows: 12 months of 30 days
VAL_END = TRAIN_END + 4 * 30 * 24  # 11520
TEST_END = TRAIN_END + 8 * 30 * 24  # 14400
SPLITS = ("train", "val", "test", "all")


@dataclass
class Series:
    values: np.ndarray  # (T, C) float64, raw units
    names: list[str]  # C variable names
    dates: list[str]  # T timestamps as written in the file


def read_csv(path: str | Path) -> Series:
    """A CSV with a leading date column and numeric columns after it (the ETT layout)."""
    with open(path, newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        rows = [row for row in reader if row]
    dates = [row[0] for row in rows]
    values = np.asarray([[float(cell) for cell in row[1:]] for row in rows], dtype=np.float64)
    return Series(values, header[1:], dates)


@dataclass
class Scaler:
    mean: np.ndarray  # (C,)
    std: np.ndarray  # (C,)

    @classmethod
    def fit(cls, values: np.ndarray) -> Scaler:
        return cls(values.mean(axis=0), values.std(axis=0))

    def transform(self, values: np.ndarray) -> np.ndarray:
        return (values - self.mean) / self.std

    def inverse(self, values: np.ndarray) -> np.ndarray:
        return values * self.std + self.mean

    def as_dict(self) -> dict[str, list[float]]:
        return {"mean": [float(v) for v in self.mean], "std": [float(v) for v in self.std]}

    @classmethod
    def from_dict(cls, document: dict[str, list[float]]) -> Scaler:
        return cls(np.asarray(document["mean"], dtype=np.float64), np.asarray(document["std"], dtype=np.float64))


def split_rows(n_rows: int, split: str, lookback: int) -> tuple[int, int]:
    """Row range [start, end) of a split: the Informer borders, the look-back reaching back."""
    if split == "all":
        return 0, n_rows
    if n_rows < TEST_END:
        raise ValueError(f"the Informer split needs {TEST_END} rows, the file has {n_rows}; use --split all")
    borders = {"train": (0, TRAIN_END), "val": (TRAIN_END - lookback, VAL_END), "test": (VAL_END - lookback, TEST_END)}
    if split not in borders:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS}")
    return borders[split]


def windows(values: np.ndarray, lookback: int, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """All sliding windows of a (T, C) array: x (N, L, C) and y (N, H, C), as strided views."""
    n = values.shape[0] - lookback - horizon + 1
    if n <= 0:
        raise ValueError(f"{values.shape[0]} rows are too few for look-back {lookback} + horizon {horizon}")
    view = np.lib.stride_tricks.sliding_window_view(values, lookback + horizon, axis=0)  # (N, C, L+H)
    view = view.transpose(0, 2, 1)  # (N, L+H, C)
    return view[:n, :lookback], view[:n, lookback:]


def load_split(
    path: str | Path, split: str, lookback: int, horizon: int, scaler: Scaler | None = None
) -> tuple[np.ndarray, np.ndarray, Scaler, list[str]]:
    """Standardized windows of one split; the scaler is fitted on the train rows unless given."""
    series = read_csv(path)
    if scaler is None:
        scaler = Scaler.fit(series.values[:TRAIN_END])
    start, end = split_rows(len(series.values), split, lookback)
    x, y = windows(scaler.transform(series.values[start:end]), lookback, horizon)
    return x, y, scaler, series.names


def windows_to_score(path: str | Path, split: str, settings: Mapping[str, Any], scaler: Scaler,
                     read: Callable[..., Any]) -> tuple[np.ndarray, np.ndarray, str]:
    """Standardized windows (x (N, L, C), y (N, H, C)) a forecaster is scored on, and the split's name.

    A model trained on a user's files (``settings["protocol"] == "files"``) is scored on every window of
    ``path``, read with the family's reader ``read`` and the model's columns; any other on the Informer
    ``split`` of an ETT-layout file. ``settings``: a checkpoint's extras or an exported entry's settings.
    """
    lookback, horizon = int(settings["lookback"]), int(settings["horizon"])
    if settings.get("protocol", "informer") == "files":
        series = read(path, settings["variables"], settings.get("targets"))
        series.check_length(lookback, horizon)
        x, y = windows(scaler.transform(series.values), lookback, horizon)
        return x, y, "all"
    x, y, _, _ = load_split(path, split, lookback, horizon, scaler)
    return x, y, split
