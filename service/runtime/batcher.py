"""Continuous batching of graph steps, knowing nothing about the model family.

Concurrent calls to :meth:`DynamicBatcher.submit` — from one-shot requests
and from different sessions — are stacked along axis 0 into one call of the
backend and split back. The worker never waits on an idle queue:

- when the worker is idle, a step runs at once (a lone request pays no delay);
- while a batch runs, arrivals queue up, and the next batch is everything
  compatible that is queued when the worker comes free (continuous batching);
- ``max_queue_delay`` only bounds waiting *for company that is expected*: when
  fewer rows are queued than the previous batch had, the worker waits at most
  that long for the rest (the callers of the last batch usually come back
  together), never when the previous batch was as small as this one.

Only calls whose inputs agree on every non-batch axis and dtype are stacked
(a chunk of 5 rows and one of 9 go in separate calls); graphs whose inputs
differ in length use :mod:`service.runtime.decode_loop` instead, which pads
and masks. The backend runs on a worker thread: the event loop never blocks
on model execution.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from service.metrics import ServiceMetrics
from service.runtime.backends import Backend
from service.runtime.graph_runner import GraphRunner

Signature = tuple[tuple[str, tuple[int, ...], str], ...]


def signature(inputs: Mapping[str, np.ndarray]) -> Signature:
    return tuple((name, tuple(array.shape[1:]), array.dtype.str) for name, array in sorted(inputs.items()))


@dataclass(eq=False)  # identity, not field equality: deque.remove must never compare arrays
class _Pending:
    inputs: dict[str, np.ndarray]
    rows: int
    key: Signature
    future: asyncio.Future[dict[str, np.ndarray]]
    enqueued: float = field(default_factory=time.perf_counter)


class DynamicBatcher(GraphRunner):
    def __init__(
        self,
        backend: Backend,
        model: str,
        graph: str,
        max_batch_size: int,
        max_queue_delay_seconds: float,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        super().__init__(backend, model, graph, max_batch_size, metrics)
        self.max_queue_delay = max_queue_delay_seconds
        self._queue: deque[_Pending] = deque()
        self._last_rows = 0  # rows of the previous batch: how much company to expect

    async def submit(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one step (batch axis 0, usually of size 1) as part of a batch; returns its own rows."""
        self._ensure_worker()
        arrays = {name: np.asarray(value) for name, value in inputs.items()}
        rows = {array.shape[0] for array in arrays.values()}
        if len(rows) != 1:
            raise ValueError(f"inputs disagree on the batch axis: { {k: v.shape for k, v in arrays.items()} }")
        pending = _Pending(arrays, rows.pop(), signature(arrays), asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        self._wakeup.set()
        return await pending.future

    async def _run_forever(self) -> None:
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch: list[_Pending] = []
            try:
                await self._wait_for_expected_company()
                self._take(batch)
                await self._execute(batch)
            except Exception as error:  # a fault here must fail its callers, never strand them
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(error)

    async def _wait_for_expected_company(self) -> None:
        """Wait, at most ``max_queue_delay`` after the oldest arrival, while fewer rows are queued than last time."""
        wanted = min(self._last_rows, self.max_batch_size)
        if self.max_queue_delay <= 0:
            return
        deadline = self._queue[0].enqueued + self.max_queue_delay
        while sum(p.rows for p in self._queue) < wanted:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=remaining)
            except TimeoutError:
                return

    def _take(self, batch: list[_Pending]) -> None:
        """Fill ``batch``: the oldest pending call plus every queued call of the same shapes, up to the limit."""
        first = self._queue.popleft()
        batch.append(first)
        rows = first.rows
        for pending in list(self._queue):
            if rows >= self.max_batch_size:
                break
            if pending.key == first.key and rows + pending.rows <= self.max_batch_size:
                self._queue.remove(pending)
                batch.append(pending)
                rows += pending.rows

    async def _execute(self, batch: list[_Pending]) -> None:
        live = [pending for pending in batch if not pending.future.done()]  # a cancelled caller is skipped
        if not live:
            return
        stacked = {name: np.concatenate([p.inputs[name] for p in live], axis=0) for name in live[0].inputs}
        rows = sum(p.rows for p in live)
        self._last_rows = rows
        try:
            outputs = await self._run_batch(stacked, rows, [pending.enqueued for pending in live])
        except Exception as error:  # the whole batch failed: every caller learns why
            for pending in live:
                if not pending.future.done():
                    pending.future.set_exception(error)
            return
        offset = 0
        for pending in live:
            part = {name: value[offset : offset + pending.rows] for name, value in outputs.items()}
            offset += pending.rows
            if not pending.future.done():
                pending.future.set_result(part)
