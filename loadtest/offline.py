"""The RMT step graph alone, in the bench's process: what a served piece is compared with (``e2e``,
``throughput``).

:class:`OfflineSteps` loads the entry's ``step`` graph with the service's backend, device, precision and
thread settings (``load_backends``, as the service does) and times the very segments the served pieces
complete: one session's segments at batch 1 (memory carried), or step k of N sessions stacked at batch N.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.bench_inputs import SessionInput
from models.text_stream import Segment


class OfflineSteps:
    """The RMT entry's ``step`` graph loaded here with the service's backend, device, precision and thread
    settings."""

    def __init__(self, entry: Path, manifest: Mapping[str, Any], model: Mapping[str, Any], threads: int,
                 spinning: bool) -> None:
        from service.runtime.backends import load_backends
        from service.runtime.pipeline import load_initial_state

        self.step = load_backends(entry, manifest, model["backend"], threads, model.get("device", "cpu"),
                                  model.get("precision", "fp32"), spinning=spinning)["step"]
        self.memory = load_initial_state(entry)["memory"]  # (1, m, d)

    def _run(self, memory: np.ndarray, segments: list[Segment]) -> np.ndarray:
        ids = np.stack([segment[0] for segment in segments])
        mask = np.stack([segment[1] for segment in segments])
        return self.step.run({"memory": memory, "input_ids": ids, "attention_mask": mask})["next_memory"]

    def batch_one_seconds(self, sessions: Sequence[SessionInput]) -> list[float]:
        """Each session's segments one step at a time, memory carried; the time of every step."""
        times = []
        for session in sessions:
            memory = self.memory
            for segment in session.segments:
                started = time.perf_counter()
                memory = self._run(memory, [segment])
                times.append(time.perf_counter() - started)
        return times

    def batched_seconds(self, sessions: Sequence[SessionInput]) -> float:
        """Step k of every session stacked into one batch, for every k; the total time."""
        memory = np.repeat(self.memory, len(sessions), axis=0)
        started = time.perf_counter()
        for k in range(len(sessions[0].segments)):
            memory = self._run(memory, [session.segments[k] for session in sessions])
        return time.perf_counter() - started
