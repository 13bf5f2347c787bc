"""Summarization with SRformer: text pieces -> encoder windows (append-only) -> search over decoder steps.

Session state, bounded: the text cutter's pending text and ids, the running K'V and sum(K^2)
accumulators per decoder layer (Eq. 15, 13), the last source token and a token count. Each
closed encoder window (``encoder_window`` tokens) is one ``encode_window`` step whose keys,
values and ids are appended as a chunk: a piece writes O(its own text), never O(document).
Finish closes the last window, gathers the chunks, and runs greedy or beam search over the
``decode_step`` graph (Algorithm 1), optionally streaming the summary as it is generated.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from models.text_stream import SegmentCutter
from service.runtime.batcher import DynamicBatcher
from service.runtime.decode_loop import DecodeLoop
from service.runtime.decoding import BeamSearch, GreedySearch, Search, TokenCallback
from service.runtime.detokenize import Detokenizer, WordStream
from service.runtime.pipeline import Arrays, Consumed, Finished, load_initial_state


class SummarizePipeline:
    task = "summarize"
    input_kind = "text"

    def __init__(self, manifest: Mapping[str, Any], entry: Path,
                 graphs: Mapping[str, DynamicBatcher | DecodeLoop]) -> None:
        self.manifest = manifest
        self.settings = s = manifest["settings"]
        self.encode, self.decode = graphs["encode_window"], graphs["decode_step"]
        assert isinstance(self.encode, DynamicBatcher) and isinstance(self.decode, DecodeLoop)
        self.layers, self.heads, self.head_dim = int(s["n_layer"]), int(s["n_head"]), int(s["head_dim"])
        self.tokenizer = Tokenizer.from_file(str(entry / manifest["assets"]["tokenizer"]))
        self.detokenizer = Detokenizer(self.tokenizer)
        self.cutter = SegmentCutter(
            self.tokenizer, int(s["encoder_window"]) + 2, int(s["max_windows"]), int(s["pending_bytes"])
        )
        self.max_source = int(s["max_source"]) or None
        self.initial_state = load_initial_state(entry)

    def new_state(self) -> Arrays:
        return dict(self.initial_state)

    # ---- reading the document ------------------------------------------------------------------
    async def consume(self, state: Mapping[str, np.ndarray], piece: str) -> Consumed:
        before = int(state["source_tokens"][0]) + int(state["pending_ids_len"][0])
        cut_state, windows = self.cutter.feed(state, piece)
        new_state, chunk = await self._encode(cut_state, windows)
        read = int(new_state["source_tokens"][0]) + int(new_state["pending_ids_len"][0])
        result = {"tokens": read, "encoded_tokens": int(new_state["source_tokens"][0]),
                  "windows": int(new_state["segments_done"][0])}
        return Consumed(new_state, result, consumed=read - before, chunk=chunk, segments=len(windows))

    async def _encode(self, state: dict[str, np.ndarray], windows: list) -> tuple[dict[str, np.ndarray], Arrays | None]:
        parts: list[Arrays] = []
        for ids, mask in windows:  # each window's keys see the token before it (first_prev)
            content = ids[1 : int(mask.sum()) - 1]  # drop [CLS] ... [SEP]
            done = int(state["source_tokens"][0])
            if self.max_source is not None:
                content = content[: max(self.max_source - done, 0)]  # the model reads no further
            if content.size == 0:
                continue
            out = await self.encode.submit({"window_ids": content[None], "first_prev": state["last_source_id"]})
            part: Arrays = {"source_ids": content[None]}
            for layer in range(self.layers):
                part[f"k{layer}"], part[f"v{layer}"] = out[f"k{layer}"], out[f"v{layer}"]
                state[f"kv{layer}"] = state[f"kv{layer}"] + out[f"kv{layer}"]
                state[f"ksq{layer}"] = state[f"ksq{layer}"] + out[f"ksq{layer}"]
            state["last_source_id"] = content[-1:].astype(np.int64)
            state["source_tokens"] = state["source_tokens"] + content.size
            parts.append(part)
        if not parts:
            return state, None
        axis = {"source_ids": 1} | {f"{kind}{layer}": 2 for layer in range(self.layers) for kind in "kv"}
        return state, {name: np.concatenate([p[name] for p in parts], axis=axis[name]) for name in parts[0]}

    # ---- writing the summary -------------------------------------------------------------------
    async def finish(
        self, state: Mapping[str, np.ndarray], chunks: list[Arrays], last_result: Mapping[str, Any] | None,
        stream: bool = False, options: Mapping[str, Any] | None = None,
    ) -> Finished:
        options = options or {}
        cut_state, windows = self.cutter.flush(state)
        final_state, chunk = await self._encode(cut_state, windows)
        chunks = [*chunks, chunk] if chunk is not None else list(chunks)
        if not chunks:  # a document without a single token: an empty summary (the schema allows empty text)
            result = {"summary": "", "tokens": 0, "summary_tokens": 0}
            return Finished(result, _no_tokens() if stream else None, segments=len(windows))
        memory, source_ids = self._memory(final_state, chunks)
        beams = int(options.get("beam_size") or self.settings["beam_size"])
        limit = self._limit(source_ids.shape[1], options.get("max_length"))
        result: dict[str, Any] = {"summary": "", "tokens": int(source_ids.shape[1]), "summary_tokens": 0}
        # copying models: words only as the document has them (no glued pieces, no word cut at the cap)
        known = self.detokenizer.vocabulary(source_ids[0]) if self.settings["output_vocab"] != "full" else None

        async def run(on_token: TokenCallback | None = None) -> list[int]:
            ids = await self._search(memory, source_ids, limit, beams, on_token)
            result.update(summary=self.detokenizer.text(ids, known), summary_tokens=len(ids))
            return ids

        if not stream:
            await run()
            return Finished(result, segments=len(windows))
        return Finished(result, self._stream(run, beams, result, known), segments=len(windows))

    async def _stream(self, run: Callable[..., Awaitable[list[int]]], beams: int, result: dict[str, Any],
                      known: frozenset[tuple[int, ...]] | None) -> AsyncIterator[str]:
        """Text as it is generated, whole words at a time (greedy search); beam search: all of it at the end."""
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        words = WordStream(self.detokenizer, known)

        def on_token(ids: list[int]) -> None:
            piece = words.update(ids)
            if piece:
                queue.put_nowait(piece)

        task = asyncio.create_task(run(on_token if beams == 1 else None))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (delta := await queue.get()) is not None:
                yield delta
        finally:  # the client left (the generator is closed early): stop generating at the next step
            if not task.done():
                task.cancel()
        await task  # re-raises a failed search
        rest = words.finish(result["summary"])
        if rest:
            yield rest

    def _memory(self, state: Mapping[str, np.ndarray], chunks: list[Arrays]) -> tuple[Arrays, np.ndarray]:
        memory: Arrays = {}
        for layer in range(self.layers):
            memory[f"k{layer}"] = np.concatenate([c[f"k{layer}"] for c in chunks], axis=2)
            memory[f"v{layer}"] = np.concatenate([c[f"v{layer}"] for c in chunks], axis=2)
            memory[f"kv{layer}"], memory[f"ksq{layer}"] = state[f"kv{layer}"], state[f"ksq{layer}"]
        return memory, np.concatenate([c["source_ids"] for c in chunks], axis=1)

    def _limit(self, source_tokens: int, max_length: int | None) -> int:
        s = self.settings
        q = int(s["summary_length"]) or max(1, math.ceil(float(s["summary_ratio"]) * source_tokens))
        return min(int(max_length) if max_length else math.ceil(1.25 * q), int(s["max_target"]))

    def _vocabulary(self, source_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Candidate output ids (V,) and the column of each source token (k,)."""
        if self.settings["output_vocab"] == "full":
            vocab_ids = np.arange(int(self.settings["vocab_size"]), dtype=np.int64)
        else:  # the document's own ids and [SEP]: extractive news summaries copy from the article
            vocab_ids = np.unique(np.append(source_ids[0], int(self.settings["eos_id"]))).astype(np.int64)
        return vocab_ids, np.searchsorted(vocab_ids, source_ids[0]).astype(np.int64)

    async def _search(
        self, memory: Arrays, source_ids: np.ndarray, limit: int, beams: int, on_token: TokenCallback | None,
    ) -> list[int]:
        vocab_ids, src_index = self._vocabulary(source_ids)
        fixed = repeat_rows({
            "mask": np.ones_like(source_ids, dtype=bool), "vocab_ids": vocab_ids[None],
            "vocab_mask": np.ones((1, len(vocab_ids)), dtype=bool), "src_index": src_index[None], **memory,
        }, beams)
        state: Arrays = {"prev": np.full(beams, -1, dtype=np.int64), "last": np.full(beams, -1, dtype=np.int64),
                         "self_mask": np.zeros((beams, 0), dtype=bool)}
        for layer in range(self.layers):
            empty = np.zeros((beams, self.heads, 0, self.head_dim), dtype=np.float32)
            square = np.zeros((beams, self.heads, self.head_dim, self.head_dim), dtype=np.float32)
            state |= {f"self_k{layer}": empty, f"self_v{layer}": empty,
                      f"membrane{layer}": square, f"raf_out{layer}": square}
        s = self.settings
        bos, eos, no_repeat = int(s["bos_id"]), int(s["eos_id"]), int(s["no_repeat_ngram"])
        search: Search = (GreedySearch(bos, eos, vocab_ids, limit, no_repeat, on_token) if beams == 1
                          else BeamSearch(bos, eos, vocab_ids, limit, no_repeat, beams))
        return await self.decode.generate(search, fixed, state)


async def _no_tokens() -> AsyncIterator[str]:
    return
    yield  # an async generator that yields nothing


def repeat_rows(arrays: Mapping[str, np.ndarray], rows: int) -> Arrays:
    return {name: np.repeat(np.asarray(value), rows, axis=0) for name, value in arrays.items()}
