"""How fast the machine runs right now: its interpreter and the forecaster's step graph, each timed alone.

A shared 2-core VM's speed drifts with its neighbours: on one machine ten million Python additions took 1.97 s of
CPU at one hour and 0.80-0.88 s the next. The ratios of two servers measured side by side in one run hold; their
milliseconds do not. ``rtserve bench`` takes the pace before its scenarios and after them, so that its report says
how fast its machine ran, and whether that moved during the run:

- ``python_s``: the CPU seconds of :data:`PYTHON_ADDITIONS` additions in a Python loop, in the bench's process: the
  interpreter alone, in a loop that fits the first-level cache (on that machine the loop's fastest hour was not its
  servers' fastest, as a neighbour taking the host's caches or memory bandwidth would do);
- ``step_ms_per_row``: the CPU milliseconds a row of the forecaster's step graph costs, :data:`STEP_ROWS` sessions'
  pieces of :data:`PIECE_ROWS` rows stacked, on ONNX Runtime with one thread, not spinning, the median of
  :data:`STEP_CALLS` calls (the step both servers run). None without the graph.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("rtserve.bench")

PYTHON_ADDITIONS = 10_000_000
STEP_ROWS = 16  # sessions stacked in a step: the batch of rtserve's streams at 16 sessions
PIECE_ROWS = 24  # a piece's rows (the bench's RSA pieces): the size of every open axis of the inputs but the batch
STEP_CALLS = 100
DRIFT = 0.15  # a pace that moved by more than this during the run is said in the report


def python_seconds(additions: int = PYTHON_ADDITIONS) -> float:
    """CPU seconds of ``additions`` additions in a Python loop."""
    started = time.process_time()
    total = 0
    for number in range(additions):
        total += number
    return time.process_time() - started


def step_ms_per_row(step: Path, rows: int = STEP_ROWS, calls: int = STEP_CALLS) -> float:
    """CPU milliseconds a row of the graph at ``step`` costs at a batch of ``rows`` (the module's docstring)."""
    from service.runtime.backends import onnx_session

    session = onnx_session(step, intra_op_threads=1)  # as the service opens a light graph on a CPU
    generator = np.random.default_rng(0)
    feed = {}
    for node in session.get_inputs():
        shape = [rows if axis == 0 else (size if isinstance(size, int) else PIECE_ROWS)
                 for axis, size in enumerate(node.shape)]
        if node.type == "tensor(float)":
            feed[node.name] = generator.standard_normal(shape).astype(np.float32)
        elif node.type == "tensor(int64)":
            feed[node.name] = np.full(shape, PIECE_ROWS, dtype=np.int64)
        else:
            raise ValueError(f"{step}: input {node.name} is {node.type}; the pace times float and int64 inputs")
    for _ in range(10):  # warm-up
        session.run(None, feed)
    spent = []
    for _ in range(calls):
        started = time.process_time()
        session.run(None, feed)
        spent.append(time.process_time() - started)
    return 1000 * statistics.median(spent) / rows


def pace(step: Path | None) -> dict[str, float | None]:
    """The machine's pace now: ``python_s`` and ``step_ms_per_row`` (None without ``step``, or where ONNX Runtime
    cannot run it here: logged, and the run goes on, since the pace only describes the machine)."""
    step_ms = None
    if step is not None:
        try:
            step_ms = step_ms_per_row(step)
        except Exception as error:  # onnxruntime's own errors (a file it cannot load, an input it cannot feed)
            log.warning("the machine's pace leaves out the step of %s: %s", step, error)
    return {"python_s": python_seconds(), "step_ms_per_row": step_ms}


def drift_note(before: Mapping[str, Any], after: Mapping[str, Any]) -> str | None:
    """A sentence when a pace moved by more than :data:`DRIFT` from before the run to after it; None otherwise."""
    moved = [f"{label} {before[key]:.3g} -> {after[key]:.3g}"
             for key, label in (("python_s", "Python additions s"), ("step_ms_per_row", "step ms a row"))
             if before.get(key) and after.get(key) and abs(after[key] / before[key] - 1) > DRIFT]
    if not moved:
        return None
    return (f"the machine's pace moved during the run ({'; '.join(moved)}): its ratios, each measured side by side "
            "within a repeat, hold; its milliseconds belong to no one pace")
