"""Cross-attention cost per generated token: SRformer vs full attention (paper Table 1, Fig. 5).

    .venv/bin/python benchmarks/cross_attention_cost.py [--d-model 128 --heads 4 --segment-size 16]

Variants: full, segmented, SRformer with O_R = Q RAF(P) / norm(K) (Eq. 13) and with the kernel form
(App. A.1 Eq. 22, ``recurrent_norm="kernel"``).

For encoder lengths k = 1k, 4k, 16k and a summary of q = k * q_ratio tokens
(default 1/8, the paper's Fig. 5 setting k = 8q), one decoder layer's
cross-attention is stepped through all q tokens (Algorithm 1), batch 1, one
thread. Printed side by side per generated token:

- FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` (matrix
  products: QK', AV, the RAF projection, P = K'V - K_Si'V_Si, Q RAF(P)); the
  input projection of Q and the output projection are the same in both modes
  and excluded; K'V itself is accumulated while the encoder windows are read
  (the streaming state), so it is reported separately, amortized over q.
- wall time per token (median of 3 runs of the whole summary).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models.srformer import CROSS_ATTENTION, CrossAttention, SRformerConfig, segment_index  # noqa: E402

VARIANTS = {"full": {}, "segmented": {}, "srformer": {},
            "srformer_kernel": {"cross_attention": "srformer", "recurrent_norm": "kernel"}}


def run_summary(layer: CrossAttention, mem: dict[str, torch.Tensor], mask: torch.Tensor, queries: torch.Tensor,
                m: int, q: int) -> None:
    """Step the cross-attention through q tokens; Q/O projections are bypassed (identity) by the caller."""
    B, h, _, dh = mem["k"].shape
    membrane = torch.zeros(B, h, dh, dh)
    raf_out = torch.zeros(B, h, dh, dh)
    prev = torch.full((B,), -1, dtype=torch.long)
    mt, qt = torch.tensor([m]), torch.tensor([q])
    context = torch.zeros(B, 2, mem["k"].shape[2])  # copy-continuation indicators (no match here)
    for t in range(q):
        seg = segment_index(torch.tensor([t]), mt, qt)
        _, membrane, raf_out, _, _ = layer.step(queries[t], mem, mask, seg, prev, membrane, raf_out, context)
        prev = seg


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--segment-size", type=int, default=16)
    parser.add_argument("--q-ratio", type=float, default=0.125, help="q = k * ratio (paper Fig. 5: 1/8)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for k in args.lengths:
        q = max(1, int(k * args.q_ratio))
        m = -(-k // args.segment_size)
        row: dict[str, object] = {"k": k, "q": q, "segments_m": m}
        dh = args.d_model // args.heads
        for variant, options in VARIANTS.items():
            config = SRformerConfig(**{"cross_attention": variant, **options}, segment_size=args.segment_size,
                                    d_model=args.d_model, n_head=args.heads)
            layer = CROSS_ATTENTION[config.cross_attention](config).eval()
            with torch.no_grad():
                layer.q_proj = torch.nn.Identity()  # same cost in every variant: not counted
                layer.o_proj = torch.nn.Identity()
                enc = torch.randn(1, k, config.embed_dim)
                mask = torch.ones(1, k, dtype=torch.bool)
                emb = torch.randn(1, k, config.embed_dim)
                mem = layer.memory(enc, mask, emb, emb)
                queries = torch.randn(q, 1, args.d_model)
                counter = FlopCounterMode(display=False)
                with counter:
                    run_summary(layer, mem, mask, queries, m, q)
                flops = counter.get_total_flops()
                times = []
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    run_summary(layer, mem, mask, queries, m, q)
                    times.append(time.perf_counter() - started)
            row[f"{variant}_flops_per_token"] = round(flops / q)
            row[f"{variant}_us_per_token"] = round(1e6 * statistics.median(times) / q, 1)
            if variant.startswith("srformer"):
                kv_flops = 2 * k * args.heads * dh * config.kv_columns  # K'V, accumulated at encode time
                row[f"{variant}_kv_flops_per_token_amortized"] = round(kv_flops / q)
                row[f"{variant}_flops_ratio_incl_kv"] = round(
                    (row[f"{variant}_flops_per_token"] + kv_flops / q) / row["full_flops_per_token"], 4)
            if variant != "full":
                for unit, key in (("flops_per_token", "flops_ratio"), ("us_per_token", "time_ratio")):
                    row[f"{variant}_{key}"] = round(row[f"{variant}_{unit}"] / row[f"full_{unit}"], 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"d_model={args.d_model} heads={args.heads} s={args.segment_size} q=k*{args.q_ratio} batch 1, 1 thread")
    print(f"{'k':>6} {'q':>5} {'variant':>16} | {'FLOP/tok':>11} {'vs full':>7} {'incl KV':>7} | "
          f"{'us/tok':>8} {'vs full':>7}")
    for r in rows:
        for variant in VARIANTS:
            ratio = r.get(f"{variant}_flops_ratio", 1.0)
            incl = r.get(f"{variant}_flops_ratio_incl_kv", ratio)
            time_ratio = r.get(f"{variant}_time_ratio", 1.0)
            print(f"{r['k']:>6} {r['q']:>5} {variant:>16} | {r[f'{variant}_flops_per_token']:>11,} {ratio:>7.3f} "
                  f"{incl:>7.3f} | {r[f'{variant}_us_per_token']:>8} {time_ratio:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
