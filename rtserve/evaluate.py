"""``rtserve eval <model-repository entry>``: quality of an exported model, through the serving path.

Each example goes through the same pipeline, batcher and backend the service
uses (``run_whole``), many at a time so the batcher stacks them; the metrics
are the training recipes' own, so the figures sit beside the checkpoint's.
The scorer is the ``evaluate`` part of the entry's family (:mod:`models.families`).
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

from models.cli_help import HelpFormatter
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


async def _answer(model: LoadedModel, piece: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the one-shot endpoint would answer for ``piece`` (``options``: the request's options)."""
    return (await run_whole(model.pipeline, piece, options=options))[1].result


async def score_forecaster(model: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    """MSE and MAE of the targets, standardized, over every window of a CSV file (a model trained on files)
    or over a split of an ETT-layout file (Informer protocol)."""
    from models.data.ett import Scaler, windows_to_score

    settings = model.manifest["settings"]
    scaler = Scaler.from_dict(settings["scaler"])
    x, y, split = windows_to_score(args.data, args.split, settings, scaler, model.family.part("reader"))
    if args.limit:
        x, y = x[: args.limit], y[: args.limit]
    columns = list(settings["variables"])
    targets = [columns.index(name) for name in settings.get("targets", columns)]
    target_scaler = Scaler(scaler.mean[targets], scaler.std[targets])

    async def forecast(window: np.ndarray) -> np.ndarray:
        _, finished = await run_whole(model.pipeline, scaler.inverse(window).tolist())
        return target_scaler.transform(np.asarray(finished.result["forecast"], dtype=np.float64))  # (H, K)

    predictions = np.stack(await _gather(list(x), forecast))  # (N, H, K)
    error = predictions - y[:, :, targets]
    return {"split": split, "windows": len(x), "mse": float((error**2).mean()), "mae": float(np.abs(error).mean())}


async def score_classifier(model: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    """Accuracy and macro-F1 on a JSON Lines file of labelled documents (the family's reader) or on a
    Hyperpartisan folder's split."""
    from models.data.files import check_labels
    from models.data.hyperpartisan import LABEL_NAMES, load_split, metrics

    labels = list(model.manifest["settings"]["labels"])
    if Path(args.data).is_dir():
        articles = load_split(args.data, args.split)[: args.limit or None]
        texts, truth = [a.text for a in articles], [LABEL_NAMES[a.label] for a in articles]
    else:
        examples = model.family.part("reader")(args.data, text_field=args.text_field,
                                               label_field=args.label_field)[: args.limit or None]
        check_labels(args.data, examples, labels)
        texts, truth = [e.text for e in examples], [e.label for e in examples]

    results = await _gather(texts, lambda text: _answer(model, text))
    return {
        "documents": len(texts),
        **metrics([labels.index(label) for label in truth], [labels.index(r["label"]) for r in results]),
        "segments_mean": float(np.mean([r["segments"] for r in results])),
    }


# Lead-k's k where the corpus has a customary one: Lead-3 for news, Lead-10 for SumPubMed's long articles.
LEAD_SENTENCES = {"bbc": 3, "sumpubmed": 10}


async def score_summarizer(model: LoadedModel, args: argparse.Namespace) -> dict[str, Any]:
    """ROUGE and the reader's measures (:mod:`models.data.summary_quality`) of the served summaries, beside
    the same measures of the baselines on the same documents (:func:`summary_baselines`), on a corpus
    folder's split or on a user's JSON Lines file of pairs (the family's reader)."""
    from models.data.summarization import PairsFile, corpus_name, corpus_of

    if Path(args.data).is_dir():
        pairs = corpus_of(args.data).load_split(args.data, args.split, args.limit or None)
        name = corpus_name(args.data)
    else:
        read = model.family.part("reader")
        corpus = PairsFile(args.data, read(args.data, source_field=args.source_field,
                                           summary_field=args.summary_field))
        pairs, name = corpus.load_split(args.data, "all", args.limit or None), corpus.__name__
    options = {name: value for name, value in (("decoding", args.decoding), ("beam_size", args.beam_size),
                                                ("max_length", args.max_length)) if value is not None}

    started = time.perf_counter()
    results = await _gather([p.document for p in pairs], lambda text: _answer(model, text, options or None))
    seconds = time.perf_counter() - started
    summaries = [r["summary"] for r in results]
    tokens = sum(r["summary_tokens"] for r in results)
    lead_sentences = args.lead_sentences or LEAD_SENTENCES.get(name, 3)
    texts, extractor = summary_baselines(summaries, pairs, args.data, lead_sentences,
                                         args.extractor_train_limit, args.extractor)
    systems = score_systems(texts, pairs)
    print(systems_table(systems), file=sys.stderr)
    if args.summaries_out:
        with open(args.summaries_out, "w", encoding="utf-8") as out:
            for i, pair in enumerate(pairs):
                row = {"key": pair.key, **{system: summaries[i] for system, summaries in texts.items()},
                       "reference": pair.summary}
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
    if args.judgement_sheet:
        from rtserve.judgement import write_sheet

        lead_name = "lead_same_length" if args.judgement_lead == "same-length" else f"lead_{lead_sentences}"
        candidates = {"model": summaries, lead_name: texts[lead_name], "reference": [p.summary for p in pairs]}
        if "extractor" in texts:  # the peer a user would pick instead
            candidates["extractor"] = texts["extractor"]
        write_sheet(Path(args.judgement_sheet), pairs, candidates, count=args.judgement_count,
                    seed=args.judgement_seed, about={"corpus": name, "data": str(args.data), "split": args.split,
                                                     "entry": str(args.entry), "options": options})
    return {
        "pairs": len(pairs),
        **{metric: systems["model"][metric] for metric in ("rouge1", "rouge2", "rougeL")},
        "options": options,
        # the decoding the answers say they used, where the pipeline reports it
        "decoding": sorted({str(r["decoding"]) for r in results if "decoding" in r}) or None,
        "corpus": name,
        "systems": systems,
        "extractor": extractor,
        "seconds_per_summary": seconds / max(len(pairs), 1),
        "tokens_per_second": tokens / seconds if seconds else 0.0,
    }


def summary_baselines(summaries: list[str], pairs: Sequence[Any], data: str | Path, lead_sentences: int,
                      train_limit: int = 0, with_extractor: bool = True,
                      ) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Each system's summaries of the same documents: the model's ``summaries``; a lead of each summary's
    length; Lead-k; the extractor trained on the train split (less any scored document), at each summary's
    length. Returns (summaries by system, what the extractor was trained on)."""
    from models.data.baselines import SentenceExtractor, lead, lead_of_length
    from models.data.summarization import corpus_of
    from models.data.summary_quality import words

    lengths = [len(words(summary)) for summary in summaries]
    texts = {
        "model": summaries,
        "lead_same_length": [lead_of_length(p.body, n) for p, n in zip(pairs, lengths, strict=True)],
        f"lead_{lead_sentences}": [lead(p.body, lead_sentences) for p in pairs],
    }
    extractor: dict[str, Any] = {"trained": False}
    if with_extractor and not Path(data).is_dir():
        extractor["reason"] = "a file of pairs is scored: there is no train split beside it to fit the extractor on"
    elif with_extractor:
        corpus = corpus_of(data)
        scored = {p.key for p in pairs}
        try:
            keys = [key for key in corpus.split_keys(data, "train") if key not in scored]
        except ValueError as error:  # a splits.json without a train split
            keys, extractor["reason"] = [], str(error)
        keys = keys[:train_limit] if train_limit else keys
        if keys:
            started = time.perf_counter()
            training = [corpus.read_pair(data, key) for key in keys]
            model = SentenceExtractor().fit([p.body for p in training], [p.summary for p in training])
            texts["extractor"] = [model.summarize(p.body, n) for p, n in zip(pairs, lengths, strict=True)]
            extractor = {"trained": True, "documents": len(keys), "seconds": round(time.perf_counter() - started, 1)}
        else:
            extractor.setdefault("reason", "no training documents outside the scored ones")
    return texts, extractor


def score_systems(texts: dict[str, list[str]], pairs: Sequence[Any]) -> dict[str, dict[str, float | None]]:
    """ROUGE and the reader's measures of each system's summaries, and the reader's measures of the
    references themselves (their ROUGE against themselves would be 1)."""
    from models.data.summarization import rouge_scores
    from models.data.summary_quality import reader_measures

    references = [p.summary for p in pairs]
    sources = [p.document for p in pairs]
    systems = {name: {**rouge_scores(candidates, references), **reader_measures(candidates, sources, references)}
               for name, candidates in texts.items()}
    systems["reference"] = reader_measures(references, sources, references)
    return systems


def systems_table(systems: dict[str, Any]) -> str:
    """The systems' scores as a Markdown table (stderr; stdout keeps the JSON)."""
    columns = ("rouge1", "rouge2", "rougeL", "repeated_trigrams", "verbatim_sentences",
               "verbatim_sentences_uncased", "cased_as_source", "length_ratio", "summary_words")
    rows = [f"| system | {' | '.join(columns)} |", "|---" * (len(columns) + 1) + "|"]
    for name, scores in systems.items():
        cells = [f"{scores[c]:.4g}" if isinstance(scores.get(c), float) else "-" for c in columns]
        rows.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(rows)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="rtserve eval", formatter_class=HelpFormatter,
        description="Score an exported model-repository entry through the serving path; prints one JSON object. "
        "A checkpoint folder (config.json + model.safetensors) is scored by its family's recipe instead, which "
        "takes its own options: rtserve eval CHECKPOINT --help.")
    parser.add_argument("entry", help="model-repository entry folder (holds manifest.json), or a checkpoint folder")
    parser.add_argument("--data", required=True, help="a data file (JSON Lines for text, CSV for series) or a "
                        "bundled corpus's folder")
    parser.add_argument("--split", default="test", help="a bundled corpus's split: train | dev/val | test | all")
    parser.add_argument("--text-field", default="text", help="classify, JSON Lines: the text's field")
    parser.add_argument("--label-field", default="label", help="classify, JSON Lines: the label's field")
    parser.add_argument("--source-field", default="source", help="summarize, JSON Lines: the document's field")
    parser.add_argument("--summary-field", default="summary", help="summarize, JSON Lines: the reference's field")
    parser.add_argument("--backend", default="onnx", choices=("onnx", "torchscript", "torch"))
    parser.add_argument("--limit", type=int, default=0, help="score only the first N examples (0 = all)")
    summaries = parser.add_argument_group("summarizers")
    summaries.add_argument("--decoding", choices=("sentence", "free"),
                           help="the request option 'decoding' (default: the model's)")
    summaries.add_argument("--beam-size", type=int, help="the request option 'beam_size' (default: the model's)")
    summaries.add_argument("--max-length", type=int, help="the request option 'max_length' (default: the model's)")
    summaries.add_argument("--lead-sentences", type=int, default=0,
                           help="k of the Lead-k baseline (default: 3 for BBC, 10 for SumPubMed)")
    summaries.add_argument("--no-extractor", dest="extractor", action="store_false",
                           help="leave out the TF-IDF sentence extractor baseline (trained on the train split)")
    summaries.add_argument("--extractor-train-limit", type=int, default=0,
                           help="train the extractor on the first N training documents (0 = all)")
    summaries.add_argument("--summaries-out", help="write every document's summaries, by system, here (JSON "
                           "lines: key, model, lead_same_length, lead_<k>, extractor, reference)")
    summaries.add_argument("--judgement-sheet", help="also write a blind-judgement sheet here (its key: "
                           "<name>.key.json beside it); score it with `rtserve judgement score`")
    summaries.add_argument("--judgement-count", type=int, default=15, help="documents on the sheet")
    summaries.add_argument("--judgement-seed", type=int, default=0, help="which documents, in which order")
    summaries.add_argument("--judgement-lead", choices=("same-length", "lead-k"), default="same-length",
                           help="the lead candidate on the sheet: a lead of the summary's length, or Lead-k")
    args = parser.parse_args(list(argv))
    entry = Path(args.entry)
    manifest = json.loads((entry / "manifest.json").read_text())
    model = load_model(entry, args.backend, Settings(max_batch_size=CONCURRENCY, max_queue_delay_ms=2))
    started = time.perf_counter()
    scores = asyncio.run(model.family.part("evaluate")(model, args))
    print(json.dumps({
        "entry": str(entry), "family": manifest["family"], "backend": args.backend,
        "providers": model.providers, "data": args.data,
        **({"split": args.split} if Path(args.data).is_dir() else {}), **scores,
        "eval_seconds": round(time.perf_counter() - started, 1),
    }))
    return 0
