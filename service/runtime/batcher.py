"""Dynamic batching of steps, knowing nothing about the model family.

Concurrent calls to :meth:`DynamicBatcher.submit` — from one-shot requests
and from different sessions — are stacked along axis 0 into one call of the
backend, up to ``max_batch_size`` rows within ``max_queue_delay`` of the
first, then split back. Only calls whose inputs agree on every non-batch
axis and dtype are stacked together (a chunk of 5 rows and one of 9 go in
separate calls). The backend runs on a worker thread: the event loop never
blocks on model execution.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from service.metrics import ServiceMetrics
from service.runtime.backends import Backend

Signature = tuple[tuple[str, tuple[int, ...], str], ...]


def signature(inputs: Mapping[str, np.ndarray]) -> Signature:
    return tuple((name, tuple(array.shape[1:]), array.dtype.str) for name, array in sorted(inputs.items()))


@dataclass(eq=False)  # identity, not field equality: deque.remove must never compare arrays
class _Pending:
    inputs: dict[str, np.ndarray]
    rows: int
    future: asyncio.Future[dict[str, np.ndarray]]
    enqueued: float = field(default_factory=time.perf_counter)


class DynamicBatcher:
    def __init__(
        self,
        backend: Backend,
        model: str,
        graph: str,
        max_batch_size: int,
        max_queue_delay_seconds: float,
        metrics: ServiceMetrics | None = None,
    ) -> None:
        self.backend = backend
        self.model, self.graph = model, graph
        self.max_batch_size = max_batch_size
        self.max_queue_delay = max_queue_delay_seconds
        self.metrics = metrics
        self._queue: deque[_Pending] = deque()
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{model}-{graph}")
        self._worker: asyncio.Task[None] | None = None

    async def submit(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one step (batch axis 0, usually of size 1) as part of a batch; returns its own rows."""
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run_forever())
        arrays = {name: np.asarray(value) for name, value in inputs.items()}
        rows = {array.shape[0] for array in arrays.values()}
        if len(rows) != 1:
            raise ValueError(f"inputs disagree on the batch axis: { {k: v.shape for k, v in arrays.items()} }")
        pending = _Pending(arrays, rows.pop(), asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        self._wakeup.set()
        return await pending.future

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run_forever(self) -> None:
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch: list[_Pending] = []
            try:
                await self._collect(batch)
                await self._execute(batch)
            except Exception as error:  # a fault here must fail its callers, never strand them
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(error)

    async def _collect(self, batch: list[_Pending]) -> None:
        """Fill ``batch``: the oldest pending call plus every compatible one arriving within the queue delay."""
        first = self._queue.popleft()
        batch.append(first)
        rows, key = first.rows, signature(first.inputs)
        deadline = first.enqueued + self.max_queue_delay
        while rows < self.max_batch_size:
            for pending in list(self._queue):
                if rows + pending.rows > self.max_batch_size:
                    continue
                if signature(pending.inputs) == key:
                    self._queue.remove(pending)
                    batch.append(pending)
                    rows += pending.rows
            remaining = deadline - time.perf_counter()
            if rows >= self.max_batch_size or remaining <= 0:
                break
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), timeout=remaining)
            except TimeoutError:
                pass

    async def _execute(self, batch: list[_Pending]) -> None:
        live = [pending for pending in batch if not pending.future.done()]  # a cancelled caller is skipped
        if not live:
            return
        started = time.perf_counter()
        stacked = {name: np.concatenate([p.inputs[name] for p in live], axis=0) for name in live[0].inputs}
        try:
            outputs = await asyncio.get_running_loop().run_in_executor(self._executor, self.backend.run, stacked)
        except Exception as error:  # the whole batch failed: every caller learns why
            for pending in live:
                if not pending.future.done():
                    pending.future.set_exception(error)
            return
        finished = time.perf_counter()
        if self.metrics is not None:
            self.metrics.batch_size.labels(model=self.model).observe(sum(p.rows for p in live))
            self.metrics.step_seconds.labels(model=self.model, backend=self.backend.name, graph=self.graph).observe(
                finished - started
            )
            for pending in live:
                self.metrics.queue_seconds.labels(model=self.model).observe(started - pending.enqueued)
        offset = 0
        for pending in live:
            part = {name: value[offset : offset + pending.rows] for name, value in outputs.items()}
            offset += pending.rows
            if not pending.future.done():
                pending.future.set_result(part)
