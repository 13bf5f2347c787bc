"""``rtserve eval <exported entry> --data test.jsonl``: accuracy through the serving path (pipeline, batcher,
backend), as the service answers ``/classify``."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from service.runtime.pipeline import run_whole


async def score(model: Any, args: argparse.Namespace) -> dict[str, Any]:
    examples = model.family.part("reader")(args.data, text_field=args.text_field, label_field=args.label_field)
    documents = [(e.text, e.label) for e in examples[: args.limit or None]]
    answers = await asyncio.gather(*(run_whole(model.pipeline, text) for text, _ in documents))
    correct = sum(finished.result["label"] == label for (_, finished), (_, label) in zip(answers, documents,
                                                                                         strict=True))
    return {"documents": len(documents), "accuracy": correct / len(documents)}
