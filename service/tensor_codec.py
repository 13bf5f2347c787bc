"""Named tensors <-> bytes, in the safetensors format (never pickle).

The bytes are self-describing (names, dtypes, shapes in a JSON header), so a
state written by one replica can be read by any other, whatever language it
is written in.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from safetensors import TensorSpec, serialize
from safetensors.numpy import load as _load
from safetensors.numpy import save as _save

Arrays = dict[str, np.ndarray]  # a state, a chunk, a graph's inputs or outputs: named arrays


def encode_tensors(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialize named arrays. Arrays are made contiguous; 0-d arrays are kept 0-d."""
    # np.require keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d); an array already C-contiguous (a
    # state's, every piece) is taken as it is, without the call
    arrays = {name: value if type(value) is np.ndarray and value.flags.c_contiguous
              else np.require(value, requirements="C") for name, value in tensors.items()}
    if any(array.dtype.byteorder == ">" for array in arrays.values()):
        return _save(arrays, metadata=dict(metadata) if metadata else None)  # safetensors swaps them to little
    # safetensors' own serializer, given each array's dtype name from a table: numpy's ``dtype.name`` costs more
    # than the whole serialization of a session's state (this runs for every piece)
    specs = {name: TensorSpec(dtype=_dtype_name(array.dtype), shape=array.shape,
                              data_ptr=array.ctypes.data, data_len=array.nbytes)
             for name, array in arrays.items()}
    return bytes(serialize(specs, metadata=dict(metadata) if metadata else None))


_DTYPE_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def decode_tensors(data: bytes) -> dict[str, np.ndarray]:
    """Inverse of :func:`encode_tensors`."""
    return dict(_load(data))
