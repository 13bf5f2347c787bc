"""SumPubMed (Gupta et al., ACL-IJCNLP SRW 2021): loading, the clean reference and Lead-k.

Layout (see ../shared/data/README.md): ``text/text_<id>.txt`` (a BioMed Central
article body) pairs with ``abstract/abstract_<id>.txt`` (its abstract).
``splits.json`` maps train/dev/test to lists of integer ids; a folder without it
is one split, ``all``. Text is preprocessed upstream: lower-cased, citations
replaced by ``<cit>``, numbers by ``<dig>``. Article and abstract carry the
upper-case header lines ``BACKGROUND``, ``RESULTS``, ``CONCLUSIONS``.

The clean reference follows the data README: the abstract up to the first blank
line after its ``CONCLUSIONS`` paragraph (what follows is supplementary-material
notes, run-together keywords or conference details), header lines dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from models.data import summarization as summarization_data

HEADERS = ("BACKGROUND", "RESULTS", "CONCLUSIONS")


@dataclass(frozen=True)
class Pair:
    key: str  # the article id, as a string
    body: str  # article paragraphs (header lines dropped), joined by newlines
    summary: str  # the clean reference abstract, paragraphs joined by newlines

    @property
    def document(self) -> str:
        """What the summarizer reads."""
        return self.body


def _is_header(line: str) -> bool:
    # the three upper-case headers, plus lower-case section names some abstracts carry ("methods")
    return line in HEADERS or (len(line.split()) == 1 and line.isalpha() and line.lower() == line and len(line) < 16)


def clean_abstract(raw: str) -> str:
    """The abstract up to the end of its CONCLUSIONS paragraph, header lines dropped."""
    kept: list[str] = []
    blocks = re.split(r"\n\s*\n", raw.strip())
    in_conclusions = False
    for block in blocks:
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        if lines[0] == "CONCLUSIONS":
            in_conclusions = True
        kept.extend(line for line in lines if not _is_header(line))
        if in_conclusions and len(lines) > (1 if lines[0] == "CONCLUSIONS" else 0):
            break  # the first paragraph after CONCLUSIONS ends the clean reference
    return "\n".join(kept)


def read_pair(root: str | Path, key: str | int) -> Pair:
    root = Path(root)
    body = (root / "text" / f"text_{key}.txt").read_text(encoding="utf-8", errors="replace")
    abstract = (root / "abstract" / f"abstract_{key}.txt").read_text(encoding="utf-8", errors="replace")
    paragraphs = [p for p in (line.strip() for line in body.splitlines()) if p and p not in HEADERS]
    return Pair(key=str(key), body="\n".join(paragraphs), summary=clean_abstract(abstract))


def all_keys(root: str | Path) -> list[str]:
    """Every id with both an article and an abstract, in numeric order."""
    root = Path(root)
    ids = sorted(int(p.stem.removeprefix("text_")) for p in (root / "text").glob("text_*.txt"))
    return [str(i) for i in ids if (root / "abstract" / f"abstract_{i}.txt").exists()]


def split_keys(root: str | Path, split: str) -> list[str]:
    """Keys of one split; ``all`` (or a folder without splits.json) is every pair."""
    return summarization_data.split_keys(root, split, all_keys)


def load_split(root: str | Path, split: str, limit: int | None = None) -> list[Pair]:
    keys = split_keys(root, split)
    return [read_pair(root, key) for key in (keys[:limit] if limit is not None else keys)]


# Sentences end at . ! or ? followed by white space. The text is lower-cased, so no
# capital letter marks a new sentence; the common abbreviations are kept together.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_ABBREVIATIONS = ("e.g.", "i.e.", "et al.", "vs.", "cf.", "approx.", "fig.", "ref.")


def sentences(text: str) -> list[str]:
    out: list[str] = []
    for paragraph in text.split("\n"):
        pending = ""
        for piece in _SENTENCE_END.split(paragraph.strip()):
            pending = f"{pending} {piece}".strip() if pending else piece
            if pending and not pending.endswith(_ABBREVIATIONS):
                out.append(pending)
                pending = ""
        if pending:
            out.append(pending)
    return out


def lead(pair: Pair, k: int) -> str:
    """Lead-k: the first k sentences of the article body."""
    return " ".join(sentences(pair.body)[:k])
