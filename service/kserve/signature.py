"""What a model takes and gives over KServe v2: its input and output tensors, read from the model's pipeline and its
family's answer schema, so that no family needs a line here.

- **The input** is the piece the pipeline reads (``input_kind``): ``TEXT``, BYTES of shape ``[1]`` (the text, UTF-8),
  or ``ROWS``, FP32 of shape ``[-1, C]`` (T rows of the model's C variables, oldest first).
- **The outputs** are the fields of the family's ``finish`` answer (the one-shot answer), less ``model`` and
  ``session``, each named by its field in capitals: a string is BYTES ``[1]``, an integer INT64 ``[1]``, a boolean
  BOOL ``[1]``, a number FP64 ``[1]`` (the answer's own float64 values, so that an output equals the JSON answer to
  the bit), a list ``[n]`` (``[n, m]`` for rows of numbers), a mapping two outputs: ``F`` its values and ``F_KEYS``
  its keys, in the same order. A field that is null (no label before the first segment, no forecast before the
  look-back) is an output with no element (shape ``[0]``, ``[0, 0]`` for rows). A piece's running answer may hold
  fields the final one lacks (a summary's progress: ``ENCODED_TOKENS``, ``WINDOWS``), sent as well; an output the
  final answer has and a running one lacks (``SUMMARY`` before the end) comes back with no element when asked for.
- **No batch axis** (``max_batch_size`` 0): one request carries one input, and rtserve batches the steps of all
  requests and sequences itself, as Triton's sequence batcher does for requests of batch 1.
"""

from __future__ import annotations

import functools
import types
import typing
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel

from service.kserve.tensors import BYTES, InferRequest, RequestedOutput, Tensor, raw_bytes
from service.runtime.pipeline import InputError
from service.runtime.registry import LoadedModel

INPUTS = {"text": "TEXT", "rows": "ROWS"}  # the input tensor of each pipeline input kind
KEYS = "_KEYS"  # the suffix of a mapping's keys output
NOT_OUTPUTS = ("model", "session")  # fields of a finish answer that are not results
SHORT = 64  # a text or list of texts no longer than this may repeat from answer to answer (a label, columns' names)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]  # -1: any size

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.dims)}

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "data_type": f"TYPE_{'STRING' if self.datatype == BYTES else self.datatype}",
                "dims": list(self.dims)}

    def empty(self) -> Tensor:
        """No element: the output of a null field."""
        shape = (0,) * len(self.dims)
        if self.datatype == BYTES:
            return Tensor(self.name, BYTES, shape, [])
        return Tensor(self.name, self.datatype, shape, np.zeros(shape, dtype=_NUMPY_OUT[self.datatype]))


_NUMPY_OUT = {"FP64": np.float64, "INT64": np.int64, "BOOL": np.bool_}


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """The annotation without ``| None``, and whether it had it."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        arguments = [a for a in typing.get_args(annotation) if a is not type(None)]
        return (arguments[0] if len(arguments) == 1 else Any), len(arguments) < len(typing.get_args(annotation))
    return annotation, False


def specs_of_field(name: str, annotation: Any) -> list[TensorSpec]:
    """The outputs a field of the answer schema becomes (module docstring)."""
    kind, optional = _unwrap(annotation)
    tensor = name.upper()
    origin, arguments = typing.get_origin(kind), typing.get_args(kind)
    one = (-1,) if optional else (1,)
    if kind is bool:
        return [TensorSpec(tensor, "BOOL", one)]
    if kind is int:
        return [TensorSpec(tensor, "INT64", one)]
    if kind is float:
        return [TensorSpec(tensor, "FP64", one)]
    if kind is str or origin is typing.Literal:
        return [TensorSpec(tensor, BYTES, one)]
    if origin is dict:
        return [TensorSpec(tensor, _scalar(arguments[1]), (-1,)), TensorSpec(tensor + KEYS, BYTES, (-1,))]
    if origin is list:
        inner, _ = _unwrap(arguments[0])
        if typing.get_origin(inner) is list:
            return [TensorSpec(tensor, _scalar(typing.get_args(inner)[0]), (-1, -1))]
        return [TensorSpec(tensor, _scalar(inner), (-1,))]
    return [TensorSpec(tensor, BYTES, one)]  # anything else: its JSON text


def _scalar(kind: Any) -> str:
    kind, _ = _unwrap(kind)
    return {bool: "BOOL", int: "INT64", float: "FP64"}.get(kind, BYTES)


def tensors_of_value(name: str, value: Any, spec: TensorSpec | None) -> list[Tensor]:
    """The outputs of one field's value (a null one: no element)."""
    tensor = name.upper()
    if isinstance(value, np.ndarray | list):  # rows (a forecast's: a float64 array), the commonest: first
        return [spec.empty()] if spec is not None and not len(value) else [_array(value, tensor)]
    if value is None:
        return [spec.empty() if spec is not None else Tensor(tensor, BYTES, (0,), [])]
    if isinstance(value, bool):
        return [Tensor(tensor, "BOOL", (1,), np.array([value]))]
    if isinstance(value, int):
        return [Tensor(tensor, "INT64", (1,), np.array([value], dtype=np.int64))]
    if isinstance(value, float):
        return [Tensor(tensor, "FP64", (1,), np.array([value]))]
    if isinstance(value, str):
        return [Tensor(tensor, BYTES, (1,), [value.encode("utf-8", "surrogatepass")])]
    if isinstance(value, dict):
        keys = [str(key).encode() for key in value]
        values = _array(list(value.values()), tensor)
        return [values, Tensor(tensor + KEYS, BYTES, (len(keys),), keys)]
    return [Tensor(tensor, BYTES, (1,), [orjson.dumps(value)])]  # anything else: its JSON


def _array(values: list[Any] | np.ndarray, name: str) -> Tensor:
    if isinstance(values, list) and values and all(isinstance(value, str) for value in values):
        return Tensor(name, BYTES, (len(values),), [value.encode("utf-8", "surrogatepass") for value in values])
    array = np.asarray(values)
    if array.dtype.kind == "f":
        return Tensor(name, "FP64", array.shape, array.astype(np.float64, copy=False))
    if array.dtype.kind in "iu":
        return Tensor(name, "INT64", array.shape, array.astype(np.int64, copy=False))
    if array.dtype.kind == "b":
        return Tensor(name, "BOOL", array.shape, array)
    return Tensor(name, BYTES, (len(values),), [str(value).encode() for value in values])


class Signature:
    """One model's tensors (module docstring): its metadata, its configuration, a request's piece and an answer's
    outputs."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        pipeline = model.pipeline
        kind = pipeline.input_kind
        if kind not in INPUTS:
            raise ValueError(f"{model.ref}: a pipeline reading {kind!r} has no KServe v2 input")
        width = pipeline.row_width
        self.input = (TensorSpec(INPUTS[kind], "FP32", (-1, width if width is not None else -1)) if kind == "rows"
                      else TensorSpec(INPUTS[kind], BYTES, (1,)))
        schema: type[BaseModel] = model.family.part("finish")
        self.outputs = [spec for name, info in schema.model_fields.items() if name not in NOT_OUTPUTS
                        for spec in specs_of_field(name, info.annotation)]
        self.by_name = {spec.name: spec for spec in self.outputs}
        self._repeated = functools.lru_cache(maxsize=4096, typed=True)(self._written)

    def _written(self, field: str, value: Any) -> tuple[Tensor, ...]:
        """The outputs of a field's plain value (a number, a text, a tuple of texts), their raw data written once:
        kept (:attr:`_repeated`) for the answers that repeat it."""
        made = tensors_of_value(field, list(value) if type(value) is tuple else value, self.by_name.get(field.upper()))
        for tensor in made:
            tensor.raw = raw_bytes(tensor)
        return tuple(made)

    def _kept(self, field: str, value: Any) -> tuple[Tensor, ...] | None:
        """The outputs of a value answers repeat (a count, a label, a forecast's columns), kept; None for another."""
        kind = type(value)
        if kind is int or kind is bool or (kind is str and len(value) <= SHORT):
            return self._repeated(field, value)
        if kind is list and 0 < len(value) <= SHORT and type(value[0]) is str:
            try:
                return self._repeated(field, tuple(value))
            except TypeError:  # an element not hashable: not a list of names
                return None
        return None

    # ---- what the model takes ------------------------------------------------------------------------------------
    def piece(self, request: InferRequest) -> str | np.ndarray:
        """The request's input as the piece the pipeline reads (``TEXT``: the text; ``ROWS``: the rows)."""
        name, spec = self.model.name, self.input
        given = [tensor.name for tensor in request.inputs]
        if given != [spec.name]:
            unknown = [item for item in given if item != spec.name]
            if unknown:
                raise InputError(f"unexpected inference input '{unknown[0]}' for model '{name}': it takes one input, "
                                 f"'{spec.name}' ({spec.datatype} {list(spec.dims)})")
            raise InputError(f"expected 1 inputs but got {len(given)} inputs for model '{name}': send '{spec.name}' "
                             "once")
        tensor = request.inputs[0]
        if tensor.datatype != spec.datatype:
            raise InputError(f"inference input '{spec.name}' data-type is '{tensor.datatype}', but model '{name}' "
                             f"expects '{spec.datatype}'")
        if len(tensor.shape) != len(spec.dims) or any(d not in (-1, s) for d, s in zip(spec.dims, tensor.shape,
                                                                                       strict=False)):
            raise InputError(f"unexpected shape for input '{spec.name}' for model '{name}'. Expected "
                             f"[{','.join(map(str, spec.dims))}], got [{','.join(map(str, tensor.shape))}]")
        if spec.datatype == BYTES:
            assert isinstance(tensor.data, list)
            raw = tensor.data[0]
            try:
                return raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise InputError(f"input '{spec.name}' is not UTF-8 text (byte {error.start} is "
                                 f"0x{raw[error.start]:02x}): send the text encoded as UTF-8") from None
        assert isinstance(tensor.data, np.ndarray)
        return tensor.data.astype(np.float64)  # as the native routes' fast path reads rows (and the digest hashes them)

    # ---- what it gives -------------------------------------------------------------------------------------------
    def check_outputs(self, requested: list[RequestedOutput] | None) -> None:
        """Refuse (in Triton's words) an output asked for by name that the model's metadata does not list: before
        anything is applied. (A piece's running answer may hold more, sent when the request names none.)"""
        for output in requested or ():
            if output.name not in self.by_name:
                raise InputError(f"unexpected inference output '{output.name}' for model '{self.model.name}': it "
                                 f"gives {', '.join(self.by_name)}")

    def outputs_of(self, result: dict[str, Any], requested: list[RequestedOutput] | None) -> list[Tensor]:
        """The answer's outputs: every field of ``result``, or those ``requested`` in their order (checked by
        :meth:`check_outputs`; one the answer lacks, as a summary before the end: no element)."""
        tensors: dict[str, Tensor] = {}
        for field, value in result.items():
            made = self._kept(field, value)
            if made is None:
                made = tensors_of_value(field, value, self.by_name.get(field.upper()))
            for tensor in made:
                tensors[tensor.name] = tensor
        if requested is None:
            return list(tensors.values())
        return [tensors.get(output.name) or self.by_name[output.name].empty() for output in requested]

    # ---- what it says of itself ----------------------------------------------------------------------------------
    def metadata(self, versions: list[str]) -> dict[str, Any]:
        return {"name": self.model.name, "versions": versions, "platform": "rtserve",
                "inputs": [self.input.metadata()], "outputs": [spec.metadata() for spec in self.outputs]}

    def config(self, session_ttl_seconds: int, max_queue_delay_ms: float) -> dict[str, Any]:
        """Triton's model configuration (the ``model_configuration`` extension; what ``perf_analyzer`` reads): no batch
        axis, and a sequence batcher whose sequences are rtserve's sessions (idle expiry: the session TTL; the
        ``oldest`` strategy: any sequence's next piece joins the batch being formed)."""
        model = self.model
        return {
            "name": model.name, "platform": "rtserve", "backend": "rtserve",
            "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 0,
            "input": [self.input.config()], "output": [spec.config() for spec in self.outputs],
            "sequence_batching": {
                "max_sequence_idle_microseconds": int(session_ttl_seconds * 1_000_000),
                "oldest": {"max_candidate_sequences": model.max_batch_size,
                           "max_queue_delay_microseconds": int(max_queue_delay_ms * 1000)},
            },
            "instance_group": [{"name": model.name, "kind": "KIND_GPU" if model.device.startswith("cuda") else
                                "KIND_CPU", "count": 1}],
            "parameters": {key: {"string_value": str(value)} for key, value in (
                ("task", model.task), ("family", model.manifest["family"]), ("version", model.version),
                ("backend", model.backend), ("device", model.device), ("precision", model.precision),
                ("max_batch_size", model.max_batch_size))},
        }
