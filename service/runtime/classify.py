"""Classification with RMT: text pieces -> segments -> memory steps -> label probabilities.

State: the memory (m x d), the logits of the last complete segment, and the
text cutter's pending text and ids (all bounded).
Every complete segment is one ``step`` of the exported graph; the running
result after a piece is the prediction of the last complete segment. Finish
flushes the tail as the last, partial segment.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from models.text_stream import SegmentCutter
from service.runtime.batcher import DynamicBatcher
from service.runtime.pipeline import Arrays, Consumed, Finished, load_initial_state


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


class ClassifyPipeline:
    task = "classify"
    input_kind = "text"

    def __init__(self, manifest: Mapping[str, Any], entry: Path, graphs: Mapping[str, DynamicBatcher]) -> None:
        self.manifest = manifest
        self.step = graphs["step"]
        settings = manifest["settings"]
        self.labels = list(settings["labels"])
        tokenizer = Tokenizer.from_file(str(entry / manifest["assets"]["tokenizer"]))
        self.cutter = SegmentCutter(
            tokenizer, int(settings["segment_size"]), int(settings["max_segments"]), int(settings["pending_bytes"])
        )
        self.initial_state = load_initial_state(entry)

    def new_state(self) -> Arrays:
        return dict(self.initial_state)

    async def consume(self, state: Mapping[str, np.ndarray], piece: str) -> Consumed:
        before = self._tokens_read(state)
        cut_state, segments = self.cutter.feed(state, piece)
        new_state = await self._run(cut_state, segments)
        consumed = self._tokens_read(new_state) - before
        return Consumed(new_state, self._result(new_state), consumed=consumed, segments=len(segments))

    async def finish(
        self, state: Mapping[str, np.ndarray], chunks: list[Arrays], last_result: Mapping[str, Any] | None,
        stream: bool = False, options: Mapping[str, Any] | None = None,
    ) -> Finished:
        cut_state, segments = self.cutter.flush(state)
        new_state = await self._run(cut_state, segments)
        # a document without a single token: label null, no probabilities (the schema's own "no text yet")
        return Finished(self._result(new_state), segments=len(segments))

    async def _run(self, state: dict[str, np.ndarray], segments: list) -> dict[str, np.ndarray]:
        for ids, mask in segments:  # each segment reads the memory the previous one wrote
            out = await self.step.submit(
                {"memory": state["memory"], "input_ids": ids[None], "attention_mask": mask[None]}
            )
            state["memory"], state["last_logits"] = out["next_memory"], out["logits"]
        return state

    @staticmethod
    def _tokens_read(state: Mapping[str, np.ndarray]) -> int:
        """Tokens in complete segments plus those waiting for the next segment."""
        return int(state["tokens_seen"][0]) + int(state["pending_ids_len"][0])

    def _result(self, state: Mapping[str, np.ndarray]) -> dict[str, Any]:
        segments, tokens = int(state["segments_done"][0]), self._tokens_read(state)
        if segments == 0:  # no complete segment yet
            return {"label": None, "probabilities": {}, "segments": 0, "tokens": tokens}
        probabilities = softmax(state["last_logits"].astype(np.float64))[0]
        return {
            "label": self.labels[int(probabilities.argmax())],
            "probabilities": {label: float(p) for label, p in zip(self.labels, probabilities, strict=True)},
            "segments": segments,
            "tokens": tokens,
        }
