"""The bench's closed-loop scenarios: `rtserve bench --only triton` (rtserve beside Triton's sequence batcher on the
same step graph, one client for both; skipped, saying why, without the peer venv: `make peers`) and
`rtserve bench --only sweep` (capacity over rising session counts)."""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadtest.closed_loop import Run, Target, client_limit, in_session_order, triton_body
from loadtest.scenarios.sweep import capacity
from loadtest.triton.repository import write_model
from loadtest.triton.server import find_triton

ROOT = Path(__file__).resolve().parents[1]
PEER_VENV = Path(os.environ.get("RTSERVE_BENCH_TRITON_VENV") or ROOT / ".venv-peers")


def synthetic_ett(folder: Path, variables: list[str], rows: int = 2000) -> Path:
    """An ETTh1.csv of the model's columns (the bench reads ETT-small/ETTh1.csv under --data)."""
    rng = np.random.default_rng(7)
    t = np.arange(rows)
    values = np.stack([np.sin(2 * np.pi * t / 24 + k) + 0.1 * rng.normal(size=rows) for k in range(len(variables))],
                      axis=1)
    (folder / "ETT-small").mkdir(parents=True)
    with open(folder / "ETT-small" / "ETTh1.csv", "w") as handle:
        handle.write("date," + ",".join(variables) + "\n")
        for index in range(rows):
            handle.write(f"{index}," + ",".join(f"{v:.6f}" for v in values[index]) + "\n")
    return folder


def run_bench(repository: Path, data: Path, out: Path, only: str,
              *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")}
    env |= {"RTSERVE_INTRA_OP_THREADS": "1", "RTSERVE_LOG_LEVEL": "warning", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "rtserve.cli", "bench", "--quick", "--only", only, "--model-repository",
         str(repository), "--data", str(data), "--out-json", str(out / "bench.json"), "--out-md",
         str(out / "bench.md"), "--client-processes", "2", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    return result, out / "bench.json"


def forecast_variables(repository: Path) -> list[str]:
    manifest = json.loads(next(repository.glob("*/*/manifest.json")).read_text())
    return list(manifest["settings"]["variables"])


def test_the_triton_side_says_why_it_cannot_run_and_how_to_get_it(tmp_path):
    assert find_triton(tmp_path / "absent") == f"no Triton venv at {tmp_path / 'absent'}"
    from loadtest.scenarios.triton import unavailable_reason

    reason = unavailable_reason(tmp_path / "absent")
    assert reason.startswith("Triton side skipped: no Triton venv") and "make peers" in reason


@pytest.mark.slow
def test_bench_without_the_triton_venv_skips_that_side_and_exits_0(forecast_repository, tmp_path):
    repository = forecast_repository[0]
    data = synthetic_ett(tmp_path / "data", forecast_variables(repository))
    result, out_json = run_bench(repository, data, tmp_path, "triton", "--triton-venv", str(tmp_path / "no-venv"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out_json.read_text())
    assert "triton" not in report["scenarios"] and report["failed"] == {}
    assert report["skipped"]["triton"].startswith("Triton side skipped: no Triton venv")
    assert "make peers" in result.stdout and "Triton side skipped" in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(isinstance(find_triton(PEER_VENV), str),
                    reason=f"no Triton peer venv at {PEER_VENV} (`make peers`)")
def test_triton_serves_the_same_step_graph_and_both_sides_are_reported(forecast_repository, tmp_path):
    """A tiny RSA at 1 and 2 sessions: both servers measured, and Triton's forecasts equal rtserve's."""
    repository = forecast_repository[0]
    data = synthetic_ett(tmp_path / "data", forecast_variables(repository))
    result, out_json = run_bench(repository, data, tmp_path, "triton", "--triton-venv", str(PEER_VENV))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out_json.read_text())
    triton = report["scenarios"]["triton"]
    assert triton["triton_version"].startswith("2.") and triton["client_processes"] == 2
    forecast = triton["models"]["forecast"]
    assert set(forecast["sessions"]) == {"1", "2"}
    for count, row in forecast["sessions"].items():
        for side in ("rtserve-http", "triton-0ms"):
            figures = row["sides"][side]
            assert figures["pieces"] == int(count) * forecast["pieces_per_session"], (side, figures)
            for key in ("pieces_per_second", "p50_ms", "p99_ms", "server_cpu_ms_per_piece",
                        "client_cpu_ms_per_piece"):
                assert figures[key] > 0, (side, key, figures)
            assert figures["p50_ms"] <= figures["p99_ms"]
            # each server's own count of the pieces a step held: one session's pieces step alone
            assert 1 <= figures["mean_batch_size"] <= int(count), (side, figures)
            if count == "1":
                assert figures["mean_batch_size"] == 1, (side, figures)
        assert set(row["ratios"]["rtserve-http/triton-0ms"]) == {"pieces_per_second", "p50_ms", "p99_ms",
                                                                 "server_cpu_ms_per_piece"}
        # the same step graph: each session's last forecast, to float tolerance
        difference = row["answers_max_abs_difference"]["triton-0ms"]
        assert difference is not None and difference <= 1e-5, difference
        assert len(row["repeats"]) == 1 and set(row["repeats"][0]) >= {"rtserve-http", "triton-0ms"}
    # the session stream is measured where this rtserve serves it, and said not to be otherwise
    assert "rtserve-ws" in forecast.get("unavailable", {}) or "rtserve-ws" in forecast["sessions"]["1"]["sides"]
    table = (tmp_path / "bench.md").read_text()
    assert "rtserve beside Triton" in table and "| model | sessions | transport | pieces/s |" in table
    assert "| mean batch |" in table


def test_a_mean_batch_that_cannot_be_read_is_left_out_of_the_report():
    """Neither server's count read (a service without /metrics, a Triton without its statistics extension): the
    reading is 0, 0, the run has no mean batch, and its cell in the table is empty."""
    import asyncio

    from loadtest.bench_report import triton_section
    from loadtest.harness import BenchError
    from loadtest.scenarios.triton import rtserve_batches, triton_batches

    class Refusing:
        async def metrics(self):
            raise BenchError("GET /metrics answered 404")

        async def get_json(self, path):
            raise BenchError(f"GET {path} answered 400")

    assert asyncio.run(rtserve_batches(Refusing(), "m:1")()) == (0.0, 0.0)
    assert asyncio.run(triton_batches(Refusing(), "m")()) == (0.0, 0.0)
    figures = {"pieces_per_second": 10.0, "p50_ms": 1.0, "p99_ms": 2.0, "server_cpu_ms_per_piece": 0.5,
               "client_cpu_ms_per_piece": 0.1}
    run = {"queue_delays_ms": [0.0], "client_processes": 2, "cores": 2, "models": {"forecast": {
        "model": "m:1", "sessions": {"16": {"sides": {"rtserve-ws": figures, "triton-0ms": figures | {
            "mean_batch_size": 8.0}}, "ratios": {}, "answers_max_abs_difference": {}}}}}}
    rows = [line for line in triton_section(run) if line.startswith("| m:1 |")]
    assert [row.split(" | ")[8] for row in rows] == ["", "8"], rows


def test_a_triton_request_carries_the_same_rows_or_text_as_the_rtserve_piece():
    rows = {"seq": 1, "rows": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]}
    body = json.loads(triton_body(json.dumps(rows).encode(), Target("triton-http", "", "m", outputs=("forecast",)),
                                  42, first=True, last=False))
    assert body["parameters"] == {"sequence_id": 42, "sequence_start": True, "sequence_end": False}
    assert body["inputs"] == [{"name": "values", "shape": [1, 3, 2], "datatype": "FP32",
                               "data": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}]
    assert [o["name"] for o in body["outputs"]] == ["forecast", "STEPS"]
    text = json.loads(triton_body(b'{"seq": 3, "text": "a piece"}', Target("triton-http", "", "m", text=True), 7,
                                  first=False, last=True))
    assert text["inputs"] == [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a piece"]}]
    assert text["parameters"]["sequence_end"] is True
    binary = triton_body(json.dumps(rows).encode(), Target("triton-http-binary", "", "m"), 42, first=True, last=False,
                         binary=True)
    header, data = binary.split(b"\n", 1)  # the JSON header, then the tensor data
    assert json.loads(header)["inputs"] == [{"name": "values", "shape": [1, 3, 2], "datatype": "FP32",
                                             "parameters": {"binary_data_size": 24}}]
    assert np.frombuffer(data, "<f4").tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_answers_come_back_in_session_order_from_the_round_robin_shares():
    sessions = list(range(7))
    shares = [sessions[index::3] for index in range(3)]
    assert in_session_order(shares) == sessions


def test_a_run_whose_client_was_busy_says_the_client_was_the_limit():
    def run(client_busy, server_cpu, client_cpu):
        return Run("rtserve-http", 4, 100, 1.0, [0.01] * 100, server_cpu, client_cpu, client_busy, 2)

    assert client_limit(run(0.3, 0.9, 0.4), cores=2) is None
    assert "busy 95%" in client_limit(run(0.95, 0.9, 0.9), cores=2)
    assert "took more CPU than the server" in client_limit(run(0.85, 0.3, 1.6), cores=2)


def test_the_triton_model_of_an_entry_declares_its_piece_and_answer_tensors(tmp_path):
    manifest = {
        "name": "rsa-x", "task": "forecast", "assets": {},
        "graphs": [{"name": "step", "intra_op_threads": 1, "files": {"onnx": "step.onnx"},
                    "state_outputs": {"window": "next_window", "rows_seen": "next_rows_seen"},
                    "inputs": [{"name": "window", "dtype": "float32", "shape": ["batch", 96, 7]},
                               {"name": "rows_seen", "dtype": "int64", "shape": ["batch"]},
                               {"name": "values", "dtype": "float32", "shape": ["batch", "rows", 7]}],
                    "outputs": [{"name": "next_window", "dtype": "float32", "shape": ["batch", 96, 7]},
                                {"name": "next_rows_seen", "dtype": "int64", "shape": ["batch"]},
                                {"name": "forecast", "dtype": "float32", "shape": ["batch", 24, 7]},
                                {"name": "ready", "dtype": "bool", "shape": ["batch"]}]}],
    }
    model = write_model(tmp_path, tmp_path / "entry", manifest, delay_ms=5, intra_op_threads=0)
    assert model.name == "rsa-x-5ms" and not model.text
    assert model.piece_inputs == (("values", "FP32"),) and model.answers == ("forecast", "ready")
    config = (tmp_path / "rsa-x-5ms" / "config.pbtxt").read_text()
    assert '{ name: "values" data_type: TYPE_FP32 dims: [ -1, 7 ] }' in config
    assert '{ name: "ready" data_type: TYPE_BOOL dims: [ 1 ] }' in config
    assert "max_queue_delay_microseconds: 5000" in config and "max_batch_size: 32" in config
    assert 'key: "intra_op_threads" value: { string_value: "1" }' in config  # the manifest's, as rtserve's rule
    assert (tmp_path / "rsa-x-5ms" / "1" / "model.py").exists()


@pytest.mark.slow
def test_sweep_reports_every_count_with_the_engines_mean_batch_and_the_capacity(forecast_repository, tmp_path):
    repository = forecast_repository[0]
    data = synthetic_ett(tmp_path / "data", forecast_variables(repository))
    result, out_json = run_bench(repository, data, tmp_path, "sweep")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sweep = json.loads(out_json.read_text())["scenarios"]["sweep"]
    model = sweep["models"]["forecast"]
    assert "skipped" in sweep["models"]["classify"]  # no RMT in this repository
    assert list(model["levels"])[0] == "1"
    for count, row in model["levels"].items():
        assert row["pieces"] == int(count) * model["pieces_per_session"]
        assert 1 <= row["mean_batch_size"] <= int(count) and 0 < row["client_cpu_share"] <= 1
        assert row["pieces_per_second"] > 0 and row["p50_ms"] <= row["p99_ms"]
    assert model["capacity"] is None or model["capacity"]["sessions"] in sweep["counts"]
    assert "Capacity sweep" in (tmp_path / "bench.md").read_text()


def test_capacity_is_the_highest_rate_whose_p99_stays_under_the_bound():
    levels = {"1": {"pieces_per_second": 100.0, "p99_ms": 5.0}, "8": {"pieces_per_second": 400.0, "p99_ms": 90.0},
              "32": {"pieces_per_second": 450.0, "p99_ms": 300.0}}
    assert capacity(levels) == {"pieces_per_second": 400.0, "sessions": 8, "p99_bound_ms": 250.0}
    assert capacity({"1": {"pieces_per_second": 1.0, "p99_ms": 900.0}}) is None


class FakeSessionStream:
    """A stand-in rtserve (aiohttp, in a thread) that speaks the session stream's protocol, or lacks the route."""

    def __init__(self, with_stream: bool) -> None:
        import asyncio
        import threading

        from aiohttp import web

        self.frames: list[dict] = []
        self.deleted: list[str] = []
        self.in_flight = self.most_in_flight = 0  # sessions between their first piece and their third
        app = web.Application()
        app.router.add_post("/sessions", self.create)
        app.router.add_post("/sessions/{id}/finish", self.finish)
        app.router.add_delete("/sessions/{id}", self.delete)
        if with_stream:
            app.router.add_get("/sessions/{id}/stream", self.stream)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def create(self, request):
        from aiohttp import web

        return web.json_response({"id": f"s{len(self.deleted)}-{id(request)}"}, status=201)

    async def finish(self, request):
        from aiohttp import web

        return web.json_response({"result": {}})

    async def delete(self, request):
        from aiohttp import web

        self.deleted.append(request.match_info["id"])
        return web.Response(status=204)

    async def stream(self, request):
        from aiohttp import web

        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"event": "open", "session": {"id": request.match_info["id"], "seq": 0}})
        seq = 0
        async for message in ws:
            if message.type == web.WSMsgType.BINARY:  # seq, rows, columns, float32 values
                seq_sent, count, columns = struct.unpack_from("<QII", message.data)
                values = np.frombuffer(message.data, "<f4", offset=16).reshape(count, columns)
                frame = {"seq": seq_sent, "rows": values.tolist(), "binary": True}
            else:
                frame = json.loads(message.data)
            self.frames.append(frame)
            if "finish" in frame:
                await ws.send_json({"session": {"seq": seq}, "result": {}})
            elif frame["seq"] != seq + 1:
                await ws.send_json({"event": "error", "data": {"expected_seq": seq + 1}, "status": 409})
            else:
                seq += 1
                self.in_flight += (seq == 1) - (seq == 3)
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                await ws.send_json({"session": {"seq": seq, "segments": seq}, "replayed": False,
                                    "result": {"forecast": [[float(seq)]]}})
        return ws

    def close(self):
        import asyncio

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.mark.parametrize("transport", ["rtserve-ws", "rtserve-ws-binary"])
def test_the_session_stream_sends_piece_frames_in_order_and_finishes_or_says_it_is_not_served(transport):
    from loadtest.closed_loop import ClientPool

    pieces = [[json.dumps({"seq": k, "rows": [[1.5, -2.0]]}).encode() for k in (1, 2, 3)] for _ in range(3)]
    pool = ClientPool(2)
    served, missing = FakeSessionStream(with_stream=True), FakeSessionStream(with_stream=False)
    try:
        run = pool.run(Target(transport, served.url, "m:1"), pieces, lambda: 0.0, keep_answers=True)
        assert run.unavailable is None and run.errors == [] and run.pieces == 9 and run.processes == 2
        assert [frame for frame in served.frames if "finish" in frame] == [{"finish": {}}] * 3
        binary = transport == "rtserve-ws-binary"
        assert sorted(frame["seq"] for frame in served.frames if "seq" in frame) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
        assert all(frame["rows"] == [[1.5, -2.0]] and frame.get("binary", False) is binary
                   for frame in served.frames if "seq" in frame)
        assert [answer["session"]["seq"] for answer in run.answers] == [3, 3, 3] and len(served.deleted) == 3
        run = pool.run(Target(transport, missing.url, "m:1"), pieces, lambda: 0.0)
        assert run.unavailable.startswith("not served by this rtserve (HTTP 404") and run.pieces == 0
        assert len(missing.deleted) == 3  # the sessions it opened are deleted all the same
    finally:
        pool.close()
        served.close()
        missing.close()


def test_a_run_of_more_sessions_than_its_concurrency_keeps_that_many_in_flight_and_answers_every_piece():
    from loadtest.closed_loop import ClientPool

    pieces = [[json.dumps({"seq": k, "rows": [[1.0]]}).encode() for k in (1, 2, 3)] for _ in range(12)]
    pool = ClientPool(2)
    served = FakeSessionStream(with_stream=True)
    try:
        run = pool.run(Target("rtserve-ws", served.url, "m:1"), pieces, lambda: 0.0, keep_answers=True,
                       concurrency=3)
        assert run.errors == [] and run.pieces == 36 and run.sessions == 3 and run.processes == 2
        assert [answer["session"]["seq"] for answer in run.answers] == [3] * 12 and len(served.deleted) == 12
        assert 1 <= served.most_in_flight <= 3
    finally:
        pool.close()
        served.close()
