"""The decode batching benchmark runs on a tiny summarizer, side by side with a baseline repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def test_decode_batching_benchmark_prints_both_ways_for_both_repositories(summarize_repository):
    repository = summarize_repository[0]
    run = subprocess.run([sys.executable, "benchmarks/decode_batching.py", "--repository", str(repository),
                          "--baseline", str(repository), "--model", "srformer-tiny", "--data", str(DATA),
                          "--documents", "3", "--repeats", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    lines = run.stdout.splitlines()
    for name in ("this concurrent", "this one at a time", "baseline concurrent", "baseline one at a time"):
        row = next(line for line in lines if line.startswith(f"| {name} |"))
        tokens_per_second, mean_batch = (float(cell) for cell in row.split("|")[2:4])
        assert tokens_per_second > 0 and mean_batch >= 1
    concurrent = next(line for line in lines if line.startswith("| this concurrent |"))
    assert float(concurrent.split("|")[3]) > 1  # the three documents shared decode steps
    every_input, kept = (float(mb) for mb in concurrent.split("|")[6].split("/"))
    assert 0 < kept < every_input  # the fixed inputs are copied at re-forms only
    assert any(line.startswith("this / baseline, concurrent:") for line in lines)
