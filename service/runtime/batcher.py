"""Continuous batching of graph steps, knowing nothing about the model family.

Concurrent calls to :meth:`DynamicBatcher.submit` — from one-shot requests
and from different sessions — are stacked along axis 0 into one call of the
backend and split back. When a batch runs and which calls it holds is the
batching policy's decision (:mod:`service.runtime.batching`); the service's,
:class:`~service.runtime.batching.ContinuousBatching`:

- a batch runs as soon as the worker is free; calls that arrive while a batch
  runs form the next one (continuous batching);
- the one wait: when fewer rows are queued than the previous batch had, the
  worker waits, at most ``max_queue_delay`` after the oldest arrival, for the
  rest (the callers of the last batch usually come back together). A request
  that finds the worker free therefore runs at once after a batch of one row,
  and waits up to ``max_queue_delay`` after a larger batch when no one else
  comes (the batch of one it then runs resets the expectation to one row).

Only calls whose inputs agree on every non-batch axis and dtype are stacked
(a chunk of 5 rows and one of 9 go in separate calls); graphs whose inputs
differ in length use :mod:`service.runtime.decode_loop` instead, which pads
and masks. The backend runs on a worker thread: the event loop never blocks
on a batch. Two exceptions, for a *light* graph (one that a single thread runs
at batch 1 in under 2 ms, and every core not 1.5 times as fast, as its export
measured), where the hops to the worker's thread and back cost more CPU than
the step itself:

- the call of a request that is the process's only one in flight
  (``in_flight``: the process's requests; in the engine process, the rows of
  its calls), finding nothing queued, nothing running and no company
  promised, runs on the event loop at once, as the policy would have run it;
  with other requests in flight every call goes through the queue, so that
  theirs can join it;
- a batch that holds every request in flight (sessions stepping together and
  nothing else) runs on the event loop too (``whole_batches_on_loop``,
  ``RTSERVE_LIGHT_BATCHES_ON_LOOP``): no request could use the loop while it
  steps, and the requests that arrive meanwhile are read after it, as the
  next batch, which they could not have joined.

On a device whose step costs about the same at any batch size (a GPU:
``flat_step``, by default where the backend's device is CUDA), the company a
batch expects also counts the rows that arrived while the previous batch ran:
two cohorts out of phase (two front ends' frames, two sessions alternating)
each find the worker busy with the other, and without this would alternate
half-full batches for ever; with it the second waits (within
``max_queue_delay`` of its arrival) for the first to come back, and the two
run as one batch from then on. On a CPU, where a batch's time grows with its
rows, holding the worker idle would only lose time, and the rule stays off.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from service.metrics import ServiceMetrics
from service.runtime.backends import Backend
from service.runtime.batching import BatchingPolicy, ContinuousBatching
from service.runtime.graph_runner import GraphRunner

Signature = tuple[tuple[str, tuple[int, ...], np.dtype], ...]


def signature(inputs: Mapping[str, np.ndarray]) -> Signature:
    """What calls must share to be stacked: each input's name, its non-batch axes and its dtype."""
    return tuple((name, array.shape[1:], array.dtype) for name, array in sorted(inputs.items()))


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
        policy: BatchingPolicy | None = None,
        in_flight: Callable[[], int] | None = None,
        flat_step: bool | None = None,
        whole_batches_on_loop: bool = False,
    ) -> None:
        """``in_flight``: for a light graph, the requests in flight in this process (the engine's: their rows); a
        lone one's call, and with ``whole_batches_on_loop`` a batch of every one, then runs on the event loop (the
        module's docstring). None: every call goes through the worker. ``flat_step``: whether a batch costs about the
        same at any size (None: where the backend's device is CUDA)."""
        super().__init__(backend, model, graph, max_batch_size, metrics)
        self.flat_step = str(getattr(backend, "device", "cpu")).startswith("cuda") if flat_step is None else flat_step
        self._last_span = (0.0, 0.0)  # when the previous batch started and ended (perf_counter)
        self.policy: BatchingPolicy = policy or ContinuousBatching(max_queue_delay_seconds)
        self.in_flight = in_flight
        self.whole_batches_on_loop = whole_batches_on_loop and in_flight is not None
        self._queue: deque[_Pending] = deque()
        self._last_rows = 0  # rows of the previous batch: how much company to expect
        self._running = False  # a batch taken from the queue has not finished
        self._waiting_for_company = False  # the worker waits, with a timer, for the rows the policy expects

    async def submit(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one step (batch axis 0, usually of size 1) as part of a batch; returns its own rows."""
        self._ensure_worker()
        arrays = {name: np.asarray(value) for name, value in inputs.items()}
        rows = {array.shape[0] for array in arrays.values()}
        if len(rows) != 1:
            raise ValueError(f"inputs disagree on the batch axis: { {k: v.shape for k, v in arrays.items()} }")
        pending = _Pending(arrays, rows.pop(), signature(arrays), asyncio.get_running_loop().create_future())
        if (self.in_flight is not None and not self._queue and not self._running and self.in_flight() == 1
                and self.policy.run_at((pending,), self._last_rows, self.max_batch_size) <= time.perf_counter()):
            # no one to batch with, and the policy runs it at once: on the loop, without the worker and its thread
            self._last_rows = pending.rows
            return self._run_on_loop(arrays, pending.rows)
        self._queue.append(pending)
        if not self._waiting_for_company or self._company_came():
            self._wakeup.set()  # else the worker sleeps on: its timer wakes it, or the arrival that completes the batch
        return await pending.future

    def _company_came(self) -> bool:
        """Whether the policy runs the queued calls now: asked at each arrival while the worker waits for company,
        so that only the arrival that completes the batch wakes it."""
        return self._due_at() <= time.perf_counter()

    def _due_at(self) -> float:
        """When the policy runs the queued calls (``time.perf_counter()`` time), given the company it expects."""
        return self.policy.run_at(self._queue, self._expected(), self.max_batch_size)

    async def _run_forever(self) -> None:
        """The worker: one batch per turn of the loop.

        A turn decides when the next batch runs and which queued calls it holds; both are the policy's
        answers (``self.policy``), so a different policy changes no line here. The worker never polls: it
        sleeps on an empty queue, and while it waits for company each arrival asks the policy again, waking
        it only when the batch is due. A batch runs on the backend's own thread, so calls keep arriving
        meanwhile and form the next batch (continuous batching). Then, in order:
        """
        while True:
            # 1) Idle: sleep until a call arrives.
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch: list[_Pending] = []
            try:
                # 2) Wait for the company the policy expects, until the time it names.
                await self._wait_until_ready()
                # 3) Take the batch the policy picks: the oldest call and what may stack with it.
                batch = self.policy.take(self._queue, self.max_batch_size)
                for pending in batch:
                    self._queue.remove(pending)
                # 4) Run it and hand every caller its own rows.
                self._running = True
                await self._execute(batch)
            except Exception as error:  # a fault here must fail its callers, never strand them
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(error)
            finally:
                self._running = False

    async def _wait_until_ready(self) -> None:
        loop = asyncio.get_running_loop()
        while (remaining := self._due_at() - time.perf_counter()) > 0:
            self._wakeup.clear()
            # a timer that sets the event, not asyncio.wait_for: no task and no timeout scope per wait
            timer = loop.call_later(remaining, self._wakeup.set)
            self._waiting_for_company = True
            try:
                await self._wakeup.wait()
            finally:
                self._waiting_for_company = False
                timer.cancel()

    def _expected(self) -> int:
        """The rows the next batch expects: the previous batch's, and on a flat-step device also the rows that
        arrived while it ran (the module's docstring)."""
        if not self.flat_step:
            return self._last_rows
        started, ended = self._last_span
        return self._last_rows + sum(p.rows for p in self._queue if started <= p.enqueued < ended)

    async def _execute(self, batch: list[_Pending]) -> None:
        live = [pending for pending in batch if not pending.future.done()]  # a cancelled caller is skipped
        if not live:
            return
        if len(live) == 1:  # a lone call runs on its own arrays and gets the outputs whole
            stacked, rows = live[0].inputs, live[0].rows
        else:
            stacked = {name: np.concatenate([p.inputs[name] for p in live], axis=0) for name in live[0].inputs}
            rows = sum(p.rows for p in live)
        self._last_rows = rows
        started = time.perf_counter()
        try:
            enqueued = [pending.enqueued for pending in live]
            in_flight = self.in_flight if self.whole_batches_on_loop else None
            if in_flight is not None and in_flight() <= rows:  # every request in flight is in this batch
                outputs = self._run_on_loop(stacked, rows, enqueued)
            else:
                outputs = await self._run_batch(stacked, rows, enqueued)
        except Exception as error:  # the whole batch failed: every caller learns why
            for pending in live:
                if not pending.future.done():
                    pending.future.set_exception(error)
            return
        finally:
            self._last_span = (started, time.perf_counter())
        if len(live) == 1:
            if not live[0].future.done():
                live[0].future.set_result(outputs)
            return
        offset = 0
        for pending in live:
            part = {name: value[offset : offset + pending.rows] for name, value in outputs.items()}
            offset += pending.rows
            if not pending.future.done():
                pending.future.set_result(part)
