"""SemEval-2019 Task 4 Hyperpartisan News (by-article): texts, labels, splits.

Folder layout (see shared/data/README.md): ``articles.xml`` (``<article id
title>`` with ``<p>``/``<a>`` markup: we take the title, a newline and the text
content), ``ground-truth.xml`` (``hyperpartisan="true|false"``, joined on id)
and optionally ``splits.json`` ({"train": [ids], "dev": [...], "test": [...]}).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LABEL_NAMES = ["mainstream", "hyperpartisan"]  # index 1 = hyperpartisan="true"
SPLITS = ("train", "dev", "test")


@dataclass
class Article:
    id: str
    text: str  # title + "\n" + text content of the body
    label: int  # 1 = hyperpartisan


def load_articles(folder: str | Path) -> list[Article]:
    """Every labelled article of the folder, in file order."""
    folder = Path(folder)
    labels = {}
    for element in ET.parse(folder / "ground-truth.xml").getroot().iter("article"):
        labels[element.get("id")] = 1 if element.get("hyperpartisan") == "true" else 0
    articles = []
    for element in ET.parse(folder / "articles.xml").getroot().iter("article"):
        article_id = element.get("id")
        if article_id not in labels:
            continue
        body = "".join(element.itertext())
        articles.append(Article(article_id, f"{element.get('title') or ''}\n{body}", labels[article_id]))
    return articles


def load_split(folder: str | Path, split: str) -> list[Article]:
    """Articles of one split; ``all`` (or a folder without splits.json) gives every article."""
    folder = Path(folder)
    articles = load_articles(folder)
    split_file = folder / "splits.json"
    if split == "all" or not split_file.exists():
        return articles
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {SPLITS} or 'all'")
    wanted = set(json.loads(split_file.read_text())[split])
    return [a for a in articles if a.id in wanted]


def metrics(labels: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    """Accuracy and macro-F1 (the shared task's measure) of predicted label indices."""
    from sklearn.metrics import accuracy_score, f1_score

    return {
        "accuracy": float(accuracy_score(labels, predictions)),
        "macro_f1": float(f1_score(labels, predictions, average="macro")),
    }
