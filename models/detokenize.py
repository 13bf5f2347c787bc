"""Summary ids -> text: WordPiece pieces joined into words, words checked against the document, spacing cleaned.

The tokenizer's own WordPiece decoder (``tokenizers``, ``cleanup=True``) joins ``##`` pieces to the word before and
puts a space between all other tokens; its clean-up works on one token at a time, so what BERT's pre-tokenizer
split apart stays apart: ``year ' s``, ``us - based``, ``$ 1. 2871``, ``1, 000``, ``( bbc )``. :func:`clean_spacing`
rejoins those on the whole text.

For models that copy from the document (``output_vocab`` "source": every generated id is a document id), a word
is kept only when the document has it, piece for piece. That removes two artifacts the decoder makes: a word glued
from pieces of different document words (``kil`` + ``##rfield``), and a word cut at the length cap (``compan``
before ``##y`` could come): a summary always ends at a word boundary.

With a :class:`models.letter_case.DocumentCase`, each word then takes the letter case the document writes it
with, and sentence starts are capitalised: an uncased vocabulary does not show in the text.

Streaming (:class:`WordStream`) sends text only once the words it holds can no longer change: a word is complete
when the next word starts, and the last two words are held back because spacing clean-up may still join them
with what follows. The pieces, concatenated, are exactly the final summary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tokenizers import Tokenizer

from models.letter_case import DocumentCase

# (pattern, replacement), applied in order to the decoder's text
_RULES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"(\w) ' (s|t|re|ve|m|ll|d)\b"), r"\1'\2"),  # year ' s, don ' t
    (re.compile(r"(\w) (n't)\b"), r"\1\2"),  # do n't (when split that way)
    (re.compile(r"(\w) '(?= |$)"), r"\1'"),  # the players ' union (a plural possessive)
    (re.compile(r"(\w) ?- ?(?=\w)"), r"\1-"),  # us - based (hyphens outnumber spaced dashes 4:1 in BBC text)
    (re.compile(r"(\d) ?([.,:]) (?=\d)"), r"\1\2"),  # 1. 2871, 1, 000, 10: 30
    (re.compile(r"([$£€#@]) (?=\w)"), r"\1"),  # $ 1 (currency before a number)
    (re.compile(r"([(\[{]) "), r"\1"),  # ( bbc
    (re.compile(r" ([)\]}.,!?;:%])"), r"\1"),  # bbc ), 5 %, end .
    (re.compile(r"< (dig|cit) >"), r"<\1>"),  # SumPubMed's placeholders, written as its documents write them
]  # (quotes stay as the decoder spaces them: which quote opens and which closes is not local to a few words)


def clean_spacing(text: str) -> str:
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text


class Detokenizer:
    """Ids -> text for one tokenizer; ``source_ids`` (when given) is the document the words must come from."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.continuation = frozenset(i for token, i in tokenizer.get_vocab().items() if token.startswith("##"))

    def words(self, ids: Iterable[int]) -> list[tuple[int, ...]]:
        """Ids grouped into words: a word starts at a piece without ``##``."""
        words: list[list[int]] = []
        for token in ids:
            if token in self.continuation and words:
                words[-1].append(int(token))
            else:
                words.append([int(token)])
        return [tuple(word) for word in words]

    def vocabulary(self, source_ids: Iterable[int]) -> frozenset[tuple[int, ...]]:
        """The document's words, piece for piece."""
        return frozenset(self.words(source_ids))

    def text(self, ids: Iterable[int], known: frozenset[tuple[int, ...]] | None = None,
             case: DocumentCase | None = None) -> str:
        """The summary text of ``ids``; with ``known``, only words the document has; with ``case``, in the
        document's letter case (see module docstring)."""
        words = self.words(ids)
        if known is not None:
            words = [word for word in words if word in known]
        text = clean_spacing(self.tokenizer.decode([token for word in words for token in word]))
        return case.restore(text) if case is not None else text


def sentence_end_ids(tokenizer: Tokenizer) -> frozenset[int]:
    """Ids of the tokens that end a sentence (``.``, ``!``, ``?``)."""
    vocabulary = tokenizer.get_vocab()
    return frozenset(vocabulary[mark] for mark in ".!?" if mark in vocabulary)


class WordStream:
    """Text pieces of a growing id sequence that never need taking back (see module docstring)."""

    HELD_WORDS = 2

    def __init__(self, detokenizer: Detokenizer, known: frozenset[tuple[int, ...]] | None,
                 case: DocumentCase | None = None) -> None:
        self.detokenizer, self.known, self.case = detokenizer, known, case
        self.sent = ""

    def update(self, ids: list[int]) -> str | None:
        """After each new id: the next piece, or None while nothing new is certain."""
        words = self.detokenizer.words(ids)
        if len(words) <= 1:
            return None
        complete = [token for word in words[:-1] for token in word]  # the last word may still grow
        text = self.detokenizer.text(complete, self.known, self.case)
        cut = _start_of_held_words(text, self.HELD_WORDS)
        if cut <= len(self.sent) or not text.startswith(self.sent):
            return None
        piece, self.sent = text[len(self.sent) : cut], text[:cut]
        return piece

    def finish(self, final_text: str) -> str | None:
        """The rest of the summary, once generation ended."""
        if not final_text.startswith(self.sent):  # cannot happen with the rules above; never send a wrong text
            raise AssertionError(f"streamed {self.sent!r} is not a prefix of the summary {final_text!r}")
        rest = final_text[len(self.sent) :]
        self.sent = final_text
        return rest or None


def _start_of_held_words(text: str, held: int) -> int:
    """Index where the last ``held`` space-separated words of ``text`` begin (at the space before them)."""
    cut = len(text)
    for _ in range(held):
        cut = text.rfind(" ", 0, cut)
        if cut <= 0:
            return 0
    return cut
