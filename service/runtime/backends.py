"""Backends: one interface over ONNX Runtime, TorchScript and eager PyTorch.

A backend runs one graph of a model-repository entry: named numpy arrays in,
named numpy arrays out, names and dtypes from the entry's manifest. torch is
imported only by the TorchScript and eager backends, so an ONNX-only service
never loads it on the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

BACKENDS = ("onnx", "torchscript", "torch")


class Backend(Protocol):
    name: str
    providers: list[str]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


def onnx_session(path: str | Path, intra_op_threads: int = 0) -> Any:
    """An ONNX Runtime session with full graph optimization; CUDA first when the GPU build sees a GPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = intra_op_threads
    providers = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    return ort.InferenceSession(str(path), sess_options=options, providers=providers)


def _coerce(inputs: Mapping[str, np.ndarray], specs: list[dict[str, Any]]) -> list[np.ndarray]:
    """Inputs in manifest order and dtype; a missing name is a programming error worth a clear message."""
    arrays = []
    for spec in specs:
        if spec["name"] not in inputs:
            raise KeyError(f"graph input {spec['name']!r} missing; got {sorted(inputs)}")
        arrays.append(np.ascontiguousarray(inputs[spec["name"]], dtype=np.dtype(spec["dtype"])))
    return arrays


class OnnxBackend:
    name = "onnx"

    def __init__(self, path: Path, graph: Mapping[str, Any], intra_op_threads: int = 0) -> None:
        self.session = onnx_session(path, intra_op_threads)
        self.providers = list(self.session.get_providers())
        # the exporter drops inputs a graph never reads (e.g. the RAF state of a full-attention
        # SRformer): feed only what the session takes
        taken = {node.name for node in self.session.get_inputs()}
        self.input_specs = [spec for spec in graph["inputs"] if spec["name"] in taken]
        self.output_names = [spec["name"] for spec in graph["outputs"]]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = _coerce(inputs, self.input_specs)
        feed = {spec["name"]: array for spec, array in zip(self.input_specs, arrays, strict=True)}
        outputs = self.session.run(self.output_names, feed)
        return dict(zip(self.output_names, outputs, strict=True))


class _TorchModuleBackend:
    """Shared by TorchScript and eager: positional tensors in, tuple of tensors out."""

    name = "torch"

    def __init__(self, module: Any, graph: Mapping[str, Any]) -> None:
        self.module = module
        self.providers = ["CPU"]
        self.input_specs = list(graph["inputs"])
        self.output_names = [spec["name"] for spec in graph["outputs"]]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        tensors = [torch.from_numpy(array) for array in _coerce(inputs, self.input_specs)]
        with torch.inference_mode():
            outputs = self.module(*tensors)
        return {name: tensor.numpy() for name, tensor in zip(self.output_names, outputs, strict=True)}


class TorchScriptBackend(_TorchModuleBackend):
    name = "torchscript"

    def __init__(self, path: Path, graph: Mapping[str, Any]) -> None:
        import warnings

        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript; still loads
            module = torch.jit.load(str(path), map_location="cpu").eval()
        super().__init__(module, graph)


class TorchBackend(_TorchModuleBackend):
    """Eager PyTorch, rebuilt from the entry's ``checkpoint/`` with the ``models`` code."""

    name = "torch"


def load_backends(
    entry: Path, manifest: Mapping[str, Any], backend: str, intra_op_threads: int = 0
) -> dict[str, Backend]:
    """One backend per graph of the entry; ``intra_op_threads`` > 0 caps each graph's CPU threads."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {BACKENDS}")
    if backend != "onnx" and intra_op_threads > 0:
        import torch

        torch.set_num_threads(intra_op_threads)  # process-wide for torch
    if backend == "torch":
        from models.servable import build_servable

        servable = build_servable(entry / "checkpoint", name=manifest["name"])
        return {g["name"]: TorchBackend(servable.graph(g["name"]).module, g) for g in manifest["graphs"]}
    loaded: dict[str, Backend] = {}
    for graph in manifest["graphs"]:
        file_name = graph["files"].get(backend)
        if file_name is None:
            raise FileNotFoundError(f"{entry} has no {backend} export of graph {graph['name']!r}")
        if backend == "onnx":
            loaded[graph["name"]] = OnnxBackend(entry / file_name, graph, intra_op_threads)
        else:
            loaded[graph["name"]] = TorchScriptBackend(entry / file_name, graph)
    return loaded
