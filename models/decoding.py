"""Searches over a decoder's log-probabilities, in numpy: greedy and beam search, no-repeat n-grams.

The one decoder search of the project, family-agnostic: the service's decode loop
(:class:`service.runtime.decode_loop.DecodeLoop`, steps of many documents in one batched call of the
exported graph), ``SRformer.generate`` (training's dev selection and ``rtserve eval`` of a checkpoint)
and ``rtserve eval`` of an exported entry all drive these state machines one step at a time:

    search.tokens, search.t          the next step's inputs for its rows (rows = beams)
    search.advance(logp (rows, V))   reads the step's log-probabilities over ``vocab_ids`` and
                                     returns the parent row of every row (beam reordering)
    search.done, search.result()     finished? the chosen ids (without [CLS] / [SEP])

The searches know nothing about the model: ``vocab_ids`` (V,) maps a column of the log-probabilities
to a token id, ``bos`` starts every sequence and ``eos`` ends it. Given sentence-end ids ``ends`` and a
``target`` length (the model's summary length), a summary also ends at the first sentence end at or past
the target, so it never stops mid-sentence because it reached its length; ``min_length`` keeps ``eos``
out until the summary has that many tokens (the service passes the target: the length follows the
model's summary ratio, not the decoder's own guess of when to stop).
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


class NgramBan:
    """The no-repeat n-gram rule for one growing sequence, kept up to date in O(1) per token.

    ``banned()`` equals :func:`banned_ids` of the sequence so far: the tokens that followed an earlier
    occurrence of the last n-1 tokens.
    """

    def __init__(self, n: int, sequence: list[int] | None = None) -> None:
        self.n = n
        self.sequence: list[int] = []
        self.followers: dict[tuple[int, ...], set[int]] = {}
        for token in sequence or []:
            self.push(token)

    def push(self, token: int) -> None:
        self.sequence.append(token)
        if self.n > 0 and len(self.sequence) >= self.n:
            prefix = tuple(self.sequence[len(self.sequence) - self.n : -1])
            self.followers.setdefault(prefix, set()).add(token)

    def banned(self) -> set[int]:
        if self.n <= 0 or len(self.sequence) < self.n - 1:
            return set()
        return self.followers.get(tuple(self.sequence[len(self.sequence) - self.n + 1 :]), set())

    def copy(self) -> NgramBan:
        twin = NgramBan(0)
        twin.n, twin.sequence = self.n, list(self.sequence)
        twin.followers = {prefix: set(tokens) for prefix, tokens in self.followers.items()}
        return twin


def ban_columns(logp_row: np.ndarray, banned: set[int], vocab_ids: np.ndarray) -> None:
    """Set the log-probability of each banned token to NEG, in place (``vocab_ids`` sorted, as built)."""
    if not banned:
        return
    tokens = np.fromiter(banned, dtype=np.int64, count=len(banned))
    columns = np.searchsorted(vocab_ids, tokens).clip(max=len(vocab_ids) - 1)
    with np.errstate(over="ignore"):  # a float16 row (an fp16 export): NEG becomes -inf, as banned
        logp_row[columns[vocab_ids[columns] == tokens]] = NEG


class GreedySearch:
    """One row: the most likely token at every step, until ``eos`` or ``limit`` tokens.

    ``on_token`` sees the ids so far after every new token (for streaming).
    """

    def __init__(self, bos: int, eos: int, vocab_ids: np.ndarray, limit: int, no_repeat: int,
                 on_token: TokenCallback | None = None, ends: frozenset[int] = frozenset(),
                 target: int | None = None, min_length: int = 0) -> None:
        self.rows = 1
        self.bos, self.eos, self.vocab_ids, self.limit, self.no_repeat = bos, eos, vocab_ids, limit, no_repeat
        self.ends, self.target = ends, target if target is not None else limit
        self.min_length = min(min_length, limit)
        self.on_token = on_token
        self.ban = NgramBan(no_repeat)
        self.sequence = self.ban.sequence
        self.tokens = np.array([bos], dtype=np.int64)
        self.t = 0
        self.done = limit <= 0

    def advance(self, logp: np.ndarray) -> np.ndarray:
        """``logp`` (1, >= V) is this search's own rows of the step's output (it may be changed in place)."""
        row = logp[0, : len(self.vocab_ids)]
        ban_columns(row, self.ban.banned(), self.vocab_ids)
        if self.t < self.min_length:
            ban_columns(row, {self.eos}, self.vocab_ids)
        chosen = int(self.vocab_ids[int(row.argmax())])
        self.t += 1
        if chosen == self.eos:
            self.done = True
        else:
            self.ban.push(chosen)
            if self.on_token is not None:
                self.on_token(self.sequence)
            self.tokens = np.array([chosen], dtype=np.int64)
            self.done = self.t >= self.limit or (chosen in self.ends and self.t >= self.target)
        return np.zeros(1, dtype=np.int64)

    def result(self) -> list[int]:
        return self.sequence


class BeamSearch:
    """``beams`` rows; hypotheses end at ``eos``; scores are normalised by length ** ``length_penalty``."""

    def __init__(self, bos: int, eos: int, vocab_ids: np.ndarray, limit: int, no_repeat: int, beams: int,
                 length_penalty: float = 1.0, ends: frozenset[int] = frozenset(), target: int | None = None,
                 min_length: int = 0) -> None:
        self.rows = beams
        self.bos, self.eos, self.vocab_ids, self.limit, self.no_repeat = bos, eos, vocab_ids, limit, no_repeat
        self.ends, self.target = ends, target if target is not None else limit
        self.min_length = min(min_length, limit)
        self.length_penalty = length_penalty
        self.bans = [NgramBan(no_repeat) for _ in range(beams)]
        self.sequences: list[list[int]] = [ban.sequence for ban in self.bans]
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
        logp = logp[:, :width]
        for row, ban in enumerate(self.bans):
            ban_columns(logp[row], ban.banned(), self.vocab_ids)
            if len(ban.sequence) < self.min_length:
                ban_columns(logp[row], {self.eos}, self.vocab_ids)
        total = (self.scores[:, None] + logp).reshape(-1)
        order = np.argsort(-total, kind="stable")[: 2 * beams]
        rows: list[int] = []
        next_bans: list[NgramBan] = []
        next_scores: list[float] = []
        for flat in order:
            value = float(total[flat])
            if value <= NEG / 2:
                continue
            row, column = divmod(int(flat), width)
            token = int(self.vocab_ids[column])
            if token == self.eos:
                self.finished.append((self._normalised(value, self.sequences[row]), list(self.sequences[row])))
                continue
            if token in self.ends and len(self.sequences[row]) + 1 >= self.target:  # ends at this sentence end
                ended = [*self.sequences[row], token]
                self.finished.append((self._normalised(value, ended), ended))
                continue
            rows.append(row)
            ban = self.bans[row].copy()
            ban.push(token)
            next_bans.append(ban)
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
            next_bans.append(next_bans[0])
            next_scores.append(NEG)
        self.bans, self.scores = next_bans, np.array(next_scores)
        self.sequences = [ban.sequence for ban in self.bans]
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
