"""Triton's ``perf_analyzer`` (the tritonclient 2.50.0 wheel's) drives rtserve in sequence mode, over gRPC (streaming)
and HTTP, unchanged: it reads the model's metadata, configuration and statistics, sends sequences of pieces with
START and END, and every request succeeds. Skipped where perf_analyzer is not installed (`make peers`: .venv-peers,
or ../shared/peers/triton/setup.sh: /tmp/trv; or RTSERVE_BENCH_TRITON_VENV)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from loadtest.chaos import free_port
from loadtest.perf_analyzer import PerfAnalyzer, find_perf_analyzer, inference_count, run, write_input_data
from tests.service_helpers import start_rtserve

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = [os.environ.get("RTSERVE_BENCH_TRITON_VENV"), str(ROOT / ".venv-peers"), "/tmp/trv"]


@pytest.fixture(scope="module")
def analyzer() -> PerfAnalyzer:
    reasons = []
    for venv in filter(None, CANDIDATES):
        found = find_perf_analyzer(Path(venv))
        if isinstance(found, PerfAnalyzer):
            return found
        reasons.append(found)
    pytest.skip("perf_analyzer is not installed: " + "; ".join(reasons))


@pytest.mark.slow
def test_perf_analyzer_runs_sequences_against_rtserve_over_grpc_and_http(analyzer, forecast_repository, redis_url,
                                                                        tmp_path):
    port, grpc_port = free_port(), free_port()
    process = start_rtserve({"RTSERVE_MODEL_REPOSITORY": str(forecast_repository[0]), "RTSERVE_REDIS_URL": redis_url,
                             "RTSERVE_REDIS_KEY_PREFIX": f"perf-analyzer-{os.getpid()}",
                             "RTSERVE_LOG_LEVEL": "warning", "RTSERVE_GRPC_PORT": str(grpc_port)}, port)
    base = f"http://127.0.0.1:{port}"
    try:
        data = write_input_data(tmp_path / "rows.json", "ROWS", rows=6, width=7, steps=4)
        for protocol, url in (("grpc", f"127.0.0.1:{grpc_port}"), ("http", f"127.0.0.1:{port}")):
            before = inference_count(base, "rsa-tiny")
            figures = run(analyzer, "rsa-tiny", url, protocol, data, concurrency=2, sequence_length=4,
                          measurement_ms=800, streaming=protocol == "grpc", timeout=120)
            assert figures["pieces_per_second"] > 0, figures["output"]
            assert inference_count(base, "rsa-tiny") > before
            assert "Failed" not in figures["output"] and "error" not in figures["output"].lower(), figures["output"]
        sessions = httpx.get(f"{base}/metrics").text
        assert 'route="/inference.GRPCInferenceService/ModelStreamInfer"' in sessions
        assert 'route="/v2/models/{model_name}/infer"' in sessions
    finally:
        process.terminate()
        process.wait(timeout=30)
