"""The units of a document a summary may copy, and the text a summarizer read. numpy and ``tokenizers`` only:
the service, the training recipes and the tests share it.

A copy unit is a sentence (``models/sentences.py``), or the sentences of a quotation that runs on within a
line, joined: a copied quote never starts or stops mid-quotation. :class:`DocumentText` is the text a
summarizer read cut into units, with the unit of every token it read; :meth:`DocumentText.copyable` says
which units a summary may copy at all. Titles and headers (a line that does not end as a sentence ends)
are never copied, nor what a reader takes for noise out of its place: lists of names, a table's notes, a
figure's legend, back matter. Which of the copyable units a summary copies is ``models/sentence_choice.py``.
"""

from __future__ import annotations

import re
from functools import cached_property

import numpy as np

from models.sentences import ENDS_SENTENCE, capitalised, is_uncased, sentence_spans

MIN_SENTENCE_WORDS = 4  # shorter units (section headers, fragments) are never copied
# In lower-cased text (scientific articles, SumPubMed) units under this many words are nearly all caption
# lines, footnotes and author notes ("scale bar: 10 mm.", "mt performed animal experiments.") or fragments
# left where the text's parentheses were removed upstream ("<cit> . for known disease associations.").
MIN_UNCASED_SENTENCE_WORDS = 7
# a unit that points the reader to a table or figure the summary does not have ("Table 2 shows ...")
_DISPLAY_REFERENCE = re.compile(
    r"\b(?:tables?|figures?|figs?\.|additional files?)\s*(?:<\s*dig\s*>|\d|[ivx]+\b|s\d)", re.IGNORECASE)
# a unit that ends by saying that something is shown, without where: a caption or legend ("data from three
# independent productions are shown.")
_LEGEND_ENDING = re.compile(
    r"\b(?:is|are)\s+(?:shown|depicted|illustrated|displayed|listed|summari[sz]ed|presented)\s*[.:]?\s*$",
    re.IGNORECASE)
# a unit that says what a figure's marks mean: its colours, bars, lines, arrows or symbols ("herv-mediated cnvs
# confirmed in this study are indicated in yellow.", "error bars represent ± <dig> sem", "circles represent the
# sts."), a legend's sentence, which reads as nonsense without the figure
_COLOUR = r"(?:red|green|blue|yellow|orange|purple|black|gr[ae]y|white|pink|cyan|magenta|brown|violet)"
_FIGURE_MARKS = re.compile(
    r"\b(?:is|are)\s+(?:shown|indicated|highlighted|marked|colou?red|shaded|boxed|circled|underlined|labell?ed"
    rf"|depicted|represented)\s+(?:in|by|with|as)\s+(?:\w+\s+)?{_COLOUR}\b"
    rf"|\b{_COLOUR}\s+(?:represents?|indicates?|denotes?)\b"
    r"|\b(?:error|scale)\s+bars?\s+(?:indicate|represent|denote|show|are)"
    rf"|\b(?:arrows?|arrowheads?|asterisks?|(?:{_COLOUR}|dashed|dotted|solid|broken|vertical|horizontal|thick|thin"
    r"|open|filled|closed)\s+(?:lines?|bars?|dots?|circles?|squares?|triangles?|symbols?|boxes|arrows?))\s+"
    r"(?:indicate|represent|denote|show|mark|point|correspond|connect)s?\b"
    r"|\b(?:bars|lines|dots|boxes|circles|symbols|squares|triangles)\s+(?:indicate|represent|denote)s?\b",
    re.IGNORECASE)
# every match holds one of these: testing for them first spares most units the pattern's scan (a third of the time)
_FIGURE_MARK_STEMS = ("represent", "indicat", "denot", "show", "mark", "point", "correspond", "connect", "highlight",
                      "colo", "shad", "box", "circl", "underlin", "label", "depict", "bar")


def _names_figure_marks(unit: str) -> bool:
    lowered = unit.lower()
    return any(stem in lowered for stem in _FIGURE_MARK_STEMS) and bool(_FIGURE_MARKS.search(unit))

# back matter, which no abstract carries: a software note's fields ("Operating system: ...") and the authors'
# contributions ("Smw ... drafted the manuscript.", "All authors read and approved the final manuscript.")
_BACK_MATTER = re.compile(
    r"^\W*(?:project name|project home ?page|operating systems?|programming languages?|other requirements"
    r"|licen[cs]e|any restrictions to use by non-academics)\s*:"
    r"|\b(?:drafted|wrote|revised|edited) (?:the|this) manuscript\b"
    r"|\bapproved the final (?:version of the )?manuscript"
    r"|\bconceived (?:of )?(?:and designed )?the (?:study|project)\b"
    r"|\bparticipated in (?:the )?(?:design|coordination) of|\bhelped (?:to )?draft\b",
    re.IGNORECASE)


_LINE_BREAK = re.compile(r"\s*\n\s*")  # notes stand on lines of their own
# a note's mark at a line's start: a number glued to its first word ("1backbone atom ...") or a letter
# before it ("a gene name ...", "b theoretical values ...")
_NOTE_MARK = re.compile(r"(\d{1,2})(?=[^\W\d_])|([a-h])\s")


def note_lines(text: str) -> list[tuple[int, int]]:
    """The spans of a text's table notes: lines that open with a note mark right after a line that opens with
    the mark before it, or right before one with the mark after it ("1backbone ...", "2docking ..."; "a gene
    name ...", "b theoretical ..."). Such a series is a table's footnotes, flattened into the text upstream;
    copied, a note reads as a stray fragment with a letter or a number stuck to it."""
    lines: list[tuple[int, int, tuple[str, int] | None]] = []
    start = 0
    for end, after in [(m.start(), m.end()) for m in _LINE_BREAK.finditer(text)] + [(len(text), len(text))]:
        while start < end and text[start].isspace():
            start += 1
        if start < end:
            mark = _NOTE_MARK.match(text, start)
            lines.append((start, end, None if mark is None else (
                ("number", int(mark.group(1))) if mark.group(1) else ("letter", ord(mark.group(2))))))
        start = after
    notes = []
    for i, (start, end, mark) in enumerate(lines):
        if mark is None:
            continue
        before = lines[i - 1][2] if i else None
        after = lines[i + 1][2] if i + 1 < len(lines) else None
        if before == (mark[0], mark[1] - 1) or after == (mark[0], mark[1] + 1):  # notes run in order
            notes.append((start, end))
    return notes


# a unit that ends in two or more "abbreviation, meaning" pairs: a legend's key ("cnv, copy-number variation;
# herv, human endogenous retrovirus.", "df, degrees of freedom; ms, mean square.")
_KEY = r"(?!(?:hence|thus|rather|while|first|second|third|and|or|but|so|yet)\b)[^\s,;]{1,6}"
_LEGEND_KEY = re.compile(rf"(?:^|[\s:])(?:{_KEY},\s[^,;.]+;\s*)+{_KEY},\s[^,;.]+\.\s*$", re.IGNORECASE)


class DocumentText:
    """The text a summarizer read: ``text`` cut after the last token it read, its sentences (``spans``; a
    sentence cut by the reading limit is dropped) and, per read token, the sentence it belongs to."""

    def __init__(self, text: str, tokenizer: object, tokens_read: int) -> None:
        encoding = tokenizer.encode_batch([text], add_special_tokens=False)[0]  # type: ignore[attr-defined]
        offsets = encoding.offsets[:tokens_read]
        self.ids = np.asarray(encoding.ids[:tokens_read], dtype=np.int64)
        truncated = len(encoding.ids) > tokens_read
        end = offsets[-1][1] if offsets else 0
        self.text = text if not truncated else text[:end]
        self.uncased = is_uncased(self.text)
        spans = sentence_spans(self.text, self.uncased)
        if truncated and spans and spans[-1][1] >= end and not ENDS_SENTENCE.search(self.text[:end]):
            spans = spans[:-1]  # the reading limit cut this sentence
        self.spans = _quote_units(self.text, spans)
        spans = self.spans
        starts = np.array([start for start, _ in offsets], dtype=np.int64)
        span_starts = np.array([a for a, _ in spans], dtype=np.int64)
        span_ends = np.array([b for _, b in spans], dtype=np.int64)
        index = np.searchsorted(span_starts, starts, side="right") - 1  # the last sentence starting at or before
        inside = (index >= 0) & (starts < span_ends[index.clip(0)] if len(spans) else False)
        self.sentence_of = np.where(inside, index, -1).astype(np.int64)  # (tokens,) -1: between sentences
        self.tokens = np.bincount(self.sentence_of[self.sentence_of >= 0], minlength=len(spans))  # per sentence

    @cached_property
    def _copyable(self) -> list[bool]:
        shortest = MIN_UNCASED_SENTENCE_WORDS if self.uncased else MIN_SENTENCE_WORDS
        notes = note_lines(self.text)
        in_note = [any(a <= start < b for a, b in notes) for start, _ in self.spans]
        units = [self.text[start:end] for start, end in self.spans]
        return [bool(ENDS_SENTENCE.search(unit)) and len(unit.split()) >= shortest and not is_name_list(unit)
                and not _DISPLAY_REFERENCE.search(unit) and not _LEGEND_ENDING.search(unit)
                and not _names_figure_marks(unit) and not _LEGEND_KEY.search(unit)
                and not _BACK_MATTER.search(unit) and _brackets_pair(unit)
                and not note
                for unit, note in zip(units, in_note, strict=True)]

    def copyable(self, j: int) -> bool:
        """A unit a summary may copy: it ends as a sentence ends (a title or header line does not), has
        ``MIN_SENTENCE_WORDS`` words (``MIN_UNCASED_SENTENCE_WORDS`` in lower-cased text), is not a list of
        names (:func:`is_name_list`), does not point to a table or figure, is not one of a table's notes
        (:func:`note_lines`), a legend's sentence (what a figure's colours, bars or arrows mean; what "is shown"),
        a legend's key of abbreviations or back matter (a software note's fields, the authors' contributions),
        and its brackets pair up (an unpaired one is text garbled upstream: "short ) non-coding rnas"). Decided
        once per unit."""
        return self._copyable[j]

    def sentence(self, j: int) -> str:
        """Sentence ``j`` as the document writes it (white space runs made one space), first letter capital."""
        start, end = self.spans[j]
        return capitalised(" ".join(self.text[start:end].split()))

    def words(self, j: int) -> int:
        start, end = self.spans[j]
        return len(self.text[start:end].split())


_LIST_SEPARATOR = re.compile(r"[,;:]")


def _brackets_pair(unit: str) -> bool:
    """Whether every ``(`` and ``[`` of ``unit`` is closed after it opens."""
    depth = {"(": 0, "[": 0}
    closes = {")": "(", "]": "["}
    for ch in unit:
        if ch in depth:
            depth[ch] += 1
        elif ch in closes:
            depth[closes[ch]] -= 1
            if depth[closes[ch]] < 0:
                return False
    return not any(depth.values())


def is_name_list(unit: str) -> bool:
    """A list of names that ends with a full stop, as a team line-up or a list of replacements does
    ("Phillips, Amankwaah, Coles, Hill, Fortune, Murray (Anyinsah 59), ...", "Subs Not Used: Orr, Brown."): two
    or more commas, semicolons or colons, and under 15% of its words starting with a lower-case letter (a
    sentence's function words do). A reader takes it for noise in a summary."""
    if len(_LIST_SEPARATOR.findall(unit)) < 2:
        return False
    words = [word.strip("\"'“”‘’()[]:;,.") for word in unit.split()]
    words = [word for word in words if word[:1].isalpha()]
    return len(words) >= MIN_SENTENCE_WORDS and sum(word[0].islower() for word in words) < 0.15 * len(words)


MAX_QUOTE_SENTENCES = 4  # a quotation longer than this is copied sentence by sentence


_QUOTE_MARK = re.compile(r'["“”]')


def open_quote(text: str) -> bool:
    """Whether ``text`` ends inside a quotation: its last quote mark opens one (“, or a straight quote not
    after a letter or punctuation). News style reopens a quotation that runs on ("I could tell you yes.
    "It's a blow ...), so counting marks would not tell."""
    marks = list(_QUOTE_MARK.finditer(text))
    if not marks:
        return False
    last = marks[-1]
    if last.group(0) != '"':
        return last.group(0) == "“"
    before = text[last.start() - 1] if last.start() else " "
    return before.isspace() or before in "([—-:"


def _quote_units(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sentences joined where a quotation runs on within a line ("I could tell you yes. It's a blow ..."):
    a copied quote never starts or stops mid-quotation, nor reads as the narrator's words."""
    units: list[tuple[int, int]] = []
    joined = 0
    for start, end in spans:
        if units and joined < MAX_QUOTE_SENTENCES and "\n" not in text[units[-1][1] : start] \
                and open_quote(text[units[-1][0] : units[-1][1]]):
            units[-1] = (units[-1][0], end)
            joined += 1
        else:
            units.append((start, end))
            joined = 1
    return units
