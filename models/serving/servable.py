"""What export and the eager backend see of a trained model: named step graphs.

A ``Servable`` is a trained model cut into the graphs the service runs, each a
module whose ``forward`` takes and returns positional tensors with the names,
dtypes and shapes of its ``TensorSpec``s (axis 0 is always the batch). State
tensors are plain inputs and outputs, so sessions can be stacked into one
batch and stored between steps. Graph inputs named in ``state_outputs`` are
state: the step returns their next value under the mapped output name.

``build_servable(folder)`` calls the adapter of the checkpoint's family (its record in :mod:`models.families`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from models.checkpoint import load_checkpoint
from models.families import family
from models.segment import TensorSpec


@dataclass
class Graph:
    name: str  # "step", "encode_window", "decode_step" ...
    module: nn.Module  # forward(*inputs) -> tuple of outputs, in spec order
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    sample_inputs: Callable[[int, torch.Generator], tuple[torch.Tensor, ...]]  # fresh random inputs, batch b
    state_outputs: dict[str, str] = field(default_factory=dict)  # state input name -> its next-value output
    onnx_exporter: str = "dynamo"  # "dynamo" (torch.export) or "torchscript" (the tracing exporter)
    # symbolic axis -> the bool input marking each row's own positions on it: rows whose extents differ
    # may share a batch, zero-padded at the end of that axis (autoregressive decode graphs)
    axis_masks: dict[str, str] = field(default_factory=dict)
    # whether a call on the sample inputs costs what a served call costs, so that the export may time the graph
    # to choose its CPU threads (export/exporter.py light_graph_threads); False where a symbolic axis is served
    # far longer than sampled
    sized_like_served: bool = True
    # inputs of b rows shaped as a typical served call's (a full segment, where the sample's length is random), for
    # the export's timing of cost per row by batch size (export/exporter.py cpu_batch_cap); None: the sample inputs
    served_inputs: Callable[[int, torch.Generator], tuple[torch.Tensor, ...]] | None = None

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """Symbolic axes of every input and output, as ``torch.onnx.export`` wants them."""
        return {
            spec.name: {axis: size for axis, size in enumerate(spec.shape) if isinstance(size, str)}
            for spec in [*self.inputs, *self.outputs]
        }


@dataclass
class Servable:
    name: str  # model name in the repository, e.g. "rsa-etth1-h24"
    task: str  # "forecast" | "classify" | "summarize"
    family: str
    graphs: list[Graph]
    state_spec: list[TensorSpec]
    settings: dict[str, Any]  # serving settings: segment length, look-back, labels, variables ...
    assets: dict[str, Path] = field(default_factory=dict)  # files copied into the entry (tokenizer.json)
    tensor_assets: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # key -> assets/<key>.safetensors
    initial_state: dict[str, torch.Tensor] = field(default_factory=dict)  # init_state(1); zeros where absent

    def init_state(self) -> dict[str, torch.Tensor]:
        """``init_state(1)``: the learned initial values where the model has them, zeros elsewhere."""
        state = {}
        for spec in self.state_spec:
            if spec.name in self.initial_state:
                state[spec.name] = self.initial_state[spec.name]
            else:
                shape = [1 if axis == "batch" else (0 if isinstance(axis, str) else axis) for axis in spec.shape]
                state[spec.name] = torch.zeros(shape, dtype=getattr(torch, spec.dtype))
        return state

    def graph(self, name: str) -> Graph:
        for graph in self.graphs:
            if graph.name == name:
                return graph
        raise KeyError(f"{self.name} has no graph {name!r}; it has {[g.name for g in self.graphs]}")


def build_servable(folder: str | Path, name: str | None = None) -> Servable:
    """The servable of a checkpoint folder, its modules in eval mode."""
    checkpoint = load_checkpoint(folder)
    servable: Servable = family(checkpoint.family).part("adapter")(checkpoint)
    servable.name = name or checkpoint.extras.get("name") or Path(folder).resolve().name
    for graph in servable.graphs:
        graph.module.eval()
    return servable
