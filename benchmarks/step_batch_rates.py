"""The RMT step's offline rate at each batch size: does a larger batch make a segment cheaper on this machine?

    .venv/bin/python benchmarks/step_batch_rates.py [--batches 4,8,16,32] [--repeats 3] [--model-repository ...]

Method: the bench's offline steps (``loadtest.offline.OfflineSteps``: the entry's ``step`` graph loaded with the
service's backend and thread settings, no HTTP, no Redis): the bench's classify sessions of 4 one-segment pieces,
step k of every session stacked into one batch. Each repeat runs every batch size in turn; printed: segments/s
per batch size, per repeat and the median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from loadtest import bench_inputs as inputs
    from loadtest.offline import OfflineSteps

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=lambda text: [int(n) for n in text.split(",")], default=[4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="rmt-hyperpartisan")
    parser.add_argument("--threads", type=int, default=0, help="intra-op threads (0: every core, as the service)")
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    options = parser.parse_args()
    entry = options.model_repository / options.model / "1"
    manifest = json.loads((entry / "manifest.json").read_text())
    sessions = inputs.classify_sessions(entry, manifest, inputs.hyperpartisan_texts(options.data),
                                        max(options.batches), 4)
    steps = OfflineSteps(entry, manifest, {"backend": "onnx"}, options.threads, False)
    steps.batched_seconds(sessions[:1])  # warm-up
    rates: dict[int, list[float]] = {batch: [] for batch in options.batches}
    for _ in range(options.repeats):
        for batch in options.batches:
            chosen = sessions[:batch]
            rates[batch].append(batch * len(chosen[0].segments) / steps.batched_seconds(chosen))
    for batch, values in rates.items():
        print(f"batch {batch}: {statistics.median(values):.1f} segments/s (repeats: "
              f"{', '.join(f'{value:.1f}' for value in values)})")


if __name__ == "__main__":
    main()
