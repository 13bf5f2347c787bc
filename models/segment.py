"""The segment-model contract every served model keeps (docs/architecture.md), in PyTorch.

    state_spec()               -> [TensorSpec]      # names, dtypes, shapes; batch is axis 0
    init_state(batch)          -> state             # dict of named tensors
    step(state, segment)       -> state', output    # pure: no Python-side memory
    readout(state, output)     -> task result

The families implement it (``RMT``, ``ForecastStream``; SRformer's decoder ``step`` with its cache)
and the serving adapters (``models/serving/``) trace ``step`` into the exported graphs, state in and
state out, so states of different sessions stack along axis 0 and a whole input is a fold of
``step``. Around the graphs, each family's numpy stream (``models/text_stream.py``,
``classifier_stream.py``, ``summary_stream.py``) turns user pieces into segments; the service's
pipelines (``service/runtime/pipeline.py``: ``new_state`` / ``consume`` / ``finish``) wrap those
streams and run the graphs batched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch

from models.tensor_spec import TensorSpec

State = dict[str, torch.Tensor]
__all__ = ["SegmentModel", "State", "TensorSpec"]


class SegmentModel(Protocol):
    def state_spec(self) -> list[TensorSpec]: ...

    def init_state(self, batch: int) -> State: ...

    def step(self, state: Mapping[str, torch.Tensor], segment: Mapping[str, torch.Tensor]) -> tuple[State, State]: ...

    def readout(self, state: Mapping[str, torch.Tensor], output: Mapping[str, torch.Tensor]) -> Any: ...
