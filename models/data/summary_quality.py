"""What a reader sees in a summary, measured: repetition, copying, length and letter case.

ROUGE rewards a long string of the document's own words whether or not it reads as text. These
measures sit beside it (``rtserve eval`` reports both, for the model and for the baselines in
:mod:`models.data.baselines`):

- **repeated trigrams**: of all word trigrams in the summaries, the share that repeat an earlier
  trigram of the same summary (words lower-cased). Salad that loops ("we investigated. we
  investigated.") scores high; a lead of the article scores about 1%.
- **verbatim sentences**: of all summary sentences, the share found in the source as written, after
  white space is collapsed to single spaces, at word boundaries. Reported twice: case-sensitive
  (``verbatim_sentences``; a sentence may open with a capital where the source has a lower-case letter,
  as a sentence start should) and case-insensitive (``verbatim_sentences_uncased``), so that a summary
  copied in the wrong case is told apart from one that is not copied at all.
- **length ratio**: the mean over documents of summary words / reference words.
- **cased as the source**: of the summary words whose letters occur in the source as a word in some
  case, the share written in a form the source itself uses (see :func:`cased_as_source`).

Words are runs of letters and digits, joined across an inner apostrophe, hyphen, full stop or comma
("Stuart's", "e-mail", "0.7", "1,000"); punctuation is not a word (:func:`models.sentences.words`).
Sentences are :func:`models.sentences.sentences`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from models.sentences import is_uncased, sentences, words

_SPACE = re.compile(r"\s+")


def trigram_repeats(summary: str) -> tuple[int, int]:
    """``(repeated, total)``: word trigrams of ``summary`` (lower-cased) that repeat an earlier one, and all."""
    lowered = [word.lower() for word in words(summary)]
    seen: set[tuple[str, ...]] = set()
    repeated = 0
    for i in range(len(lowered) - 2):
        trigram = tuple(lowered[i : i + 3])
        repeated += trigram in seen
        seen.add(trigram)
    return repeated, max(len(lowered) - 2, 0)


def _normalised(text: str) -> str:
    return _SPACE.sub(" ", text).strip()


def _occurs(sentence: str, source: str) -> bool:
    """``sentence`` in ``source``, not starting or ending inside a word of the source ("he said." is not in
    "she said."); both already normalised and, for the case-insensitive count, lower-cased."""
    start = source.find(sentence)
    while start >= 0:
        end = start + len(sentence)
        inside_before = sentence[0].isalnum() and start > 0 and source[start - 1].isalnum()
        inside_after = sentence[-1].isalnum() and end < len(source) and source[end].isalnum()
        if not (inside_before or inside_after):
            return True
        start = source.find(sentence, start + 1)
    return False


def _first_letter_lowered(sentence: str) -> str:
    """``sentence`` with its first letter in lower case, unless a digit comes first (the inverse of
    :func:`models.sentences.capitalised`)."""
    for i, ch in enumerate(sentence):
        if ch.isalpha():
            return sentence[:i] + ch.lower() + sentence[i + 1 :]
        if ch.isdigit():
            break
    return sentence


def _occurs_as_sentence(sentence: str, source: str) -> bool:
    """Case-sensitive, but a sentence may open with a capital where the source has it in lower case
    (a sentence copied from mid-sentence, or from lower-cased text, starts with a capital)."""
    return _occurs(sentence, source) or _occurs(_first_letter_lowered(sentence), source)


def contains_sentence(text: str, sentence: str, ignore_case: bool = False) -> bool:
    """Whether ``sentence`` occurs in ``text`` as written (white space normalised, at word boundaries; its
    first letter may be a capital where ``text`` has it in lower case)."""
    text, sentence = _normalised(text), _normalised(sentence)
    if not sentence:
        return False
    if ignore_case:
        return _occurs(sentence.lower(), text.lower())
    return _occurs_as_sentence(sentence, text)


def verbatim_sentences(summary: str, source: str) -> tuple[int, int, int]:
    """``(cased, uncased, total)``: summary sentences found in the source case-sensitively (but for a capital
    opening the sentence), found ignoring case, and all (white space normalised on both sides)."""
    normal_source = _normalised(source)
    lower_source = normal_source.lower()
    cased = uncased = total = 0
    for sentence in sentences(summary):
        sentence = _normalised(sentence)
        if not sentence:
            continue
        total += 1
        cased += _occurs_as_sentence(sentence, normal_source)
        uncased += _occurs(sentence.lower(), lower_source)
    return cased, uncased, total


def cased_as_source(summary: str, source: str) -> tuple[int, int]:
    """``(right, judged)`` words of ``summary``.

    *Judged*: a summary word with at least one letter whose lower-cased form is a word of the source in some
    case (a word the source does not have, and a number, is not judged: the source says nothing about its
    case). *Right*, for a judged word inside a sentence: its exact form is a word of the source ("BBC" is
    right, "bbc" wrong where the source writes only "BBC"). For the first word of a summary sentence in a
    cased source: it starts with a capital and is a source word as written or with its first letter lowered
    ("However" from the source's "however"; "the" opening a sentence is wrong). In an uncased source
    (:func:`models.sentences.is_uncased`, SumPubMed's lower-cased text) a sentence may open either way.
    """
    source_forms = set(words(source))
    source_lowered = {form.lower() for form in source_forms}
    cased_source = not is_uncased(source)
    right = judged = 0
    for sentence in sentences(summary):
        for position, word in enumerate(words(sentence)):
            if not any(ch.isalpha() for ch in word) or word.lower() not in source_lowered:
                continue
            judged += 1
            if position > 0:
                right += word in source_forms
            elif word[0].isupper() or not cased_source:
                right += word in source_forms or word[0].lower() + word[1:] in source_forms
    return right, judged


@dataclass
class Tally:
    """Running totals of the measures over a set of (summary, source, reference) triples."""

    documents: int = 0
    summary_words: int = 0
    length_ratio_sum: float = 0.0
    length_ratio_count: int = 0
    trigrams_repeated: int = 0
    trigrams: int = 0
    sentences_verbatim: int = 0
    sentences_verbatim_uncased: int = 0
    sentences: int = 0
    words_cased_right: int = 0
    words_judged: int = 0

    def add(self, summary: str, source: str, reference: str | None) -> None:
        self.documents += 1
        self.summary_words += len(words(summary))
        if reference is not None and words(reference):
            self.length_ratio_sum += len(words(summary)) / len(words(reference))
            self.length_ratio_count += 1
        repeated, total = trigram_repeats(summary)
        self.trigrams_repeated += repeated
        self.trigrams += total
        cased, uncased, total = verbatim_sentences(summary, source)
        self.sentences_verbatim += cased
        self.sentences_verbatim_uncased += uncased
        self.sentences += total
        right, judged = cased_as_source(summary, source)
        self.words_cased_right += right
        self.words_judged += judged

    def scores(self) -> dict[str, float | None]:
        """Shares pooled over all documents' trigrams / sentences / words; None where nothing was counted."""

        def share(part: float, whole: float) -> float | None:
            return round(part / whole, 4) if whole else None

        return {
            "repeated_trigrams": share(self.trigrams_repeated, self.trigrams),
            "verbatim_sentences": share(self.sentences_verbatim, self.sentences),
            "verbatim_sentences_uncased": share(self.sentences_verbatim_uncased, self.sentences),
            "cased_as_source": share(self.words_cased_right, self.words_judged),
            "length_ratio": share(self.length_ratio_sum, self.length_ratio_count),
            "summary_words": share(self.summary_words, self.documents),
        }


def reader_measures(summaries: Sequence[str], sources: Sequence[str],
                    references: Sequence[str] | None = None) -> dict[str, float | None]:
    """The measures of the module docstring over paired lists (``references`` None: no length ratio)."""
    tally = Tally()
    for i, (summary, source) in enumerate(zip(summaries, sources, strict=True)):
        tally.add(summary, source, references[i] if references is not None else None)
    return tally.scores()
