"""The document's letter case for generated text.

Free generation (``decoding="free"``) writes WordPiece tokens of an uncased vocabulary: :class:`DocumentCase`
gives each generated word the letter case (and accents) the document writes it with, and capitalises
sentence starts. Plain Python: the service and the eager summarizer share it (``models/detokenize.py``).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

from models.sentences import sentence_spans

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
