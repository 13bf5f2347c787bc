"""The cross-attention cost benchmark runs for every variant (it broke once unnoticed: nothing ran it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cross_attention_cost_benchmark_prints_every_variant():
    run = subprocess.run([sys.executable, "benchmarks/cross_attention_cost.py", "--lengths", "64", "--repeats", "1",
                          "--d-model", "16", "--heads", "2", "--segment-size", "8"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    row = json.loads(run.stdout.splitlines()[0])
    for variant in ("full", "segmented", "srformer", "srformer_kernel"):
        assert row[f"{variant}_flops_per_token"] > 0, variant
    assert row["segmented_flops_ratio"] < 1  # a segment of 8 keys of 64 costs less than all of them
