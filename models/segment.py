"""The segment-model contract every served model keeps (see DESIGN.md).

    init_state(batch)          -> state            # dict of named tensors
    step(state, segment)       -> state', output   # pure: no Python-side memory
    readout(state, output)     -> task result

``state`` is a flat mapping of named tensors whose names, dtypes and shapes
are the model's *state spec*. The batch axis is always axis 0, so states of
different sessions stack along it. A whole-input call is a fold of ``step``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import torch

from models.tensor_spec import TensorSpec

State = dict[str, torch.Tensor]
__all__ = ["SegmentModel", "State", "TensorSpec", "fold", "split_state", "stack_states"]


class SegmentModel(Protocol):
    def state_spec(self) -> list[TensorSpec]: ...

    def init_state(self, batch: int) -> State: ...

    def step(self, state: Mapping[str, torch.Tensor], segment: Mapping[str, torch.Tensor]) -> tuple[State, State]: ...

    def readout(self, state: Mapping[str, torch.Tensor], output: Mapping[str, torch.Tensor]) -> Any: ...


def fold(model: SegmentModel, segments: Iterable[Mapping[str, torch.Tensor]], batch: int = 1) -> tuple[State, State]:
    """A whole-input call: ``step`` folded over the segments, from ``init_state``."""
    state = model.init_state(batch)
    output: State = {}
    for segment in segments:
        state, output = model.step(state, segment)
    return state, output


def stack_states(states: list[Mapping[str, torch.Tensor]]) -> State:
    """Stack per-session states (each with batch 1 or more) along axis 0."""
    return {name: torch.cat([state[name] for state in states], dim=0) for name in states[0]}


def split_state(state: Mapping[str, torch.Tensor], sizes: list[int]) -> list[State]:
    """Inverse of :func:`stack_states`."""
    pieces = {name: torch.split(tensor, sizes, dim=0) for name, tensor in state.items()}
    return [{name: pieces[name][index] for name in state} for index in range(len(sizes))]
