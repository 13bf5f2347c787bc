"""A Triton model repository serving rtserve's exported step graphs with the python backend and the sequence
batcher, written from the rtserve model-repository entries (the bench's Triton side).

Per entry and per queue delay, one Triton model ``<entry name>-<delay>ms`` whose version folder holds
:mod:`loadtest.triton.model` as ``model.py``; the entry itself is read in place (``entry`` parameter), so both
servers load the very same ``step.onnx`` and ``initial_state.safetensors``. Each model: one CPU instance,
``max_batch_size`` 32 (rtserve's default), ``sequence_batching`` with the ``oldest`` strategy, the given
``max_queue_delay_microseconds`` (0, or rtserve's own 5 ms), up to 1024 candidate sequences.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODEL_SOURCE = Path(__file__).with_name("model.py")
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # where models/text_stream.py is, for a text model's cutter

TRITON_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "int64": "TYPE_INT64", "int32": "TYPE_INT32",
                "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8"}
JSON_TYPES = {"float32": "FP32", "float16": "FP16", "int64": "INT64", "int32": "INT32", "bool": "BOOL",
              "uint8": "UINT8"}

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: {max_batch}
input [
{inputs}
]
output [
{outputs}
]
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  oldest {{
    max_candidate_sequences: {candidates}
    max_queue_delay_microseconds: {delay_us}
  }}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
}}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters: [
{parameters}
]
"""


@dataclass(frozen=True)
class TritonModel:
    """One Triton model of the repository: which rtserve entry it serves and how its pieces are sent."""

    name: str  # Triton's model name
    entry: Path  # the rtserve model-repository entry (name/version folder)
    delay_ms: float  # the sequence batcher's max_queue_delay
    text: bool  # the piece goes as TEXT (BYTES), cut into segments in Triton; else as the graph's piece tensors
    piece_inputs: tuple[tuple[str, str], ...]  # (name, KServe datatype) of the tensors a piece sends (not text)
    answers: tuple[str, ...]  # the graph's answer outputs (not the state it carries on)


def _dims(shape: Sequence[Any]) -> str:
    """Triton dims of a manifest shape without its batch axis; symbolic axes are -1, a bare batch axis is [1]."""
    dims = [str(axis) if isinstance(axis, int) else "-1" for axis in shape[1:]]
    return ", ".join(dims) if dims else "1"


def _tensor(name: str, dtype: str, dims: str) -> str:
    return f'  {{ name: "{name}" data_type: {dtype} dims: [ {dims} ] }}'


def step_graph(manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    return next(g for g in manifest["graphs"] if g["name"] == "step")


def text_model(manifest: Mapping[str, Any]) -> bool:
    """A model that reads text: the Triton side takes the piece's text and cuts it (rtserve's classify path)."""
    return manifest["task"] == "classify" and "tokenizer" in manifest.get("assets", {})


def write_model(root: Path, entry: Path, manifest: Mapping[str, Any], delay_ms: float, intra_op_threads: int,
                max_batch: int = 32, candidates: int = 1024) -> TritonModel:
    """Write the Triton model serving ``entry`` with this queue delay under ``root``; what the client needs."""
    graph = step_graph(manifest)
    carried = set(graph["state_outputs"].values())
    pieces = [i for i in graph["inputs"] if i["name"] not in graph["state_outputs"]]
    answers = [o for o in graph["outputs"] if o["name"] not in carried]
    text = text_model(manifest)
    name = f"{manifest['name']}-{delay_ms:g}ms".replace(".", "_")
    inputs = ([_tensor("TEXT", "TYPE_STRING", "1")] if text else
              [_tensor(i["name"], TRITON_TYPES[i["dtype"]], _dims(i["shape"])) for i in pieces])
    outputs = [_tensor(o["name"], TRITON_TYPES[o["dtype"]], _dims(o["shape"])) for o in answers]
    outputs.append(_tensor("STEPS", "TYPE_INT64", "1"))
    threads = intra_op_threads or int(graph.get("intra_op_threads") or 0)  # rtserve's rule (load_backends)
    parameters = {"entry": str(entry.resolve()), "intra_op_threads": str(threads), "text": "1" if text else "0",
                  "source_root": str(SOURCE_ROOT), "cache_capacity": "4096"}
    folder = root / name
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "1").mkdir(parents=True)
    shutil.copy2(MODEL_SOURCE, folder / "1" / "model.py")
    (folder / "config.pbtxt").write_text(CONFIG.format(
        name=name, max_batch=max_batch, inputs=",\n".join(inputs), outputs=",\n".join(outputs),
        candidates=candidates, delay_us=int(delay_ms * 1000),
        parameters=",\n".join(f'  {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in parameters.items()),
    ))
    return TritonModel(name, entry, delay_ms, text, tuple((i["name"], JSON_TYPES[i["dtype"]]) for i in pieces),
                       tuple(o["name"] for o in answers))
