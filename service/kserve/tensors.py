"""KServe v2 tensors over HTTP: a request's inputs read from JSON or from Triton's binary tensor data extension, and
an answer's outputs written back the same two ways.

- A request is a JSON object (``id``, ``parameters``, ``inputs``, ``outputs``), or, with the header
  ``Inference-Header-Content-Length: N``, that object in the body's first N bytes followed by the inputs' raw data,
  each such input giving its byte count in ``parameters.binary_data_size`` (in the order of ``inputs``).
- Raw data: numbers little-endian in row-major order, BOOL one byte each, BYTES each element as a 4-byte
  little-endian length and its bytes (Triton's layout, as ``tritonclient`` writes it).
- An answer's outputs are JSON ``data``, or raw after the JSON header where the request asks for it (an output's
  ``parameters.binary_data``, or the request's ``parameters.binary_data_output`` for the others); the header's length
  is then the answer's ``Inference-Header-Content-Length``.
- A body sent with ``Content-Encoding: gzip`` or ``deflate`` (``tritonclient``'s ``request_compression_algorithm``)
  is inflated first, to at most ``RTSERVE_MAX_BODY_BYTES``.

What goes wrong is one of the service's errors, so that the one STATUS table answers it: a request whose bytes
cannot be read (:class:`UnreadableBody`, 400), an inflated body over the limit (413), an unknown encoding (415), any
other request that says something wrong (:class:`~service.runtime.pipeline.InputError`, 422), each with what to change
in Triton's words where Triton has them.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from starlette.exceptions import HTTPException

from service.fast_path import UnsupportedBody
from service.runtime.pipeline import InputError

BYTES = "BYTES"
NUMPY: dict[str, np.dtype[Any]] = {  # every fixed-size datatype of the protocol that numpy holds (no BF16)
    "BOOL": np.dtype(np.bool_), "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"), "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"), "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
DATATYPES = (*NUMPY, BYTES)
INPUT_FIELDS = frozenset(("name", "datatype", "shape", "parameters", "data"))
_JSON_KINDS = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}  # what JSON numbers a datatype takes, by numpy kind


class UnreadableBody(Exception):
    """The request's bytes are not a request (a binary part that disagrees with its header, a header that is not
    UTF-8): HTTP 400; the message says what is wrong."""


@dataclass
class Tensor:
    """One tensor of a request or an answer. ``data``: numbers as an array of ``shape``; BYTES as the elements, in
    row-major order."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | list[bytes]
    raw: bytes | None = None  # ``data`` in the raw layout, where written once for many answers (:func:`raw_bytes`)


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None = None  # its parameters.binary_data; None: as the request's binary_data_output says


@dataclass
class InferRequest:
    """A KServe v2 inference request, whatever carried it (HTTP or gRPC)."""

    inputs: list[Tensor]
    outputs: list[RequestedOutput] | None = None  # None: every output the model gives
    parameters: dict[str, Any] = field(default_factory=dict)
    id: str = ""
    binary_output: bool = False  # parameters.binary_data_output: outputs raw unless one says otherwise


@dataclass
class InferAnswer:
    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


# ---- reading -----------------------------------------------------------------------------------------------------
def inflate(body: bytes, encoding: str | None, limit: int) -> bytes:
    """``body`` as sent, or inflated (``Content-Encoding`` gzip or deflate) to at most ``limit`` bytes."""
    if not encoding or encoding.strip().lower() == "identity":
        return body
    wbits = {"gzip": 31, "deflate": 15}.get(encoding.strip().lower())
    if wbits is None:
        raise UnsupportedBody(f"Content-Encoding `{encoding}` is not supported: send the body as it is, or gzip or "
                              "deflate it")
    inflater = zlib.decompressobj(wbits)
    try:
        plain = inflater.decompress(body, limit + 1)
    except zlib.error as error:
        raise UnreadableBody(f"the body is not {encoding.strip().lower()} data: {error}") from None
    if len(plain) > limit:
        raise HTTPException(413, f"the request body inflates past {limit} bytes (RTSERVE_MAX_BODY_BYTES): send long "
                                 "inputs as a sequence of pieces")
    return plain


def read_request(body: bytes, header_length: str | None) -> InferRequest:
    """The request of an HTTP body: JSON, or with ``Inference-Header-Content-Length`` a JSON header and raw data."""
    raw = memoryview(b"")
    if header_length is not None:
        if not header_length.strip().isdigit() or not 0 < int(header_length) <= len(body):
            raise UnreadableBody(f"Inference-Header-Content-Length is {header_length!r}: it must be the byte count "
                                 f"of the JSON header at the start of the body (1 to {len(body)})")
        size = int(header_length)
        raw, body = memoryview(body)[size:], body[:size]
    try:
        header = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        try:
            bytes(body).decode("utf-8")
        except UnicodeDecodeError as bad:
            raise UnreadableBody(f"the request's JSON is not UTF-8 text (byte {bad.start}): send JSON encoded as "
                                 "UTF-8") from None
        raise InputError(f"the request is not valid JSON: {error}", kind="json_invalid") from None
    return parse_request(header, raw)


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if type(value) is not dict:
        raise InputError(f"`{where}` must be a JSON object")
    return value


def parse_request(header: Any, raw: memoryview) -> InferRequest:
    """The request of a JSON header (already parsed) and its raw data (empty without the binary extension)."""
    if type(header) is not dict:
        raise InputError("the request must be a JSON object with `inputs` (KServe v2's inference request)")
    unknown = set(header) - {"id", "parameters", "inputs", "outputs"}
    if unknown:
        raise InputError(f"unexpected field(s) {sorted(unknown)} in the inference request: it takes `id`, "
                         "`parameters`, `inputs` and `outputs`")
    request_id = header.get("id", "")
    if type(request_id) is not str:
        raise InputError("`id` must be a string")
    parameters = _object(header.get("parameters"), "parameters")
    inputs = header.get("inputs")
    if type(inputs) is not list or not inputs:
        raise InputError("`inputs` must be a non-empty list of tensors ({\"name\", \"datatype\", \"shape\", \"data\"})")
    tensors, offset = [], 0
    for index, item in enumerate(inputs):
        tensor, used = _input(item, index, raw[offset:])
        tensors.append(tensor)
        offset += used
    if offset != len(raw):
        raise UnreadableBody(f"the body holds {len(raw)} bytes of binary tensor data after its JSON header, but its "
                             f"inputs' binary_data_size add up to {offset}: send exactly the bytes they declare")
    outputs = None
    if "outputs" in header:
        listed = header["outputs"]
        if type(listed) is not list:
            raise InputError("`outputs` must be a list of {\"name\", \"parameters\"?}")
        outputs = [_output(item, index) for index, item in enumerate(listed)]
    binary_output = parameters.get("binary_data_output", False)
    if type(binary_output) is not bool:
        raise InputError("`parameters.binary_data_output` must be true or false")
    return InferRequest(tensors, outputs, parameters, request_id, binary_output)


def _input(item: Any, index: int, raw: memoryview) -> tuple[Tensor, int]:
    """Input ``index`` of the request, and the bytes of ``raw`` it took."""
    where = f"inputs[{index}]"
    if type(item) is not dict:
        raise InputError(f"`{where}` must be a JSON object: {{\"name\", \"datatype\", \"shape\", \"data\"}}")
    name, datatype, shape = item.get("name"), item.get("datatype"), item.get("shape")
    if type(name) is not str or not name:
        raise InputError(f"`{where}.name` must be a non-empty string")
    if not item.keys() <= INPUT_FIELDS:
        raise InputError(f"input '{name}': unexpected field(s) {sorted(item.keys() - INPUT_FIELDS)}; a tensor has "
                         f"{', '.join(sorted(INPUT_FIELDS))}")
    if datatype not in DATATYPES:
        raise InputError(f"input '{name}': datatype {datatype!r} is not one of {', '.join(DATATYPES)}")
    dims = check_shape(shape, f"input '{name}'")
    parameters = _object(item.get("parameters"), f"{where}.parameters")
    if "shared_memory_region" in parameters:
        raise InputError(f"input '{name}': shared memory is not supported; send the tensor's data in the request")
    size = parameters.get("binary_data_size")
    if size is not None:
        if type(size) is not int or size < 0:
            raise InputError(f"input '{name}': parameters.binary_data_size must be a byte count")
        if "data" in item:
            raise InputError(f"input '{name}' has both `data` and parameters.binary_data_size: send one")
        if size > len(raw):
            raise UnreadableBody(f"input '{name}' declares {size} bytes of binary data but the body holds "
                                 f"{len(raw)} more: send exactly the bytes its binary_data_size says")
        return Tensor(name, datatype, dims, raw_tensor(raw[:size], datatype, dims, name)), size
    if "data" not in item:
        raise InputError(f"input '{name}' has no `data` (and no parameters.binary_data_size): send its elements")
    return Tensor(name, datatype, dims, json_tensor(item["data"], datatype, dims, name)), 0


def check_shape(shape: Any, what: str) -> tuple[int, ...]:
    if type(shape) is not list or any(type(size) is not int or size < 0 for size in shape):
        raise InputError(f"{what}: `shape` must be a list of sizes (integers from 0), e.g. [24, 7]")
    return tuple(shape)


def _output(item: Any, index: int) -> RequestedOutput:
    if type(item) is not dict or type(item.get("name")) is not str or not item.keys() <= {"name", "parameters"}:
        raise InputError(f"`outputs[{index}]` must be a JSON object with a string `name` and optional `parameters`")
    parameters = _object(item.get("parameters"), f"outputs[{index}].parameters")
    for unsupported in ("classification", "shared_memory_region"):
        if unsupported in parameters:
            raise InputError(f"output '{item['name']}': parameters.{unsupported} is not supported; ask for the "
                             "output itself")
    binary = parameters.get("binary_data")
    if binary is not None and type(binary) is not bool:
        raise InputError(f"output '{item['name']}': parameters.binary_data must be true or false")
    return RequestedOutput(item["name"], binary)


def _flat(data: Any) -> Iterable[Any]:
    for item in data:
        if type(item) is list:
            yield from _flat(item)
        else:
            yield item


def json_tensor(data: Any, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray | list[bytes]:
    """A tensor's JSON ``data`` (flat or nested in row-major order) as numbers of ``shape`` or BYTES elements."""
    count = math.prod(shape)
    if type(data) is not list:
        data = [data]
    if datatype == BYTES:
        elements = list(_flat(data))
        if any(type(element) is not str for element in elements):
            raise InputError(f"input '{name}': BYTES data in JSON are strings (send raw bytes with the binary tensor "
                             "data extension)")
        _check_count(len(elements), count, name, shape)
        return [element.encode("utf-8", "surrogatepass") for element in elements]
    try:
        array = np.asarray(data)
    except ValueError:  # ragged nesting
        array = np.asarray(list(_flat(data)), dtype=object)
    wanted = NUMPY[datatype]
    if array.size and (array.dtype.kind not in _JSON_KINDS[wanted.kind]
                       or (array.dtype.kind == "b") != (wanted.kind == "b")):
        expected = "true or false" if wanted.kind == "b" else "JSON numbers"
        raise InputError(f"input '{name}': {datatype} data must be {expected}, flat or nested in row-major order")
    _check_count(array.size, count, name, shape)
    limits = np.iinfo(wanted) if wanted.kind in "iu" else None
    if limits is not None and array.size and (array.min() < limits.min or array.max() > limits.max):
        raise InputError(f"input '{name}': a value is outside {datatype}'s range")
    with np.errstate(over="ignore"):  # a number past FP32's range becomes infinite: the model's checks refuse it
        return array.astype(wanted, copy=False).reshape(shape)


def raw_tensor(raw: memoryview, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray | list[bytes]:
    """A tensor's raw bytes (binary tensor data extension, or gRPC's raw contents) as numbers or BYTES elements."""
    count = math.prod(shape)
    if datatype == BYTES:
        elements = bytes_elements(raw, name)
        _check_count(len(elements), count, name, shape)
        return elements
    dtype = NUMPY[datatype]
    if len(raw) != count * dtype.itemsize:
        raise UnreadableBody(f"input '{name}' has {len(raw)} bytes of data, but {datatype} of shape {list(shape)} "
                             f"takes {count * dtype.itemsize}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def bytes_elements(raw: memoryview | bytes, name: str) -> list[bytes]:
    """BYTES elements, each a 4-byte little-endian length and that many bytes."""
    elements, offset, data = [], 0, bytes(raw)
    while offset < len(data):
        if offset + 4 > len(data):
            raise UnreadableBody(f"input '{name}': BYTES data end inside an element's 4-byte length")
        size = int.from_bytes(data[offset : offset + 4], "little")
        offset += 4
        if offset + size > len(data):
            raise UnreadableBody(f"input '{name}': a BYTES element of {size} bytes runs past the end of its data")
        elements.append(data[offset : offset + size])
        offset += size
    return elements


def _check_count(got: int, count: int, name: str, shape: tuple[int, ...]) -> None:
    if got != count:
        raise InputError(f"input '{name}' has {got} elements, but its shape {list(shape)} takes {count}")


# ---- writing -----------------------------------------------------------------------------------------------------
def raw_bytes(tensor: Tensor) -> bytes:
    """The tensor's data in the raw layout (binary extension, gRPC's raw contents)."""
    if tensor.raw is not None:
        return tensor.raw
    if tensor.datatype == BYTES:
        assert isinstance(tensor.data, list)
        return b"".join(len(element).to_bytes(4, "little") + element for element in tensor.data)
    assert isinstance(tensor.data, np.ndarray)
    return np.ascontiguousarray(tensor.data, dtype=NUMPY[tensor.datatype]).tobytes()


def json_data(tensor: Tensor) -> list[Any]:
    """The tensor's elements as flat JSON data."""
    if tensor.datatype == BYTES:
        assert isinstance(tensor.data, list)
        return [element.decode("utf-8", "surrogatepass") for element in tensor.data]
    assert isinstance(tensor.data, np.ndarray)
    return tensor.data.ravel().tolist()


def write_answer(answer: InferAnswer, binary: set[str]) -> tuple[bytes, int | None]:
    """The HTTP body of an answer, its outputs ``binary`` raw (:func:`binary_outputs`), and the length of its JSON
    header when raw outputs follow it (else None)."""
    outputs: list[dict[str, Any]] = []
    raw: list[bytes] = []
    for tensor in answer.outputs:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        if tensor.name in binary:
            data = raw_bytes(tensor)
            entry["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
        else:
            entry["data"] = json_data(tensor)
        outputs.append(entry)
    body: dict[str, Any] = {"model_name": answer.model_name, "model_version": answer.model_version}
    if answer.id:
        body["id"] = answer.id
    if answer.parameters:
        body["parameters"] = answer.parameters
    body["outputs"] = outputs
    header = orjson.dumps(body)
    if not raw:
        return header, None
    return b"".join((header, *raw)), len(header)


def binary_outputs(request: InferRequest, names: Iterable[str]) -> set[str]:
    """Which of the answer's outputs ``names`` go raw: each output's own ``binary_data``, else the request's
    ``binary_data_output``."""
    chosen: Mapping[str, bool | None] = {o.name: o.binary for o in request.outputs or ()}
    return {name for name in names
            if (chosen.get(name) if chosen.get(name) is not None else request.binary_output)}
