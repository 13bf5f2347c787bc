"""Cross-validation of the RMT recipe: stratified k folds over Hyperpartisan's train+dev articles.

    python -m models.training.rmt cv --data ../shared/data/hyperpartisan --folds 5 --segments 8 --out runs/cv/x.json
    python -m models.training.rmt cv-ensemble runs/cv/x.json runs/cv/y.json --data ... --out runs/cv/x+y.json

``cv`` scores a recipe (the flags of ``rtserve train rmt``) by stratified k-fold cross-validation over
the train+dev articles: each fold's model is trained on the other folds exactly as ``--fit-on
train+dev`` trains (fixed epochs, last kept) and scored on the held-out fold, and on test.
``cv-ensemble`` scores the mean probability of several runs made on the same folds. The TF-IDF
baseline is cross-validated on the same folds (``tfidf-cv``, ``models/training/tfidf_baseline.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from models.data.hyperpartisan import Article, load_articles, metrics
from models.rmt import rmt_from_minilm
from models.training.common import command_parser, hardware, recipe_record, seed_everything
from models.training.rmt import (
    CACHE_SEGMENTS,
    lower_cache,
    lower_masks,
    proba_cached,
    read_corpus,
    recipe_config,
    recipe_parser,
    train_epochs,
)


def cv_folds(articles: Sequence[Article], k: int, seed: int = 0) -> list[list[str]]:
    """Stratified, seeded k folds of article ids: each label's ids (sorted, then shuffled with
    ``seed``) are dealt round-robin, so every fold holds ~1/k of each label. Independent of
    the articles' order."""
    folds: list[list[str]] = [[] for _ in range(k)]
    start = 0
    for label in sorted({a.label for a in articles}):
        ids = sorted(a.id for a in articles if a.label == label)
        random.Random(f"{seed}-{label}").shuffle(ids)
        for i, article_id in enumerate(ids):
            folds[(start + i) % k].append(article_id)
        start += len(ids)  # the next label continues the deal where this one stopped: fold sizes differ by <= 1
    return [sorted(f) for f in folds]


def fold_parts(articles: Sequence[Article], folds: list[list[str]], i: int) -> tuple[list[Article], list[Article]]:
    """(training part, held-out fold i), each in the articles' order."""
    held = set(folds[i])
    return [a for a in articles if a.id not in held], [a for a in articles if a.id in held]


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Mean and sample standard deviation (n - 1)."""
    return {"mean": statistics.mean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0}


def cv_report(result: dict, readings: Sequence[str]) -> dict:
    """Adds ``summary``: mean ± sample sd over folds of every reading's held-out and test scores."""
    result["summary"] = {
        f"{part}_{reading}": {m: summarize([f[part][reading][m] for f in result["folds"]])
                              for m in ("macro_f1", "accuracy")}
        for part in ("heldout", "test") for reading in readings
    }
    return result


def print_cv(result: dict) -> None:
    for f in result["folds"]:
        cells = "  ".join(f"{part}/{r}: F1 {f[part][r]['macro_f1']:.3f} acc {f[part][r]['accuracy']:.3f}"
                          for part in ("heldout", "test") for r in f[part])
        print(f"fold {f['fold']} (n={f['n_heldout']}): {cells}", file=sys.stderr)
    for name, s in result["summary"].items():
        print(f"{name}: macro-F1 {s['macro_f1']['mean']:.3f} ± {s['macro_f1']['sd']:.3f}, "
              f"accuracy {s['accuracy']['mean']:.3f} ± {s['accuracy']['sd']:.3f}", file=sys.stderr)


def scored(articles: list[Article], p_hyper: Sequence[float]) -> dict[str, float]:
    return metrics([a.label for a in articles], [int(p > 0.5) for p in p_hyper])


def cv_main(argv: Sequence[str]) -> int:
    parser = command_parser(
        "python -m models.training.rmt cv", "k-fold cross-validation of the RMT recipe over train+dev (each fold "
        "trained like --fit-on train+dev: fixed epochs, last kept), scored on the held-out fold and on test.",
        parents=[recipe_parser()])
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--fold-seed", type=int, default=0, help="seed of the fold assignment (not the model's)")
    parser.add_argument("--only-folds", type=int, nargs="*", default=None, help="run these fold indices only")
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write (rewritten after every fold)")
    args = parser.parse_args(argv)
    if args.data is None or args.train is not None:
        parser.error("cv reads a Hyperpartisan --data folder")
    config = recipe_config(args, parser)
    corpus = read_corpus(args)
    pool, test = corpus.train + corpus.dev, corpus.test
    folds = cv_folds(pool, args.folds, args.fold_seed)
    # two readings: as trained (max_segments) and every cached segment (up to CACHE_SEGMENTS)
    readings = {"as_trained": config.max_segments, "all_cached": CACHE_SEGMENTS}
    result = {
        "model": "rmt", "recipe": recipe_record(args),
        "protocol": f"stratified {args.folds}-fold CV over train+dev ({len(pool)} articles), fold seed "
        f"{args.fold_seed}; each fold trained on the other folds for {args.epochs} epochs, last epoch kept",
        "readings": {"as_trained": f"first {config.max_segments} segment(s), as trained",
                     "all_cached": f"every cached segment (first {CACHE_SEGMENTS}, {CACHE_SEGMENTS * 126} tokens)"},
        "hardware": hardware(args.threads), "fold_ids": folds, "folds": [],
    }
    cache = masks = None
    for i in range(args.folds) if args.only_folds is None else args.only_folds:
        seed_everything(args.seed)
        model = rmt_from_minilm(dataclasses.replace(config), seed=args.seed)  # a fresh config per fold
        if cache is None:
            cache = lower_cache(model, corpus, args.cache_dir)
            masks = lower_masks(corpus, config.segment_size)
        train, held = fold_parts(pool, folds, i)
        history = [{**row, "train_loss": round(row["train_loss"], 5)}
                   for row in train_epochs(model, train, cache, masks, args, f"fold {i}")]
        fold = {"fold": i, "n_train": len(train), "n_heldout": len(held), "train_seconds": history[-1]["elapsed_s"],
                "history": history, "heldout": {}, "test": {}, "p_hyperpartisan": {}}
        for reading, n in readings.items():
            for part, articles in (("heldout", held), ("test", test)):
                p = proba_cached(model, articles, cache, masks, max_segments=n)[:, 1].tolist()
                fold[part][reading] = scored(articles, p)
                fold["p_hyperpartisan"].setdefault(part, {})[reading] = {
                    a.id: round(x, 6) for a, x in zip(articles, p, strict=True)}
        result["folds"].append(fold)
        print(json.dumps({k: fold[k] for k in ("fold", "train_seconds", "heldout", "test")}), file=sys.stderr)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(cv_report(result, list(readings)), indent=1) + "\n")
    print_cv(result)
    print(json.dumps(result["summary"]))
    return 0


def member_reading(by_reading: dict[str, dict[str, float]], reading: str) -> dict[str, float]:
    """A member's probabilities for ``reading``, or its only reading's where it has just one."""
    if reading in by_reading:
        return by_reading[reading]
    if len(by_reading) == 1:
        return next(iter(by_reading.values()))
    raise ValueError(f"a member has no reading {reading!r} (it has {sorted(by_reading)})")


def cv_ensemble_main(argv: Sequence[str]) -> int:
    """Scores the average of several ``cv`` runs' probabilities (a seed ensemble), fold by fold,
    without retraining: the runs must share their folds. A run with a single reading (``tfidf-cv``'s
    whole text) joins every reading of the first run."""
    parser = argparse.ArgumentParser(prog="python -m models.training.rmt cv-ensemble")
    parser.add_argument("runs", nargs="+", type=Path, help="JSON files written by cv on the same folds")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    runs = [json.loads(r.read_text()) for r in args.runs]
    if any(r["fold_ids"] != runs[0]["fold_ids"] for r in runs):
        parser.error("the runs were made on different folds")
    by_id = {a.id: a for a in load_articles(args.data)}
    readings = list(runs[0]["readings"])
    n_folds = min(len(r["folds"]) for r in runs)
    result = {"model": "ensemble (mean probability)", "members": [str(r) for r in args.runs],
              "fold_ids": runs[0]["fold_ids"], "readings": runs[0]["readings"], "folds": []}
    for i in range(n_folds):
        members = [next(f for f in r["folds"] if f["fold"] == i) for r in runs]
        fold = {"fold": i, "n_heldout": members[0]["n_heldout"], "heldout": {}, "test": {}}
        for part in ("heldout", "test"):
            for reading in readings:
                probabilities = [member_reading(m["p_hyperpartisan"][part], reading) for m in members]
                ids = list(probabilities[0])
                p = [sum(member[a] for member in probabilities) / len(members) for a in ids]
                fold[part][reading] = scored([by_id[a] for a in ids], p)
        result["folds"].append(fold)
    cv_report(result, readings)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print_cv(result)
    print(json.dumps(result["summary"]))
    return 0
