"""Summarization with SRformer: the family's stream (``models/summary_stream.py``) over the batched graphs.

The stream owns the model's rules (cutting text into encoder windows, the Eq. 15 / 13 accumulators,
the chunk layout, the decoder's inputs); this pipeline runs each closed window through the
``encode_window`` batcher, the document's candidate ids through ``output_head`` (once, where the
model folds its output layer) and the search (``models/decoding.py``) on the shared decode loop,
optionally streaming the summary as it is generated."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from models.decoding import BeamSearch, GreedySearch, Search, TokenCallback
from models.summary_stream import SummaryStream
from service.runtime.batcher import DynamicBatcher
from service.runtime.decode_loop import DecodeLoop
from service.runtime.detokenize import Detokenizer, WordStream
from service.runtime.pipeline import Arrays, Consumed, Finished, TextPipeline, cut_text


class SummarizePipeline(TextPipeline):
    task = "summarize"
    generated_text, generated_tokens = "summary", "summary_tokens"

    def __init__(self, manifest: Mapping[str, Any], entry: Path,
                 graphs: Mapping[str, DynamicBatcher | DecodeLoop], over_limit: str = "truncate") -> None:
        super().__init__(manifest, entry, over_limit)
        self.settings = s = manifest["settings"]
        self.encode, self.decode = graphs["encode_window"], graphs["decode_step"]
        self.head = graphs.get("output_head")  # the output layer folded once per document, where exported
        assert isinstance(self.encode, DynamicBatcher) and isinstance(self.decode, DecodeLoop)
        assert self.head is None or isinstance(self.head, DynamicBatcher)
        self.detokenizer = Detokenizer(self.tokenizer)
        self.stream = SummaryStream(s, self.tokenizer)

    # ---- reading the document ------------------------------------------------------------------
    async def consume(self, state: Mapping[str, np.ndarray], piece: str) -> Consumed:
        before = self.stream.tokens_read(state)
        cut_state, windows = await cut_text(self.stream.feed, state, piece)
        self._check(cut_state)
        new_state, chunk = await self._encode(cut_state, windows)
        read = self.stream.tokens_read(new_state)
        result = {**self.stream.reading(new_state), "encoded_tokens": int(new_state["source_tokens"][0]),
                  "windows": int(new_state["segments_done"][0])}
        return Consumed(new_state, result, units_read=read - before, chunk=chunk, segments=len(windows))

    async def _encode(self, state: Arrays, windows: list) -> tuple[Arrays, Arrays | None]:
        parts: list[Arrays] = []
        for window in windows:  # in order: each window's keys see the token before it
            inputs = self.stream.window_inputs(state, window)
            if inputs is None:  # past max_source: the model reads no further
                continue
            state, part = self.stream.absorb(state, inputs, await self.encode.submit(inputs))
            parts.append(part)
        return state, self.stream.join(parts)

    # ---- writing the summary -------------------------------------------------------------------
    async def finish(
        self, state: Mapping[str, np.ndarray], chunks: list[Arrays], last_result: Mapping[str, Any] | None,
        stream: bool = False, options: Mapping[str, Any] | None = None,
    ) -> Finished:
        options = options or {}
        cut_state, windows = self.stream.flush(state)
        self._check(cut_state)
        final_state, chunk = await self._encode(cut_state, windows)
        chunks = [*chunks, chunk] if chunk is not None else list(chunks)
        if not chunks:  # a document without a single token: an empty summary (the schema allows empty text)
            result = {"summary": "", **self.stream.reading(final_state), "summary_tokens": 0}
            return Finished(result, _no_tokens() if stream else None, segments=len(windows))
        memory, source_ids = self.stream.memory(final_state, chunks)
        beams = int(options.get("beam_size") or self.settings["beam_size"])
        limit = self.stream.length_limit(source_ids.shape[1], options.get("max_length"))
        result: dict[str, Any] = {"summary": "", **self.stream.reading(final_state), "summary_tokens": 0}
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

    async def _search(
        self, memory: Arrays, source_ids: np.ndarray, limit: int, beams: int, on_token: TokenCallback | None,
    ) -> list[int]:
        vocab_ids, src_index = self.stream.vocabulary(source_ids)
        head = await self.head.submit({"vocab_ids": vocab_ids[None]}) if self.head is not None else None
        fixed, state = self.stream.decoder_inputs(memory, source_ids, vocab_ids, src_index, beams, head)
        s = self.settings
        bos, eos, no_repeat = int(s["bos_id"]), int(s["eos_id"]), int(s["no_repeat_ngram"])
        search: Search = (GreedySearch(bos, eos, vocab_ids, limit, no_repeat, on_token) if beams == 1
                          else BeamSearch(bos, eos, vocab_ids, limit, no_repeat, beams))
        return await self.decode.generate(search, fixed, state)


async def _no_tokens() -> AsyncIterator[str]:
    return
    yield  # an async generator that yields nothing
