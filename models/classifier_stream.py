"""RMT's streaming path over its step, in numpy (no torch): the classifier's side of the segment contract.

    feed(state, text) / flush(state)  -> state, segments   # the text cutter (models/text_stream.py)
    step_inputs(state, segment)       -> step inputs        # memory + one segment
    absorb(state, step outputs)       -> state               # the memory the segment wrote, its logits
    result(state)                     -> the running answer

The service's classify pipeline runs ``step_inputs`` through the exported ``step`` graph;
``models.rmt_stream.RMTStream`` runs the same path on the eager model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from models.text_stream import Segment, SegmentCutter


class ClassifierStream:
    """RMT's streaming path over its step, in numpy (no torch): the service's classify pipeline wraps it,
    running ``step_inputs`` through the exported ``step`` graph; :class:`RMTStream` runs it on the eager
    model. Both cut text with the same :class:`SegmentCutter` and fold the memory the same way (Eq. 1-2
    of the RMT paper: each segment reads the memory the previous one wrote).
    """

    def __init__(self, cutter: SegmentCutter, labels: list[str]) -> None:
        self.cutter, self.labels = cutter, labels

    def feed(self, state: Mapping[str, np.ndarray], text: str) -> tuple[dict[str, np.ndarray], list[Segment]]:
        return self.cutter.feed(state, text)

    def flush(self, state: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[Segment]]:
        return self.cutter.flush(state)

    @staticmethod
    def step_inputs(state: Mapping[str, np.ndarray], segment: Segment) -> dict[str, np.ndarray]:
        ids, mask = segment
        return {"memory": state["memory"], "input_ids": ids[None], "attention_mask": mask[None]}

    @staticmethod
    def absorb(state: Mapping[str, np.ndarray], outputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The memory the segment wrote and its logits (the running prediction)."""
        return {**state, "memory": outputs["next_memory"], "last_logits": outputs["logits"]}

    @staticmethod
    def tokens_read(state: Mapping[str, np.ndarray]) -> int:
        """Tokens in complete segments plus those waiting for the next segment."""
        return int(state["tokens_seen"][0]) + int(state["pending_ids_len"][0])

    @property
    def limit(self) -> int | None:
        """The most tokens the model reads of a document: ``max_segments`` segments of ``s - 2`` (None: all)."""
        return self.cutter.max_segments * self.cutter.content_size if self.cutter.bounded else None

    def reading(self, state: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """How much of the document the model read: ``tokens_read`` of ``tokens_total``, ``truncated`` once
        it stopped at ``max_segments`` with tokens left unread."""
        read, total = self.tokens_read(state), self.cutter.tokens_total(state)
        return {"tokens_read": read, "tokens_total": total, "truncated": total > read}

    def result(self, state: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """The prediction after the last applied segment (none before the first)."""
        segments = int(state["segments_done"][0])
        if segments == 0:
            return {"label": None, "probabilities": {}, "segments": 0, **self.reading(state)}
        probabilities = softmax(state["last_logits"].astype(np.float64))[0]
        return {
            "label": self.labels[int(probabilities.argmax())],
            "probabilities": {label: float(p) for label, p in zip(self.labels, probabilities, strict=True)},
            "segments": segments,
            **self.reading(state),
        }


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)
