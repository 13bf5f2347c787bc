"""Teacher-forced training step of the SRformer decoder, per cross-attention mode, on long sources.

    .venv/bin/python benchmarks/srformer_training_step.py [--source 4096 --target 480 --batch 16 --device cpu]

The shape of the SumPubMed recipe by default (docs/summarization.md): a batch of 16 documents of
4,096 encoder positions, summaries of 480 tokens, s = 64, q = 345, d = 256, 2 layers, a candidate
vocabulary of about 1,000 source ids per document. Inputs are random (the cost does not depend on
the values). For each mode one step is forward + backward of the loss over the summary; printed:
the median wall time of ``--repeats`` steps after one warm-up, and the ratio to full attention
measured in the same run. On CUDA also the peak memory allocated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.srformer import SRformer, SRformerConfig  # noqa: E402

MODES = {
    "full": {"cross_attention": "full"},
    "segmented": {"cross_attention": "segmented"},
    "srformer (Eq. 13)": {"cross_attention": "srformer"},
    "srformer (kernel, Eq. 22)": {"cross_attention": "srformer", "recurrent_norm": "kernel"},
}


def synthetic_batch(config: SRformerConfig, batch: int, source: int, target: int, vocab: int, device: str
                    ) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    enc = torch.randn(batch, source, config.embed_dim, generator=generator)
    mask = torch.ones(batch, source, dtype=torch.bool)
    mask[batch // 2:, source * 3 // 4:] = False  # half the documents shorter: padding, as in real batches
    source_ids = torch.randint(1000, 1000 + vocab, (batch, source), generator=generator)
    tokens = torch.randint(1000, 1000 + vocab, (batch, target), generator=generator)
    tokens[:, 0] = config.bos_id
    return tuple(x.to(device) for x in (enc, mask, source_ids, tokens))


def training_step(model: SRformer, enc: torch.Tensor, mask: torch.Tensor, source_ids: torch.Tensor,
                  tokens: torch.Tensor) -> None:
    memory = model.memory(enc, mask, source_ids)
    vocab_ids, vocab_mask, src_index = model.vocab(source_ids, mask)
    logp = model(tokens, memory, mask, vocab_ids, vocab_mask, src_index)  # (B, T, V)
    labels = torch.zeros_like(tokens)[..., None]  # any column: the cost does not depend on it
    (-logp.gather(-1, labels).mean()).backward()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=int, default=4096, help="encoder positions per document (k)")
    parser.add_argument("--target", type=int, default=480, help="summary tokens trained on (T)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=1000, help="distinct source ids per batch")
    parser.add_argument("--segment-size", type=int, default=64)
    parser.add_argument("--summary-length", type=int, default=345, help="q, the schedule's length")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name, options in MODES.items():
        config = SRformerConfig(segment_size=args.segment_size, summary_length=args.summary_length,
                                max_source=args.source, max_target=max(512, args.target), **options)
        torch.manual_seed(0)
        model = SRformer(config).to(args.device).train()
        batch = synthetic_batch(config, args.batch, args.source, args.target, args.vocab, args.device)
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.repeats + 1):  # the first is a warm-up
            model.zero_grad(set_to_none=True)
            started = time.perf_counter()
            training_step(model, *batch)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        row = {"mode": name, "seconds_per_step": round(statistics.median(times[1:]), 3)}
        if args.device.startswith("cuda"):
            row["peak_memory_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
        rows.append(row)
        print(json.dumps(row), flush=True)
    full = rows[0]["seconds_per_step"]
    print(f"\nbatch {args.batch}, k = {args.source}, T = {args.target}, s = {args.segment_size}, "
          f"q = {args.summary_length}, {args.threads} thread(s), {args.device}\n")
    print("| mode | s / step | vs full |" + (" peak MiB |" if args.device.startswith("cuda") else ""))
    print("|---|---|---|" + ("---|" if args.device.startswith("cuda") else ""))
    for row in rows:
        extra = f" {row['peak_memory_mib']} |" if "peak_memory_mib" in row else ""
        print(f"| {row['mode']} | {row['seconds_per_step']} | {row['seconds_per_step'] / full:.2f} |{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
