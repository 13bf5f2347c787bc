"""SRformer's streaming path over its two exported graphs, in numpy (no torch): the summarizer's side of
the segment contract that the service wraps.

    feed(state, text)        -> state, windows       # the text cutter: closed encoder windows
    flush(state)             -> state, windows       # end of document: the last, partial window
    window_inputs(state, w)  -> encode_window inputs # or None past ``max_source``
    absorb(state, inputs, o) -> state, part          # Eq. 15, 13: K'V and sum(K^2) accumulate
    join(parts)              -> chunk                # append-only keys / values of a piece
    memory(state, chunks)    -> memory, source_ids   # what the decoder attends to
    document(chunks)         -> text, salience       # what sentence copy reads
    decoder_inputs(...)      -> fixed, cache         # the decode_step graph's inputs at t = 0 (with the
                                                     # output_head graph's, where the model folds it)

A session's bounded state is the cutter's pending text and ids, the last source token, the number of
encoded tokens and, per decoder layer l, the running ``kv{l}`` (h, dh, dh) and ``ksq{l}`` (h,)
(Eq. 15: K'V summed over segments; Eq. 13: the norm's sum of squared keys). Each piece's text, and each
encoder window's keys ``k{l}`` and values ``v{l}`` (h, w, dh), its ids and (models with a salience head)
its tokens' salience logits are append-only *chunks*, laid out as the manifest's ``chunk_spec`` says:
sentence copy and letter case read the document's own text at finish. The exporter writes
:func:`state_and_chunk_specs` into the manifest; the service reads them back from there, so the per-layer
names live here only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from models.tensor_spec import TensorSpec
from models.text_stream import Segment, SegmentCutter

Arrays = dict[str, np.ndarray]


TEXT_PAST_LIMIT = 64  # tokens of text kept past the reading limit
CHUNK_DTYPE = "float16"  # stored keys and values: half the bytes per token (parity: docs/summarization.md)


def state_and_chunk_specs(cutter: SegmentCutter, layers: int, heads: int, head_dim: int, kv_columns: int,
                          salience: bool = False, chunk_dtype: str = CHUNK_DTYPE
                          ) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The session state (bounded) and the append-only chunk of one piece (grows with the document): the
    piece's text (UTF-8 bytes: summaries are written in the document's own words and case), the window's
    ids, per token its salience logit (models with a salience head) and, per decoder layer, its
    cross-attention keys and values, stored as ``chunk_dtype``. The running K'V has ``kv_columns``
    columns per head (head_dim, or one more for the kernel form of O_R, whose last column sums phi(K))."""
    state = [*cutter.state_spec(), TensorSpec("last_source_id", "int64", ("batch",)),
             TensorSpec("source_tokens", "int64", ("batch",))]
    chunk = [TensorSpec("text", "uint8", ("batch", "text")), TensorSpec("source_ids", "int64", ("batch", "window"))]
    if salience:
        chunk.append(TensorSpec("salience", "float32", ("batch", "window")))
    for layer in range(layers):
        state += [TensorSpec(f"kv{layer}", "float32", ("batch", heads, head_dim, kv_columns)),
                  TensorSpec(f"ksq{layer}", "float32", ("batch", heads))]
        chunk += [TensorSpec(f"k{layer}", chunk_dtype, ("batch", heads, "window", head_dim)),
                  TensorSpec(f"v{layer}", chunk_dtype, ("batch", heads, "window", head_dim))]
    return state, chunk


class SummaryStream:
    """The summarizer's streaming path, built from a manifest's ``settings`` and the tokenizer."""

    def __init__(self, settings: Mapping[str, Any], tokenizer: Any) -> None:
        self.settings = s = settings
        self.layers, self.heads, self.head_dim = int(s["n_layer"]), int(s["n_head"]), int(s["head_dim"])
        self.cutter = SegmentCutter(tokenizer, int(s["encoder_window"]) + 2, int(s["max_windows"]),
                                    int(s["pending_bytes"]))
        self.max_source = int(s["max_source"]) or None
        # chunk tensor -> the axis along which it grows (its named axis other than "batch"), its dtype
        self.growing_axis = {spec["name"]: next(i for i, axis in enumerate(spec["shape"])
                                                if isinstance(axis, str) and axis != "batch")
                             for spec in s["chunk_spec"]}
        self.chunk_dtype = {spec["name"]: np.dtype(spec["dtype"]) for spec in s["chunk_spec"]}

    # ---- reading the document ------------------------------------------------------------------
    def feed(self, state: Mapping[str, np.ndarray], text: str) -> tuple[Arrays, list[Segment]]:
        return self.cutter.feed(state, text)

    def flush(self, state: Mapping[str, np.ndarray]) -> tuple[Arrays, list[Segment]]:
        return self.cutter.flush(state)

    def tokens_read(self, state: Mapping[str, np.ndarray]) -> int:
        """Tokens cut into windows (encoded, up to ``max_source``) plus those waiting for the next window."""
        read = int(state["tokens_seen"][0]) + int(state["pending_ids_len"][0])
        return read if self.max_source is None else min(read, self.max_source)

    @property
    def limit(self) -> int | None:
        """The most tokens the model reads of a document (None: all)."""
        return self.max_source

    def reading(self, state: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """How much of the document the model reads: ``tokens_read`` of ``tokens_total``, ``truncated`` once
        tokens past ``max_source`` are left unread."""
        read, total = self.tokens_read(state), self.cutter.tokens_total(state)
        return {"tokens_read": read, "tokens_total": total, "truncated": total > read}

    def window_inputs(self, state: Mapping[str, np.ndarray], window: Segment) -> Arrays | None:
        """The ``encode_window`` inputs of a closed window: its ids without [CLS]/[SEP], and the token
        before it (the keys' previous-token feature). None once ``max_source`` tokens are encoded."""
        ids, mask = window
        content = ids[1 : int(mask.sum()) - 1]
        if self.max_source is not None:
            content = content[: max(self.max_source - int(state["source_tokens"][0]), 0)]
        if content.size == 0:
            return None
        return {"window_ids": content[None], "first_prev": np.asarray(state["last_source_id"])}

    def absorb(self, state: Mapping[str, np.ndarray], inputs: Mapping[str, np.ndarray],
               outputs: Mapping[str, np.ndarray]) -> tuple[Arrays, Arrays]:
        """Fold one encoded window into the state (Eq. 15, 13) and return its append-only part."""
        content = inputs["window_ids"]
        new = dict(state)
        part: Arrays = {"source_ids": content}
        if "salience" in outputs:
            part["salience"] = np.asarray(outputs["salience"], dtype=np.float32)
        for layer in range(self.layers):
            for kind in ("k", "v"):  # stored as the chunk spec says (float16: half the bytes)
                part[f"{kind}{layer}"] = outputs[f"{kind}{layer}"].astype(self.chunk_dtype[f"{kind}{layer}"])
            new[f"kv{layer}"] = state[f"kv{layer}"] + outputs[f"kv{layer}"]  # Eq. 15: sum of K_j' V_j
            new[f"ksq{layer}"] = state[f"ksq{layer}"] + outputs[f"ksq{layer}"]  # Eq. 13: sum of K^2
        new["last_source_id"] = content[0, -1:].astype(np.int64)
        new["source_tokens"] = state["source_tokens"] + content.shape[1]
        return new, part

    def join(self, parts: list[Arrays]) -> Arrays | None:
        """Parts (windows, pieces of text) as one chunk, each tensor joined along its growing axis over the
        parts that have it (None if no part)."""
        if not parts:
            return None
        names = dict.fromkeys(name for part in parts for name in part)
        return {name: np.concatenate([part[name] for part in parts if name in part], axis=self.growing_axis[name])
                for name in names}

    def keeps_text(self, state: Mapping[str, np.ndarray]) -> bool:
        """Whether the next piece's text is kept: until the document has a few tokens past what the model reads
        (the kept text then covers every token read, and the word the limit may cut), so a session's chunks
        never grow with text the model does not read."""
        return self.max_source is None or self.cutter.tokens_total(state) < self.max_source + TEXT_PAST_LIMIT

    @staticmethod
    def text_part(piece: str) -> Arrays:
        """The chunk part that keeps a piece's text."""
        return {"text": np.frombuffer(piece.encode("utf-8"), dtype=np.uint8)[None]}

    def document(self, chunks: list[Arrays]) -> tuple[str, np.ndarray | None]:
        """The document's text as sent, and the salience logit of every token read (None without a head)."""
        whole = self.join([{name: chunk[name] for name in ("text", "salience") if name in chunk} for chunk in chunks])
        whole = whole or {}
        text = bytes(whole["text"][0]).decode("utf-8") if "text" in whole else ""
        salience = whole["salience"][0] if "salience" in whole else None
        return text, salience

    # ---- what the decoder reads ----------------------------------------------------------------
    def memory(self, state: Mapping[str, np.ndarray], chunks: list[Arrays]) -> tuple[Arrays, np.ndarray]:
        """Every chunk joined along its window axis, with the running accumulators: the decoder's memory."""
        whole = self.join(chunks)
        assert whole is not None, "memory() needs at least one chunk"
        # the decoder reads float32 keys and values (the accumulators were summed in float32 all along)
        memory = {name: value.astype(np.float32) for name, value in whole.items()
                  if name not in ("source_ids", "text", "salience")}
        for layer in range(self.layers):
            memory[f"kv{layer}"], memory[f"ksq{layer}"] = state[f"kv{layer}"], state[f"ksq{layer}"]
        return memory, whole["source_ids"]

    def summary_tokens(self, tokens_read: int) -> int:
        """q: the summary length the model was trained to write (``summary_length``, or ``summary_ratio`` of
        the tokens read)."""
        s = self.settings
        return int(s["summary_length"]) or max(1, math.ceil(float(s["summary_ratio"]) * tokens_read))

    def length_limit(self, source_tokens: int, max_length: int | None) -> int:
        """Summary tokens allowed: ``max_length`` or 1.25 q (q = the schedule's summary length), capped."""
        q = self.summary_tokens(source_tokens)
        return min(int(max_length) if max_length else math.ceil(1.25 * q), int(self.settings["max_target"]))

    def vocabulary(self, source_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidate output ids (V,), sorted, and the column of each source token (k,)."""
        if self.settings["output_vocab"] == "full":
            vocab_ids = np.arange(int(self.settings["vocab_size"]), dtype=np.int64)
        else:  # the document's own ids and [SEP]: extractive news summaries copy from the article
            vocab_ids = np.unique(np.append(source_ids[0], int(self.settings["eos_id"]))).astype(np.int64)
        return vocab_ids, np.searchsorted(vocab_ids, source_ids[0]).astype(np.int64)

    def decoder_inputs(self, memory: Arrays, source_ids: np.ndarray, vocab_ids: np.ndarray,
                       src_index: np.ndarray, rows: int, head: Arrays | None = None) -> tuple[Arrays, Arrays]:
        """The ``decode_step`` inputs that stay fixed over a search (repeated for its ``rows``) and the
        decoder cache at t = 0 (Algorithm 1: empty self-attention, RAF state reset). ``head``: the
        ``output_head`` graph's outputs for ``vocab_ids``, for a decode graph that reads them."""
        fixed = repeat_rows({"mask": np.ones_like(source_ids, dtype=bool), "vocab_ids": vocab_ids[None],
                             "vocab_mask": np.ones((1, len(vocab_ids)), dtype=bool),
                             "src_index": src_index[None], **(head or {}), **memory}, rows)
        cache: Arrays = {"prev": np.full(rows, -1, dtype=np.int64), "last": np.full(rows, -1, dtype=np.int64),
                         "self_mask": np.zeros((rows, 0), dtype=bool)}
        for layer in range(self.layers):
            empty = np.zeros((rows, self.heads, 0, self.head_dim), dtype=np.float32)
            square = np.zeros((rows, self.heads, self.head_dim, self.head_dim), dtype=np.float32)
            cache |= {f"self_k{layer}": empty, f"self_v{layer}": empty,
                      f"membrane{layer}": square, f"raf_out{layer}": square}
        return fixed, cache


def repeat_rows(arrays: Mapping[str, np.ndarray], rows: int) -> Arrays:
    return {name: np.repeat(np.asarray(value), rows, axis=0) for name, value in arrays.items()}
