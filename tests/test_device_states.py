"""Session states kept where their step left them: the table's handles and bound, the torch backend reusing a kept
state instead of the host copy (on the CPU the "device" is the host, which is what these tests can show), and handles
crossing the engine's wire with the rows they belong to. On a GPU host: benchmarks/gpu_run.sh."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from loadtest.fake_engine import FakeRegistry
from models.serving.servable import build_servable
from service.runtime.backends import TorchBackend
from service.runtime.batcher import DynamicBatcher
from service.runtime.device_states import STATE_HANDLE, DeviceStates
from service.runtime.engine import Engine
from service.runtime.engine_client import EngineClient, RemoteGraph
from tests.test_precision import FAMILIES


def test_a_cohort_comes_back_whole_others_are_gathered_and_the_bound_drops_the_oldest():
    states = DeviceStates(max_bytes=3 * 4 * 8 * 4)  # three batches of 4 rows of 8 float32
    first, second = torch.randn(4, 8), torch.randn(4, 8)
    a, b = states.keep({"s": first}, 4), states.keep({"s": second}, 4)
    assert (a != 0).all() and len(set(a) | set(b)) == 8 and states.nbytes == 2 * 4 * 8 * 4
    whole = states.stacked(a, ["s"])
    assert whole is not None and torch.equal(whole["s"], first)
    mixed = states.stacked(np.array([b[2], a[0], a[3]]), ["s"])
    assert mixed is not None and torch.equal(mixed["s"], torch.stack([second[2], first[0], first[3]]))
    some = states.stacked(np.array([a[1], a[2]]), ["s"])
    assert some is not None and torch.equal(some["s"], first[1:3])
    assert states.stacked(np.array([a[0], 12345]), ["s"]) is None  # one row not kept: the host arrays for all
    states.keep({"s": torch.randn(4, 8)}, 4)
    states.keep({"s": torch.randn(4, 8)}, 4)  # over the bound: the least recently used go, a batch freed whole
    assert states.nbytes <= states.max_bytes and states.dropped > 0
    states.forget(np.concatenate([a, b]))
    assert states.nbytes <= 2 * 4 * 8 * 4
    assert (DeviceStates(max_bytes=16).keep({"s": torch.randn(4, 8)}, 4) == 0).all()  # larger than the bound


@pytest.fixture
def rsa_step(tmp_path):
    servable = build_servable(FAMILIES["rsa"](tmp_path))
    graph = servable.graph("step")
    spec = {"name": "step", "inputs": [s.as_dict() for s in graph.inputs],
            "outputs": [s.as_dict() for s in graph.outputs], "state_outputs": graph.state_outputs}
    return graph, spec


def sample(graph, rows, seed):
    generator = torch.Generator().manual_seed(seed)
    return {s.name: t.numpy() for s, t in zip(graph.inputs, graph.sample_inputs(rows, generator), strict=True)}


def test_a_kept_state_is_stepped_from_where_it_lies_and_an_unknown_handle_from_the_host(rsa_step):
    graph, spec = rsa_step
    states = DeviceStates(2**20)
    kept = TorchBackend(graph.module, spec, device_states=states)
    plain = TorchBackend(graph.module, spec)
    first = sample(graph, 3, 0) | {STATE_HANDLE: np.zeros(3, np.int64)}
    out = kept.run(first)
    handles = out[STATE_HANDLE]
    assert handles.shape == (3,) and (handles != 0).all() and states.copied_rows == 3  # "none": from the host
    following = sample(graph, 3, 1)
    host_state = {"window": out["next_window"], "rows_seen": out["next_rows_seen"]}
    reference = plain.run(following | host_state)
    # the host state passed beside live handles is not read: the kept one is (garbage here, to show which was used)
    garbage = {"window": np.full_like(out["next_window"], 1e6), "rows_seen": np.zeros_like(out["next_rows_seen"])}
    again = kept.run(following | garbage | {STATE_HANDLE: handles})
    for name, want in reference.items():
        np.testing.assert_allclose(again[name], want, rtol=1e-6, atol=1e-6)
    assert states.reused_rows == 3 and not set(handles) & set(again[STATE_HANDLE])
    # the old handles were dropped with their step: passed again, the host state is read
    stale = kept.run(following | host_state | {STATE_HANDLE: handles})
    for name, want in reference.items():
        np.testing.assert_allclose(stale[name], want, rtol=1e-6, atol=1e-6)
    assert states.copied_rows == 6
    # a backend without a table answers every row "not kept"
    assert (plain.run(following | host_state | {STATE_HANDLE: handles})[STATE_HANDLE] == 0).all()


async def test_handles_cross_the_engine_with_their_rows(rsa_step, tmp_path):
    graph, spec = rsa_step
    states = DeviceStates(2**20)
    batcher = DynamicBatcher(TorchBackend(graph.module, spec, device_states=states), "rsa:1", "step", 8, 0.0)
    server = await Engine(FakeRegistry.over(batcher)).serve(tmp_path / "engine.sock")
    client = EngineClient(tmp_path / "engine.sock")
    await client.connect(timeout=10)
    remote = RemoteGraph(client, "rsa:1", "step", 8)
    plain = TorchBackend(graph.module, spec)
    try:
        sessions = [sample(graph, 1, seed) | {STATE_HANDLE: np.zeros(1, np.int64)} for seed in range(5)]
        answers = await asyncio.gather(*(remote.submit(inputs) for inputs in sessions))
        pieces = [sample(graph, 1, 10 + seed) for seed in range(5)]
        reference = [plain.run(piece | {"window": a["next_window"], "rows_seen": a["next_rows_seen"]})
                     for piece, a in zip(pieces, answers, strict=True)]
        # every session's next piece in reverse order, its kept handle beside a garbage host state
        nexts = await asyncio.gather(*(remote.submit(piece | {"window": np.zeros_like(a["next_window"]),
                                                              "rows_seen": a["next_rows_seen"],
                                                              STATE_HANDLE: a[STATE_HANDLE]})
                                       for piece, a in reversed(list(zip(pieces, answers, strict=True)))))
        for got, want in zip(reversed(nexts), reference, strict=True):
            np.testing.assert_allclose(got["forecast"], want["forecast"], rtol=1e-6, atol=1e-6)
        assert states.reused_rows == 5
    finally:
        server.close()
        await client.close()
        await batcher.close()
