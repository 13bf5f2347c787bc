"""Which way a torch step runs on its device: eagerly, as captured CUDA graphs, or ``torch.compile``'d.

The choice is measured, not guessed: ``benchmarks/step_modes.py`` (run by ``benchmarks/gpu_run.sh`` on the GPU host)
times each graph of a model offline at every batch bucket in each mode and writes the fastest into the entry, as
``step_modes.json`` (:func:`write_record`)::

    {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "measured_at": "...",
     "graphs": {"step": {"mode": "graphs", "rates": {"eager": {"1": 280.1, ...}, "graphs": {...}}}}}

The service reads it at load (:func:`choose`): with ``RTSERVE_STEP_MODE=auto`` (the default) a graph runs in the
mode its record names, eagerly where there is none; ``eager``, ``graphs`` or ``compile`` (per model:
``RTSERVE_MODEL_STEP_MODES``) force one. On a CPU, and for a decode graph (rows of different lengths, re-formed at
every join: no fixed shapes to capture), the step always runs eagerly.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.runtime.step_graphs import MODES

RECORD = "step_modes.json"
SETTINGS = ("auto", *MODES)


@dataclass(frozen=True)
class Choice:
    mode: str  # one of MODES
    why: str  # for the load's log line


def read_record(entry: Path) -> dict[str, Any] | None:
    path = entry / RECORD
    if not path.is_file():
        return None
    record: dict[str, Any] = json.loads(path.read_text())
    return record


def choose(setting: str, graph: Mapping[str, Any], device: str, record: Mapping[str, Any] | None) -> Choice:
    """The mode of ``graph`` (its manifest entry) on ``device`` under ``setting`` (auto, eager, graphs, compile)."""
    if setting not in SETTINGS:
        raise ValueError(f"unknown step mode {setting!r}; choose one of {SETTINGS}")
    if not device.startswith("cuda"):
        return Choice("eager", "on the CPU")
    if graph.get("axis_masks"):
        return Choice("eager", "a decode graph (rows of different lengths)")
    if setting != "auto":
        return Choice(setting, "set (RTSERVE_STEP_MODE or RTSERVE_MODEL_STEP_MODES)")
    measured = ((record or {}).get("graphs") or {}).get(graph["name"])
    if not measured:
        return Choice("eager", f"no {RECORD} measure of this graph")
    return Choice(str(measured["mode"]), f"the fastest offline on {record.get('device')} ({RECORD})")  # type: ignore[union-attr]


def fastest(rates: Mapping[str, Mapping[str, float]]) -> str:
    """The mode with the most segments/s summed over the batch buckets every mode measured (each bucket weighs by
    its own rate: the large buckets, where a saturated service runs, count most)."""
    common = set.intersection(*(set(by_batch) for by_batch in rates.values()))
    return max(rates, key=lambda mode: (sum(rates[mode][b] for b in common), mode == "eager"))


def write_record(entry: Path, device: str, torch_version: str,
                 rates: Mapping[str, Mapping[str, Mapping[str, float]]], notes: Mapping[str, str] | None = None
                 ) -> dict[str, Any]:
    """Record per graph the fastest mode and every mode's segments/s per batch (``rates[graph][mode][batch]``)."""
    record = {"device": device, "torch": torch_version, "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
              "graphs": {graph: {"mode": fastest(by_mode), "rates": by_mode,
                                 **({"note": notes[graph]} if notes and graph in notes else {})}
                         for graph, by_mode in rates.items()}}
    (entry / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record
