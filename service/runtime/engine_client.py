"""A front end's side of the engine (:mod:`service.runtime.engine`): one connection, any number of calls in flight,
and the stand-ins a front end's pipelines hold where a graph's runner would be (:class:`RemoteGraph`,
:class:`RemoteDecodeLoop`).

**A batch per frame.** The steps a front end's pipelines submit in one turn of its event loop (the sessions whose
answers came back in one frame resume together, and submit together) leave as one frame per graph and shape
(:class:`StepFrames`): their rows stacked, at most the graph's largest batch, answered by one frame that the front end
splits back. The engine's batcher sees the frame as one call of many rows, so the engine's cost per frame (a read, a
header, a task, a hop to the graph's thread, a write) is shared by its rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from models.decoding import Search
from service.runtime.batcher import signature
from service.runtime.engine_wire import (
    FIXED,
    STATE,
    VOCAB,
    EngineUnavailable,
    error_from,
    pack,
    read_frame,
    search_spec,
    unpack,
)

CONNECT_SECONDS = 600.0  # a front end waits this long for the engine's socket (the engine loads every model first)


class EngineClient:
    """A front end's one connection to the engine: any number of calls in flight, matched by id."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.models: dict[str, dict[str, Any]] = {}  # the engine's description of each model (hello)
        self.errors: dict[str, str] = {}  # entries the engine could not load
        self._ids = itertools.count(1)
        self._calls: dict[int, tuple[asyncio.Future[Any], Callable[[list[int]], None] | None]] = {}
        self._frames: dict[int, StepFrame] = {}  # step frames in flight
        self.steps = StepFrames(self)
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None

    async def connect(self, timeout: float = CONNECT_SECONDS) -> None:
        """Connect (waiting for the engine's socket while the engine loads its models) and read its hello.

        The wait ends early when this process's parent is gone: the engine, its child too, has gone with it (a
        front end still starting when the parent was killed would otherwise wait out ``timeout``, since its
        server acts on the SIGTERM only once started)."""
        deadline = asyncio.get_running_loop().time() + timeout
        parent = multiprocessing.parent_process()  # a front end's: the process that started it and the engine
        while True:
            try:
                reader, self._writer = await asyncio.open_unix_connection(str(self.path))
                break
            except (FileNotFoundError, ConnectionRefusedError) as error:
                if parent is not None and not parent.is_alive():
                    raise EngineUnavailable("the parent process is gone, and the engine with it") from error
                if asyncio.get_running_loop().time() > deadline:
                    raise EngineUnavailable(f"no engine answered at {self.path} within {timeout:.0f} s") from error
                await asyncio.sleep(0.1)
        header, _ = await read_frame(reader)
        self.models, self.errors = header["models"], header.get("errors", {})
        self._reader_task = asyncio.create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                header, body = await read_frame(reader)
                frame = self._frames.pop(header["id"], None)
                if frame is not None:
                    frame.answer(header, body)
                    continue
                future, on_token = self._calls.get(header["id"], (None, None))
                if future is None or future.done():
                    continue
                if header["kind"] == "tokens":
                    if on_token is not None:
                        on_token(header["ids"])
                elif header["kind"] == "result":
                    future.set_result(header["ids"] if "ids" in header else unpack(header["arrays"], body))
                else:
                    future.set_exception(error_from(header))
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            self._fail(EngineUnavailable(f"the engine at {self.path} closed the connection ({error!r})"))

    def _fail(self, error: Exception) -> None:
        for future, _ in self._calls.values():
            if not future.done():
                future.set_exception(error)
        self._calls.clear()
        for frame in self._frames.values():
            frame.fail(error)
        self._frames.clear()
        self.steps.fail(error)

    def _check_open(self) -> asyncio.StreamWriter:
        if self._writer is None or self._writer.is_closing() or self._reader_task is None or self._reader_task.done():
            raise EngineUnavailable(f"no connection to the engine at {self.path}")
        return self._writer

    def send_frame(self, frame: StepFrame, header: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        """Send one step frame (:class:`StepFrames`); its answer goes to ``frame``."""
        try:
            writer = self._check_open()
        except EngineUnavailable as error:
            frame.fail(error)
            return
        call = next(self._ids)
        frame.call = call
        self._frames[call] = frame
        writer.write(pack({**header, "id": call}, arrays))

    def cancel_frame(self, call: int) -> None:
        """Every caller of frame ``call`` left: the engine drops it."""
        if self._frames.pop(call, None) is not None and self._writer is not None and not self._writer.is_closing():
            self._writer.write(pack({"kind": "cancel", "id": call}))

    async def call(self, header: dict[str, Any], arrays: Mapping[str, np.ndarray],
                   on_token: Callable[[list[int]], None] | None = None) -> Any:
        writer = self._check_open()
        call = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call] = (future, on_token)
        writer.write(pack({**header, "id": call}, arrays))
        try:
            return await future
        except asyncio.CancelledError:  # the caller left: the engine drops the call (a search leaves its batch)
            if not writer.is_closing():
                writer.write(pack({"kind": "cancel", "id": call}))
            raise
        finally:
            self._calls.pop(call, None)

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        if self._writer is not None:
            self._writer.close()
        self._fail(EngineUnavailable("the front end is shutting down"))


class RemoteGraph:
    """Where a front end's pipeline has a graph's batcher: ``submit`` sends the step to the engine's batcher."""

    def __init__(self, client: EngineClient, model: str, graph: str, max_batch_size: int) -> None:
        self.client, self.model, self.graph = client, model, graph
        self.max_batch_size = max_batch_size

    async def submit(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One step (batch axis 0), sent with the other steps of this turn of the loop (:class:`StepFrames`)."""
        return await self.client.steps.submit(self.model, self.graph, inputs, self.max_batch_size)

    async def close(self) -> None:
        pass


class RemoteDecodeLoop(RemoteGraph):
    """Where a front end's pipeline has a decode loop: ``generate`` runs the search in the engine's loop."""

    async def generate(self, search: Search, fixed: Mapping[str, np.ndarray], state: Mapping[str, np.ndarray]
                       ) -> list[int]:
        stream = getattr(search, "on_token", None)
        arrays = {VOCAB: search.vocab_ids, **{FIXED + k: v for k, v in fixed.items()},
                  **{STATE + k: v for k, v in state.items()}}
        header = {"kind": "generate", "model": self.model, "graph": self.graph, "search": search_spec(search),
                  "stream": stream is not None}
        ids: list[int] = await self.client.call(header, arrays, on_token=stream)
        return ids


class StepFrame:
    """One step frame in flight: its callers, their rows in order, and how its answer is split back to them."""

    def __init__(self, client: EngineClient, calls: list[tuple[int, asyncio.Future[dict[str, np.ndarray]]]]) -> None:
        self.client, self.calls = client, calls  # (rows, future) per caller, in the frame's order
        self.call = 0  # the frame's id on the wire, once sent
        for _, future in calls:
            future.add_done_callback(self._left)

    def _left(self, future: asyncio.Future[Any]) -> None:
        """A caller left (cancelled): once every caller has, the engine is told to drop the frame."""
        if future.cancelled() and self.call and all(f.done() for _, f in self.calls):
            self.client.cancel_frame(self.call)

    def answer(self, header: Mapping[str, Any], body: bytearray) -> None:
        if header["kind"] != "result":
            self.fail(error_from(header))
            return
        outputs = unpack(header["arrays"], body)
        if len(self.calls) == 1:  # a lone caller gets the frame's arrays whole
            future = self.calls[0][1]
            if not future.done():
                future.set_result(outputs)
            return
        offset = 0
        for rows, future in self.calls:
            # copies: a kept state must not hold the whole frame's body alive (the state cache counts its rows)
            part = {name: value[offset : offset + rows].copy() for name, value in outputs.items()}
            offset += rows
            if not future.done():
                future.set_result(part)

    def fail(self, error: BaseException) -> None:
        for _, future in self.calls:
            if not future.done():
                future.set_exception(error)


class StepFrames:
    """The steps a front end's pipelines submit in one turn of its event loop, sent as one frame per graph.

    :meth:`submit` queues a step and, for the first of a turn, asks the loop to send them all once the turn's other
    callbacks have run (``call_soon``): the sessions an answer frame woke resume in one turn and submit in it. Steps
    stack when their inputs agree on every non-batch axis and dtype (the engine's batcher's rule); a frame holds at
    most the graph's largest batch. No step waits for company: the frame leaves in the same turn.
    """

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self._waiting: dict[tuple[str, str, int], list[tuple[dict[str, np.ndarray], int, asyncio.Future[Any]]]] = {}
        self._scheduled = False
        self.frames_sent = 0  # frames and steps sent, for the benchmarks
        self.steps_sent = 0

    def submit(self, model: str, graph: str, inputs: Mapping[str, np.ndarray],
               limit: int) -> asyncio.Future[dict[str, np.ndarray]]:
        arrays = {name: np.asarray(value) for name, value in inputs.items()}
        rows = {array.shape[0] for array in arrays.values()}
        if len(rows) != 1:
            raise ValueError(f"inputs disagree on the batch axis: { {k: v.shape for k, v in arrays.items()} }")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        self._waiting.setdefault((model, graph, limit), []).append((arrays, rows.pop(), future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._send)
        return future

    def _send(self) -> None:
        self._scheduled = False
        waiting, self._waiting = self._waiting, {}
        for (model, graph, limit), steps in waiting.items():
            by_shape: dict[Any, list[tuple[dict[str, np.ndarray], int, asyncio.Future[Any]]]] = {}
            for step in steps:
                if not step[2].done():  # a caller that left before its frame did is not sent
                    by_shape.setdefault(signature(step[0]), []).append(step)
            for group in by_shape.values():
                frame: list[tuple[dict[str, np.ndarray], int, asyncio.Future[Any]]] = []
                rows = 0
                for step in group:
                    if frame and rows + step[1] > limit:
                        self._send_frame(model, graph, frame)
                        frame, rows = [], 0
                    frame.append(step)
                    rows += step[1]
                self._send_frame(model, graph, frame)

    def _send_frame(self, model: str, graph: str, steps: list[tuple[dict[str, np.ndarray], int, asyncio.Future[Any]]]
                    ) -> None:
        if len(steps) == 1:
            stacked = steps[0][0]
        else:
            stacked = {name: np.concatenate([step[0][name] for step in steps]) for name in steps[0][0]}
        frame = StepFrame(self.client, [(rows, future) for _, rows, future in steps])
        self.frames_sent += 1
        self.steps_sent += len(steps)
        self.client.send_frame(frame, {"kind": "step", "model": model, "graph": graph}, stacked)

    def fail(self, error: BaseException) -> None:
        """The connection is gone: the steps not yet sent fail too."""
        waiting, self._waiting = self._waiting, {}
        for steps in waiting.values():
            for _, _, future in steps:
                if not future.done():
                    future.set_exception(error)
