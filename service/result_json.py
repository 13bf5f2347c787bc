"""Results as JSON text: what Redis stores for a piece, and what the answers carry.

A result may hold numpy arrays (a forecast's rows: a float64 array, never turned into a Python float per value);
they are written as the numbers they hold, with the same digits as the Python floats would have.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson


def _other(value: Any) -> Any:
    """What orjson does not write itself: an array that is not C-contiguous, as its lists."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, default=_other, option=orjson.OPT_SERIALIZE_NUMPY)
