"""``rtserve eval <model-repository entry>``: quality of an exported model, through the serving path.

Each example goes through the same pipeline, batcher and backend the service
uses (``run_whole``), many at a time so the batcher stacks them; the metrics
are the training recipes' own, so the figures sit beside the checkpoint's.
The scorer is the ``evaluate`` part of the entry's family (:mod:`rtserve.families`).
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from service.runtime.pipeline import run_whole
from service.runtime.registry import LoadedModel, load_model
from service.settings import Settings

CONCURRENCY = 32


async def _gather(items: Sequence[Any], work: Callable[[Any], Awaitable[Any]]) -> list[Any]:
    """Every item's answer, CONCURRENCY at a time; progress (done/total, rate) on stderr, stdout keeps the JSON."""
    results: list[Any] = []
    started = time.perf_counter()
    for start in range(0, len(items), CONCURRENCY):
        results += await asyncio.gather(*(work(item) for item in items[start : start + CONCURRENCY]))
        seconds = time.perf_counter() - started
        print(f"rtserve eval: {len(results)}/{len(items)} scored, {seconds:.0f} s, "
              f"{len(results) / max(seconds, 1e-9):.1f}/s", file=sys.stderr, flush=True)
    return results


async def _answer(model: LoadedModel, piece: Any) -> dict[str, Any]:
    """What the one-shot endpoint would answer for ``piece``."""
    return (await run_whole(model.pipeline, piece))[1].result


async def score_forecaster(model: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    from models.data.ett import Scaler, load_split

    settings = model.manifest["settings"]
    scaler = Scaler.from_dict(settings["scaler"])
    x, y, _, _ = load_split(args.data, args.split, int(settings["lookback"]), int(settings["horizon"]), scaler)
    if args.limit:
        x, y = x[: args.limit], y[: args.limit]

    async def forecast(window: np.ndarray) -> np.ndarray:
        _, finished = await run_whole(model.pipeline, scaler.inverse(window).tolist())
        return scaler.transform(np.asarray(finished.result["forecast"], dtype=np.float64))

    predictions = np.stack(await _gather(list(x), forecast))
    error = predictions - y
    return {"windows": len(x), "mse": float((error**2).mean()), "mae": float(np.abs(error).mean())}


async def score_classifier(model: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    from models.data.hyperpartisan import load_split, metrics

    articles = load_split(args.data, args.split)[: args.limit or None]
    labels = list(model.manifest["settings"]["labels"])

    results = await _gather([a.text for a in articles], lambda text: _answer(model, text))
    predictions = [labels.index(r["label"]) for r in results]
    return {
        "articles": len(articles),
        **metrics([a.label for a in articles], predictions),
        "segments_mean": float(np.mean([r["segments"] for r in results])),
    }


async def score_summarizer(model: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    from models.data.summarization import corpus_of, rouge_scores

    pairs = corpus_of(args.data).load_split(args.data, args.split, args.limit or None)

    started = time.perf_counter()
    results = await _gather([p.document for p in pairs], lambda text: _answer(model, text))
    seconds = time.perf_counter() - started
    tokens = sum(r["summary_tokens"] for r in results)
    return {
        "pairs": len(pairs),
        **rouge_scores([r["summary"] for r in results], [p.summary for p in pairs]),
        "seconds_per_summary": seconds / max(len(pairs), 1),
        "tokens_per_second": tokens / seconds if seconds else 0.0,
    }


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rtserve eval", description="Score an exported model-repository entry.")
    parser.add_argument("entry", help="model-repository entry folder (holds manifest.json)")
    parser.add_argument("--data", required=True, help="dataset path (CSV for forecasts, folder otherwise)")
    parser.add_argument("--split", default="test", help="train | dev/val | test | all")
    parser.add_argument("--backend", default="onnx", choices=("onnx", "torchscript", "torch"))
    parser.add_argument("--limit", type=int, default=0, help="score only the first N examples (0 = all)")
    args = parser.parse_args(list(argv))
    entry = Path(args.entry)
    manifest = json.loads((entry / "manifest.json").read_text())
    model = load_model(entry, args.backend, Settings(max_batch_size=CONCURRENCY, max_queue_delay_ms=2))
    started = time.perf_counter()
    scores = asyncio.run(model.family.part("evaluate")(model, args))
    print(json.dumps({
        "entry": str(entry), "family": manifest["family"], "backend": args.backend,
        "providers": model.providers, "data": args.data, "split": args.split, **scores,
        "eval_seconds": round(time.perf_counter() - started, 1),
    }))
    return 0
