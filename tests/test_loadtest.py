"""The locust load test runs clean against a real `rtserve serve` process."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.chaos import free_port
from tests.service_helpers import start_rtserve

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_locust_drives_one_shot_and_session_traffic_without_failures(forecast_repository, tmp_path, redis_url):
    port = free_port()
    server = start_rtserve({"RTSERVE_MODEL_REPOSITORY": str(forecast_repository[0]), "RTSERVE_REDIS_URL": redis_url,
                            "RTSERVE_LOG_LEVEL": "warning"}, port, ready_path="/healthz", timeout=30)
    try:
        locust = Path(sys.executable).with_name("locust")
        result = subprocess.run(
            [str(locust), "-f", str(ROOT / "loadtest" / "locustfile.py"), "--host", f"http://127.0.0.1:{port}",
             "--headless", "-u", "4", "-r", "4", "-t", "4s", "--csv", str(tmp_path / "stats"), "--only-summary",
             "--exit-code-on-error", "1"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},  # the locustfile imports this checkout's rtserve.client
        )
    finally:
        server.terminate()
        server.wait(timeout=20)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with open(tmp_path / "stats_stats.csv") as handle:
        rows = {row["Name"]: row for row in csv.DictReader(handle)}
    assert int(rows["Aggregated"]["Request Count"]) > 10
    assert int(rows["Aggregated"]["Failure Count"]) == 0
    assert int(rows["/forecast"]["Request Count"]) > 0
    assert int(rows["/sessions/{id}/finish"]["Request Count"]) > 0
