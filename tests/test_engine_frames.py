"""A front end's steps cross to the engine a batch per frame: the steps of one turn of the front end's loop leave as
one frame per graph and shape, at most the graph's largest batch, and every caller gets its own rows back."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from loadtest.fake_engine import FakeRegistry
from service.runtime.batcher import DynamicBatcher
from service.runtime.engine import Engine
from service.runtime.engine_client import EngineClient, RemoteGraph
from service.runtime.engine_wire import EngineUnavailable


class Doubling:
    """A backend that doubles ``x`` and records each batch's rows."""

    name, device, precision, providers = "fake", "cpu", "fp32", ["Fake"]

    def __init__(self) -> None:
        self.batches: list[int] = []

    def run(self, inputs: dict[str, np.ndarray], keep: Any = ()) -> dict[str, np.ndarray]:
        self.batches.append(inputs["x"].shape[0])
        if np.isnan(inputs["x"]).any():
            raise ValueError("a NaN row")
        return {"y": inputs["x"] * 2}

    def drop_kept(self) -> None:
        pass


@pytest.fixture
async def remote(tmp_path):
    backend = Doubling()
    batcher = DynamicBatcher(backend, "fake:1", "step", 8, 0.0)
    engine = Engine(FakeRegistry.over(batcher))
    server = await engine.serve(tmp_path / "engine.sock")
    client = EngineClient(tmp_path / "engine.sock")
    await client.connect(timeout=10)
    try:
        yield RemoteGraph(client, "fake:1", "step", 8), backend, client, engine
    finally:
        server.close()
        await client.close()
        await batcher.close()


def rows(count: int, width: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng()
    return [rng.standard_normal((1, width)).astype(np.float32) for _ in range(count)]


async def test_the_steps_of_one_turn_leave_as_one_frame_and_each_caller_gets_its_rows(remote):
    graph, backend, client, _ = remote
    xs = rows(6)
    answers = await asyncio.gather(*(graph.submit({"x": x}) for x in xs))
    assert client.steps.frames_sent == 1 and client.steps.steps_sent == 6 and backend.batches == [6]
    for x, answer in zip(xs, answers, strict=True):
        np.testing.assert_array_equal(answer["y"], x * 2)
        assert answer["y"].base is None or answer["y"].base.nbytes == answer["y"].nbytes  # its own rows, not a view
    # a step of several rows is one caller: it gets its rows whole
    block = np.random.default_rng().standard_normal((3, 3)).astype(np.float32)
    np.testing.assert_array_equal((await graph.submit({"x": block}))["y"], block * 2)


async def test_a_frame_holds_at_most_the_largest_batch_and_one_shape(remote):
    graph, backend, client, _ = remote
    narrow, wide = rows(11), rows(2, width=5)
    answers = await asyncio.gather(*(graph.submit({"x": x}) for x in narrow + wide))
    assert client.steps.frames_sent == 3 and sorted(backend.batches) == [2, 3, 8]
    for x, answer in zip(narrow + wide, answers, strict=True):
        np.testing.assert_array_equal(answer["y"], x * 2)


async def test_a_failed_frame_fails_its_callers_and_a_caller_that_left_is_not_sent(remote):
    graph, backend, client, engine = remote
    bad = np.full((1, 3), np.nan, np.float32)
    results = await asyncio.gather(graph.submit({"x": bad}), graph.submit({"x": rows(1)[0]}), return_exceptions=True)
    assert all(isinstance(r, ValueError) and "NaN" in str(r) for r in results)  # one batch: its error for all
    left = asyncio.ensure_future(graph.submit({"x": rows(1)[0]}))
    left.cancel()
    stays = rows(1)[0]
    answer = await graph.submit({"x": stays})
    with pytest.raises(asyncio.CancelledError):
        await left
    np.testing.assert_array_equal(answer["y"], stays * 2)
    assert backend.batches[-1] == 1 and engine.rows_in_flight == 0


async def test_steps_waiting_for_their_frame_fail_as_unavailable_when_the_engine_is_gone(remote):
    graph, _, client, _ = remote
    pending = asyncio.ensure_future(graph.submit({"x": rows(1)[0]}))
    await client.close()
    with pytest.raises(EngineUnavailable):
        await pending


async def test_the_engine_splits_a_frame_larger_than_the_batch(remote):
    """A frame is never larger than the graph's batch from this client; an older or foreign one still is served in
    batches of at most that many rows."""
    _, backend, client, _ = remote
    block = np.random.default_rng().standard_normal((19, 3)).astype(np.float32)
    answer = await client.call({"kind": "step", "model": "fake:1", "graph": "step"}, {"x": block})
    np.testing.assert_array_equal(answer["y"], block * 2)
    assert max(backend.batches) <= 8 and sum(backend.batches) == 19
