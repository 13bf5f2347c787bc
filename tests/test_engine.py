"""Front ends over one engine: the wire, every task read through it, and batches shared across processes."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import orjson
import pytest

from service import result_json
from service.metrics import ServiceMetrics
from service.runtime.engine import Engine
from service.runtime.engine_client import EngineClient
from service.runtime.engine_wire import EngineUnavailable, error_from, error_header, pack, unpack
from service.runtime.pipeline import InputError, run_whole
from service.runtime.registry import ModelRegistry
from service.settings import Settings
from tests.tiny_checkpoints import VARIABLES

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "benchmarks"))
from engine_scaling import measure  # noqa: E402


def test_arrays_cross_the_wire_as_they_are_and_objects_do_not():
    rng = np.random.default_rng()
    arrays = {"f32": rng.standard_normal((2, 3, 4)).astype(np.float32), "i64": rng.integers(0, 9, (2, 5)),
              "bool": rng.random(3) > 0.5, "f16": rng.standard_normal(4).astype(np.float16),
              "scalar": np.array(7, dtype=np.int64), "empty": np.zeros((0, 4), np.float32),
              "strided": rng.standard_normal((4, 6))[:, ::2]}
    frame = pack({"kind": "step", "id": 3}, arrays)
    head, body = int.from_bytes(frame[:4], "little"), int.from_bytes(frame[4:8], "little")
    header = orjson.loads(frame[8 : 8 + head])
    back = unpack(header["arrays"], bytearray(frame[8 + head : 8 + head + body]))
    assert list(back) == list(arrays) and header["id"] == 3
    for name, array in arrays.items():
        assert back[name].dtype == array.dtype and back[name].shape == array.shape
        np.testing.assert_array_equal(back[name], array)
    back["f32"][0, 0, 0] = 1.0  # writable: a pipeline may fold into what it got back
    with pytest.raises(TypeError, match="Python objects"):
        pack({}, {"text": np.array(["a"], dtype=object)})


def test_errors_cross_as_their_kind_an_input_error_with_its_field():
    error = error_from(error_header(InputError("rows[0][1] is too large", loc=("body", "rows", 0, 1), kind="range")))
    assert isinstance(error, InputError) and error.loc == ["body", "rows", 0, 1] and error.kind == "range"
    assert isinstance(error_from(error_header(ValueError("too many rows"))), ValueError)
    other = error_from(error_header(EngineUnavailable("x")))
    assert type(other) is RuntimeError and "EngineUnavailable" in str(other)


async def test_every_task_reads_the_same_through_the_engine_as_in_process(every_task_repository, tmp_path):
    settings = Settings(model_repository=every_task_repository, intra_op_threads=1, redis_url="redis://unused")
    local = ModelRegistry(settings, ServiceMetrics(collect_gpu=False))
    engine_side = ModelRegistry(settings, ServiceMetrics(collect_gpu=False))
    await local.load_all()
    await engine_side.load_all()
    socket_path = tmp_path / "engine.sock"
    server = await Engine(engine_side).serve(socket_path)
    client = EngineClient(socket_path)
    await client.connect(timeout=10)
    front = ModelRegistry(settings, ServiceMetrics(collect_gpu=False), client)
    await front.load_all()
    try:
        assert sorted(front.models) == sorted(local.models) and not front.errors
        assert front.describe()[0]["providers"] == local.describe()[0]["providers"]
        rng = np.random.default_rng()
        rows = (rng.standard_normal((40, len(VARIABLES))) * 3 + 10).tolist()
        words = ["markets", "rose", "the", "bank", "said", "on", "Monday", "shares"]
        text = " ".join(" ".join(rng.choice(words, 9)).capitalize() + "." for _ in range(30))  # sentences
        for task, piece, options in (("forecast", rows, None), ("classify", text, None),
                                     ("summarize", text, {"max_length": 12}),
                                     ("summarize", text, {"max_length": 12, "beam_size": 2})):
            alone = await run_whole(local.resolve(None, task), piece, options=options)
            remote = await run_whole(front.resolve(None, task), piece, options=options)
            for theirs, ours in ((remote[0].result, alone[0].result), (remote[1].result, alone[1].result)):
                assert result_json.dumps(theirs) == result_json.dumps(ours), task
            assert task != "summarize" or alone[1].result["summary"], "an empty summary would show nothing"
            for name, array in alone[0].state.items():
                np.testing.assert_array_equal(remote[0].state[name], array)
        # a streamed greedy summary arrives token by token through the engine, and equals the whole one
        _, streamed = await run_whole(front.resolve(None, "summarize"), text, stream=True,
                                      options={"max_length": 12})
        assert streamed.tokens is not None
        pieces = [token async for token in streamed.tokens]
        _, whole = await run_whole(local.resolve(None, "summarize"), text, options={"max_length": 12})
        assert "".join(pieces).strip() == whole.result["summary"] and len(pieces) >= 1
        # many concurrent pieces of one front end share the engine's batches
        model = front.resolve(None, "forecast")
        await asyncio.gather(*(model.consume(model.new_state(), rows) for _ in range(16)))
        # the engine gone: calls fail as unavailable (a 503), never hang
        server.close()
        await engine_side.close()
        await server.wait_closed()
        await client.close()
        with pytest.raises(EngineUnavailable):
            await model.consume(model.new_state(), rows)
    finally:
        server.close()
        await client.close()
        await local.close()
        await engine_side.close()


@pytest.mark.parametrize("whole_batches_on_loop", [True, False])
async def test_the_engines_lone_light_step_runs_on_its_event_loop_and_concurrent_ones_share_batches(
        forecast_repository, tmp_path, whole_batches_on_loop):
    """The tiny forecaster's step is light: when it is the engine's only call in flight it runs on the engine's event
    loop, as a lone request's does in one process (no hop to the worker's thread and back); many calls in flight share
    batches, which run on the loop too when they hold every row in flight (RTSERVE_LIGHT_BATCHES_ON_LOOP), else on the
    worker's thread."""
    import threading

    settings = Settings(model_repository=forecast_repository[0], redis_url="redis://unused",
                        light_batches_on_loop=whole_batches_on_loop)
    engine_side = ModelRegistry(settings, ServiceMetrics(collect_gpu=False),
                                in_flight=lambda: engine.rows_in_flight)
    engine = Engine(engine_side)
    await engine_side.load_all()
    server = await engine.serve(tmp_path / "engine.sock")
    client = EngineClient(tmp_path / "engine.sock")
    await client.connect(timeout=10)
    front = ModelRegistry(settings, ServiceMetrics(collect_gpu=False), client)
    await front.load_all()
    try:
        batcher = engine_side.models["rsa-tiny:1"].batchers["step"]
        assert engine_side.models["rsa-tiny:1"].manifest["graphs"][0]["intra_op_threads"] == 1
        threads: list[threading.Thread] = []
        rows_per_batch: list[int] = []
        run = batcher.backend.run

        def recording_run(inputs, keep=()):
            threads.append(threading.current_thread())
            rows_per_batch.append(next(iter(inputs.values())).shape[0])
            return run(inputs, keep)

        batcher.backend.run = recording_run
        model = front.resolve(None, "forecast")
        rows = (np.random.default_rng().standard_normal((40, len(VARIABLES))) * 3 + 10).tolist()
        await model.consume(model.new_state(), rows)
        assert threads == [threading.current_thread()]  # the engine's loop: this test's
        threads.clear(), rows_per_batch.clear()
        await asyncio.gather(*(model.consume(model.new_state(), rows) for _ in range(16)))
        assert sum(rows_per_batch) == 16 and max(rows_per_batch) > 1, rows_per_batch
        on_loop = [thread is threading.current_thread() for thread in threads]
        assert all(on_loop) if whole_batches_on_loop else not any(on_loop[rows_per_batch.index(16):]), on_loop
        assert engine.calls_in_flight == 0
    finally:
        server.close()
        await client.close()
        await front.close()
        await engine_side.close()


@pytest.mark.slow
def test_rows_of_two_front_ends_share_the_engines_batches():
    """Each front end's rows carry its number; the fake device sees which front ends each batch mixes, and every
    answer goes back to the front end that asked (checked in the front ends)."""
    one = measure(1, sessions=8, piece_ms=1, cost="held", device_ms=20, max_batch=6, seconds=3)
    assert one["mixed_batches"] == 0, one
    # A batch holds six rows and each front end has eight in flight: a batch leaves two of one front end's rows
    # queued, and the next batch takes them with the other's, so an engine that batched each front end apart
    # would fail here. (With a batch that holds all of one front end's rows, two closed loops with equal pieces
    # can lock in phase and alternate whole batches: seen with 12 and 32 rows a batch, 0 % mixed in every run.)
    runs = []
    for _ in range(4):
        two = measure(2, sessions=8, piece_ms=1, cost="held", device_ms=20, max_batch=6, seconds=3)
        runs.append(two)
        assert two["mean_batch_size"] >= one["mean_batch_size"] - 0.5, (one, two)
        if two["mixed_batches"] > 0.2:
            break
    assert runs[-1]["mixed_batches"] > 0.2, runs


@pytest.mark.slow
def test_pieces_per_second_rise_with_front_ends_until_the_fake_device_saturates():
    """Front ends as if each had a core (each piece holds its loop 4 ms): a fast device serves twice the pieces for
    twice the front ends. A device that takes 40 ms a batch of at most 4 rows (100 rows/s) is the limit for both."""
    front_bound = [measure(n, sessions=16, piece_ms=4, cost="held", device_ms=2, max_batch=32, seconds=3)
                   for n in (1, 2)]
    assert front_bound[1]["pieces_per_second"] > 1.5 * front_bound[0]["pieces_per_second"], front_bound
    device_bound = [measure(n, sessions=16, piece_ms=0.5, cost="held", device_ms=40, max_batch=4, seconds=3)
                    for n in (1, 2)]
    capacity = 4 / 0.040
    assert all(run["pieces_per_second"] <= 1.1 * capacity for run in device_bound), device_bound
    assert device_bound[1]["pieces_per_second"] < 1.25 * device_bound[0]["pieces_per_second"], device_bound
    assert device_bound[0]["mean_batch_size"] > 3, device_bound  # the device full at one front end already


async def test_a_front_end_stops_waiting_for_the_engine_once_its_parent_is_gone(tmp_path, monkeypatch):
    """A front end still starting when its parent died waits for no engine: the engine died with the parent."""
    import multiprocessing
    import time

    class Gone:
        @staticmethod
        def is_alive() -> bool:
            return False

    monkeypatch.setattr(multiprocessing, "parent_process", lambda: Gone())
    started = time.monotonic()
    with pytest.raises(EngineUnavailable, match="parent process is gone"):
        await EngineClient(tmp_path / "engine.sock").connect(timeout=600)
    assert time.monotonic() - started < 5
