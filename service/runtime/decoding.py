"""Search over a decoder-step function, in numpy: greedy and beam search with no-repeat n-grams.

``step(tokens (B,), t, cache) -> (log-probabilities (B, V), cache')`` is any batched step;
``vocab_ids`` (V,) maps a column of the log-probabilities to a token id. The search is the
same for every backend, and a cache is a dict of arrays whose axis 0 is the beam.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

NEG = -1e30
Cache = dict[str, np.ndarray]
StepFn = Callable[[np.ndarray, int, Cache], Awaitable[tuple[np.ndarray, Cache]]]


def banned_ids(sequence: list[int], n: int) -> list[int]:
    """Tokens that would repeat an n-gram already in ``sequence``."""
    if n <= 0 or len(sequence) < n - 1:
        return []
    prefix = tuple(sequence[len(sequence) - n + 1 :]) if n > 1 else ()
    return [sequence[i + n - 1] for i in range(len(sequence) - n + 1) if tuple(sequence[i : i + n - 1]) == prefix]


def _ban(logp: np.ndarray, sequences: list[list[int]], vocab_ids: np.ndarray, n: int) -> np.ndarray:
    if n <= 0:
        return logp
    logp = logp.copy()
    for row, sequence in enumerate(sequences):
        for token in banned_ids(sequence, n):
            logp[row, vocab_ids == token] = NEG
    return logp


async def greedy(
    step: StepFn, cache: Cache, bos: int, eos: int, vocab_ids: np.ndarray, limit: int, no_repeat: int,
    on_token: Callable[[list[int]], Awaitable[None]] | None = None,
) -> list[int]:
    """One sequence; ``on_token`` sees the ids so far after every new token (for streaming)."""
    sequence: list[int] = []
    token = np.array([bos], dtype=np.int64)
    for t in range(limit):
        logp, cache = await step(token, t, cache)
        logp = _ban(logp, [sequence], vocab_ids, no_repeat)
        chosen = int(vocab_ids[int(logp[0].argmax())])
        if chosen == eos:
            break
        sequence.append(chosen)
        if on_token is not None:
            await on_token(sequence)
        token = np.array([chosen], dtype=np.int64)
    return sequence


async def beam_search(
    step: StepFn, cache: Cache, bos: int, eos: int, vocab_ids: np.ndarray, limit: int, no_repeat: int,
    beams: int, length_penalty: float = 1.0,
) -> list[int]:
    """Beam search over ``beams`` rows; the cache must already have ``beams`` rows."""
    sequences: list[list[int]] = [[] for _ in range(beams)]
    scores = np.full(beams, NEG)
    scores[0] = 0.0  # all beams start identical: keep one alive
    tokens = np.full(beams, bos, dtype=np.int64)
    finished: list[tuple[float, list[int]]] = []
    width = len(vocab_ids)
    for t in range(limit):
        logp, cache = await step(tokens, t, cache)
        logp = _ban(logp, sequences, vocab_ids, no_repeat)
        total = (scores[:, None] + logp).reshape(-1)
        order = np.argsort(-total, kind="stable")[: 2 * beams]
        rows: list[int] = []
        next_sequences: list[list[int]] = []
        next_scores: list[float] = []
        for flat in order:
            value = float(total[flat])
            if value <= NEG / 2:
                continue
            row, column = divmod(int(flat), width)
            token = int(vocab_ids[column])
            if token == eos:
                finished.append((value / max(len(sequences[row]), 1) ** length_penalty, sequences[row]))
                continue
            rows.append(row)
            next_sequences.append([*sequences[row], token])
            next_scores.append(value)
            if len(rows) == beams:
                break
        best_done = max((score for score, _ in finished), default=None)
        best_open = max(next_scores, default=None)
        if not rows or (
            best_done is not None and len(finished) >= beams and best_open is not None
            and best_open / (t + 1) ** length_penalty < best_done
        ):
            break
        while len(rows) < beams:  # pad with dead copies
            rows.append(rows[0])
            next_sequences.append(next_sequences[0])
            next_scores.append(NEG)
        index = np.array(rows)
        cache = {name: value[index] for name, value in cache.items()}
        sequences, scores = next_sequences, np.array(next_scores)
        tokens = np.array([sequence[-1] for sequence in sequences], dtype=np.int64)
    for row in range(beams):
        if scores[row] > NEG / 2:
            finished.append((float(scores[row]) / max(len(sequences[row]), 1) ** length_penalty, sequences[row]))
    return max(finished, key=lambda item: item[0])[1] if finished else sequences[0]


def repeat_rows(arrays: dict[str, Any], rows: int) -> dict[str, np.ndarray]:
    return {name: np.repeat(np.asarray(value), rows, axis=0) for name, value in arrays.items()}
