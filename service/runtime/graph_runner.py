"""What both runners of a graph share: a worker task on the event loop and one thread for the backend.

:class:`GraphRunner` starts its worker on first use, runs a batch on its own thread (the event loop
never blocks on a model), charges the batch's GPU energy and records its size, duration and queue
times; subclasses decide what a batch is (:mod:`service.runtime.batcher`: stacked steps;
:mod:`service.runtime.decode_loop`: one token of every live search).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from service.metrics import ServiceMetrics, metered
from service.runtime.backends import Backend


class GraphRunner:
    def __init__(
        self, backend: Backend, model: str, graph: str, max_batch_size: int, metrics: ServiceMetrics | None = None
    ) -> None:
        self.backend = backend
        self.model, self.graph = model, graph
        self.max_batch_size = max_batch_size
        self.metrics = metrics
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{model}-{graph}")
        self._worker: asyncio.Task[None] | None = None

    def _ensure_worker(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._run_forever())

    async def _run_forever(self) -> None:
        raise NotImplementedError

    def _run_on_loop(self, inputs: Mapping[str, np.ndarray], rows: int,
                     enqueued: list[float] | None = None) -> dict[str, np.ndarray]:
        """One call of the backend on the event loop itself, metered and recorded as :meth:`_run_batch` is: for
        a light graph, where the two hops to the thread and back cost more than the step. ``enqueued``: as for
        :meth:`_run_batch` (None: a call that did not queue)."""
        started = time.perf_counter()
        with metered(self.metrics, self.backend, self.model, rows):
            outputs = self.backend.run(inputs)
        self._observe(rows, started, [started] if enqueued is None else enqueued)
        return outputs

    async def _run_batch(self, inputs: Mapping[str, np.ndarray], rows: int, enqueued: list[float],
                         keep: Collection[str] = ()) -> dict[str, np.ndarray]:
        """One call of the backend on its thread; ``enqueued``: when each caller new to this batch arrived;
        ``keep``: inputs passed again, unchanged, at the next call (the backend keeps their device copies)."""
        started = time.perf_counter()
        run = functools.partial(self.backend.run, inputs, keep=keep)
        with metered(self.metrics, self.backend, self.model, rows):
            outputs = await asyncio.get_running_loop().run_in_executor(self._executor, run)
        self._observe(rows, started, enqueued)
        return outputs

    def _observe(self, rows: int, started: float, enqueued: list[float]) -> None:
        """The batch's size and duration (from ``started``), and how long each caller queued before it."""
        if self.metrics is not None:
            self.metrics.observe_batch(self.model, self.backend.name, self.graph, rows,
                                       time.perf_counter() - started, [started - at for at in enqueued])

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)
