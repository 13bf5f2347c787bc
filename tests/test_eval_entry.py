"""`rtserve eval` on an exported entry (the serving path) reproduces the checkpoint's figures."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ETTH1 = Path(__file__).resolve().parents[2] / "shared" / "data" / "ETT-small" / "ETTh1.csv"


def _eval(target: Path, *extra: str) -> dict:
    result = subprocess.run([sys.executable, "-m", "rtserve.cli", "eval", str(target), *extra],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not ETTH1.exists(), reason=f"dataset not found at {ETTH1} (../shared/data)")
def test_forecaster_entry_scores_like_its_checkpoint(forecast_repository):
    repository, checkpoint = forecast_repository
    entry = repository / "rsa-tiny" / "1"
    eager = _eval(checkpoint, "--data", str(ETTH1), "--split", "val")
    exported = _eval(entry, "--data", str(ETTH1), "--split", "val")
    assert exported["windows"] == eager["windows"] > 0
    assert exported["mse"] == pytest.approx(eager["mse"], rel=1e-5)
    assert exported["mae"] == pytest.approx(eager["mae"], rel=1e-5)
