"""``rtserve train gru-classifier --train train.jsonl --dev dev.jsonl --out DIR`` and
``rtserve eval DIR --data test.jsonl``.

Data: JSON Lines, one document a line, ``{"text": "...", "label": "..."}``, read by the reader the
family's record names (rtserve's, for the classify task: a bad line stops the command with the file and
line); the labels are the ones the training file holds, sorted. Training cuts each document with
rtserve's text cutter (the segments the service will read), runs the GRU segment by segment from a zero
memory, and fits the last segment's logits to the label with cross-entropy (AdamW; gradients flow
through every segment read).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from models.checkpoint import load_checkpoint, save_checkpoint
from models.data.files import check_labels, label_set
from models.families import family
from models.minilm import load_minilm_tokenizer
from models.text_stream import SegmentCutter
from rtserve_gru_classifier.model import GRUClassifier, GRUConfig


def read_documents(path: str, args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(text, label)`` of every document of a JSON Lines file, read by the family's reader."""
    read = family("gru-classifier").part("reader")
    return [(e.text, e.label) for e in read(path, text_field=args.text_field, label_field=args.label_field)]


def add_field_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--text-field", default="text", help="the text's field")
    parser.add_argument("--label-field", default="label", help="the label's field")


def segment_batch(cutter: SegmentCutter, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """ids and masks (B, K, s) of every document's segments; shorter documents padded with empty segments."""
    cut = [cutter.segments(text) or [cutter.pack([])] for text in texts]
    k, s = max(len(segments) for segments in cut), cutter.segment_size
    ids, mask = np.zeros((len(cut), k, s), np.int64), np.zeros((len(cut), k, s), np.int64)
    for row, segments in enumerate(cut):
        for index, (segment_ids, segment_mask) in enumerate(segments):
            ids[row, index], mask[row, index] = segment_ids, segment_mask
    return torch.from_numpy(ids), torch.from_numpy(mask)


def logits_of(model: GRUClassifier, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    memory = model.init_state(ids.shape[0])["memory"]
    logits = torch.zeros(ids.shape[0], len(model.config.labels))
    for k in range(ids.shape[1]):  # in order: each segment reads the memory the previous one left
        memory, logits = model.step_tensors(memory, ids[:, k], mask[:, k])
    return logits


@torch.no_grad()
def accuracy(model: GRUClassifier, cutter: SegmentCutter, documents: list[tuple[str, str]]) -> float:
    model.eval()
    labels = model.config.labels
    correct = 0
    for start in range(0, len(documents), 32):
        batch = documents[start : start + 32]
        predicted = logits_of(model, *segment_batch(cutter, [text for text, _ in batch])).argmax(dim=1)
        correct += sum(labels[int(p)] == label for p, (_, label) in zip(predicted, batch, strict=True))
    return correct / len(documents)


def train_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rtserve train gru-classifier", description="Train the GRU classifier "
                                     "on a JSON Lines file.", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("family")
    parser.add_argument("--train", "--data", dest="train", required=True,
                        help='training JSONL: {"text": ..., "label": ...} per line')
    parser.add_argument("--dev", help="JSONL scored after training (its accuracy goes into the checkpoint)")
    add_field_flags(parser)
    parser.add_argument("--out", required=True, help="checkpoint folder to write")
    for flag, default, text in [
        ("--segment-size", 64, "tokens per segment, [CLS] and [SEP] included"),
        ("--max-segments", 16, "segments read per document in training"),
        ("--hidden", 64, "GRU hidden size (the memory)"),
        ("--embed", 64, "token embedding size"),
        ("--epochs", 10, "passes over the training data"),
        ("--batch-size", 16, "documents per batch"),
        ("--lr", 1e-2, "learning rate (AdamW)"),
        ("--seed", 0, "random seed (initialisation, data order)"),
    ]:
        parser.add_argument(flag, type=type(default), default=default, help=text)
    args = parser.parse_args(list(argv))
    torch.manual_seed(args.seed)
    examples = family("gru-classifier").part("reader")(args.train, text_field=args.text_field,
                                                       label_field=args.label_field)
    labels = label_set(args.train, examples)
    documents = [(e.text, e.label) for e in examples]
    config = GRUConfig(embed_dim=args.embed, hidden_size=args.hidden, segment_size=args.segment_size, labels=labels)
    model = GRUClassifier(config)
    cutter = SegmentCutter(load_minilm_tokenizer(), args.segment_size, args.max_segments)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        total = 0.0
        shuffled = [documents[i] for i in rng.permutation(len(documents))]
        for start in range(0, len(shuffled), args.batch_size):
            batch = shuffled[start : start + args.batch_size]
            ids, mask = segment_batch(cutter, [text for text, _ in batch])
            target = torch.tensor([labels.index(label) for _, label in batch])
            loss = F.cross_entropy(logits_of(model, ids, mask), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        print(f"epoch {epoch + 1}: loss {total / len(documents):.4f}", file=sys.stderr)
    metrics = {"train_accuracy": accuracy(model, cutter, documents)}
    if args.dev:
        metrics["dev_accuracy"] = accuracy(model, cutter, read_documents(args.dev, args))
    extras = {"task": "classify", "metrics": metrics, "recipe": {"argv": ["rtserve", "train", *argv]},
              "train_seconds": round(time.perf_counter() - started, 1)}
    save_checkpoint(args.out, "gru-classifier", config, model.state_dict(), extras)
    print(json.dumps({"checkpoint": args.out, "labels": labels, **metrics}))
    return 0


def eval_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rtserve eval", description="Score a GRU classifier checkpoint on a "
                                     "JSON Lines file.")
    parser.add_argument("checkpoint", help="checkpoint folder")
    parser.add_argument("--data", required=True, help='JSONL: {"text": ..., "label": ...} per line')
    add_field_flags(parser)
    args = parser.parse_args(list(argv))
    checkpoint = load_checkpoint(args.checkpoint)
    model = GRUClassifier(GRUConfig(**checkpoint.config))
    model.load_state_dict(checkpoint.state_dict)
    cutter = SegmentCutter(load_minilm_tokenizer(), model.config.segment_size, None)  # served: every segment
    examples = family("gru-classifier").part("reader")(args.data, text_field=args.text_field,
                                                       label_field=args.label_field)
    check_labels(args.data, examples, model.config.labels)
    documents = [(e.text, e.label) for e in examples]
    print(json.dumps({"checkpoint": args.checkpoint, "data": args.data, "documents": len(documents),
                      "accuracy": accuracy(model, cutter, documents)}))
    return 0
