"""The CUDA paths, where a GPU is visible: graphs on the GPU against the CPU, and the service serving from it.

Skipped where torch or ONNX Runtime sees no GPU (the CI machines), each test naming what it lacks; ``make
test`` on a GPU host runs them (``make ORT=gpu test`` for the ONNX ones). What they check:

- every family's graphs through the eager torch backend on ``cuda:0`` in fp32, fp16 and bf16 against the same
  graphs in fp32 on the CPU (the tolerances of ``tests/test_precision.py``; fp32 on another device: 1e-4 of the
  output's largest magnitude);
- each task's tiny ONNX export through ONNX Runtime's CUDA provider, with IO binding, against the CPU provider;
- the service with ``RTSERVE_DEVICE=cuda``: ``/models`` names the GPU and its providers, a one-shot answer
  equals the CPU service's within the fp32 bound, a session streamed piece by piece ends where the one-shot
  answer does, and the GPU's energy is charged to the model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models.serving.servable import build_servable
from service import devices
from service.runtime.backends import OnnxBackend, TorchBackend, load_backends
from tests.service_helpers import make_client
from tests.test_precision import FAMILIES, TOLERANCE, assert_close

TORCH_CUDA = torch.cuda.is_available()
ONNX_CUDA = devices.cuda_device_count("onnx")[0] > 0
needs_torch_cuda = pytest.mark.skipif(not TORCH_CUDA, reason="torch sees no CUDA device")
needs_onnx_cuda = pytest.mark.skipif(
    not ONNX_CUDA, reason="ONNX Runtime has no CUDA provider or device here (a GPU host: make ORT=gpu test)")
ON_ANOTHER_DEVICE = TOLERANCE["fp32"]  # fp32 on the GPU against fp32 on the CPU, of the largest magnitude
ROWS = [[float((i * 7 + j) % 11) - 5.0 for j in range(7)] for i in range(40)]
TEXT = ("The senate vote on the budget was delayed again on Monday, as the court weighed the border policy "
        "and the election reform that the governor had promised before the tax deadline. ") * 6


@needs_torch_cuda
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_torch_graphs_on_the_gpu_match_the_cpu(family, precision, tmp_path):
    servable = build_servable(FAMILIES[family](tmp_path))
    generator = torch.Generator().manual_seed(0)
    cases = []
    for graph in servable.graphs:  # every CPU fp32 reference first: the graphs of a model share weights
        spec = {"inputs": [s.as_dict() for s in graph.inputs], "outputs": [s.as_dict() for s in graph.outputs]}
        inputs = {s.name: t.numpy() for s, t in zip(graph.inputs, graph.sample_inputs(4, generator), strict=True)}
        cases.append((graph, spec, inputs, TorchBackend(graph.module, spec).run(inputs)))
    for graph, spec, inputs, reference in cases:
        on_gpu = TorchBackend(graph.module, spec, "cuda:0", precision)
        assert next(graph.module.parameters()).device.type == "cuda"
        assert_close(reference, on_gpu.run(inputs), precision, f"{family}.{graph.name} on cuda:0")


@needs_onnx_cuda
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", ["rsa-tiny", "rmt-tiny", "srformer-tiny"])
def test_onnx_graphs_on_the_gpu_match_the_cpu_provider(tiny_models, name, precision):
    entry = tiny_models.entry(name, formats=("onnx",))
    manifest = json.loads((entry / "manifest.json").read_text())
    on_cpu = load_backends(entry, manifest, "onnx")
    on_gpu = load_backends(entry, manifest, "onnx", device="cuda:0", precision=precision)
    servable = build_servable(entry / "checkpoint")
    generator = torch.Generator().manual_seed(0)
    for graph in servable.graphs:
        backend = on_gpu[graph.name]
        assert isinstance(backend, OnnxBackend) and backend.io_binding
        assert backend.providers[0] == "CUDAExecutionProvider"
        inputs = {s.name: t.numpy() for s, t in zip(graph.inputs, graph.sample_inputs(4, generator), strict=True)}
        reference = on_cpu[graph.name].run(inputs)
        assert_close(reference, backend.run(inputs), precision, f"{name}.{graph.name} on cuda:0")
        kept = {input_name for input_name, array in inputs.items() if np.issubdtype(array.dtype, np.floating)}
        assert_close(reference, backend.run(inputs, keep=kept), precision, f"{name}.{graph.name}, kept inputs")
        copied = backend.device_copies.bytes_copied
        assert_close(reference, backend.run(inputs, keep=kept), precision, f"{name}.{graph.name}, kept again")
        assert backend.device_copies.bytes_copied == copied  # on the GPU already: not copied again


def _answers(client) -> dict[str, dict]:
    answers = {"forecast": client.post("/forecast", json={"rows": ROWS}),
               "classify": client.post("/classify", json={"text": TEXT}),
               "summarize": client.post("/summarize", json={"text": TEXT, "max_length": 12})}
    for task, answer in answers.items():
        assert answer.status_code == 200, f"{task}: {answer.text}"
    return {task: answer.json() for task, answer in answers.items()}


def _streamed_forecast(client) -> dict:
    session = client.post("/sessions", json={"task": "forecast"}).json()
    url = f"/sessions/{session['id']}"
    for seq, start in enumerate(range(0, len(ROWS), 9), start=1):
        applied = client.post(f"{url}/segments", json={"seq": seq, "rows": ROWS[start : start + 9]})
        assert applied.status_code == 200, applied.text
    finished = client.post(f"{url}/finish")
    assert finished.status_code == 200, finished.text
    client.delete(url)
    return finished.json()


@needs_onnx_cuda
def test_the_service_serves_every_task_from_the_gpu(every_task_repository, redis_url, key_prefix):
    with make_client(every_task_repository, redis_url, key_prefix, device="cpu") as client:
        on_cpu = _answers(client)
    with make_client(every_task_repository, redis_url, key_prefix, device="cuda") as client:
        models = client.get("/models").json()
        assert {m["device"] for m in models} == {"cuda:0"}, models
        assert all(m["providers"][0] == "CUDAExecutionProvider" for m in models), models
        on_gpu = _answers(client)
        streamed = _streamed_forecast(client)
        metrics = client.get("/metrics").text
    np.testing.assert_allclose(on_gpu["forecast"]["forecast"], on_cpu["forecast"]["forecast"],
                               atol=ON_ANOTHER_DEVICE * np.abs(on_cpu["forecast"]["forecast"]).max())
    assert on_gpu["classify"]["label"] == on_cpu["classify"]["label"]
    for label, p in on_cpu["classify"]["probabilities"].items():
        assert abs(on_gpu["classify"]["probabilities"][label] - p) <= ON_ANOTHER_DEVICE
    assert on_gpu["summarize"]["tokens_read"] == on_cpu["summarize"]["tokens_read"]
    # piece by piece on the GPU ends where the one-shot answer on the GPU does (batches of other sizes may
    # take other kernels: the fp32 bound, not bit equality)
    np.testing.assert_allclose(streamed["forecast"], on_gpu["forecast"]["forecast"],
                               atol=ON_ANOTHER_DEVICE * np.abs(on_gpu["forecast"]["forecast"]).max())
    if "rtserve_gpu_energy_joules_total" in metrics:  # NVML sees the GPU and it has an energy counter
        charged = [line for line in metrics.splitlines() if line.startswith("rtserve_energy_joules_total{")]
        assert charged and all(float(line.rsplit(" ", 1)[1]) >= 0 for line in charged), charged
