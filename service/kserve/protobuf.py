"""KServe v2 over gRPC: a ``ModelInferRequest`` read into the protocol's request, an answer written as a
``ModelInferResponse``, and the metadata, configuration and statistics as their messages.

The message classes are the ones ``tritonclient[grpc]`` generates from Triton's ``grpc_service.proto`` and
``model_config.proto`` (``tritonclient.grpc.service_pb2``, ``model_config_pb2``): the same the clients use, never
written here. A tensor's data is its ``raw_input_contents`` entry (what ``tritonclient`` and ``perf_analyzer`` send,
in the layout of :mod:`service.kserve.tensors`) or its typed ``contents``; outputs go back raw, as Triton sends them.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2

from service.kserve.tensors import (
    BYTES,
    NUMPY,
    InferAnswer,
    InferRequest,
    RequestedOutput,
    Tensor,
    UnreadableBody,
    check_shape,
    raw_bytes,
    raw_tensor,
)
from service.runtime.pipeline import InputError

# the typed field of InferTensorContents that holds each datatype
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
            "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def parameters_of(parameters: Any) -> dict[str, Any]:
    """A protobuf parameter map (``InferParameter``: one of bool, int64, uint64, double, string) as plain values."""
    return {key: parameter_value(value) for key, value in parameters.items()}


def parameter_value(parameter: Any) -> Any:
    """One ``InferParameter``'s value (None when none of its kinds is set)."""
    kind = parameter.WhichOneof("parameter_choice")
    return getattr(parameter, kind) if kind is not None else None


PARAMETER_FIELDS = {bool: "bool_param", int: "int64_param", float: "double_param", str: "string_param"}


def set_parameters(target: Any, parameters: dict[str, Any]) -> None:
    """Each of ``parameters`` into the protobuf parameter map ``target``, in the field of its value's kind."""
    for key, value in parameters.items():
        field = PARAMETER_FIELDS.get(type(value)) or next(  # a plain value's at once; a subclass's by isinstance
            (name for kind, name in PARAMETER_FIELDS.items() if isinstance(value, kind)), None)
        if field is None:  # anything else: its text
            field, value = "string_param", str(value)
        setattr(target[key], field, value)


def read_request(message: Any) -> InferRequest:
    """The protocol's request of a ``ModelInferRequest``."""
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise UnreadableBody(f"the request has {len(raw)} raw_input_contents for {len(message.inputs)} inputs: send "
                             "one per input, in the order of the inputs")
    inputs = []
    for index, item in enumerate(message.inputs):
        if not item.name:
            raise InputError(f"inputs[{index}] has no name")
        if item.datatype not in CONTENTS and item.datatype not in NUMPY:
            raise InputError(f"input '{item.name}': datatype {item.datatype!r} is not one of {', '.join(CONTENTS)}")
        shape = check_shape(list(item.shape), f"input '{item.name}'")
        if "shared_memory_region" in item.parameters:
            raise InputError(f"input '{item.name}': shared memory is not supported; send the tensor's data")
        if raw:
            data = raw_tensor(memoryview(raw[index]), item.datatype, shape, item.name)
        else:
            data = _typed(item, shape)
        inputs.append(Tensor(item.name, item.datatype, shape, data))
    if not inputs:
        raise InputError("the request has no inputs")
    outputs = None
    if message.outputs:
        outputs = []
        for output in message.outputs:
            for unsupported in ("classification", "shared_memory_region"):
                if unsupported in output.parameters:
                    raise InputError(f"output '{output.name}': parameter {unsupported} is not supported; ask for "
                                     "the output itself")
            outputs.append(RequestedOutput(output.name))
    return InferRequest(inputs, outputs, parameters_of(message.parameters), message.id)


def _typed(item: Any, shape: tuple[int, ...]) -> np.ndarray | list[bytes]:
    values = getattr(item.contents, CONTENTS.get(item.datatype, ""), None) if item.HasField("contents") else None
    count = math.prod(shape)
    if values is None or len(values) != count:
        got = 0 if values is None else len(values)
        raise InputError(f"input '{item.name}' has {got} elements in contents.{CONTENTS.get(item.datatype)}, but its "
                         f"shape {list(shape)} takes {count}")
    if item.datatype == BYTES:
        return list(values)
    return np.asarray(values, dtype=NUMPY[item.datatype]).reshape(shape)


def infer_response(answer: InferAnswer, response: Any = None) -> Any:
    """The ``ModelInferResponse`` of an answer, every output's data raw; written into ``response`` when given (a
    stream response's own, which a message passed to its constructor would be copied into)."""
    if response is None:
        response = service_pb2.ModelInferResponse()
    response.MergeFrom(_output_heads(tuple((tensor.name, tensor.datatype, tuple(tensor.shape))
                                           for tensor in answer.outputs)))
    response.model_name, response.model_version, response.id = answer.model_name, answer.model_version, answer.id
    set_parameters(response.parameters, answer.parameters)
    response.raw_output_contents.extend([raw_bytes(tensor) for tensor in answer.outputs])
    return response


@functools.lru_cache(maxsize=1024)  # a model's answers have a few: its outputs' names and types, a few shapes
def _output_heads(heads: tuple[tuple[str, str, tuple[int, ...]], ...]) -> Any:
    """A response holding only the outputs' names, datatypes and shapes, merged into each answer's: a third of the
    time of adding each output to it."""
    return service_pb2.ModelInferResponse(outputs=[
        service_pb2.ModelInferResponse.InferOutputTensor(name=name, datatype=datatype, shape=shape)
        for name, datatype, shape in heads])


def model_metadata(metadata: dict[str, Any]) -> Any:
    return json_format.ParseDict(metadata, service_pb2.ModelMetadataResponse())


def model_config(config: dict[str, Any]) -> Any:
    return service_pb2.ModelConfigResponse(config=json_format.ParseDict(config, model_config_pb2.ModelConfig()))


def model_statistics(statistics: dict[str, Any]) -> Any:
    return json_format.ParseDict(statistics, service_pb2.ModelStatisticsResponse())


def server_metadata(metadata: dict[str, Any]) -> Any:
    return json_format.ParseDict(metadata, service_pb2.ServerMetadataResponse())


def repository_index(index: list[dict[str, str]]) -> Any:
    return json_format.ParseDict({"models": index}, service_pb2.RepositoryIndexResponse())
