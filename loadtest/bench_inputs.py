"""Inputs of ``rtserve bench``, prepared before any timing: real documents and series, bodies as bytes.

- Classification (RMT): Hyperpartisan articles cut into pieces that each complete exactly one
  segment, so each piece the server receives triggers exactly one ``step``. The cut is found with
  the model's own tokenizer and the same :class:`SegmentCutter` the classify pipeline runs, and the
  segments it yields (token ids and mask) are kept: the offline measurement steps the very same ones.
- Summarization: BBC News test articles, one ``/summarize`` body each; and, for the decode
  scenario, sessions whose pieces close whole encoder windows (one or two per article).
- Forecasting: ETTh1 test rows, pieces of equal length (so the batcher may stack them).
- Summarization sessions (GPU rows only): pieces that each close one encoder window.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.text_stream import Segment, SegmentCutter


@dataclass
class SessionInput:
    """One session's pieces, each a ready request body that applies exactly one step."""

    pieces: list[bytes]  # {"seq": i, "text" | "rows": ...} as JSON bytes
    segments: list[Segment] = field(default_factory=list)  # RMT only: what the server will step, in order


def piece_body(seq: int, key: str, value: Any) -> bytes:
    return json.dumps({"seq": seq, key: value}, separators=(",", ":")).encode()


def cutter_for(entry: Path, manifest: Mapping[str, Any], segment_size: int, max_segments: int | None) -> SegmentCutter:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(entry / manifest["assets"]["tokenizer"]))
    return SegmentCutter(tokenizer, segment_size, max_segments, int(manifest["settings"]["pending_bytes"]))


def _shortest_completing_end(cutter: SegmentCutter, state: Mapping[str, np.ndarray], text: str, start: int) -> int:
    """Smallest ``end`` such that feeding ``text[start:end]`` completes a segment (0 if none does).

    Feeding a longer prefix never completes fewer segments, so a binary search finds it.
    """
    low, high = start + 1, len(text)
    if high < low or not cutter.feed(state, text[start:high])[1]:
        return 0
    while low < high:
        middle = (low + high) // 2
        if cutter.feed(state, text[start:middle])[1]:
            high = middle
        else:
            low = middle + 1
    return low


def one_segment_pieces(cutter: SegmentCutter, text: str, count: int) -> tuple[list[str], list[Segment]]:
    """Up to ``count`` consecutive pieces of ``text`` of which each completes exactly one segment."""
    state = cutter.init_state()
    pieces: list[str] = []
    segments: list[Segment] = []
    start = 0
    while len(pieces) < count:
        end = _shortest_completing_end(cutter, state, text, start)
        if end == 0:
            break
        state, completed = cutter.feed(state, text[start:end])
        if len(completed) != 1:  # one character finished a word longer than a segment: stop here
            break
        pieces.append(text[start:end])
        segments.append(completed[0])
        start = end
    return pieces, segments


def first_whole_cuts(
    cutter: SegmentCutter, documents: int, text_of: Callable[[int, int], str], count_of: Callable[[int], int],
    sessions: int, what: str,
) -> list[tuple[list[str], list[Segment]]]:
    """The pieces and segments of the first ``sessions`` documents that each yield ``count`` one-segment pieces.

    Document ``index`` is ``text_of(index, count)``, ``count`` being ``count_of(documents kept so far)``;
    ``what`` names the wanted cut in the error when too few documents yield it.
    """
    kept: list[tuple[list[str], list[Segment]]] = []
    for index in range(documents):
        count = count_of(len(kept))
        cut, segments = one_segment_pieces(cutter, text_of(index, count), count)
        if len(cut) == count:
            kept.append((cut, segments))
        if len(kept) == sessions:
            return kept
    raise ValueError(f"only {len(kept)} of the documents yield {what}; {sessions} needed")


def classify_sessions(
    entry: Path, manifest: Mapping[str, Any], texts: list[str], sessions: int, pieces: int
) -> list[SessionInput]:
    """``sessions`` documents (the first long enough), each cut into ``pieces`` one-segment pieces."""
    settings = manifest["settings"]
    limit = settings["max_segments"]  # None: the model reads every segment
    count = pieces if limit is None else min(pieces, int(limit))
    cutter = cutter_for(entry, manifest, int(settings["segment_size"]), limit)
    cuts = first_whole_cuts(cutter, len(texts), lambda index, _: texts[index], lambda _: count, sessions,
                            f"{count} whole segments")
    return [SessionInput(text_session(cut).pieces, segments) for cut, segments in cuts]


def window_cutter(entry: Path, manifest: Mapping[str, Any]) -> tuple[SegmentCutter, int]:
    """The summarizer's encoder-window cutter and how many whole windows the model reads."""
    settings = manifest["settings"]
    windows = int(settings["max_windows"])
    if int(settings["max_source"]):
        windows = min(windows, int(settings["max_source"]) // int(settings["encoder_window"]))
    return cutter_for(entry, manifest, int(settings["encoder_window"]) + 2, int(settings["max_windows"])), windows


def text_session(pieces: list[str]) -> SessionInput:
    return SessionInput([piece_body(seq, "text", piece) for seq, piece in enumerate(pieces, start=1)])


def window_sessions(
    entry: Path, manifest: Mapping[str, Any], sessions: int, documents: int, text_of: Callable[[int, int], str],
    count_of: Callable[[int, int], int],
) -> list[SessionInput]:
    """Summarization sessions whose pieces each close one encoder window (one ``encode_window`` step): document
    ``index`` is ``text_of(index, count)``, cut into ``count = count_of(the model's windows, sessions kept)``."""
    cutter, windows = window_cutter(entry, manifest)
    cuts = first_whole_cuts(cutter, documents, text_of, lambda kept: count_of(windows, kept), sessions,
                            "whole encoder windows")
    return [text_session(cut) for cut, _ in cuts]


def summarize_sessions(
    entry: Path, manifest: Mapping[str, Any], texts: list[str], sessions: int, pieces: int
) -> list[SessionInput]:
    """Articles cut into ``pieces`` pieces (at most the windows the model reads), each closing one encoder window."""
    return window_sessions(entry, manifest, sessions, len(texts), lambda index, _: texts[index],
                           lambda windows, _: min(pieces, windows))


def decode_sessions(
    entry: Path, manifest: Mapping[str, Any], texts: list[str], sessions: int
) -> list[SessionInput]:
    """Summarization sessions of different source lengths (one or two whole encoder windows, alternately)
    whose pieces close every window, so that a finish encodes at most a few trailing tokens and is,
    in the main, the summary's decoding. Document ``i`` is article ``i`` followed by the next ones,
    as far as its windows reach (most BBC articles are shorter than one window)."""
    return window_sessions(entry, manifest, sessions, len(texts),
                           lambda start, count: "\n\n".join(texts[start : start + 4 * count]),  # long enough
                           lambda windows, kept: 1 + kept % max(windows, 1))


def forecast_sessions(
    values: np.ndarray, lookback: int, sessions: int, piece_rows: int, extra_pieces: int
) -> list[SessionInput]:
    """Sessions over consecutive stretches of ``values``: the look-back, then ``extra_pieces``; equal lengths."""
    pieces = math.ceil(lookback / piece_rows) + extra_pieces
    span = pieces * piece_rows
    if span * sessions > len(values):
        raise ValueError(f"{sessions} sessions of {span} rows need {span * sessions}; the series has {len(values)}")
    prepared = []
    for index in range(sessions):
        rows = values[index * span : (index + 1) * span].tolist()
        chunks = [rows[i : i + piece_rows] for i in range(0, span, piece_rows)]
        prepared.append(SessionInput([piece_body(seq, "rows", c) for seq, c in enumerate(chunks, start=1)]))
    return prepared


# ---- the datasets (see ../shared/data/README.md) -------------------------------------------------
def hyperpartisan_texts(data: Path) -> list[str]:
    """Every labelled article, test split first (the order is fixed, so every run sends the same text)."""
    from models.data.hyperpartisan import load_split

    folder = data / "hyperpartisan"
    test = load_split(folder, "test")
    test_ids = {article.id for article in test}
    rest = [article for article in load_split(folder, "all") if article.id not in test_ids]
    return [article.text for article in test + rest]


def bbc_texts(data: Path, count: int) -> list[str]:
    from models.data.bbc import load_split

    pairs = load_split(data / "bbc-news-summary", "test", limit=count)
    if len(pairs) < count:
        raise ValueError(f"the BBC test split has {len(pairs)} articles; {count} needed")
    return [pair.document for pair in pairs]


def etth1_values(data: Path, variables: list[str]) -> np.ndarray:
    """Every ETTh1 row (speed does not depend on the split), columns in the model's order."""
    from models.data.ett import read_csv

    series = read_csv(data / "ETT-small" / "ETTh1.csv")
    columns = [series.names.index(name) for name in variables]
    return series.values[:, columns]
