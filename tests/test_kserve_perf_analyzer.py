"""Triton's ``perf_analyzer`` (the tritonclient 2.50.0 wheel's) drives rtserve in sequence mode, over gRPC (streaming)
and HTTP, unchanged: it reads the model's metadata, configuration and statistics, sends sequences of pieces with
START and END, and every request succeeds. Skipped where perf_analyzer is not installed (`make peers`: .venv-peers,
or ../shared/peers/triton/setup.sh: /tmp/trv; or RTSERVE_BENCH_TRITON_VENV)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from loadtest.chaos import free_port
from loadtest.harness import Server, thread_cpu_seconds
from loadtest.perf_analyzer import (
    GRPC_FLOOR,
    PerfAnalyzer,
    budgets,
    capture_answers,
    find_perf_analyzer,
    grpc_inference_count,
    inference_count,
    measure_each,
    rtserve_steps,
    run,
    step_cpu_ms_per_row,
    steps_in,
    write_input_data,
)
from service.metrics import ServiceMetrics
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
                          measurement_ms=800, streaming=protocol == "grpc", timeout=120, stability_percentage=300)
            assert figures["pieces_per_second"] > 0, figures["output"]
            assert inference_count(base, "rsa-tiny") > before
            assert "Failed" not in figures["output"] and "error" not in figures["output"].lower(), figures["output"]
        assert 0 < rtserve_steps(base, "rsa-tiny:1") <= inference_count(base, "rsa-tiny")  # batches, of pieces
        sessions = httpx.get(f"{base}/metrics").text
        assert 'route="/inference.GRPCInferenceService/ModelStreamInfer"' in sessions
        assert 'route="/v2/models/{model_name}/infer"' in sessions
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow
def test_grpc_floor_answers_every_streamed_request_with_the_answer_captured_from_rtserve(
        analyzer, forecast_repository, redis_url, tmp_path):
    """The floor of ``python -m loadtest.perf_analyzer --floor`` answers what rtserve answered for a piece (the same
    outputs, to the byte), under each request's id, and perf_analyzer drives it as it drives the servers."""
    port, grpc_port = free_port(), free_port()
    process = start_rtserve({"RTSERVE_MODEL_REPOSITORY": str(forecast_repository[0]), "RTSERVE_REDIS_URL": redis_url,
                             "RTSERVE_REDIS_KEY_PREFIX": f"grpc-floor-{os.getpid()}",
                             "RTSERVE_LOG_LEVEL": "warning", "RTSERVE_GRPC_PORT": str(grpc_port)}, port)
    try:
        capture_answers(f"127.0.0.1:{grpc_port}", "rsa-tiny", rows=6, width=7, folder=tmp_path / "captured")
    finally:
        process.terminate()
        process.wait(timeout=30)
    captured = service_pb2.ModelInferResponse.FromString((tmp_path / "captured" / "answer").read_bytes())
    assert captured.model_name == "rsa-tiny" and [o.name for o in captured.outputs][0] == "FORECAST"

    floor_port = free_port()
    floor = Server([sys.executable, str(GRPC_FLOOR), "--port", str(floor_port), "--captured",
                    str(tmp_path / "captured")], dict(os.environ), floor_port, tmp_path / "floor.log")
    target = f"127.0.0.1:{floor_port}"
    try:
        with grpc.insecure_channel(target) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            requests = []
            for index in range(3):
                request = service_pb2.ModelInferRequest(model_name="rsa-tiny", id=f"piece-{index}")
                request.inputs.add(name="ROWS", datatype="FP32", shape=[6, 7])
                request.raw_input_contents.append(np.ones((6, 7), "<f4").tobytes())
                requests.append(request)
            answers = [message.infer_response for message in stub.ModelStreamInfer(iter(requests), timeout=30)]
        assert [answer.id for answer in answers] == ["piece-0", "piece-1", "piece-2"]
        for answer in answers:
            assert answer.outputs == captured.outputs and answer.raw_output_contents == captured.raw_output_contents
        assert grpc_inference_count(target, "rsa-tiny") == 3

        data = write_input_data(tmp_path / "rows.json", "ROWS", rows=6, width=7, steps=4)
        figures = run(analyzer, "rsa-tiny", target, "grpc", data, concurrency=2, sequence_length=4,
                      measurement_ms=800, timeout=120, stability_percentage=300)
        assert figures["pieces_per_second"] > 0 and grpc_inference_count(target, "rsa-tiny") > 3, figures["output"]
    finally:
        floor.stop()


def test_a_server_that_dies_under_a_concurrency_is_started_afresh_and_tried_there_once_more(capsys):
    def first(concurrency: int) -> dict:
        if concurrency == 2:
            return {"concurrency": concurrency, "error": "timed out", "server_alive": False}
        return {"concurrency": concurrency, "pieces_per_second": 1.0}

    def fresh(concurrency: int) -> dict:
        return {"concurrency": concurrency, "pieces_per_second": 2.0}

    rows = measure_each([1, 2, 4], first, "died", restart=lambda: fresh)
    assert rows == [{"concurrency": 1, "pieces_per_second": 1.0},
                    {"concurrency": 2, "pieces_per_second": 2.0, "crashed_first": True},
                    {"concurrency": 4, "pieces_per_second": 2.0}]
    assert "died" in capsys.readouterr().out
    dead = {"concurrency": 1, "error": "timed out", "server_alive": False}
    assert measure_each([1, 2], lambda c: dead, "died") == [dead]  # without a restart, the last row
    again = measure_each([1, 2], lambda c: dead, "died", restart=lambda: lambda c: dead)
    assert again == [dead | {"crashed_first": True}]  # the fresh server died too: the last row


def test_rows_per_step_come_from_the_batch_size_histogram_of_the_models_step_graph():
    metrics = ServiceMetrics(collect_gpu=False)
    for rows in (3, 5):
        metrics.observe_batch("rsa-tiny:1", "onnx", "step", rows, 0.001, [0.0] * rows)
    metrics.observe_batch("rsa-tiny:1", "onnx", "encoder", 4, 0.001, [0.0] * 4)  # another graph
    metrics.observe_batch("rmt-tiny:1", "onnx", "step", 2, 0.001, [0.0] * 2)  # another model
    text = metrics.exposition().decode()
    assert steps_in(text, "rsa-tiny:1") == 2
    assert steps_in(text, "rsa-tiny:2") == 0


def test_a_threads_cpu_is_read_apart_from_the_others():
    this = threading.get_native_id()
    before = thread_cpu_seconds(os.getpid(), this)
    started = time.process_time()
    while time.process_time() - started < 0.3:  # busy on this thread only
        pass
    assert thread_cpu_seconds(os.getpid(), this) - before >= 0.2


def test_the_step_alone_is_timed_on_the_entrys_own_state_and_threads(forecast_repository):
    entry = forecast_repository[0] / "rsa-tiny" / "1"
    manifest = json.loads((entry / "manifest.json").read_text())
    one, eight = (step_cpu_ms_per_row(entry, manifest, batch, rows=6, runs=20) for batch in (1, 8))
    assert 0 < one < 50 and 0 < eight < 50
    assert eight < one  # rows share a step's fixed cost


def test_the_budget_is_what_tritons_piece_leaves_once_the_floor_the_step_and_redis_are_paid():
    def row(server: str, concurrency: int, cpu: float, **more: object) -> dict:
        return {"server": server, "concurrency": concurrency, "server_cpu_ms_per_piece": cpu, **more}

    rows = [row("rtserve", 16, 0.70, rows_per_step=8.5, cpu_ms_per_piece_of={"event loop": 0.35, "Redis": 0.04}),
            row("grpc-floor", 16, 0.08), row("triton", 16, 0.32, rows_per_step=8.6),
            row("rtserve", 32, 0.68, cpu_ms_per_piece_of={"Redis": 0.05}), row("grpc-floor", 32, 0.07),
            {"server": "triton", "concurrency": 32, "error": "crashed", "server_alive": False}]
    asked = []

    def step(batch: int) -> float:
        asked.append(batch)
        return 0.17

    (budget,) = budgets(rows, step)  # at 32 Triton has no figures: no budget there
    assert asked == [9]  # the step timed at Triton's rows per step
    assert budget["paid_ms"] == pytest.approx(0.08 + 0.17 + 0.04)
    assert budget["left_by_triton_ms"] == pytest.approx(0.32 - 0.29)
    assert budget["rtserve_beyond_ms"] == pytest.approx(0.70 - 0.29)
