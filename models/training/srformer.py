"""Training and evaluation recipe for SRformer summarizers: on a user's JSON Lines pairs, or on BBC News
Summary and SumPubMed.

    rtserve train srformer --train train.jsonl --dev dev.jsonl --out runs/notes  # {"source": ..., "summary": ...}
    rtserve eval runs/notes --data test.jsonl   # what the service writes: sentence copy (the salience head)
    rtserve train srformer --data ../shared/data/bbc-news-summary --cross-attention srformer \\
        --segment-size 16 --seed 0 --out runs/srformer-s16-seed0
    rtserve eval runs/srformer-s16-seed0 --data ../shared/data/bbc-news-summary --split test
    python -m models.training.srformer lead --data ../shared/data/bbc-news-summary --split test

Recipe (CPU-sized, see docs/summarization.md): the MiniLM-L6 encoder is frozen,
so its outputs for every document (title + body, first ``max_source`` tokens,
window by window) are computed once and cached under ``cache/`` (git-ignored)
as fp16 safetensors; every run and every cross-attention mode reuses them. The
decoder is trained teacher-forced with AdamW; after each epoch the dev loss and
the greedy dev ROUGE (first ``--dev-limit`` documents; ``--dev-no-repeat-ngram``
decodes them as the service will) are measured and the epoch with the best dev
ROUGE-1 is kept (the test split is never looked at).
The checkpoint holds only the decoder (MiniLM's word embeddings and encoder
come from the pip package), and, on a user's files (``--salience``, by default),
the salience head fitted after it on the same pairs
(``models/training/srformer_salience.py``), so the model serves sentence copy.
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
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

from models.checkpoint import load_checkpoint, save_checkpoint
from models.data.summarization import PairsFile, corpus_name, corpus_of, rouge_scores
from models.families import family
from models.srformer import RECURRENT_NORMS, RECURRENT_PARTS, SRformer, SRformerConfig
from models.srformer_weights import load_decoder_weights, load_srformer, warm_start_from_minilm
from models.training.common import command_parser, hardware, recipe_record, seed_everything

CACHE_ROOT = Path("cache")
Corpus = ModuleType | PairsFile  # a corpus module (models.data.bbc, models.data.sumpubmed) or a user's file
DEFAULT_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# liblinear C tried for a head with its lexicon fitted after training: the range BBC (10) and SumPubMed (1-3)
# chose from; the fit's wider default grid reaches C = 100, which took over 50 min on 104k sentences
AFTER_TRAINING_C = (1.0, 3.0, 10.0)


# ---- frozen encoder cache -------------------------------------------------------------------
@dataclasses.dataclass
class Example:
    key: str
    source: torch.Tensor  # (k,) int64 WordPiece ids read by the encoder
    enc: torch.Tensor  # (k, 384) fp16 MiniLM outputs
    target: torch.Tensor  # (n,) int64 summary ids (no [CLS]/[SEP])
    reference: str  # summary text


def _cache_path(data: Path, max_source: int, window: int, corpus: Corpus | None = None) -> Path:
    if isinstance(corpus, PairsFile):  # a user's file: the cache follows its contents
        stamp, name = corpus.digest, corpus.__name__
    else:
        stamp = f"{data.resolve()}-{(data / 'splits.json').stat().st_size if (data / 'splits.json').exists() else 0}"
        name = corpus_name(data)
    key = hashlib.sha256(f"{stamp}-{max_source}-{window}-minilm-l6".encode()).hexdigest()[:10]
    return CACHE_ROOT / f"srformer-{name}-k{max_source}-w{window}-{key}"


def pairs_file(path: Path, args: argparse.Namespace) -> PairsFile:
    """A user's JSON Lines file of pairs, read by the family's reader with the command's field names."""
    read = family("srformer").part("reader")
    return PairsFile(path, read(path, source_field=args.source_field, summary_field=args.summary_field))


def add_pair_sources(parser: argparse.ArgumentParser, data_help: str, dev_help: str) -> None:
    """--data FOLDER, or --train FILE --dev FILE of JSON Lines pairs with their field names."""
    parser.add_argument("--data", type=Path, help=data_help)
    parser.add_argument("--train", type=Path, help='JSON Lines of pairs, {"source": ..., "summary": ...} a line '
                        "(instead of --data)")
    parser.add_argument("--dev", type=Path, help=f"JSON Lines like --train: {dev_help}")
    parser.add_argument("--source-field", default="source", help="the document's field in --train and --dev")
    parser.add_argument("--summary-field", default="summary", help="the reference summary's field")


def check_pair_sources(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if (args.data is None) == (args.train is None) or (args.train is None) != (args.dev is None):
        parser.error("give --train FILE --dev FILE (JSON Lines), or --data FOLDER")


def _cache_index(folder: Path) -> dict[str, list[str]]:
    """Shard file -> the document keys it holds (an older single-file cache is one shard)."""
    done = folder / "index.json"
    if not done.exists():
        return {}
    index = json.loads(done.read_text())
    return index.get("shards") or {"encoded.safetensors": index["keys"]}


@torch.no_grad()
def build_cache(data: Path, keys: list[str], max_source: int, window: int, batch_windows: int = 8,
                device: str = "cpu", corpus: Corpus | None = None) -> Path:
    """Encode the documents of ``keys`` not cached yet (all windows, batched, padded) into a new shard.

    Only what is asked for is encoded: an eval of 200 test articles encodes 200 articles, not the
    corpus; a later run that needs more adds a shard with just the missing ones.
    """
    from safetensors.torch import save_file
    from tqdm import tqdm

    from models.minilm import load_minilm_encoder, load_minilm_tokenizer

    corpus = corpus or corpus_of(data)
    folder = _cache_path(data, max_source, window, corpus)
    shards = _cache_index(folder)
    cached = {key for shard_keys in shards.values() for key in shard_keys}
    keys = list(dict.fromkeys(key for key in keys if key not in cached))
    if not keys:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = load_minilm_tokenizer()
    encoder = load_minilm_encoder().to(device)
    pairs = [corpus.read_pair(data, key) for key in keys]
    sources = [torch.tensor(tokenizer.encode(p.document, add_special_tokens=False).ids[:max_source]) for p in pairs]
    targets = [torch.tensor(tokenizer.encode(p.summary, add_special_tokens=False).ids) for p in pairs]
    windows = [(d, start) for d, src in enumerate(sources) for start in range(0, len(src), window)]
    windows.sort(key=lambda w: -min(window, len(sources[w[0]]) - w[1]))  # similar lengths together
    outputs: dict[tuple[int, int], torch.Tensor] = {}
    for b in tqdm(range(0, len(windows), batch_windows), desc=f"encoding {len(keys)} documents (MiniLM, cached)",
                  file=sys.stderr):
        chunk = windows[b: b + batch_windows]
        pieces = [sources[d][start: start + window] for d, start in chunk]
        width = max(len(p) for p in pieces) + 2
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for row, piece in enumerate(pieces):
            ids[row, : len(piece) + 2] = torch.cat([torch.tensor([101]), piece, torch.tensor([102])])
            mask[row, : len(piece) + 2] = 1
        hidden = encoder(input_ids=ids.to(device), attention_mask=mask.to(device)).cpu()  # (n, w+2, 384)
        for row, (d, start) in enumerate(chunk):
            outputs[(d, start)] = hidden[row, 1: 1 + len(pieces[row])].half()
    tensors = {}
    for d, key in enumerate(keys):
        name = key.replace("/", "_")
        starts = range(0, len(sources[d]), window)
        tensors[f"{name}.enc"] = torch.cat([outputs[(d, s)] for s in starts]).contiguous()
        tensors[f"{name}.source"] = sources[d].to(torch.int32).contiguous()
        tensors[f"{name}.target"] = targets[d].to(torch.int32).contiguous()
    shard = f"encoded-{len(shards)}.safetensors"
    save_file(tensors, str(folder / shard))
    shards[shard] = keys
    (folder / "index.json").write_text(json.dumps({"shards": shards, "max_source": max_source, "window": window}))
    return folder


def load_examples(data: Path, split: str, max_source: int, window: int, limit: int | None = None,
                  device: str = "cpu", corpus: Corpus | None = None) -> list[Example]:
    """The examples of a corpus folder's split, or of a user's file (``corpus``: its :class:`PairsFile`)."""
    corpus = corpus or corpus_of(data)
    keys = corpus.split_keys(data, split)[:limit] if limit else corpus.split_keys(data, split)
    return load_examples_of(data, keys, max_source, window, device, corpus)


def load_examples_of(data: Path, keys: list[str], max_source: int, window: int = 510,
                     device: str = "cpu", corpus: Corpus | None = None) -> list[Example]:
    """The cached examples of ``keys`` (encoding those not cached yet), in that order."""
    from safetensors import safe_open

    corpus = corpus or corpus_of(data)
    folder = build_cache(data, keys, max_source, window, device=device, corpus=corpus)  # encodes what is missing
    shard_of = {key: shard for shard, shard_keys in _cache_index(folder).items() for key in shard_keys}
    out = []
    for shard in dict.fromkeys(shard_of[key] for key in keys):
        with safe_open(str(folder / shard), framework="pt") as f:
            for key in keys:
                if shard_of[key] != shard:
                    continue
                name = key.replace("/", "_")
                out.append(Example(key, f.get_tensor(f"{name}.source").long(), f.get_tensor(f"{name}.enc"),
                                   f.get_tensor(f"{name}.target").long(), corpus.read_pair(data, key).summary))
    order = {key: position for position, key in enumerate(keys)}
    return sorted(out, key=lambda example: order[example.key])


# ---- batches -------------------------------------------------------------------------------
def collate(model: SRformer, examples: list[Example], max_target: int
            ) -> tuple[torch.Tensor, ...]:
    """Padded encoder outputs, mask, decoder inputs/labels and the candidate vocabulary."""
    c = model.config
    B = len(examples)
    k = max(len(e.source) for e in examples)
    enc = torch.zeros(B, k, c.embed_dim)
    mask = torch.zeros(B, k, dtype=torch.bool)
    source = torch.full((B, k), c.pad_id, dtype=torch.long)
    targets = []
    for b, e in enumerate(examples):
        enc[b, : len(e.source)] = e.enc.float()
        mask[b, : len(e.source)] = True
        source[b, : len(e.source)] = e.source
        t = e.target[: max_target]
        if len(t) < max_target:
            t = torch.cat([t, torch.tensor([c.eos_id])])  # the summary ends inside the budget
        targets.append(t)
    T = max(len(t) for t in targets)
    tokens = torch.full((B, T), c.pad_id, dtype=torch.long)
    labels = torch.full((B, T), c.pad_id, dtype=torch.long)
    valid = torch.zeros(B, T, dtype=torch.bool)
    for b, t in enumerate(targets):
        tokens[b, 0] = c.bos_id
        tokens[b, 1: len(t)] = t[:-1]
        labels[b, : len(t)] = t
        valid[b, : len(t)] = True
    device = model.wte.device
    enc, mask, source, tokens, labels, valid = (x.to(device) for x in (enc, mask, source, tokens, labels, valid))
    vocab_ids, vocab_mask, src_index = model.vocab(source, mask)
    # label -> its column in vocab_ids (ignored when absent: a token the source never had)
    ordered = torch.where(vocab_mask, vocab_ids, torch.full_like(vocab_ids, torch.iinfo(torch.long).max))
    pos = torch.searchsorted(ordered, labels).clamp(max=vocab_ids.shape[1] - 1)
    found = ordered.gather(1, pos) == labels
    target_index = torch.where(valid & found, pos, torch.full_like(pos, -100))
    return enc, mask, source, tokens, target_index, vocab_ids, vocab_mask, src_index


def clipping_groups(model: SRformer, recurrent_apart: bool) -> dict[str, list[torch.nn.Parameter]]:
    """Parameters clipped together (to norm 1): all of them, or the recurrent part's (RAF, gate) apart,
    so that its gradients cannot scale down every other update."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    apart = {name for name in params if recurrent_apart and (".raf." in name or name.endswith(".gate"))}
    if not apart:
        return {"all": list(params.values())}
    return {"rest": [p for name, p in params.items() if name not in apart],
            "recurrent": [p for name, p in params.items() if name in apart]}


class RecurrentDiagnostics:
    """Per epoch: the clip factor of each gradient group (mean of min(1, 1 / norm)) and, per SRformer
    layer, rms(O_R) / rms(O_S) and the share of RAF outputs that fired (of the batches seen)."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.batches = 0

    def add(self, model: SRformer, grad_norms: Mapping[str, float]) -> None:
        values = {f"clip_factor_{name}": min(1.0, 1.0 / max(norm, 1e-12)) for name, norm in grad_norms.items()}
        for layer, block in enumerate(model.blocks):
            stats = getattr(block.cross, "stats", None)
            if stats:
                values[f"or_over_os_l{layer}"] = float(stats["o_r_rms"] / stats["o_s_rms"].clamp(min=1e-12))
                values[f"raf_fired_l{layer}"] = float(stats["raf_fired"])
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + value
        self.batches += 1

    def summary(self) -> dict[str, float]:
        return {key: round(total / max(self.batches, 1), 4) for key, total in self.sums.items()}


def batches(examples: list[Example], batch_size: int, rng: random.Random) -> list[list[Example]]:
    """Length-bucketed shuffled batches (less padding)."""
    order = sorted(examples, key=lambda e: len(e.source) + rng.random() * 60)
    groups = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(groups)
    return groups


def loss_of(model: SRformer, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    enc, mask, source, tokens, target_index, vocab_ids, vocab_mask, src_index = batch
    memory = model.memory(enc, mask, source)
    logp = model(tokens, memory, mask, vocab_ids, vocab_mask, src_index)  # (B, T, V)
    return F.nll_loss(logp.flatten(0, 1), target_index.flatten(), ignore_index=-100)


@torch.no_grad()
def summarize_examples(model: SRformer, examples: list[Example], tokenizer: object, beams: int = 1,
                       no_repeat_ngram: int = 0, batch_size: int = 16) -> tuple[list[str], dict[str, float]]:
    """Decode summaries from cached encoder outputs as the service's free decoding does (the summary reaches
    the model's length q, then ends at a sentence end); returns texts and decode timing."""
    from models.detokenize import sentence_end_ids

    model.eval()
    ends = sentence_end_ids(tokenizer)  # type: ignore[arg-type]
    texts, tokens, seconds = [], 0, 0.0
    for i in range(0, len(examples), batch_size):
        chunk = examples[i: i + batch_size]
        enc, mask, source, *_ = collate(model, chunk, 1)
        memory = model.memory(enc, mask, source)
        started = time.perf_counter()
        ids = model.generate(memory, mask, source, beams=beams, no_repeat_ngram=no_repeat_ngram, ends=ends)
        seconds += time.perf_counter() - started
        tokens += sum(len(x) + 1 for x in ids)
        texts += [tokenizer.decode(x) for x in ids]  # type: ignore[attr-defined]
    speed = {"decode_tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
             "decode_s_per_summary": round(seconds / max(len(examples), 1), 4),
             "generated_tokens_mean": round(tokens / max(len(examples), 1), 1)}
    return texts, speed


# ---- train ---------------------------------------------------------------------------------
def train_main(argv: Sequence[str]) -> int:
    parser = command_parser(
        "rtserve train srformer", "Train an SRformer summarizer: on source/summary pairs in JSON Lines (--train, "
        "--dev) or on BBC News Summary or SumPubMed (--data).")
    parser.add_argument("family", choices=["srformer"], help=argparse.SUPPRESS)  # `rtserve train <family>` names it
    add_pair_sources(parser, "bbc-news-summary or sumpubmed folder", "the epoch kept is the one scoring best here")
    parser.add_argument("--out", required=True, type=Path, help="checkpoint folder to write")
    parser.add_argument("--cross-attention", choices=["full", "segmented", "srformer"], default="srformer")
    parser.add_argument("--segment-size", type=int, default=16, help="s: encoder positions per segment")
    parser.add_argument("--summary-ratio", type=float, default=0.45, help="q = ceil(ratio * k): the schedule")
    parser.add_argument("--summary-length", type=int, default=0,
                        help="fixed q for the schedule (and 1.25q decode cap) instead of the ratio; 0 = ratio")
    parser.add_argument("--recurrent-gate", action="store_true",
                        help="srformer: O = O_S + g O_R with g learned per head from 0 (Eq. 10)")
    parser.add_argument("--gate-init", type=float, default=0.0, help="with --recurrent-gate: g's initial value")
    parser.add_argument("--recurrent-norm", choices=RECURRENT_NORMS, default="norm_k",
                        help="O_R: norm_k = Q RAF(P) / norm(K) (Eq. 13); kernel = App. A.1 Eq. (22), phi = elu + 1")
    parser.add_argument("--recurrent-part", choices=RECURRENT_PARTS, default="raf",
                        help="ablations: linear = no RAF (the paper's III), off = O_R zeroed")
    parser.add_argument("--recurrent-only", action="store_true", help="O = O_R: no segmented part (ablation I)")
    parser.add_argument("--raf-threshold", type=float, default=0.01, help="the RAF threshold's initial value")
    parser.add_argument("--clip-recurrent-apart", action="store_true",
                        help="clip the RAF and gate gradients (norm 1) apart from the rest (norm 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (initialisation, data order)")
    parser.add_argument("--epochs", type=int, default=8, help="passes over the training data")
    parser.add_argument("--time-budget", type=float, default=0, help="minutes; stop after the epoch that passes it")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per optimizer step")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (AdamW)")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--minilm-shape", action="store_true",
                        help="decoder blocks in MiniLM's shape: post-LN, d 384, 12 heads, MLP 1536 (overrides "
                             "--d-model/--heads)")
    parser.add_argument("--warm-start", action="store_true",
                        help="start the decoder from MiniLM's layers, BERT2BERT-style (implies --minilm-shape)")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="start the decoder from this checkpoint's weights (same shape; parts this "
                             "cross-attention mode adds, e.g. the RAF, start fresh)")
    parser.add_argument("--max-source", type=int, default=1024, help="tokens of each document read")
    parser.add_argument("--max-target", type=int, default=400, help="summary tokens trained on")
    parser.add_argument("--train-limit", type=int, default=0, help="use only the first N training pairs")
    parser.add_argument("--dev-limit", type=int, default=40, help="dev pairs decoded for selection")
    parser.add_argument("--dev-loss-limit", type=int, default=0,
                        help="dev pairs the dev loss is measured on (0 = the whole dev split)")
    parser.add_argument("--dev-no-repeat-ngram", type=int, default=0,
                        help="decode the selection's dev summaries with this no-repeat n-gram rule (0 = plain greedy)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=DEFAULT_DEVICE, help="cpu or cuda (encoder cache, training, decoding)")
    parser.add_argument("--salience", choices=["lexical", "plain", "none"], default=None,
                        help="after the decoder, fit the salience head that chooses the sentences the summary copies "
                        "(the served decoding becomes sentence copy; models/training/srformer_salience.py): with "
                        "its lexicon, without, or not at all. Default: lexical with --train/--dev; none with --data, "
                        "whose recipe fits the head in a step of its own (docs/summarization.md)")
    args = parser.parse_args(list(argv))
    check_pair_sources(parser, args)
    salience = args.salience or ("none" if args.data else "lexical")
    # a user's files are read (and refused, naming a bad line) before any model is built
    train_corpus, dev_corpus = (None, None) if args.data else (pairs_file(args.train, args), pairs_file(args.dev, args))
    from tqdm import tqdm

    from models.minilm import load_minilm_tokenizer, minilm_config

    torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    shape = dict(d_model=args.d_model, n_head=args.heads, d_ff=4 * args.d_model)
    if args.minilm_shape or args.warm_start:
        bert = minilm_config()
        shape = dict(d_model=bert.hidden_size, n_head=bert.num_attention_heads, d_ff=bert.intermediate_size,
                     norm_position="post", layer_norm_eps=bert.layer_norm_eps)
    config = SRformerConfig(cross_attention=args.cross_attention, segment_size=args.segment_size,
                            summary_ratio=args.summary_ratio, summary_length=args.summary_length,
                            recurrent_gate=args.recurrent_gate, gate_init=args.gate_init,
                            recurrent_norm=args.recurrent_norm, recurrent_part=args.recurrent_part,
                            segmented_part=not args.recurrent_only, raf_threshold=args.raf_threshold,
                            n_layer=args.layers, **shape,
                            max_source=args.max_source, max_target=max(512, args.max_target + 1))
    model = load_srformer(config=config)
    if args.warm_start:
        warm_start_from_minilm(model)
    if args.init_from is not None:  # e.g. a full-attention decoder trained further as a segmented one
        load_decoder_weights(model, load_checkpoint(args.init_from))
    model = model.to(args.device).train()
    tokenizer = load_minilm_tokenizer()
    train = load_examples(args.data or args.train, "train", args.max_source, config.encoder_window,
                          args.train_limit or None, device=args.device, corpus=train_corpus)
    dev = load_examples(args.data or args.dev, "dev", args.max_source, config.encoder_window,
                        max(args.dev_loss_limit, args.dev_limit) if args.dev_loss_limit else None, device=args.device,
                        corpus=dev_corpus)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    clip_groups = clipping_groups(model, args.clip_recurrent_apart)
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    total = args.epochs * steps_per_epoch
    warmup = max(1, min(200, total // 10))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / warmup) * max(0.05, 1 - step / max(total, 1)))
    rng = random.Random(args.seed)
    started = time.time()
    best, history = None, []
    n_params = sum(p.numel() for p in params)
    progress = tqdm(total=total, desc=f"srformer {args.cross_attention} s={args.segment_size}", file=sys.stderr)
    progress.write(json.dumps({"params": n_params, "train": len(train), "dev": len(dev)}))
    for epoch in range(args.epochs):
        model.train()
        running, count = 0.0, 0
        diagnostics = RecurrentDiagnostics()
        for group in batches(train, args.batch_size, rng):
            loss = loss_of(model, collate(model, group, args.max_target))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norms = {name: float(torch.nn.utils.clip_grad_norm_(group_params, 1.0))
                     for name, group_params in clip_groups.items()}
            diagnostics.add(model, norms)
            optimizer.step()
            scheduler.step()
            running, count = running + loss.item(), count + 1
            progress.update(1)
            progress.set_postfix(loss=f"{running / count:.3f}")
        model.eval()
        with torch.no_grad():
            scored = dev[: args.dev_loss_limit or None]
            dev_loss = sum(float(loss_of(model, collate(model, scored[i: i + 16], args.max_target)))
                           for i in range(0, len(scored), 16)) / math.ceil(len(scored) / 16)
        chosen = dev[: args.dev_limit]
        texts, speed = summarize_examples(model, chosen, tokenizer, no_repeat_ngram=args.dev_no_repeat_ngram)
        scores = rouge_scores(texts, [e.reference for e in chosen])
        record = {"epoch": epoch + 1, "train_loss": round(running / max(count, 1), 4),
                  "dev_loss": round(dev_loss, 4), **{f"dev_{k}": v for k, v in scores.items()},
                  "elapsed_s": round(time.time() - started, 1), **speed, **diagnostics.summary()}
        history.append(record)
        progress.write(json.dumps(record))
        if best is None or scores["rouge1"] > best:
            best = scores["rouge1"]
            extras = {"recipe": recipe_record(args),
                      "selected_epoch": epoch + 1, "history": history, "train_seconds": round(time.time() - started, 1),
                      "hardware": hardware(args.threads, args.device), "params": n_params}
            state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            save_checkpoint(args.out, "srformer", config, state, extras)
        if args.time_budget and time.time() - started > 60 * args.time_budget:
            progress.write(f"time budget of {args.time_budget} min reached after epoch {epoch + 1}")
            break
    progress.close()
    # keep the full history in the selected checkpoint
    checkpoint = load_checkpoint(args.out)
    checkpoint.extras["history"] = history
    checkpoint.extras["train_seconds_total"] = round(time.time() - started, 1)
    save_checkpoint(args.out, "srformer", config, checkpoint.state_dict, checkpoint.extras)
    done = {"out": str(args.out), "best_dev_rouge1": best, "epochs": len(history),
            "train_seconds": round(time.time() - started, 1)}
    if salience != "none":
        done["salience"] = fit_salience_after_training(args, salience, train_corpus, dev_corpus)
    print(json.dumps(done))
    return 0


def fit_salience_after_training(args: argparse.Namespace, kind: str, train_corpus: PairsFile | None,
                                dev_corpus: PairsFile | None) -> dict:
    """The salience head fitted on the documents the decoder was trained on, chosen on the same dev documents;
    written into the checkpoint ``args.out``."""
    from models.training.srformer_salience import Documents, fit_salience

    if train_corpus is not None and dev_corpus is not None:
        train_keys = train_corpus.all_keys()[: args.train_limit or None]
        train = Documents(train_corpus.path, train_keys, train_corpus)
        dev = Documents(dev_corpus.path, dev_corpus.all_keys(), dev_corpus)
    else:
        train_keys = corpus_of(args.data).split_keys(args.data, "train")
        train = Documents(args.data, train_keys[: args.train_limit or None])
        dev = Documents.of_split(args.data, "dev", 0)
    command = f"rtserve train srformer ... --salience {kind} (after the decoder: the same train and dev documents)"
    penalties = AFTER_TRAINING_C if kind == "lexical" else None
    return fit_salience(args.out, args.out, train, dev, lexical=kind == "lexical", penalties=penalties,
                        threads=args.threads, command=command)


# ---- eval ----------------------------------------------------------------------------------
def eval_main(argv: Sequence[str]) -> int:
    parser = command_parser("rtserve eval", "ROUGE of an SRformer summarizer.")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--data", required=True, type=Path, help="JSON Lines file of pairs (as --train), or a "
                        "bbc-news-summary or sumpubmed folder")
    parser.add_argument("--split", default="test", choices=["train", "dev", "test", "all"], help="a folder's split")
    parser.add_argument("--source-field", default="source", help="JSON Lines: the document's field")
    parser.add_argument("--summary-field", default="summary", help="JSON Lines: the reference summary's field")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--decoding", choices=["sentence", "free"], default=None,
                        help="sentence copy or free generation; default: what the service writes for this checkpoint "
                        "(sentence copy, read through the served stream, when it has a salience head)")
    parser.add_argument("--beams", type=int, default=None, help="free generation's beams (default: the served)")
    parser.add_argument("--no-repeat-ngram", type=int, default=None,
                        help="free generation's no-repeat n-gram rule (default: the served)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=DEFAULT_DEVICE, help="cpu or cuda (encoder cache, training, decoding)")
    parser.add_argument("--stream", action="store_true",
                        help="read text through the served stream (EagerSummarizer), not the cache (sentence copy "
                        "always does)")
    parser.add_argument("--recurrent-part", choices=RECURRENT_PARTS, default=None,
                        help="diagnostic: score the checkpoint with this recurrent part (off = O_R zeroed)")
    parser.add_argument("--cross-attention", choices=["full", "segmented", "srformer"], default=None,
                        help="diagnostic: score the checkpoint's weights in another cross-attention mode")
    parser.add_argument("--recurrent-norm", choices=RECURRENT_NORMS, default=None,
                        help="diagnostic: with --cross-attention srformer, the form of O_R")
    args = parser.parse_args(list(argv))
    corpus = None if args.data.is_dir() else pairs_file(args.data, args)
    from models.minilm import load_minilm_tokenizer

    torch.set_num_threads(args.threads)
    overrides = {name: value for name, value in (("recurrent_part", args.recurrent_part),
                                                 ("cross_attention", args.cross_attention),
                                                 ("recurrent_norm", args.recurrent_norm)) if value is not None}
    from models.serving.srformer import served_decoding

    checkpoint = load_checkpoint(args.checkpoint)
    served = served_decoding(checkpoint)
    decoding = args.decoding or served.decoding
    if decoding == "sentence" and not checkpoint.config.get("salience", False):
        parser.error(f"{args.checkpoint} has no salience head, so it cannot copy sentences: fit one with "
                     "`python -m models.training.srformer_salience fit`, or score --decoding free")
    beams = served.beams if args.beams is None else args.beams
    no_repeat_ngram = served.no_repeat_ngram if args.no_repeat_ngram is None else args.no_repeat_ngram
    stream_path = args.stream or decoding == "sentence"  # sentence copy reads the document's text
    model = load_srformer(checkpoint, **overrides).to("cpu" if stream_path else args.device)  # stream: CPU
    tokenizer = load_minilm_tokenizer()
    c = model.config
    if stream_path:
        from models.minilm import load_minilm_encoder
        from models.serving.srformer import EagerSummarizer

        stream = EagerSummarizer(model, load_minilm_encoder(), tokenizer)
        pairs = (corpus or corpus_of(args.data)).load_split(args.data, args.split, args.limit or None)
        started = time.perf_counter()
        texts = [stream.summarize(p.document, decoding=decoding, beams=beams, no_repeat_ngram=no_repeat_ngram,
                                  adjacency=served.adjacency, trigram_overlap=served.trigram_overlap)
                 for p in pairs]
        seconds = time.perf_counter() - started
        references = [p.summary for p in pairs]
        speed = {"encode_and_decode_s_per_summary": round(seconds / max(len(pairs), 1), 4)}
    else:
        examples = load_examples(args.data, args.split, c.max_source, c.encoder_window, args.limit or None,
                                 corpus=corpus)
        texts, speed = summarize_examples(model, examples, tokenizer, beams, no_repeat_ngram)
        references = [e.reference for e in examples]
    scores = rouge_scores(texts, references)
    print(json.dumps({"checkpoint": str(args.checkpoint), "split": args.split if corpus is None else str(args.data),
                      "n": len(texts),
                      "cross_attention": c.cross_attention, "segment_size": c.segment_size,
                      "recurrent_norm": c.recurrent_norm, "recurrent_part": c.recurrent_part,
                      "decoding": decoding, **({"beams": beams, "no_repeat_ngram": no_repeat_ngram}
                                               if decoding == "free" else {}),
                      "rouge1": scores["rouge1"], "rouge2": scores["rouge2"], "rougeL": scores["rougeL"],
                      **speed, "threads": args.threads}))
    return 0


def lead_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.training.srformer lead")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--split", default="test", choices=["train", "dev", "test", "all"])
    parser.add_argument("--k", type=int, nargs="+", default=[3, 8])
    args = parser.parse_args(list(argv))
    corpus = corpus_of(args.data)
    pairs = corpus.load_split(args.data, args.split)
    out = {"corpus": corpus_name(args.data), "split": args.split, "n": len(pairs)}
    for k in args.k:
        out[f"lead{k}"] = rouge_scores([corpus.lead(p, k) for p in pairs], [p.summary for p in pairs])
    print(json.dumps(out))
    return 0


def cache_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.training.srformer cache")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--max-source", type=int, default=1024)
    parser.add_argument("--split", choices=["train", "dev", "test", "all"], default="all",
                        help="encode only this split's documents")
    parser.add_argument("--limit", type=int, default=0, help="only the split's first N documents (0 = all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default=DEFAULT_DEVICE, help="cpu or cuda (encoder cache, training, decoding)")
    args = parser.parse_args(list(argv))
    torch.set_num_threads(args.threads)
    started = time.time()
    corpus = corpus_of(args.data)
    keys = corpus.all_keys(args.data) if args.split == "all" else corpus.split_keys(args.data, args.split)
    keys = keys[: args.limit] if args.limit else keys
    folder = build_cache(args.data, keys, args.max_source, SRformerConfig().encoder_window, device=args.device)
    print(json.dumps({"cache": str(folder), "seconds": round(time.time() - started, 1)}))
    return 0


def schedule_main(argv: Sequence[str]) -> int:
    """How often the segment schedule i = min(t*m // q, m-1) holds the summary's next token.

    Per reference summary token y_t: is y_t in segment i_t, and is there a source
    position j in S_i that continues the summary (src[j-1] = y_{t-1}, src[j] = y_t)?
    The last line counts that continuation anywhere in the document (full attention).
    """
    parser = argparse.ArgumentParser(prog="python -m models.training.srformer schedule")
    parser.add_argument("--data", required=True, type=Path)
    parser.add_argument("--split", default="dev")
    parser.add_argument("--segment-sizes", type=int, nargs="+", default=[8, 16, 64, 256])
    parser.add_argument("--summary-ratio", type=float, default=0.45)
    args = parser.parse_args(list(argv))
    c = SRformerConfig()
    examples = load_examples(args.data, args.split, c.max_source, c.encoder_window)
    out: dict[str, object] = {"split": args.split, "n": len(examples)}
    for size in args.segment_sizes:
        inside = cont = total = 0
        for e in examples:
            src, tgt = e.source.tolist(), e.target.tolist()
            k = len(src)
            m, q = -(-k // size), math.ceil(args.summary_ratio * k)
            for t, y in enumerate(tgt):
                i = min(t * m // q, m - 1)
                last = tgt[t - 1] if t else c.bos_id
                inside += y in src[i * size: (i + 1) * size]
                cont += any(src[j] == y and (src[j - 1] if j else c.bos_id) == last
                            for j in range(i * size, min((i + 1) * size, k)))
                total += 1
        out[f"s{size}"] = {"target_in_segment": round(inside / total, 3),
                           "continuation_in_segment": round(cont / total, 3)}
    anywhere = total = 0
    for e in examples:
        src, tgt = e.source.tolist(), e.target.tolist()
        pairs = set(zip([c.bos_id, *src[:-1]], src, strict=True))
        for t, y in enumerate(tgt):
            anywhere += ((tgt[t - 1] if t else c.bos_id), y) in pairs
            total += 1
    out["continuation_anywhere"] = round(anywhere / total, 3)
    print(json.dumps(out))
    return 0


def ship_main(argv: Sequence[str]) -> int:
    """Copy a run's checkpoint as the shipped artifact (MiniLM parts are not stored).

    fp16 halves the file; ship fp32 when the fp16 copy scores measurably lower (`rtserve eval` both).
    """
    parser = argparse.ArgumentParser(prog="python -m models.training.srformer ship")
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16", help="stored weight type")
    parser.add_argument("--beams", type=int, default=1, help="the service's default search (chosen on dev)")
    parser.add_argument("--no-repeat-ngram", type=int, default=0, help="the service's default (chosen on dev)")
    parser.add_argument("--decoding", choices=["sentence", "free"],
                        help="the service's default decoding (chosen on dev; default: sentence with a salience head)")
    args = parser.parse_args(list(argv))
    checkpoint = load_checkpoint(args.checkpoint)
    dtype = getattr(torch, args.dtype)
    weights = {name: t.to(dtype) if t.is_floating_point() else t for name, t in checkpoint.state_dict.items()}
    decoding = args.decoding or ("sentence" if checkpoint.config.get("salience") else "free")
    decode = {"decoding": decoding, "beams": args.beams, "no_repeat_ngram": args.no_repeat_ngram}
    extras = dict(checkpoint.extras, decode=decode, weights_dtype=args.dtype, source_run=str(args.checkpoint))
    save_checkpoint(args.out, "srformer", checkpoint.config, weights, extras)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(json.dumps({"out": str(args.out), "bytes": size}))
    return 0


if __name__ == "__main__":
    commands = {"lead": lead_main, "cache": cache_main, "train": train_main, "eval": eval_main, "ship": ship_main,
                "schedule": schedule_main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        raise SystemExit(f"usage: python -m models.training.srformer {{{','.join(commands)}}} ...")
    sys.exit(commands[sys.argv[1]](sys.argv[2:]))
