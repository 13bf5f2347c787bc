"""benchmarks/engine_hop.py, run small: it prints its figures and ends cleanly (the engine it started stops without
an error logged)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_engine_hop_ends_without_a_traceback(forecast_repository):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "engine_hop.py"), "--model", "rsa-tiny",
                           "--model-repository", str(forecast_repository[0]), "--pieces", "20", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "per piece" in done.stdout
    assert "Traceback" not in done.stderr and "CancelledError" not in done.stderr and " ERROR " not in done.stderr, \
        done.stderr[-3000:]
