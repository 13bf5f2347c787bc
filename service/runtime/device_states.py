"""Session states kept where the step left them (device memory), so that a session's next step does not copy its
state to the device again.

A step graph's ``state_outputs`` (manifest) name the inputs that are state and the outputs that carry their next
value (RSA: ``window`` -> ``next_window``; RMT: ``memory`` -> ``next_memory``). A caller that asks for it (an input
array named :data:`STATE_HANDLE`, one int64 per row: 0 for "none", else the handle its previous step returned) gets
back, beside the host outputs it always gets, an output :data:`STATE_HANDLE`: per row, a handle to the row's new
state outputs as they lie on the device (:class:`DeviceStates`). Passed in again with the host state (which still
travels, and still goes to Redis at each commit), a live handle makes the backend stack the rows' device tensors
instead of copying the host arrays; a handle that is not live (dropped past the bound, never seen on this engine:
another replica's, an older run's) is ignored, and the host arrays are copied as always. Handles are random 63-bit
numbers, so one read back from elsewhere never names another session's state.

The table is bounded in bytes (``RTSERVE_DEVICE_STATE_BYTES``); past it the least recently used handles are dropped
(their sessions' next steps copy the host state). A batch's state outputs are kept as one copy per output (one kernel
each, however many rows: a step is launch-bound, and a captured graph's outputs are overwritten by its next replay);
its rows' handles point into it, and the copy is counted, and freed, whole: when its last handle goes. The handle
stands for the exact state its step produced: a caller that changes the state on the host between steps passes 0
(or no handle) for that row.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

STATE_HANDLE = "__state_handle"  # the input and output array of handles, int64 per row; 0: none
NONE = 0


class DeviceStates:
    """Per handle, a row of a kept batch of state outputs on the device; least recently used dropped past
    ``max_bytes`` (a kept batch counts whole until its last row's handle is dropped)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._handles: OrderedDict[int, tuple[int, int]] = OrderedDict()  # handle -> (batch, row)
        self._batches: dict[int, list[Any]] = {}  # batch -> [{input name: tensor (B, ...)}, live rows, bytes]
        self._next_batch = 0
        self.nbytes = 0
        self.reused_rows = self.copied_rows = self.dropped = 0  # counters (tests, benchmarks)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._handles)

    def stacked(self, handles: np.ndarray, names: Sequence[str]) -> dict[str, Any] | None:
        """The device tensors of ``names`` for every row of ``handles``, stacked; None unless every row's is live."""
        import torch

        wanted = [int(handle) for handle in handles.reshape(-1)]
        with self._lock:
            places = [self._handles.get(handle) for handle in wanted]
            if not places or any(place is None for place in places):
                self.copied_rows += len(wanted)
                return None
            for handle in wanted:
                self._handles.move_to_end(handle)
            self.reused_rows += len(wanted)
            batches = {batch: self._batches[batch][0] for batch, _ in places}  # type: ignore[misc]
        if len(batches) == 1:  # a cohort back together: one gather per state (none when it is the whole batch)
            ((batch, tensors),) = batches.items()
            rows = [row for _, row in places]  # type: ignore[misc]
            if rows == list(range(next(iter(tensors.values())).shape[0])):
                return {name: tensors[name] for name in names}
            index = torch.tensor(rows, device=next(iter(tensors.values())).device)
            return {name: tensors[name].index_select(0, index) for name in names}
        return {name: torch.cat([batches[batch][name][row : row + 1] for batch, row in places])  # type: ignore[misc]
                for name in names}

    def keep(self, outputs: Mapping[str, Any], rows: int) -> np.ndarray:
        """Keep ``outputs`` (input name -> the batch's device tensor of its next value), a handle per row; returns
        the handles, int64 per row (0 for every row when the table keeps nothing or the batch exceeds it)."""
        handles = np.zeros(rows, dtype=np.int64)
        if self.max_bytes <= 0 or not outputs:
            return handles
        size = sum(tensor.numel() * tensor.element_size() for tensor in outputs.values())
        if size > self.max_bytes:
            return handles
        copies = {name: tensor.clone() for name, tensor in outputs.items()}
        with self._lock:
            batch, self._next_batch = self._next_batch, self._next_batch + 1
            self._batches[batch] = [copies, rows, size]
            self.nbytes += size
            for row in range(rows):
                handle = secrets.randbits(63) or 1
                self._handles[handle] = (batch, row)
                handles[row] = handle
            while self.nbytes > self.max_bytes and self._handles:
                _, (old, _) = self._handles.popitem(last=False)
                self.dropped += 1
                kept = self._batches[old]
                kept[1] -= 1
                if kept[1] == 0:
                    self.nbytes -= kept[2]
                    del self._batches[old]
        return handles

    def forget(self, handles: np.ndarray) -> None:
        """Drop these handles (their states moved on: each step returns new ones)."""
        with self._lock:
            for handle in handles.reshape(-1):
                place = self._handles.pop(int(handle), None)
                if place is None:
                    continue
                kept = self._batches[place[0]]
                kept[1] -= 1
                if kept[1] == 0:
                    self.nbytes -= kept[2]
                    del self._batches[place[0]]

    def clear(self) -> None:
        with self._lock:
            self._handles.clear()
            self._batches.clear()
            self.nbytes = 0
