"""BBC News Summary (Kaggle, P. Sharif 2018): loading, splits and the Lead-k baseline.

Layout (see ../shared/data/README.md): ``News Articles/<category>/<NNN>.txt``
pairs with ``Summaries/<category>/<NNN>.txt``; the first line of an article is
its title. Files are UTF-8 except one Latin-1 byte, so they are read with
``errors="replace"``. ``splits.json`` maps train/dev/test to lists of
``<category>/<NNN>.txt`` paths; a folder without it is one split, ``all``.

The summaries are extractive: article sentences concatenated, often with no
space after the full stop ("...stabilise.China's currency...").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from models.data import summarization as summarization_data

ARTICLES = "News Articles"
SUMMARIES = "Summaries"


@dataclass(frozen=True)
class Pair:
    key: str  # "<category>/<NNN>.txt"
    title: str  # first line of the article
    body: str  # the article after its title, paragraphs joined by newlines
    summary: str  # the reference summary, as in the file

    @property
    def document(self) -> str:
        """What the summarizer reads: title, then body."""
        return f"{self.title}\n\n{self.body}"


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


def read_pair(root: str | Path, key: str) -> Pair:
    root = Path(root)
    article = _read(root / ARTICLES / key).strip()
    title, _, body = article.partition("\n")
    summary = _read(root / SUMMARIES / key).strip()
    return Pair(key=key, title=title.strip(), body=body.strip(), summary=summary)


def all_keys(root: str | Path) -> list[str]:
    """Every ``<category>/<NNN>.txt`` with both an article and a summary, sorted."""
    root = Path(root)
    keys = []
    for path in sorted((root / ARTICLES).glob("*/*.txt")):
        key = f"{path.parent.name}/{path.name}"
        if (root / SUMMARIES / key).exists():
            keys.append(key)
    return keys


def split_keys(root: str | Path, split: str) -> list[str]:
    """Keys of one split; ``all`` (or a folder without splits.json) is every pair."""
    return summarization_data.split_keys(root, split, all_keys)


def load_split(root: str | Path, split: str, limit: int | None = None) -> list[Pair]:
    keys = split_keys(root, split)
    if limit is not None:
        keys = keys[:limit]
    return [read_pair(root, key) for key in keys]


# A sentence ends at . ! or ? (optionally followed by a closing quote) and the
# next one starts with an upper-case letter, a digit or an opening quote. The
# reference summaries glue sentences together without a space, so the space is
# optional there.
_SENTENCE_END = re.compile(r"(?<=[.!?])([\"'’”]?)(?:\s+(?=[\"'‘“]?[A-Z0-9])|(?=[\"'‘“]?[A-Z]))")


def sentences(text: str) -> list[str]:
    """Split article text into sentences (paragraph breaks always end one)."""
    out: list[str] = []
    for paragraph in text.split("\n"):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        start = 0
        for match in _SENTENCE_END.finditer(paragraph):
            end = match.end(1)
            # "Mr. Smith", "U.S. trade": keep abbreviations of one or two letters together
            word = paragraph[:end].rsplit(" ", 1)[-1]
            if len(word.rstrip(".")) <= 2 and word[:1].isupper() and not match.group(1):
                continue
            piece = paragraph[start:end].strip()
            if piece:
                out.append(piece)
            start = match.end()
        piece = paragraph[start:].strip()
        if piece:
            out.append(piece)
    return out


def lead(pair: Pair, k: int) -> str:
    """Lead-k: the first k sentences of the article body."""
    return " ".join(sentences(pair.body)[:k])
