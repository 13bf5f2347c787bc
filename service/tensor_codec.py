"""Named tensors <-> bytes, in the safetensors format (never pickle).

The bytes are self-describing (names, dtypes, shapes in a JSON header), so a
state written by one replica can be read by any other, whatever language it
is written in.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from safetensors.numpy import load as _load
from safetensors.numpy import save as _save

Arrays = dict[str, np.ndarray]  # a state, a chunk, a graph's inputs or outputs: named arrays


def encode_tensors(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialize named arrays. Arrays are made contiguous; 0-d arrays are kept 0-d."""
    # np.require keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d)
    arrays = {name: np.require(value, requirements="C") for name, value in tensors.items()}
    return _save(arrays, metadata=dict(metadata) if metadata else None)


def decode_tensors(data: bytes) -> dict[str, np.ndarray]:
    """Inverse of :func:`encode_tensors`."""
    return dict(_load(data))
