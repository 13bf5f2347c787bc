"""Results as JSON text: what Redis stores for a piece, and what the answers carry.

A result may hold numpy arrays (a forecast's rows: a float64 array, never turned into a Python float per value);
they are written as the numbers they hold, with the same digits as the Python floats would have.
"""

from __future__ import annotations

from typing import Any

import orjson


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
