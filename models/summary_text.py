"""The document's own text behind a summary: its sentences, which tokens the model read of each, the
sentence-copy choice and the document's letter case. numpy and ``tokenizers`` only: the service, the
training recipe and the tests share it.

A copy unit is a sentence (``models/sentences.py``), or the sentences of a quotation that runs on within a
line, joined; titles and headers (a line that does not end as a sentence ends) are never copied.

Sentence copy (``decoding="sentence"``) writes whole sentences of the document, as the document writes
them. The model's salience head (``models/srformer.py``, ``SRformerConfig.salience``) gives every source
token t a logit a_t = w . e_t + b on the frozen encoder's output e_t; a sentence j of n, with tokens S_j,
scores

    z_j = mean_{t in S_j} a_t + p_0 [j = 0] + p_1 / (1 + j) + p_2 j / n          (sentence score)

(the mean of a linear map is the map of the mean: a logistic regression on the sentence's mean encoder
output and its position). A head with a lexicon (``SRformerConfig.salience_lexical``) adds what the words
say: a weight v_x per WordPiece id x (so a_t gains v_{x_t}), and two terms of the sentence,

    + q_0 cos(f_j, f_D - f_j) + q_1 log(1 + |S_j|)                              (lexical terms)

where f_j is sentence j's WordPiece counts times their inverse document frequency (idf, counted on the
training documents) and f_D the whole text's: how central the sentence is to the rest of the document, and
its length. The document's first unit opens the summary; then the highest-scoring units are taken until the
summary is as long as the model's summary length (``summary_ratio`` of the tokens read, or
``summary_length``): a unit is taken when it brings the length nearer that target, together with the units
it leans on (the sentence its "He" or "But" continues, the one that introduced the "Mr Kim" it names), and
never when it repeats one already taken. They are written in the document's order.

Free generation (``decoding="free"``) writes WordPiece tokens of an uncased vocabulary: :class:`DocumentCase`
gives each generated word the letter case (and accents) the document writes it with, and capitalises
sentence starts.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from models.sentences import ENDS_SENTENCE, capitalised, is_uncased, sentence_spans, words

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


def position_features(n: int) -> np.ndarray:
    """(n, 3): the position part of the sentence score, per sentence."""
    j = np.arange(n, dtype=np.float32)
    return np.stack([(j == 0).astype(np.float32), 1.0 / (1.0 + j), j / max(n, 1)], axis=1)


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


def _open_quote(text: str) -> bool:
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
                and _open_quote(text[units[-1][0] : units[-1][1]]):
            units[-1] = (units[-1][0], end)
            joined += 1
        else:
            units.append((start, end))
            joined = 1
    return units


@dataclass(frozen=True)
class Lexicon:
    """The lexical part of a salience head: per WordPiece id, its weight v and its idf; ``weights`` (q) for
    the centrality and length terms (module docstring)."""

    token_weight: np.ndarray  # (vocab,) v_x
    idf: np.ndarray  # (vocab,)
    weights: tuple[float, float]  # q_0 (centrality), q_1 (length)

    def features(self, doc: DocumentText) -> np.ndarray:
        """(n, 2): per sentence, cos(f_j, f_D - f_j) and log(1 + |S_j|)."""
        return lexical_features(doc, self.idf)


def lexical_features(doc: DocumentText, idf: np.ndarray) -> np.ndarray:
    """(n, 2): the centrality and length terms of every sentence (0 and log 1 for one without tokens)."""
    n = len(doc.spans)
    kept = doc.sentence_of >= 0
    ids, sentence = doc.ids[kept], doc.sentence_of[kept]
    present, counts = np.unique(doc.ids, return_counts=True)
    f_d = np.zeros(len(idf))
    f_d[present] = counts * idf[present]
    d_squared = float(f_d @ f_d)
    out = np.zeros((n, 2))
    for j in range(n):
        own, own_counts = np.unique(ids[sentence == j], return_counts=True)
        if not len(own):
            continue
        f_j = own_counts * idf[own]
        overlap, j_squared = float(f_j @ f_d[own]), float(f_j @ f_j)
        # f_j . (f_D - f_j) / (|f_j| |f_D - f_j|), with |f_D - f_j|^2 = |f_D|^2 - 2 f_j . f_D + |f_j|^2
        rest_squared = max(d_squared - 2 * overlap + j_squared, 0.0)
        norm = np.sqrt(j_squared * rest_squared)
        out[j, 0] = (overlap - j_squared) / norm if norm > 0 else 0.0
        out[j, 1] = np.log1p(own_counts.sum())
    return out


def sentence_scores(doc: DocumentText, token_logits: np.ndarray, position_weights: Sequence[float],
                    lexicon: Lexicon | None = None) -> np.ndarray:
    """z_j for every sentence (module docstring); -inf for a sentence without a read token."""
    n = len(doc.spans)
    logits = np.asarray(token_logits, dtype=np.float64)[: len(doc.sentence_of)]
    if lexicon is not None:
        logits = logits + lexicon.token_weight[doc.ids[: len(logits)]]
    kept = doc.sentence_of >= 0
    sums = np.bincount(doc.sentence_of[kept], weights=logits[kept], minlength=n)
    counts = doc.tokens.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), -np.inf)
    z = mean + position_features(n).astype(np.float64) @ np.asarray(position_weights, dtype=np.float64)
    if lexicon is not None:
        z = z + lexicon.features(doc) @ np.asarray(lexicon.weights, dtype=np.float64)
    return z


# ---- what a copied unit leans on ------------------------------------------------------------------
# a unit that opens with one of these reads as the continuation of the unit before it
_OPENS_LEANING = frozenset(
    "he she they it his her their its him them this these those that such another both there but however also "
    "and yet so then still meanwhile instead nevertheless moreover furthermore besides thus hence therefore "
    "further despite subsequently conversely additionally indeed overall likewise similarly consequently "
    "accordingly nonetheless otherwise finally".split())
_OPENING_PHRASES = ("for example", "for instance", "in addition", "as a result", "in contrast", "in response",
                    "on the other hand", "at the same time", "by contrast", "in turn", "in particular", "for this",
                    "to this end", "to address this", "to address these", "in this way")
# a demonstrative before a noun anywhere in the unit ("... the virulence of these recombinants") points back
# like an opening one ("study" excepted: "these studies" of a review, "this study" of the article itself)
_POINTS_BACK = re.compile(r"(?<!^)\b(?:these|those)\s+(?!stud(?:y|ies)\b)[^\W\d_]{3,}", re.IGNORECASE)
# the second and later items of an enumeration ("Fourth, species of the genus ...", "Next, tissues were ...")
_ENUMERATES = re.compile(r"^\W*(?:second|secondly|third|thirdly|fourth|fifth|sixth|lastly|next)\s*,", re.IGNORECASE)
# a subject pronoun after a short opening phrase ("During cross examination, he asked ...", "Together, they
# have ..."): a phrase of up to four words, none capitalised but the first, is too short to name its antecedent
_PRONOUN_AFTER_OPENING = re.compile(r"^\W*[^\W\d_][\w'’-]*(?:\s+[a-z0-9][\w'’-]*){0,3}\s*,\s+(?:he|she|they)\b")
_FIRST_WORDS = re.compile(r"[A-Za-z']+(?:\s+[A-Za-z']+){0,3}")
_SPEAKS = (r"(?:said|says|added|adds|told|tells|argued|continued|warned|explained|insisted|claimed|stressed"
           r"|admitted|asked|replied|wrote)")
# a quotation given to a pronoun ("..., he said."), unless a titled name is in the unit too
_PRONOUN_SPEAKS = re.compile(r"\b(?:he|she|they)\s+" + _SPEAKS + r"\b", re.IGNORECASE)
_SPEAKER = re.compile(r"\b" + _SPEAKS + r"\b", re.IGNORECASE)
_OPENING_QUOTE = re.compile(r"^\s*[\"“]")
_TITLED_NAME = re.compile(r"\b(?:Mr|Mrs|Ms|Miss|Dr|Prof|Sir|Lord|Lady)\.?\s+([A-Z][\w'’-]+)")
_CAPITALISED = re.compile(r"(?<![\w'’-])([A-Z][\w'’-]+)")
_NAME_PAIR = re.compile(r"(?=\b([A-Z][\w'’-]+)\s+([A-Z][\w'’-]+))")  # overlapping: "Mary Queen Scots"


def _opens_leaning(unit: str) -> bool:
    opening = _FIRST_WORDS.search(unit)
    if opening is None:
        return False
    words = opening.group(0).lower().split()
    return words[0] in _OPENS_LEANING or any(" ".join(words).startswith(phrase) for phrase in _OPENING_PHRASES)


def leans_on(units: Sequence[str]) -> list[frozenset[int]]:
    """Per unit, the other units a reader needs to understand it (a reader takes a summary sentence that
    leans on a sentence left out for a non sequitur, or a quote for the wrong speaker's):

    - the unit before, when it opens with a pronoun, a demonstrative, a connective or a later item of an
      enumeration ("He", "These", "But", "For example", "Fourth,"), has a subject pronoun after a short opening
      phrase ("In his memoirs, he ..."), gives a quotation to a pronoun ("..., he said.") or is a quotation that
      names no speaker (news style gives a run of quoted paragraphs the speaker of the first);
    - the unit that introduced a name it uses alone: a surname after a title ("Mr Kim") or a capitalised word
      never preceded by another one here ("Faraj continued"), whose first appearance as the second of two
      capitalised words ("Mustafa Faraj", "James Hardie") was in an earlier unit;
    - the unit after, when it ends inside a quotation that the unit after carries on (news style runs a
      quotation over paragraphs, reopening it in each and closing it in the last): copied alone, the
      quotation would never close.

    Lower-cased text (SumPubMed's) has no names to follow; its connectives still count."""
    introduced: dict[str, int] = {}
    out = []
    for j, unit in enumerate(units):
        needs: set[int] = set()
        quotation = _OPENING_QUOTE.match(unit)  # its first word is the speaker's, not the narrator's
        if j and ((not quotation and (_opens_leaning(unit) or _POINTS_BACK.search(unit) or _ENUMERATES.search(unit)
                                      or _PRONOUN_AFTER_OPENING.search(unit)))
                  or (_PRONOUN_SPEAKS.search(unit) and not _TITLED_NAME.search(unit))
                  or (quotation and not _SPEAKER.search(unit))):
            needs.add(j - 1)
        seconds = {second for _, second in _NAME_PAIR.findall(unit)}
        alone = {word for word in _CAPITALISED.findall(unit) if word not in seconds} | set(_TITLED_NAME.findall(unit))
        needs.update(introduced[name] for name in alone if name in introduced)
        for name in seconds:
            introduced.setdefault(name, j)
        if j + 1 < len(units) and _open_quote(unit) and _OPENING_QUOTE.match(units[j + 1]):
            needs.add(j + 1)
        out.append(frozenset(needs))
    return out


_STOP_WORDS = frozenset("the and for with from that this was were are been has have had not but which who its his "
                        "her their they said says will would also than into".split())
REPEATS = 0.6  # a unit with more than this share of its content words in one already taken repeats it


def _trigrams(unit: str) -> list[tuple[str, ...]]:
    """The word trigrams the repeated-trigram measure counts (``models.data.summary_quality``)."""
    tokens = [word.lower() for word in words(unit)]
    return [tuple(tokens[i : i + 3]) for i in range(len(tokens) - 2)]


def _content_words(unit: str) -> frozenset[str]:
    return frozenset(word for word in re.findall(r"[a-z0-9]+", unit.lower()) if len(word) > 2 and word not in
                     _STOP_WORDS)


def choose_sentences(doc: DocumentText, scores: np.ndarray, target_tokens: int,
                     limit_tokens: int | None = None, adjacency: float = 0.0,
                     trigram_overlap: float = 1.0) -> list[int]:
    """The units to copy, in document order.

    The document's first copy unit opens the summary (it introduces the story), then the others by score.
    A unit is taken together with what it leans on (:func:`leans_on`, followed through; a title or header it
    leans on is never copied) that is not taken yet, when that group brings the summary's token count nearer
    ``target_tokens`` (never past ``limit_tokens``), until the target is reached. A group that repeats a unit
    already taken (``REPEATS``) is passed over.

    ``adjacency`` > 0 ranks a unit next to one already taken as if it scored ``adjacency`` standard deviations
    of the document's scores more, so the summary runs in longer stretches of the document: fewer jumps
    between topics, at some cost in ROUGE (a model's choice, ``extras.decode.adjacency``).

    ``trigram_overlap`` < 1 passes over a group more than that share of whose word trigrams the summary already
    has: a head that favours the sentences dense in the document's key terms otherwise repeats its phrases
    from sentence to sentence (a model's choice, ``extras.decode.trigram_overlap``)."""
    order = [int(j) for j in np.argsort(-scores, kind="stable") if np.isfinite(scores[j]) and doc.copyable(int(j))]
    if order:
        order.insert(0, order.pop(order.index(min(order))))
    units = [doc.text[start:end] for start, end in doc.spans]
    # what a unit leans on and cannot be copied (a title, a header) is not brought: the reader never sees it
    needs = [frozenset(i for i in leaning if doc.copyable(i)) for leaning in leans_on(units)]
    words = [_content_words(unit) for unit in units]
    trigrams = [_trigrams(unit) for unit in units] if trigram_overlap < 1 else []
    taken_trigrams: set[tuple[str, ...]] = set()
    chosen: set[int] = set()
    total = 0
    finite = np.isfinite(scores)
    bonus = adjacency * float(np.std(scores[finite])) if adjacency and finite.sum() > 1 else 0.0
    pending = list(order)
    while pending:
        if total >= target_tokens:
            break
        pick = 0
        if bonus and chosen:
            keyed = [float(scores[k]) + bonus * ((k - 1 in chosen) or (k + 1 in chosen)) for k in pending]
            pick = int(np.argmax(keyed))
        j = pending.pop(pick)
        group, waiting = set(), [j]
        while waiting:
            k = waiting.pop()
            if k not in group and k not in chosen:
                group.add(k)
                waiting.extend(needs[k])
        if any(not np.isfinite(scores[k]) for k in group) or any(
                words[k] and len(words[k] & words[i]) > REPEATS * len(words[k]) for k in group for i in chosen):
            continue
        group_trigrams = [t for k in sorted(group) for t in trigrams[k]] if trigrams else []
        if group_trigrams and sum(t in taken_trigrams for t in group_trigrams) > trigram_overlap * len(group_trigrams):
            continue
        size = int(doc.tokens[sorted(group)].sum())
        if limit_tokens is not None and total + size > limit_tokens:
            continue
        if not chosen or abs(total + size - target_tokens) < abs(total - target_tokens):
            chosen |= group
            total += size
            taken_trigrams.update(group_trigrams)
    if not chosen:  # every sentence is too short to copy alone: the best one that fits (none may fit the limit)
        fitting = [int(j) for j in np.argsort(-scores, kind="stable") if np.isfinite(scores[j])
                   and (limit_tokens is None or doc.tokens[j] <= limit_tokens)]
        chosen = set(fitting[:1])
    return sorted(chosen)


def copy_sentences(text: str, tokenizer: object, token_logits: np.ndarray, tokens_read: int,
                   position_weights: Sequence[float], target_tokens: int,
                   max_length: int | None = None, lexicon: Lexicon | None = None,
                   adjacency: float = 0.0, trigram_overlap: float = 1.0) -> list[tuple[str, int]]:
    """Sentence copy of a document: the chosen sentences as the document writes them, with their token
    counts, in the document's order (``max_length`` caps the tokens; it also caps the target; ``adjacency``,
    ``trigram_overlap``: :func:`choose_sentences`)."""
    doc = DocumentText(text, tokenizer, tokens_read)
    scores = sentence_scores(doc, np.asarray(token_logits)[:tokens_read], position_weights, lexicon)
    target = min(target_tokens, max_length) if max_length else target_tokens
    chosen = choose_sentences(doc, scores, target, max_length or None, adjacency, trigram_overlap)
    return [(doc.sentence(j), int(doc.tokens[j])) for j in chosen]


# ---- letter case for generated text --------------------------------------------------------------
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def _plain(word: str) -> str:
    """The uncased vocabulary's view of a word: lower case, accents stripped."""
    decomposed = unicodedata.normalize("NFD", word.lower())
    return "".join(ch for ch in decomposed if unicodedata.category(ch) != "Mn")


class DocumentCase:
    """Each word's letter case as the document writes it.

    A word takes its most frequent form among the document's occurrences that do not start a sentence
    (where case carries no meaning); a word seen only at sentence starts takes that form with a lower-case
    first letter unless every letter is a capital. Words the document lacks stay as generated. Sentence
    starts of the output are capitalised (uncased documents too: the reader expects it).
    """

    def __init__(self, text: str) -> None:
        inner: dict[str, Counter[str]] = {}
        initial: dict[str, Counter[str]] = {}
        starts = {a for a, _ in sentence_spans(text)}
        for match in _WORD.finditer(text):
            sentence_start = match.start() in starts or _opens_sentence(text, match.start(), starts)
            table = initial if sentence_start else inner
            table.setdefault(_plain(match.group(0)), Counter())[match.group(0)] += 1
        self.forms: dict[str, str] = {}
        for key, forms in initial.items():
            form = forms.most_common(1)[0][0]
            self.forms[key] = form if form.isupper() and len(form) > 1 else form[:1].lower() + form[1:]
        for key, forms in inner.items():
            self.forms[key] = forms.most_common(1)[0][0]

    def restore(self, text: str) -> str:
        cased = _WORD.sub(lambda m: self.forms.get(_plain(m.group(0)), m.group(0)), text)
        return capitalise_sentences(cased)


def _opens_sentence(text: str, position: int, starts: set[int]) -> bool:
    """A word right after an opening quote or bracket at a sentence start."""
    before = position
    while before > 0 and text[before - 1] in "\"'“‘([":
        before -= 1
    return before != position and before in starts


_SENTENCE_START = re.compile(r"(^|[.!?][\"'”’)\]]*\s+)([\"'“‘(\[]*)([^\W\d_])", re.UNICODE)


def capitalise_sentences(text: str) -> str:
    """The first letter of the text and of every sentence after ``. ! ?`` and a space in upper case."""
    return _SENTENCE_START.sub(lambda m: m.group(1) + m.group(2) + m.group(3).upper(), text)
