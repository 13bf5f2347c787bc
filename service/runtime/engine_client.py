"""A front end's side of the engine (:mod:`service.runtime.engine`): one connection, any number of calls in flight,
and the stand-ins a front end's pipelines hold where a graph's runner would be (:class:`RemoteGraph`,
:class:`RemoteDecodeLoop`)."""

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

    async def call(self, header: dict[str, Any], arrays: Mapping[str, np.ndarray],
                   on_token: Callable[[list[int]], None] | None = None) -> Any:
        if self._writer is None or self._writer.is_closing() or self._reader_task is None or self._reader_task.done():
            raise EngineUnavailable(f"no connection to the engine at {self.path}")
        call = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call] = (future, on_token)
        self._writer.write(pack({**header, "id": call}, arrays))
        try:
            return await future
        except asyncio.CancelledError:  # the caller left: the engine drops the call (a search leaves its batch)
            if not self._writer.is_closing():
                self._writer.write(pack({"kind": "cancel", "id": call}))
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
        result: dict[str, np.ndarray] = await self.client.call(
            {"kind": "step", "model": self.model, "graph": self.graph}, inputs)
        return result

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
