"""Text pieces -> the exact token segments of the whole text, in numpy (no torch).

Shared by the RMT segment model (``models/rmt_stream.py``) and the service's
classify pipeline, so a document streamed in pieces of any size is cut into
the same segments as the document posted whole.

A *safe cut point* follows a character at which BERT pre-tokenization always
splits (whitespace, punctuation, CJK ideographs): tokenizing the text before
it and the text after it separately gives the ids of the concatenation. The
text after the last safe cut point waits in the state (``pending_text``), and
ids that do not yet fill a segment wait in ``pending_ids``. The state size
depends on the segment size and ``pending_bytes`` only, never on the length
of the document. A run of more than ``pending_bytes`` bytes without a cut
point is one WordPiece "word" longer than its 100-character limit (unless
most of it is characters the normalizer deletes), which WordPiece maps to a
single ``[UNK]``; the stream does the same (``overflow``).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any

import numpy as np

from models.tensor_spec import TensorSpec

CLS_ID, SEP_ID, PAD_ID, UNK_ID = 101, 102, 0, 100  # uncased BERT vocabulary (MiniLM-L6)
PENDING_BYTES = 1024  # longest text run without a safe cut point kept verbatim
ALL_SEGMENTS = 1 << 62  # a cutter without a segment limit (a recurrent model whose state is bounded)

Segment = tuple[np.ndarray, np.ndarray]  # input_ids (s,), attention_mask (s,), int64


def is_cut_char(ch: str) -> bool:
    """True where BERT pre-tokenization always splits (whitespace, punctuation, CJK)."""
    if ch in " \t\n\r":
        return True
    cp = ord(ch)
    if (33 <= cp <= 47) or (58 <= cp <= 64) or (91 <= cp <= 96) or (123 <= cp <= 126):
        return True  # ASCII punctuation, as BERT counts it
    category = unicodedata.category(ch)
    if category == "Zs" or category.startswith("P"):
        return True
    return (  # CJK ideographs (BERT's _is_chinese_char): the normalizer spaces them out
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )


def last_cut(text: str) -> int:
    """Length of the longest prefix of ``text`` that ends at a safe cut point (0 if none)."""
    for index in range(len(text) - 1, -1, -1):
        if is_cut_char(text[index]):
            return index + 1
    return 0


class SegmentCutter:
    """Cuts token ids into ``[CLS] w_1 .. w_{s-2} [SEP]`` segments, right-padded to ``segment_size``."""

    def __init__(self, tokenizer: Any, segment_size: int, max_segments: int | None,
                 pending_bytes: int = PENDING_BYTES):
        self.tokenizer = tokenizer  # a ``tokenizers.Tokenizer`` without truncation or padding
        self.segment_size = segment_size
        self.content_size = segment_size - 2
        self.bounded = max_segments is not None  # None: every segment of any document is read
        self.max_segments = max_segments if max_segments is not None else ALL_SEGMENTS
        self.pending_bytes = pending_bytes

    # ---- whole documents ----------------------------------------------------------------------
    def token_ids(self, text: str) -> list[int]:
        # encode_batch, not encode: the same ids, and it releases the GIL, so a thread tokenizing a long
        # piece leaves the service's event loop free (encode held it: 75-100 ms for 200,000 characters)
        return list(self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids) if text else []

    def pack(self, chunk: list[int]) -> Segment:
        """One chunk of <= s-2 ids -> (input_ids (s,), attention_mask (s,))."""
        ids = [CLS_ID, *chunk, SEP_ID]
        pad = self.segment_size - len(ids)
        mask = np.array([1] * len(ids) + [0] * pad, dtype=np.int64)
        return np.array(ids + [PAD_ID] * pad, dtype=np.int64), mask

    def segments(self, text: str) -> list[Segment]:
        """Every segment the model reads of a whole document, in order (at most ``max_segments``)."""
        ids, c = self.token_ids(text), self.content_size
        return [self.pack(ids[i : i + c]) for i in range(0, len(ids), c)][: self.max_segments]

    # ---- streams: the state is named arrays with a batch axis of 1 ----------------------------
    def state_spec(self) -> list[TensorSpec]:
        return [
            TensorSpec("pending_text", "uint8", ("batch", self.pending_bytes)),
            TensorSpec("pending_text_len", "int64", ("batch",)),
            TensorSpec("pending_ids", "int64", ("batch", self.content_size)),
            TensorSpec("pending_ids_len", "int64", ("batch",)),
            TensorSpec("segments_done", "int64", ("batch",)),
            TensorSpec("overflow", "bool", ("batch",)),
            TensorSpec("tokens_seen", "int64", ("batch",)),
            TensorSpec("tokens_past_limit", "int64", ("batch",)),
        ]

    def init_state(self) -> dict[str, np.ndarray]:
        return {
            "pending_text": np.zeros((1, self.pending_bytes), dtype=np.uint8),
            "pending_text_len": np.zeros(1, dtype=np.int64),
            "pending_ids": np.zeros((1, self.content_size), dtype=np.int64),
            "pending_ids_len": np.zeros(1, dtype=np.int64),
            "segments_done": np.zeros(1, dtype=np.int64),
            "overflow": np.zeros(1, dtype=bool),
            "tokens_seen": np.zeros(1, dtype=np.int64),
            "tokens_past_limit": np.zeros(1, dtype=np.int64),
        }

    def feed(self, state: Mapping[str, np.ndarray], text: str) -> tuple[dict[str, np.ndarray], list[Segment]]:
        """Append a text piece: the new state and the segments it completed (to step, in order)."""
        state = {name: np.array(value) for name, value in state.items()}
        pending = self._pending_text(state) + text
        overflow = bool(state["overflow"][0])
        ids: list[int] = []
        cut = last_cut(pending)
        if cut:
            head, pending = pending[:cut], pending[cut:]
            if overflow:  # the over-long word ends just before the first cut character of `head`
                ids.append(UNK_ID)
                head = head[next(i for i, ch in enumerate(head) if is_cut_char(ch)) :]
                overflow = False
            ids += self.token_ids(head)
        raw = pending.encode("utf-8")
        if overflow or len(raw) > self.pending_bytes:
            overflow, raw = True, b""  # a word of > P bytes: WordPiece gives one [UNK]
        self._set_text(state, raw, overflow)
        return self._push_ids(state, ids, final=False)

    def flush(self, state: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[Segment]]:
        """End of document: the pending text and ids become the last (partial) segment(s)."""
        state = {name: np.array(value) for name, value in state.items()}
        ids = ([UNK_ID] if bool(state["overflow"][0]) else []) + self.token_ids(self._pending_text(state))
        self._set_text(state, b"", False)
        return self._push_ids(state, ids, final=True)

    @staticmethod
    def tokens_total(state: Mapping[str, np.ndarray]) -> int:
        """Every token of the document so far: cut into segments, waiting, or past ``max_segments``."""
        return int(state["tokens_seen"][0]) + int(state["pending_ids_len"][0]) + int(state["tokens_past_limit"][0])

    def _pending_text(self, state: Mapping[str, np.ndarray]) -> str:
        length = int(state["pending_text_len"][0])
        return state["pending_text"][0, :length].tobytes().decode("utf-8")

    def _set_text(self, state: dict[str, np.ndarray], raw: bytes, overflow: bool) -> None:
        state["pending_text"] = np.zeros((1, self.pending_bytes), dtype=np.uint8)
        state["pending_text"][0, : len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        state["pending_text_len"] = np.array([len(raw)], dtype=np.int64)
        state["overflow"] = np.array([overflow])

    def _push_ids(
        self, state: dict[str, np.ndarray], ids: list[int], final: bool
    ) -> tuple[dict[str, np.ndarray], list[Segment]]:
        c = self.content_size
        held = int(state["pending_ids_len"][0])
        pending = state["pending_ids"][0, :held].tolist() + ids
        done = int(state["segments_done"][0])
        segments: list[Segment] = []
        while pending and done < self.max_segments and (len(pending) >= c or final):
            segments.append(self.pack(pending[:c]))
            state["tokens_seen"] = state["tokens_seen"] + len(pending[:c])
            pending, done = pending[c:], done + 1
        if done >= self.max_segments:  # the model reads no further: count what it leaves unread
            state["tokens_past_limit"] = state["tokens_past_limit"] + len(pending)
            pending = []
        state["pending_ids"] = np.zeros((1, c), dtype=np.int64)
        state["pending_ids"][0, : len(pending)] = pending
        state["pending_ids_len"] = np.array([len(pending)], dtype=np.int64)
        state["segments_done"] = np.array([done], dtype=np.int64)
        return state, segments
