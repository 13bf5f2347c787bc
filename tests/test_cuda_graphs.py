"""Captured CUDA graphs on a GPU host (skipped elsewhere, saying so): every family's step graphs replayed per batch
bucket answer as the eager step on the same device, in fp32 and fp16, and the backend loads them captured."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models.serving.servable import build_servable
from service.runtime.backends import TorchBackend, load_backends
from service.runtime.step_modes import RECORD, write_record
from tests.test_precision import FAMILIES

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}  # of each output's largest magnitude: replay against eager, one device


@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("family", ["rsa", "rmt", "srformer"])
def test_captured_graphs_answer_as_the_eager_step_on_the_gpu(family, precision, tmp_path):
    servable = build_servable(FAMILIES[family](tmp_path))
    generator = torch.Generator().manual_seed(0)
    for graph in servable.graphs:
        if graph.name == "decode_step":
            continue
        spec = {"name": graph.name, "inputs": [s.as_dict() for s in graph.inputs],
                "outputs": [s.as_dict() for s in graph.outputs]}
        eager = TorchBackend(graph.module, spec, "cuda:0", precision)
        graphed = TorchBackend(graph.module, spec, "cuda:0", precision, mode="graphs", largest_batch=16)
        graphed.warm(lambda rows, graph=graph: graph.sample_inputs(rows, generator))
        assert graphed.graphs is not None and graphed.graphs.failure is None, graphed.graphs.failure
        for rows in (1, 3, 16, 5, 20):  # 20: above the largest bucket, eagerly
            inputs = {s.name: t.numpy() for s, t in zip(graph.inputs, graph.sample_inputs(rows, generator),
                                                          strict=True)}
            want, got = eager.run(inputs), graphed.run(inputs)
            for name, reference in want.items():
                if np.issubdtype(reference.dtype, np.floating):
                    scale = max(float(np.abs(reference).max()), 1e-6)
                    worst = float(np.abs(got[name] - reference).max()) / scale
                    assert worst <= TOLERANCE[precision], f"{family}.{graph.name}.{name} at {rows}: {worst:.3g}"
                else:
                    np.testing.assert_array_equal(got[name], reference)
        assert graphed.graphs.replays >= 4


@needs_cuda
def test_the_torch_backend_loads_the_measured_mode_and_captures_at_load(tiny_models):
    entry = tiny_models.entry("rsa-tiny", formats=())
    manifest = json.loads((entry / "manifest.json").read_text())
    write_record(entry, torch.cuda.get_device_name(0), torch.__version__,
                 {"step": {"eager": {"1": 1.0}, "graphs": {"1": 2.0}}})
    try:
        (backend,) = load_backends(entry, manifest, "torch", device="cuda:0", max_batch_size=8).values()
        assert backend.mode == "graphs" and "CUDA graphs" in backend.providers  # type: ignore[attr-defined]
        assert backend.graphs.shapes() == 1  # type: ignore[attr-defined]  # every bucket of the sample's shape
    finally:
        (entry / RECORD).unlink()


@needs_cuda
@pytest.mark.parametrize("mode", ["eager", "graphs"])
def test_a_kept_state_on_the_gpu_steps_as_the_host_copy_would(mode, tmp_path):
    from service.runtime.backends import device_states_on
    from service.runtime.device_states import STATE_HANDLE

    servable = build_servable(FAMILIES["rsa"](tmp_path))
    graph = servable.graph("step")
    spec = {"name": "step", "inputs": [s.as_dict() for s in graph.inputs],
            "outputs": [s.as_dict() for s in graph.outputs], "state_outputs": graph.state_outputs}
    states = device_states_on("cuda:0", 2**24)
    assert states is not None and device_states_on("cpu", 2**24) is None
    kept = TorchBackend(graph.module, spec, "cuda:0", mode=mode, largest_batch=8, device_states=states)
    plain = TorchBackend(graph.module, spec, "cuda:0")
    generator = torch.Generator().manual_seed(0)

    def sample(rows):
        return {s.name: t.numpy() for s, t in zip(graph.inputs, graph.sample_inputs(rows, generator), strict=True)}

    out = kept.run(sample(5) | {STATE_HANDLE: np.zeros(5, np.int64)})
    piece = sample(5)
    reference = plain.run(piece | {"window": out["next_window"], "rows_seen": out["next_rows_seen"]})
    reused_before = states.reused_rows
    again = kept.run(piece | {"window": np.zeros_like(out["next_window"]), "rows_seen": out["next_rows_seen"],
                              STATE_HANDLE: out[STATE_HANDLE]})
    assert states.reused_rows == reused_before + 5
    for name, want in reference.items():
        np.testing.assert_allclose(again[name], want, rtol=1e-5, atol=1e-5)
