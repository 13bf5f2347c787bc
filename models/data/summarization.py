"""Summarization corpora behind one interface, and the ROUGE used to score them.

A corpus module (``models.data.bbc``, ``models.data.sumpubmed``) offers ``read_pair``,
``all_keys``, ``split_keys``, ``load_split``, ``sentences`` and ``lead``; its
pairs have ``key``, ``document`` and ``summary``. ``corpus_of`` picks the module
from the folder's layout, so every command takes just ``--data <folder>``.
A user's JSON Lines file of pairs is a :class:`PairsFile`, which offers the same
reading functions (its one split is the whole file).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from models.data.files import TextPair


@dataclass(frozen=True)
class FilePair:
    key: str  # the pair's line in its file, as text
    document: str
    summary: str

    @property
    def body(self) -> str:
        """What the lead baselines read: the whole source (a user's file has no title apart)."""
        return self.document


class PairsFile:
    """A JSON Lines file's pairs (read by the family's reader) behind the corpus modules' interface.

    ``root`` arguments are ignored: the file is the corpus. Keys are line numbers; every split is the
    whole file (``--train`` and ``--dev`` are files of their own).
    """

    def __init__(self, path: str | Path, pairs: Sequence[TextPair]) -> None:
        self.path = Path(path)
        self.__name__ = self.path.stem  # as corpus_name reads a module's name
        self.pairs = {str(pair.line): FilePair(str(pair.line), pair.source, pair.summary) for pair in pairs}
        digest = hashlib.sha256()
        for pair in self.pairs.values():
            digest.update(f"{pair.document}\0{pair.summary}\0".encode())
        self.digest = digest.hexdigest()  # what an encoder cache of these pairs depends on

    def read_pair(self, root: object, key: str) -> FilePair:
        return self.pairs[key]

    def all_keys(self, root: object = None) -> list[str]:
        return list(self.pairs)

    def split_keys(self, root: object, split: str) -> list[str]:
        return self.all_keys()

    def load_split(self, root: object, split: str, limit: int | None = None) -> list[FilePair]:
        return list(self.pairs.values())[:limit]


def corpus_of(data: str | Path) -> ModuleType:
    """``models.data.bbc`` for a BBC News Summary folder, ``models.data.sumpubmed`` for SumPubMed."""
    from models.data import bbc, sumpubmed

    data = Path(data)
    if (data / bbc.ARTICLES).is_dir():
        return bbc
    if (data / "text").is_dir() and (data / "abstract").is_dir():
        return sumpubmed
    raise ValueError(f"{data} is neither a BBC News Summary folder ('{bbc.ARTICLES}/') "
                     "nor a SumPubMed folder ('text/' + 'abstract/')")


def split_keys(root: str | Path, split: str, all_keys: Callable[[Path], list[str]]) -> list[str]:
    """Keys of one split of ``splits.json``; ``all`` (or a folder without splits.json) is every pair."""
    root = Path(root)
    splits_path = root / "splits.json"
    if split == "all" or not splits_path.exists():
        return all_keys(root)
    splits = json.loads(splits_path.read_text())
    if split not in splits:
        raise ValueError(f"{splits_path} has no split {split!r}; it has {sorted(splits)}")
    return [str(key) for key in splits[split]]


def corpus_name(data: str | Path) -> str:
    return corpus_of(data).__name__.rsplit(".", 1)[-1]


def rouge_scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    """Mean ROUGE-1/2/L F-measures (``rouge-score``, Porter stemming; ROUGE-L over the whole text)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for prediction, reference in zip(predictions, references, strict=True):
        scores = scorer.score(reference, prediction)
        for name in totals:
            totals[name] += scores[name].fmeasure
    count = max(len(predictions), 1)
    return {name: round(value / count, 4) for name, value in totals.items()}
