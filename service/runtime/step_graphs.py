"""A torch step at the device's real speed: the step replayed as a captured CUDA graph, per batch bucket.

A small recurrent step on a GPU is launch-bound (a 6-layer MiniLM over 138 positions: 3.5 ms at batch 1 and 4.9 ms
at batch 32 in eager torch on an H200, most of it Python and kernel launches). A CUDA graph records the step's kernels
once and replays them with one launch. A graph holds fixed shapes, so batches are padded up to a **bucket** (1, 2, 4,
8, ... up to the largest batch): a batch of 5 rows runs the bucket of 8.

:class:`StepGraphs` keeps, per bucket and per shape of the inputs' other axes, static input tensors, the replay
of the step captured on them, and its static outputs. A call copies its rows into the first rows of the static
inputs, replays, and returns the first rows of the outputs (views: the caller copies them out before the next call).
The rows past the batch keep what earlier calls left there (real rows of earlier batches, or at capture the first
row repeated), so padding costs no copy and never feeds the step values it would not see served; their outputs
are dropped. Graphs whose inputs have an axis that differs from call to call besides the batch (a piece's row
count) are captured per shape met, at most :data:`MAX_SHAPES` of them; other shapes, and batches above the largest
bucket, run eagerly. A step that cannot be captured (a host sync inside, ...) runs eagerly, and says why once.

The capture itself is a function (:func:`cuda_capture` on a GPU); :func:`stand_in_capture` runs the module into the
same static tensors on a CPU, so that the buckets, the padding and the static buffers are tested without a GPU.
``torch.compile`` (mode ``compile``) pads to the same buckets, so that it compiles one shape per bucket.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

MODES = ("eager", "graphs", "compile")
MAX_SHAPES = 8  # shapes of the non-batch axes captured per graph (a piece's row count varies); others run eagerly
WARM_UP_CALLS = 3  # eager calls before a capture (lazy initialization, cuBLAS workspaces, autotuning)


def batch_buckets(largest: int) -> list[int]:
    """Powers of two up to ``largest``, and ``largest`` itself: ``batch_buckets(48) == [1, 2, 4, 8, 16, 32, 48]``."""
    buckets, size = [], 1
    while size < largest:
        buckets.append(size)
        size *= 2
    return [*buckets, largest]


def bucket_for(rows: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket holding ``rows``; None above the largest (the batch runs eagerly)."""
    return next((bucket for bucket in buckets if bucket >= rows), None)


def pad_rows(tensor: Any, bucket: int) -> Any:
    """``tensor`` with its first row repeated up to ``bucket`` rows (a real row: padding never feeds the step zeros
    it would not see served, e.g. an all-masked segment)."""
    import torch

    rows = tensor.shape[0]
    if rows == bucket:
        return tensor
    return torch.cat([tensor, tensor[:1].expand(bucket - rows, *tensor.shape[1:])])


Replay = Callable[[], None]
Capture = Callable[[Any, list[Any], Any], tuple[Replay, tuple[Any, ...]]]


def cuda_capture(module: Any, static_inputs: list[Any], pool: Any) -> tuple[Replay, tuple[Any, ...]]:
    """Capture ``module(*static_inputs)`` as a CUDA graph in memory pool ``pool``: its replay and static outputs."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARM_UP_CALLS):
            module(*static_inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: the other models' threads may run their steps on the device while this one captures
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        outputs = module(*static_inputs)
    return graph.replay, tuple(outputs)


def stand_in_capture(module: Any, static_inputs: list[Any], pool: Any) -> tuple[Replay, tuple[Any, ...]]:
    """What a capture gives, on any device: a replay that runs ``module`` on the static inputs into the static
    outputs (for tests of the buckets and buffers on a CPU)."""
    outputs = tuple(output.clone() for output in module(*static_inputs))

    def replay() -> None:
        for static, fresh in zip(outputs, module(*static_inputs), strict=True):
            static.copy_(fresh)

    return replay, outputs


@dataclass
class Captured:
    inputs: list[Any]  # static input tensors, ``bucket`` rows each
    replay: Replay
    outputs: tuple[Any, ...]  # static output tensors, overwritten by each replay


class StepGraphs:
    """``module`` called through captured graphs, one per batch bucket and input shape (the module's docstring)."""

    def __init__(self, module: Any, largest_batch: int, capture: Capture = cuda_capture, pool: Any = None) -> None:
        self.module = module
        self.buckets = batch_buckets(largest_batch)
        self.capture, self.pool = capture, pool
        self._captured: dict[tuple[Any, ...], Captured] = {}
        self._refused: set[tuple[Any, ...]] = set()  # shapes that run eagerly (over MAX_SHAPES, or failed)
        self.failure: str | None = None  # why a capture failed (then every call runs eagerly)
        self.replays = self.eager_calls = 0
        self._lock = threading.Lock()  # a backend runs on its batcher's one thread; this guards any other caller

    def shapes(self) -> int:
        return len({key[1:] for key in self._captured})

    def __call__(self, *tensors: Any) -> tuple[Any, ...]:
        rows = tensors[0].shape[0]
        bucket = bucket_for(rows, self.buckets)
        key = (bucket, *((tuple(t.shape[1:]), t.dtype) for t in tensors))
        if bucket is None or self.failure is not None or key in self._refused:
            self.eager_calls += 1
            return tuple(self.module(*tensors))
        with self._lock:
            captured = self._captured.get(key) or self._capture(key, tensors, bucket)
            if captured is None:
                self.eager_calls += 1
                return tuple(self.module(*tensors))
            for static, given in zip(captured.inputs, tensors, strict=True):
                static[:rows].copy_(given)
            captured.replay()
            self.replays += 1
            return tuple(output[:rows] for output in captured.outputs)

    def _capture(self, key: tuple[Any, ...], tensors: Sequence[Any], bucket: int) -> Captured | None:
        if key[1:] not in {k[1:] for k in self._captured} and self.shapes() >= MAX_SHAPES:
            self._refused.add(key)
            return None
        static_inputs = [pad_rows(tensor, bucket).clone() for tensor in tensors]
        try:
            replay, outputs = self.capture(self.module, static_inputs, self.pool)
        except Exception as error:  # e.g. a host sync in the step: it runs eagerly from now on
            self.failure = f"{type(error).__name__}: {error}"
            log.warning("the step cannot be captured as a CUDA graph; it runs eagerly (%s)", self.failure)
            return None
        captured = Captured(static_inputs, replay, outputs)
        self._captured[key] = captured
        return captured

    def warm(self, sample: Callable[[int], Sequence[Any]]) -> None:
        """Capture every bucket now (largest first, so the smaller reuse its memory), each on the first rows of one
        ``sample(largest bucket)``: a sample drawn per bucket may differ in its other axes (a forecaster's piece of
        any length), and each of those shapes would be a capture of its own, against the limit of shapes."""
        inputs = sample(self.buckets[-1])
        for bucket in reversed(self.buckets):
            self(*(tensor[:bucket] for tensor in inputs))


class PaddedCompile:
    """``torch.compile``'d ``module`` called on batches padded to the buckets (one compiled shape per bucket)."""

    def __init__(self, module: Any, largest_batch: int) -> None:
        import torch

        self.compiled = torch.compile(module, mode="reduce-overhead", dynamic=False)
        self.module = module
        self.buckets = batch_buckets(largest_batch)

    def __call__(self, *tensors: Any) -> tuple[Any, ...]:
        rows = tensors[0].shape[0]
        bucket = bucket_for(rows, self.buckets)
        if bucket is None:
            return tuple(self.module(*tensors))
        outputs = self.compiled(*(pad_rows(tensor, bucket) for tensor in tensors))
        return tuple(output[:rows].clone() for output in outputs)  # the compiled graph's outputs are reused
