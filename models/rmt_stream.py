"""RMT over text: whole documents and streams of text pieces of any size.

Text is cut into segments by ``models/text_stream.py`` (numpy, shared with the
service): the document's WordPiece ids (no special tokens) in chunks of
``s - 2``, each wrapped as ``[CLS] chunk [SEP]`` and right-padded to ``s``, at
most ``max_segments`` of them. This module runs the model over those segments.

Streaming session state (batch 1), all tensors, size independent of the
document's length:

| name | dtype | shape | meaning |
|---|---|---|---|
| memory | float32 | (1, m, d) | RMT memory after the last applied segment |
| pending_text | uint8 | (1, P) | UTF-8 text after the last safe cut point |
| pending_text_len | int64 | (1,) | bytes used in pending_text |
| pending_ids | int64 | (1, s-2) | token ids not yet filling a segment |
| pending_ids_len | int64 | (1,) | ids used in pending_ids |
| segments_done | int64 | (1,) | segments applied (stops at max_segments) |
| overflow | bool | (1,) | pending word longer than P bytes: one [UNK] |
| tokens_seen | int64 | (1,) | document tokens applied so far |
| tokens_past_limit | int64 | (1,) | document tokens left unread past max_segments |

A safe cut point follows whitespace, punctuation or a CJK ideograph, where BERT
pre-tokenization always splits, so pieces tokenized separately give the ids of
the whole text (see ``models/text_stream.py`` for the one adversarial
exception, a > P-byte run of characters the normalizer deletes).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from tokenizers import Tokenizer

from models.classifier_stream import ClassifierStream
from models.rmt import RMT
from models.segment import State, TensorSpec
from models.text_stream import PENDING_BYTES, Segment, SegmentCutter, last_cut

__all__ = ["PENDING_BYTES", "RMTStream", "batch_segments", "classify_documents", "last_cut", "torch_segments"]


def torch_segments(cutter: SegmentCutter, text: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The cutter's segments of a whole document, as (ids (s,), mask (s,)) tensors."""
    return [(torch.from_numpy(ids), torch.from_numpy(mask)) for ids, mask in cutter.segments(text)]


def batch_segments(
    docs: list[list[tuple[torch.Tensor, torch.Tensor]]],
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """Per-document segment lists -> list over t of stacked pairs (B, ...) and counts (B,).

    A pair is (ids (s,), mask (s,)) or, from the recipe's cache, (lower-layer states (s, d), mask (s,)).
    Documents with fewer segments get all-zero (all-padding) segments, which ``step`` skips.
    """
    counts = torch.tensor([len(d) for d in docs], dtype=torch.long)
    T = int(counts.max()) if len(docs) else 0
    out = []
    for t in range(T):
        first = next(d[t] for d in docs if t < len(d))
        values, mask = (torch.zeros(len(docs), *x.shape, dtype=x.dtype) for x in first)
        for b, d in enumerate(docs):
            if t < len(d):
                values[b], mask[b] = d[t]
        out.append((values, mask))
    return out, counts


@torch.no_grad()
def classify_documents(model: RMT, cutter: SegmentCutter, texts: list[str], batch_size: int = 16) -> torch.Tensor:
    """Whole-document path, batched: probabilities (N, C) from a fold of ``model.step``."""
    probs = []
    for i in range(0, len(texts), batch_size):
        docs = [torch_segments(cutter, t) for t in texts[i : i + batch_size]]
        segs, _ = batch_segments(docs)
        state = model.init_state(len(docs))
        output: State = {}
        for ids, mask in segs:
            state, output = model.step(state, {"input_ids": ids, "attention_mask": mask})
        probs.append(model.readout(state, output))
    return torch.cat(probs) if probs else torch.zeros(0, model.config.num_labels)


class RMTStream:
    """Streaming sessions over an eager :class:`RMT`: ``init_state`` / ``feed`` / ``finish`` (batch 1), the
    :class:`ClassifierStream` path with the model's own ``step`` in place of the exported graph.

    ``feed`` returns the running prediction (probabilities (1, C)) after every segment it
    completed; ``finish`` flushes the tail as the last, partial segment and returns the final
    probabilities, equal to ``classify_documents`` on the concatenated text.
    """

    def __init__(self, model: RMT, tokenizer: Tokenizer, pending_bytes: int = PENDING_BYTES):
        self.model = model
        c = model.config
        cutter = SegmentCutter(tokenizer, c.segment_size, c.max_segments, pending_bytes)
        self.stream = ClassifierStream(cutter, [str(i) for i in range(c.num_labels)])
        self.cutter = cutter

    def state_spec(self) -> list[TensorSpec]:
        return [*self.model.state_spec(), *self.cutter.state_spec()]

    def init_state(self, batch: int = 1) -> State:
        if batch != 1:
            raise ValueError("a text stream is one document: init_state(1), stack sessions along axis 0")
        state = self.model.init_state(1)
        state.update({name: torch.from_numpy(value) for name, value in self.cutter.init_state().items()})
        return state

    @torch.no_grad()
    def _run(self, state: Mapping[str, torch.Tensor], cut: dict[str, np.ndarray], segments: list[Segment]
             ) -> tuple[State, list[torch.Tensor]]:
        arrays = {**cut, "memory": state["memory"].numpy()}
        running = []
        for segment in segments:
            inputs = {name: torch.from_numpy(value) for name, value in self.stream.step_inputs(arrays, segment).items()}
            new, output = self.model.step({"memory": inputs.pop("memory")}, inputs)  # (1, m, d), (1, C)
            running.append(self.model.readout(new, output))
            arrays = self.stream.absorb(arrays, {"next_memory": new["memory"].numpy(),
                                                 "logits": output["logits"].numpy()})
        out: State = {name: torch.from_numpy(value) for name, value in cut.items()}
        out["memory"] = torch.from_numpy(arrays["memory"])
        return out, running

    def _cut_state(self, state: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
        return {name: state[name].numpy() for name in self.cutter.init_state()}

    def feed(self, state: Mapping[str, torch.Tensor], text: str) -> tuple[State, list[torch.Tensor]]:
        """Append a text piece; returns the new state and one (1, C) prediction per completed segment."""
        cut, segments = self.stream.feed(self._cut_state(state), text)
        return self._run(state, cut, segments)

    def finish(self, state: Mapping[str, torch.Tensor]) -> tuple[State, torch.Tensor]:
        """End of document: flush the pending text and ids as the last segment; final (1, C)."""
        cut, segments = self.stream.flush(self._cut_state(state))
        state, _ = self._run(state, cut, segments)
        with torch.no_grad():
            return state, self.model.readout({"memory": state["memory"]})
