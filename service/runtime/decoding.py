"""Searches over a decoder's log-probabilities, in numpy: greedy and beam search, no-repeat n-grams.

A search is a small state machine that :class:`service.runtime.decode_loop.DecodeLoop` drives one
step at a time, so that steps of many documents share one batched call of the decode graph:

    search.tokens, search.t          the next step's inputs for its rows (rows = beams)
    search.advance(logp (rows, V))   reads the step's log-probabilities over ``vocab_ids`` and
                                     returns the parent row of every row (beam reordering)
    search.done, search.result()     finished? the chosen ids (without [CLS] / [SEP])

The searches know nothing about the model: ``vocab_ids`` (V,) maps a column of the log-probabilities
to a token id, ``bos`` starts every sequence and ``eos`` ends it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

NEG = -1e30
TokenCallback = Callable[[list[int]], None]


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


class GreedySearch:
    """One row: the most likely token at every step, until ``eos`` or ``limit`` tokens.

    ``on_token`` sees the ids so far after every new token (for streaming).
    """

    def __init__(self, bos: int, eos: int, vocab_ids: np.ndarray, limit: int, no_repeat: int,
                 on_token: TokenCallback | None = None) -> None:
        self.rows = 1
        self.eos, self.vocab_ids, self.limit, self.no_repeat = eos, vocab_ids, limit, no_repeat
        self.on_token = on_token
        self.sequence: list[int] = []
        self.tokens = np.array([bos], dtype=np.int64)
        self.t = 0
        self.done = limit <= 0

    def advance(self, logp: np.ndarray) -> np.ndarray:
        logp = _ban(logp[:, : len(self.vocab_ids)], [self.sequence], self.vocab_ids, self.no_repeat)
        chosen = int(self.vocab_ids[int(logp[0].argmax())])
        self.t += 1
        if chosen == self.eos:
            self.done = True
        else:
            self.sequence.append(chosen)
            if self.on_token is not None:
                self.on_token(self.sequence)
            self.tokens = np.array([chosen], dtype=np.int64)
            self.done = self.t >= self.limit
        return np.zeros(1, dtype=np.int64)

    def result(self) -> list[int]:
        return self.sequence


class BeamSearch:
    """``beams`` rows; hypotheses end at ``eos``; scores are normalised by length ** ``length_penalty``."""

    def __init__(self, bos: int, eos: int, vocab_ids: np.ndarray, limit: int, no_repeat: int, beams: int,
                 length_penalty: float = 1.0) -> None:
        self.rows = beams
        self.eos, self.vocab_ids, self.limit, self.no_repeat = eos, vocab_ids, limit, no_repeat
        self.length_penalty = length_penalty
        self.sequences: list[list[int]] = [[] for _ in range(beams)]
        self.scores = np.full(beams, NEG)
        self.scores[0] = 0.0  # all beams start identical: keep one alive
        self.tokens = np.full(beams, bos, dtype=np.int64)
        self.finished: list[tuple[float, list[int]]] = []
        self.t = 0
        self.done = limit <= 0

    def _normalised(self, score: float, sequence: list[int]) -> float:
        return score / max(len(sequence), 1) ** self.length_penalty

    def advance(self, logp: np.ndarray) -> np.ndarray:
        beams, width = self.rows, len(self.vocab_ids)
        logp = _ban(logp[:, :width], self.sequences, self.vocab_ids, self.no_repeat)
        total = (self.scores[:, None] + logp).reshape(-1)
        order = np.argsort(-total, kind="stable")[: 2 * beams]
        rows: list[int] = []
        next_sequences: list[list[int]] = []
        next_scores: list[float] = []
        for flat in order:
            value = float(total[flat])
            if value <= NEG / 2:
                continue
            row, column = divmod(int(flat), width)
            token = int(self.vocab_ids[column])
            if token == self.eos:
                self.finished.append((self._normalised(value, self.sequences[row]), self.sequences[row]))
                continue
            rows.append(row)
            next_sequences.append([*self.sequences[row], token])
            next_scores.append(value)
            if len(rows) == beams:
                break
        self.t += 1
        best_done = max((score for score, _ in self.finished), default=None)
        best_open = max(next_scores, default=None)
        if not rows or (
            best_done is not None and len(self.finished) >= beams and best_open is not None
            and best_open / self.t ** self.length_penalty < best_done
        ):
            self.done = True
            return np.arange(beams, dtype=np.int64)
        while len(rows) < beams:  # pad with dead copies
            rows.append(rows[0])
            next_sequences.append(next_sequences[0])
            next_scores.append(NEG)
        self.sequences, self.scores = next_sequences, np.array(next_scores)
        self.tokens = np.array([sequence[-1] for sequence in self.sequences], dtype=np.int64)
        self.done = self.t >= self.limit
        return np.array(rows, dtype=np.int64)

    def result(self) -> list[int]:
        finished = list(self.finished)
        for row in range(self.rows):
            if self.scores[row] > NEG / 2:
                finished.append((self._normalised(float(self.scores[row]), self.sequences[row]), self.sequences[row]))
        return max(finished, key=lambda item: item[0])[1] if finished else self.sequences[0]


Search = GreedySearch | BeamSearch
