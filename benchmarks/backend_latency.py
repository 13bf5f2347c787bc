"""Per-step latency of eager PyTorch, TorchScript and ONNX Runtime, side by side in one run.

    .venv/bin/python benchmarks/backend_latency.py                 # every checkpoint under weights/
    .venv/bin/python benchmarks/backend_latency.py weights/rsa-etth1-h24 --batches 1,8,32 --repeats 50

Each checkpoint is exported to a temporary repository, then every graph runs
through the three backends the service uses (same inputs, same thread count),
and the median time per step is printed with the ratios to eager.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from export.exporter import export_checkpoint
from models.serving.servable import build_servable
from service.runtime.backends import load_backends


def median_seconds(run: object, inputs: dict[str, np.ndarray], repeats: int) -> float:
    for _ in range(3):
        run(inputs)  # type: ignore[operator]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(inputs)  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="*", help="checkpoint folders (default: weights/*)")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2, help="torch and ONNX Runtime intra-op threads")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    folders = [Path(p) for p in args.checkpoints] or sorted(p.parent for p in Path("weights").glob("*/config.json"))
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    header = f"{'model':<26} {'graph':<14} {'batch':>5} {'eager ms':>9} {'ts ms':>8} {'onnx ms':>8} {'ts/eager':>9} " \
             f"{'onnx/eager':>10}"
    print(f"torch {torch.__version__}, {args.threads} threads, median of {args.repeats} steps")
    print(header)
    with tempfile.TemporaryDirectory() as scratch:
        for folder in folders:
            entry = export_checkpoint(folder, Path(scratch))
            manifest = json.loads((entry / "manifest.json").read_text())
            backends = {name: load_backends(entry, manifest, name) for name in ("torch", "torchscript", "onnx")}
            servable = build_servable(folder)
            for graph in servable.graphs:
                for batch in batches:
                    sample = graph.sample_inputs(batch, torch.Generator().manual_seed(batch))
                    inputs = {spec.name: t.numpy() for spec, t in zip(graph.inputs, sample, strict=True)}
                    ms = {name: 1000 * median_seconds(backends[name][graph.name].run, inputs, args.repeats)
                          for name in ("torch", "torchscript", "onnx")}
                    row = {"model": manifest["name"], "graph": graph.name, "batch": batch, **ms}
                    rows.append(row)
                    print(f"{manifest['name']:<26} {graph.name:<14} {batch:>5} {ms['torch']:>9.3f} "
                          f"{ms['torchscript']:>8.3f} {ms['onnx']:>8.3f} {ms['torchscript'] / ms['torch']:>9.2f} "
                          f"{ms['onnx'] / ms['torch']:>10.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
