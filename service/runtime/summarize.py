"""Summarization with SRformer: the family's stream (``models/summary_stream.py``) over the batched graphs.

The stream owns the model's rules (cutting text into encoder windows, the Eq. 15 / 13 accumulators,
the chunk layout, the decoder's inputs); this pipeline runs each closed window through the
``encode_window`` batcher and writes the summary one of two ways (``decoding``):

- ``sentence``: the document's own sentences chosen by the model's salience scores
  (``models/sentence_choice.py``, over the copy units of ``models/copy_units.py``), in the document's text and
  order; no decoder step runs;
- ``free``: the document's candidate ids through ``output_head`` (once, where the model folds its output
  layer) and the search (``models/decoding.py``) on the shared decode loop, the words then given the
  document's letter case.

Either can stream the summary as it is written (a sentence, or whole words, at a time)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from models.decoding import BeamSearch, GreedySearch, Search, TokenCallback
from models.detokenize import Detokenizer, WordStream, sentence_end_ids
from models.letter_case import DocumentCase
from models.sentence_choice import Lexicon, copy_sentences
from models.summary_stream import SummaryStream
from service.runtime.batcher import DynamicBatcher
from service.runtime.decode_loop import DecodeLoop
from service.runtime.pipeline import (
    OFF_LOOP_CHARS,
    Arrays,
    Consumed,
    FinalResult,
    InputError,
    TextPipeline,
    cut_text,
)

DECODINGS = ("sentence", "free")


def load_lexicon(entry: Path, manifest: Mapping[str, Any]) -> Lexicon | None:
    """The salience head's lexical part (models/sentence_choice.py), where the model has one."""
    weights = manifest["settings"].get("salience_lexical")
    if not weights:
        return None
    from safetensors.numpy import load_file

    arrays = load_file(str(entry / manifest["assets"]["lexicon"]))
    return Lexicon(arrays["token_weight"].astype(np.float64), arrays["idf"].astype(np.float64),
                   (float(weights[0]), float(weights[1])))

class SummarizePipeline(TextPipeline):
    task = "summarize"
    generated_text, generated_tokens = "summary", "summary_tokens"

    def __init__(self, manifest: Mapping[str, Any], entry: Path,
                 graphs: Mapping[str, DynamicBatcher | DecodeLoop], over_limit: str = "truncate") -> None:
        super().__init__(manifest, entry, over_limit)
        self.settings = s = manifest["settings"]
        self.encode, self.decode = graphs["encode_window"], graphs["decode_step"]
        self.head = graphs.get("output_head")  # the output layer folded once per document, where exported
        # batchers and a decode loop, or in a front end their stand-ins (service.runtime.engine): the same calls
        assert hasattr(self.encode, "submit") and hasattr(self.decode, "generate")
        assert self.head is None or hasattr(self.head, "submit")
        self.detokenizer = Detokenizer(self.tokenizer)
        self.sentence_ends = sentence_end_ids(self.tokenizer)
        self.stream = SummaryStream(s, self.tokenizer)
        self.position_weights = s.get("salience_position")  # None: no salience head, no sentence copy
        self.lexicon = load_lexicon(entry, manifest)
        self.copy_adjacency = float(s.get("copy_adjacency") or 0.0)
        self.copy_trigram_overlap = float(s.get("copy_trigram_overlap", 1.0))
        self.default_decoding = str(s.get("decoding") or ("sentence" if self.position_weights else "free"))

    # ---- reading the document ------------------------------------------------------------------
    async def consume(self, state: Mapping[str, np.ndarray], piece: str) -> Consumed:
        before = self.stream.tokens_read(state)
        cut_state, windows = await cut_text(self.stream.feed, state, piece)
        self._check(cut_state)
        new_state, chunk = await self._encode(cut_state, windows)
        if piece and self.stream.keeps_text(state):  # the text too: summaries are written in the document's own words
            chunk = self.stream.join([self.stream.text_part(piece), *([chunk] if chunk is not None else [])])
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
    ) -> FinalResult:
        options = options or {}
        decoding = self._decoding(options)
        cut_state, windows = self.stream.flush(state)
        self._check(cut_state)
        final_state, chunk = await self._encode(cut_state, windows)
        chunks = [*chunks, chunk] if chunk is not None else list(chunks)
        result: dict[str, Any] = {"summary": "", **self.stream.reading(final_state), "summary_tokens": 0,
                                  "decoding": decoding}
        read = int(final_state["source_tokens"][0])
        if read == 0:  # a document without a single token: an empty summary (the schema allows empty text)
            return FinalResult(result, _no_tokens() if stream else None, segments=len(windows))
        text, salience = self.stream.document(chunks)
        if decoding == "sentence":
            assert salience is not None, "sentence copy needs the salience output (checked in _decoding)"
            sentences = await _off_loop(len(text), self._copy_sentences, text, salience, read,
                                        options.get("max_length"))
            result.update(summary=" ".join(text for text, _ in sentences),
                          summary_tokens=sum(tokens for _, tokens in sentences))
            tokens = _sentences_as_pieces([text for text, _ in sentences]) if stream else None
            return FinalResult(result, tokens, segments=len(windows))

        memory, source_ids = self.stream.memory(final_state, chunks)
        beams = int(options.get("beam_size") or self.settings["beam_size"])
        limit = self.stream.length_limit(source_ids.shape[1], options.get("max_length"))
        target = min(self.stream.summary_tokens(source_ids.shape[1]), limit)
        # copying models: words only as the document has them (no glued pieces, no word cut at the cap)
        known = self.detokenizer.vocabulary(source_ids[0]) if self.settings["output_vocab"] != "full" else None
        case = await _off_loop(len(text), DocumentCase, text)

        async def run(on_token: TokenCallback | None = None) -> list[int]:
            ids = await self._search(memory, source_ids, limit, target, beams, on_token)
            result.update(summary=self.detokenizer.text(ids, known, case), summary_tokens=len(ids))
            return ids

        if not stream:
            await run()
            return FinalResult(result, segments=len(windows))
        return FinalResult(result, self._stream(run, beams, result, known, case), segments=len(windows))

    def _decoding(self, options: Mapping[str, Any]) -> str:
        """The request's decoding; a beam search asked for without one means free decoding (sentence copy runs
        no search, and ignores ``beam_size`` when asked for by name)."""
        default = "free" if int(options.get("beam_size") or 1) > 1 else self.default_decoding
        decoding = str(options.get("decoding") or default)
        if decoding not in DECODINGS:
            raise InputError(f"decoding must be one of {list(DECODINGS)}, not {decoding!r}", ("body", "decoding"))
        if decoding == "sentence" and self.position_weights is None:
            raise InputError(f"{self.manifest['name']} has no salience head, so it cannot choose sentences to copy: "
                             "send decoding \"free\" (or leave it out)", ("body", "decoding"))
        return decoding

    def _copy_sentences(self, text: str, salience: np.ndarray, read: int,
                        max_length: int | None) -> list[tuple[str, int]]:
        return copy_sentences(text, self.tokenizer, salience, read, self.position_weights,
                              self.stream.summary_tokens(read), int(max_length) if max_length else None, self.lexicon,
                              self.copy_adjacency, self.copy_trigram_overlap)

    async def _stream(self, run: Callable[..., Awaitable[list[int]]], beams: int, result: dict[str, Any],
                      known: frozenset[tuple[int, ...]] | None, case: DocumentCase) -> AsyncIterator[str]:
        """Text as it is generated, whole words at a time (greedy search); beam search: all of it at the end."""
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        words = WordStream(self.detokenizer, known, case)

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
        self, memory: Arrays, source_ids: np.ndarray, limit: int, target: int, beams: int,
        on_token: TokenCallback | None,
    ) -> list[int]:
        vocab_ids, src_index = self.stream.vocabulary(source_ids)
        head = await self.head.submit({"vocab_ids": vocab_ids[None]}) if self.head is not None else None
        fixed, state = self.stream.decoder_inputs(memory, source_ids, vocab_ids, src_index, beams, head)
        s = self.settings
        bos, eos, no_repeat = int(s["bos_id"]), int(s["eos_id"]), int(s["no_repeat_ngram"])
        # the summary reaches the model's length (no end before it), then ends at the next sentence end
        ends = self.sentence_ends
        search: Search = (GreedySearch(bos, eos, vocab_ids, limit, no_repeat, on_token, ends, target, target)
                          if beams == 1 else
                          BeamSearch(bos, eos, vocab_ids, limit, no_repeat, beams, ends=ends, target=target,
                                     min_length=target))
        return await self.decode.generate(search, fixed, state)


async def _off_loop(size: int, work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)`` on a worker thread for a long document (tokenizing it again), inline for a short one."""
    return work(*args) if size < OFF_LOOP_CHARS else await asyncio.to_thread(work, *args)


async def _sentences_as_pieces(sentences: list[str]) -> AsyncIterator[str]:
    """A copied summary as stream pieces: a sentence at a time (joined, they are the summary)."""
    for index, sentence in enumerate(sentences):
        yield sentence if index == 0 else " " + sentence


async def _no_tokens() -> AsyncIterator[str]:
    return
    yield  # an async generator that yields nothing
