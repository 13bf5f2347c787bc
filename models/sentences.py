"""Sentences of a document, as character spans: the unit that sentence-copy summaries and the readability
measures count in.

Rules, in order (a line break always ends a sentence: titles, headers and paragraphs are their own units):

- a sentence ends at ``.``, ``!`` or ``?`` (with any closing quotes or brackets after it) followed by white
  space and the start of a new sentence: an upper-case letter, a digit or an opening quote in cased text;
  any letter in uncased text (SumPubMed is lower-cased upstream, so case cannot mark a start);
- not after a known abbreviation (``Mr.``, ``e.g.``, ``et al.``, months, ``U.S.``, a cultivar's ``cv.``, a
  species' ``sp.`` and ``spp.``) or a single capital
  (an initial: ``J. Smith``; in uncased text any single letter: ``e. coli``);
- BBC articles glue some sentences with no space (``stabilise.China's``, ``$360m.Under``, ``1997.They``,
  ``sales.GM``, ``Idec."Most``): in cased text a full stop after two lower-case letters or digits (or
  a figure's unit or %) and before a capital, or an opening quote and a capital, ends a sentence too
  (``U.S.``, ``3.5`` and ``bbc.co.uk`` do not match).

A text is *uncased* when its sentences start in lower case (:func:`is_uncased`).
"""

from __future__ import annotations

import re

ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st sr jr rev gen col lt sgt capt gov sen rep mt ft no nos vs etc al fig figs eq eqs "
    "e.g i.e approx ca cf inc ltd co corp dept est vol pp ed eds jan feb mar apr jun jul aug sep sept oct "
    "nov dec u.s u.k u.n e.u a.m p.m cv cvs sp spp subsp ssp var resp".split()
)
_CLOSERS = "\"'”’)]"
_OPENERS = "\"'“‘(["
# a candidate end: terminal punctuation, closers, then white space (same line) and the next character
_SPACED_END = re.compile(r"[.!?]+[" + re.escape(_CLOSERS) + r"]*(?=[ \t]+(\S))")
ENDS_SENTENCE = re.compile(r"[.!?][" + re.escape(_CLOSERS) + r"]*$")  # text that ends as a sentence ends
_GLUED_END = re.compile(r"(?:(?<=[a-z]{2})|(?<=[0-9][0-9a-z%])|(?<=[a-z][0-9a-z%]))\.(?=[\"“]?[A-Z])")
_WORD_BEFORE = re.compile(r"([\w.]+)[.!?]*[" + re.escape(_CLOSERS) + r"]*$")
# a word: letters and digits, joined across an inner apostrophe, hyphen, full stop or comma ("Stuart's",
# "e-mail", "0.7", "1,000"); punctuation is not a word
_WORD = re.compile(r"[^\W_]+(?:['’.,-][^\W_]+)*")


def words(text: str) -> list[str]:
    """The words of ``text``, as written: what the readability measures and sentence copy's trigram rule count."""
    return _WORD.findall(text)


def is_uncased(text: str) -> bool:
    """True for text lower-cased upstream: after a full stop and a space, lower-case letters outnumber
    capitals (or, with no such place, capitals are under 1 in 200 letters); all-capital header words
    (SumPubMed's ``BACKGROUND``) do not count."""
    starts = re.findall(r"[.!?] +([A-Za-z])", text)
    if starts:
        return sum(ch.islower() for ch in starts) > len(starts) / 2
    words = [word for word in re.findall(r"[A-Za-z]+", text) if not (word.isupper() and len(word) > 1)]
    letters = sum(len(word) for word in words)
    upper = sum(ch.isupper() for word in words for ch in word)
    return letters > 0 and upper * 200 < letters


def _is_abbreviation(line: str, end: int, uncased: bool = False) -> bool:
    """Whether the full stop ending at ``end`` (exclusive) closes an abbreviation or an initial (in uncased
    text any single letter: "e. coli", "s. cerevisiae")."""
    match = _WORD_BEFORE.search(line, 0, end)
    if match is None:
        return False
    word = match.group(1).rstrip(".")
    if line[end - 1] != "." and not line[match.end(1) - 1 : end].startswith("."):
        return False  # ! and ? always end a sentence
    if word.lower() in ABBREVIATIONS:
        return True
    return len(word) == 1 and (word.isupper() or (uncased and word.isalpha()))  # an initial


def _line_spans(line: str, offset: int, uncased: bool) -> list[tuple[int, int]]:
    ends: list[int] = []
    for match in _SPACED_END.finditer(line):
        following = match.group(1)
        starts_sentence = following[0].isalpha() if uncased else (
            following[0].isupper() or following[0].isdigit() or following[0] in _OPENERS)
        if starts_sentence and not _is_abbreviation(line, match.end(), uncased):
            ends.append(match.end())
    if not uncased:
        ends += [match.end() for match in _GLUED_END.finditer(line)]
    spans: list[tuple[int, int]] = []
    start = 0
    for end in sorted(set(ends)):
        spans.append((start, end))
        start = end
    spans.append((start, len(line)))
    out = []
    for a, b in spans:
        piece = line[a:b]
        stripped_left = len(piece) - len(piece.lstrip())
        stripped_right = len(piece.rstrip())
        if piece.strip():
            out.append((offset + a + stripped_left, offset + a + stripped_right))
    return out


def sentence_spans(text: str, uncased: bool | None = None) -> list[tuple[int, int]]:
    """``(start, end)`` character offsets of each sentence of ``text``, in order, without surrounding space.
    ``uncased`` None: decided from the text (:func:`is_uncased`)."""
    if uncased is None:
        uncased = is_uncased(text)
    spans: list[tuple[int, int]] = []
    for line in re.finditer(r"[^\n]+", text):
        spans += _line_spans(line.group(0), line.start(), uncased)
    return spans


def sentences(text: str, uncased: bool | None = None) -> list[str]:
    """The sentences of ``text`` (see :func:`sentence_spans`)."""
    return [text[a:b] for a, b in sentence_spans(text, uncased)]


def capitalised(sentence: str) -> str:
    """``sentence`` with its first letter in upper case (the rest as written)."""
    for i, ch in enumerate(sentence):
        if ch.isalpha():
            return sentence[:i] + ch.upper() + sentence[i + 1 :]
        if ch.isdigit():
            return sentence
    return sentence
