"""The description of one named tensor: what manifests, state specs and graph signatures are made of.

Its own module, free of torch, so that code the service runs on the ONNX path (the text cutter)
can describe its state without importing PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor of a state or of a step's input/output.

    ``shape`` uses strings for symbolic axes ("batch", "segment", ...) and
    ints for fixed sizes.
    """

    name: str
    dtype: str  # numpy/torch dtype name: "float32", "int64", ...
    shape: tuple[int | str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
