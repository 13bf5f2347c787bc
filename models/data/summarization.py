"""Summarization corpora behind one interface, and the ROUGE used to score them.

A corpus module (``models.data.bbc``, ``models.data.sumpubmed``) offers ``read_pair``,
``all_keys``, ``split_keys``, ``load_split``, ``sentences`` and ``lead``; its
pairs have ``key``, ``document`` and ``summary``. ``corpus_of`` picks the module
from the folder's layout, so every command takes just ``--data <folder>``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType


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
