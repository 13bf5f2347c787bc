"""Classification with RMT: the family's stream (``models/classifier_stream.py``) over the batched step graph.

The stream owns the model's rules (cutting text into segments, the state the memory steps carry,
the running prediction); this pipeline runs every complete segment through the ``step`` batcher.
The running result after a piece is the prediction of the last complete segment; finish flushes
the tail as the last, partial segment.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from models.classifier_stream import ClassifierStream
from models.text_stream import SegmentCutter
from service.runtime.batcher import DynamicBatcher
from service.runtime.pipeline import Arrays, Consumed, FinalResult, TextPipeline, cut_text


class ClassifyPipeline(TextPipeline):
    task = "classify"

    def __init__(self, manifest: Mapping[str, Any], entry: Path, graphs: Mapping[str, DynamicBatcher],
                 over_limit: str = "truncate") -> None:
        super().__init__(manifest, entry, over_limit)
        self.step = graphs["step"]
        settings = manifest["settings"]
        self.labels = list(settings["labels"])
        cutter = SegmentCutter(
            self.tokenizer, int(settings["segment_size"]), settings["max_segments"], int(settings["pending_bytes"])
        )
        self.stream = ClassifierStream(cutter, self.labels)

    async def consume(self, state: Mapping[str, np.ndarray], piece: str) -> Consumed:
        before = self.stream.tokens_read(state)
        cut_state, segments = await cut_text(self.stream.feed, state, piece)
        self._check(cut_state)
        new_state = await self._run(cut_state, segments)
        consumed = self.stream.tokens_read(new_state) - before
        return Consumed(new_state, self.stream.result(new_state), units_read=consumed, segments=len(segments))

    async def finish(
        self, state: Mapping[str, np.ndarray], chunks: list[Arrays], last_result: Mapping[str, Any] | None,
        stream: bool = False, options: Mapping[str, Any] | None = None,
    ) -> FinalResult:
        cut_state, segments = self.stream.flush(state)
        self._check(cut_state)
        new_state = await self._run(cut_state, segments)
        # a document without a single token: label null, no probabilities (the schema's own "no text yet")
        return FinalResult(self.stream.result(new_state), segments=len(segments))

    async def _run(self, state: dict[str, np.ndarray], segments: list) -> dict[str, np.ndarray]:
        for segment in segments:  # in order: each segment reads the memory the previous one wrote
            state = self.stream.absorb(state, await self.step.submit(self.stream.step_inputs(state, segment)))
        return state
