"""What a task pipeline is: the segment contract, in numpy, over batched graphs.

A pipeline turns user pieces (text, series rows) into graph steps and graph
outputs into answers. It holds no per-session memory: everything a session
needs between pieces is in ``state`` (named arrays, batch axis of size 1),
plus, for models whose state must grow, append-only ``chunks`` that the
session store writes once and never rewrites.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from safetensors.numpy import load as safetensors_load
from tokenizers import Tokenizer

from service.tensor_codec import Arrays

T = TypeVar("T")


class InputError(ValueError):
    """The request's content cannot be processed as given (HTTP 422); the message says what to change, ``loc`` the
    field it is about when it is about one (``("body", "rows", 3, 2)``), ``kind`` the rule it breaks."""

    def __init__(self, message: str, loc: Sequence[str | int] | None = None, kind: str = "value_error") -> None:
        super().__init__(message)
        self.loc, self.kind = loc, kind


@dataclass
class Consumed:
    state: Arrays  # the new bounded state
    result: dict[str, Any]  # the running result the client sees after this piece
    units_read: int  # tokens / rows this piece added to what the session has read
    chunk: Arrays | None = None  # append-only part of the state written by this piece (SRformer)
    segments: int = 0  # graph steps applied


@dataclass
class FinalResult:
    result: dict[str, Any]
    tokens: AsyncIterator[str] | None = field(default=None)  # summaries can stream token by token
    segments: int = 0  # graph steps the finish applied (the tail of the document)


class Steps(Protocol):
    """What reads a document: a pipeline, or a loaded model (the same calls, metered)."""

    def new_state(self) -> Arrays: ...

    async def consume(self, state: Mapping[str, np.ndarray], piece: Any) -> Consumed: ...

    async def finish(
        self, state: Mapping[str, np.ndarray], chunks: list[Arrays], last_result: Mapping[str, Any] | None,
        stream: bool = False, options: Mapping[str, Any] | None = None,
    ) -> FinalResult: ...


class Pipeline(Steps, Protocol):
    """What the service sees of a family's pipeline (the ``pipeline`` part of its record); the routes, the
    session flow and the registry read these and nothing else, so that they hold no per-task branch."""

    task: str
    input_kind: str  # "text" | "rows": the piece a request or a session sends
    max_tokens: int | None  # most tokens of a document the model reads (text); None where it reads any length
    row_width: int | None  # values per row (rows); None for text
    example: Any  # an input that answers in full, for /docs (rows: a look-back's rows); None where the schema's serves
    value_range: dict[str, list[float]] | None  # per variable, the lowest and highest value taken (rows); None for text
    # the result field holding text generated at finish (summaries), which `stream` sends as it is generated;
    # None: the answer comes whole
    generated_text: str | None
    generated_tokens: str | None  # the result field counting the tokens generated (metered)


OVER_LIMIT = ("truncate", "refuse")  # what a text pipeline does with tokens past its model's limit


OFF_LOOP_CHARS = 4096  # pieces this long (~2 ms to tokenize here, 60 ms at 200,000) are cut on a thread


async def cut_text(feed: Callable[[Arrays, str], T], state: Arrays, text: str) -> T:
    """``feed(state, text)``: a text stream cutting a piece into segments. A long piece is cut on a worker
    thread (the tokenizer releases the GIL), so that other requests' pieces and decode steps go on meanwhile;
    a short one inline, where the thread hop would cost more than it frees."""
    if len(text) < OFF_LOOP_CHARS:
        return feed(state, text)
    return await asyncio.to_thread(feed, state, text)


def check_reading(reading: Mapping[str, Any], limit: int | None, over_limit: str, model: str) -> None:
    """With ``over_limit="refuse"``, a document longer than the model reads is a 422 (nothing applied)."""
    if over_limit == "refuse" and reading["truncated"]:
        raise InputError(
            f"the document is longer than {model} reads: it reads the first {limit} tokens and this document has "
            f"{reading['tokens_total']} so far. Send a shorter document, or ask the operator for "
            "RTSERVE_OVER_LIMIT=truncate (the model then reads the first tokens and says truncated: true)"
        )


def load_initial_state(entry: Path) -> Arrays:
    """``init_state(1)`` as the exporter wrote it (learned initial memory, zeros, ...)."""
    return dict(safetensors_load((entry / "initial_state.safetensors").read_bytes()))


class TextPipeline:
    """What the pipelines that read text share: the entry's tokenizer and initial state, and the reading
    limit of the family's stream (``self.stream``, set by the subclass: its ``limit`` and ``reading``)."""

    input_kind = "text"
    row_width = value_range = example = None
    generated_text: str | None = None
    generated_tokens: str | None = None
    stream: Any

    def __init__(self, manifest: Mapping[str, Any], entry: Path, over_limit: str = "truncate") -> None:
        self.manifest, self.over_limit = manifest, over_limit
        self.tokenizer = Tokenizer.from_file(str(entry / manifest["assets"]["tokenizer"]))
        self.initial_state = load_initial_state(entry)

    @property
    def max_tokens(self) -> int | None:
        return self.stream.limit

    def new_state(self) -> Arrays:
        return dict(self.initial_state)

    def _check(self, state: Mapping[str, np.ndarray]) -> None:
        check_reading(self.stream.reading(state), self.stream.limit, self.over_limit, self.manifest["name"])


def reads_nothing(result: Mapping[str, Any]) -> bool:
    """True for a text model's answer to a document it read no token of (empty, whitespace, control characters)."""
    return result.get("tokens_total") == 0


async def run_whole(
    steps: Steps, piece: Any, stream: bool = False, options: Mapping[str, Any] | None = None
) -> tuple[Consumed, FinalResult]:
    """A one-shot request: the same ``consume`` and ``finish`` a session runs, on one piece."""
    consumed = await steps.consume(steps.new_state(), piece)
    chunks = [consumed.chunk] if consumed.chunk else []
    finished = await steps.finish(consumed.state, chunks, consumed.result, stream=stream, options=options)
    return consumed, finished
