"""The labelled documents the recipe and the scorer read: JSON Lines, ``{"text": "...", "label": "..."}``."""

from __future__ import annotations

import json
from pathlib import Path


def read_jsonl(path: str | Path) -> list[tuple[str, str]]:
    """``(text, label)`` of every line; a malformed line stops with its number and what is wrong."""
    documents = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise SystemExit(f"{path}:{number}: not JSON ({error.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str) or "label" not in record:
            raise SystemExit(f'{path}:{number}: expected an object with "text" (a string) and "label"')
        documents.append((record["text"], str(record["label"])))
    if not documents:
        raise SystemExit(f"{path}: no documents")
    return documents
