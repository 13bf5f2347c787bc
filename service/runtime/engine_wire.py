"""The engine's wire: what crosses the Unix socket between a front end and the engine (:mod:`service.runtime.engine`).

Frames of ``<u32 header length><u32 body length>``, a JSON header (orjson), then the raw bytes of the arrays the
header names (name, dtype, shape, in order). No pickle crosses the boundary. Errors travel as their kind
(:func:`error_header`, :func:`error_from`): an :class:`InputError` stays a 422 with its field, a builtin type is
raised again as itself, anything else as a RuntimeError naming it. A decode search travels as its description
(:func:`search_spec`, :func:`search_from`).
"""

from __future__ import annotations

import asyncio
import builtins
import math
import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import orjson

from models.decoding import BeamSearch, GreedySearch, Search
from service.runtime.pipeline import InputError

FRAME = struct.Struct("<II")  # header bytes, body bytes


class EngineUnavailable(RuntimeError):
    """The engine process cannot be reached, or left while a call was in flight (HTTP 503)."""


def pack(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> bytes:
    """One frame: ``header`` plus the arrays' specs as JSON, then the arrays' bytes."""
    specs, parts = [], []
    for name, value in (arrays or {}).items():
        array = np.require(value, requirements="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        if array.dtype.hasobject:
            raise TypeError(f"array {name!r} holds Python objects; only numeric and bool arrays cross to the engine")
        specs.append([name, array.dtype.str, list(array.shape)])
        parts.append(array.tobytes())
    head = orjson.dumps({**header, "arrays": specs})
    body = b"".join(parts)
    return FRAME.pack(len(head), len(body)) + head + body


def unpack(specs: list[list[Any]], body: bytearray) -> dict[str, np.ndarray]:
    """The arrays of a frame's body: views of its (writable) bytes."""
    arrays, offset = {}, 0
    for name, dtype, shape in specs:
        kind = np.dtype(dtype)
        count = math.prod(shape)
        arrays[name] = np.frombuffer(body, kind, count, offset).reshape(shape)
        offset += count * kind.itemsize
    return arrays


def frame_rows(header: Mapping[str, Any]) -> int:
    """Rows of a step frame: the batch axis of its first array (every array of a step shares it)."""
    specs = header.get("arrays") or []
    return int(specs[0][2][0]) if specs and specs[0][2] else 1


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytearray]:
    head_bytes, body_bytes = FRAME.unpack(await reader.readexactly(FRAME.size))
    header = orjson.loads(await reader.readexactly(head_bytes))
    body = bytearray(await reader.readexactly(body_bytes)) if body_bytes else bytearray()
    return header, body


def error_header(error: BaseException) -> dict[str, Any]:
    header: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if isinstance(error, InputError):
        header |= {"loc": list(error.loc) if error.loc is not None else None, "kind": error.kind}
    return header


def error_from(header: Mapping[str, Any]) -> Exception:
    """The engine's error raised again in the front end: an InputError, a builtin type, or a RuntimeError."""
    kind, message = header["type"], header["message"]
    if kind == "InputError":
        return InputError(message, loc=header.get("loc"), kind=header.get("kind", "value_error"))
    builtin = getattr(builtins, kind, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception) and builtin is not EngineUnavailable:
        try:
            return builtin(message)
        except TypeError:
            pass
    return RuntimeError(f"the engine failed: {kind}: {message}")


def search_spec(search: Search) -> dict[str, Any]:
    """What the engine needs to rebuild a search (its vocabulary travels as an array)."""
    common = {"bos": int(search.bos), "eos": int(search.eos), "limit": int(search.limit),
              "no_repeat": int(search.no_repeat), "ends": sorted(int(i) for i in search.ends),
              "target": int(search.target), "min_length": int(search.min_length)}
    if isinstance(search, GreedySearch):
        return {"kind": "greedy", **common}
    if isinstance(search, BeamSearch):
        return {"kind": "beam", **common, "beams": search.rows, "length_penalty": search.length_penalty}
    raise TypeError(f"{type(search).__name__} cannot be sent to the engine")


def search_from(spec: Mapping[str, Any], vocab_ids: np.ndarray,
                on_token: Callable[[list[int]], None] | None) -> Search:
    common = (int(spec["bos"]), int(spec["eos"]), vocab_ids, int(spec["limit"]), int(spec["no_repeat"]))
    ends, target, min_length = frozenset(int(i) for i in spec["ends"]), int(spec["target"]), int(spec["min_length"])
    if spec["kind"] == "greedy":
        return GreedySearch(*common, on_token, ends, target, min_length)
    return BeamSearch(*common, int(spec["beams"]), float(spec["length_penalty"]), ends=ends, target=target,
                      min_length=min_length)


VOCAB = "__vocab_ids"  # the array of a generate frame that is the search's vocabulary
FIXED, STATE = "fixed:", "state:"  # prefixes of a generate frame's arrays
