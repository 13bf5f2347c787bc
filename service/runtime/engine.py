"""One batching engine per device, fed by every front end.

With ``RTSERVE_WORKERS`` above 1 the service runs that many HTTP front ends and one engine process
(:mod:`service.workers` starts it). The engine owns the models: it loads every entry's graphs once,
with one batcher per graph (:mod:`service.runtime.batcher`) and one decode loop per decode graph
(:mod:`service.runtime.decode_loop`), and serves every front end over one Unix socket. A front end
loads what runs around the graphs (manifests, tokenizers, pipelines) and, where a graph runner would
be, a stand-in with the same calls (:class:`RemoteGraph`: ``submit``; :class:`RemoteDecodeLoop`:
``generate``) that sends the call to the engine. The engine's batcher stacks rows from every front
end into one batch, as it stacks rows of different sessions in one process: batches are not split by
process, and there is one copy of each model per device.

The wire: frames of ``<u32 header length><u32 body length>``, a JSON header (orjson), then the raw bytes
of the arrays the header names (name, dtype, shape, in order). No pickle crosses the boundary. A front
end sends ``step`` (a graph's inputs: the batcher's ``submit``) and ``generate`` (a search's description,
its fixed inputs and its state: the decode loop's ``generate``; greedy searches stream ``tokens`` frames
back as they grow) and ``cancel``; the engine answers ``result`` or ``error`` (the error's type and
message: an :class:`InputError` stays a 422 with its field, anything else is raised again in the front
end as the same builtin type where it is one). Every request carries an id, so a front end has any
number of calls in flight on its one connection. A ``step`` frame holds the rows of every step its front end
submitted in one turn of its loop (:class:`~service.runtime.engine_client.StepFrames`): the batcher takes it as one
call of that many rows, and one ``result`` frame answers it. When the socket breaks, every call in flight fails
with :class:`EngineUnavailable` (a 503; a piece's retry is safe, as after any 503).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from service.runtime.engine_wire import (
    FIXED,
    STATE,
    VOCAB,
    error_header,
    frame_rows,
    pack,
    read_frame,
    search_from,
    unpack,
)


class Engine:
    """Serves the models of ``registry`` (loaded with their graphs) to every front end that connects."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self.calls_in_flight = 0  # step frames and searches of every front end, being served
        # their rows (a search counts one): a light graph's call alone in flight, or a batch of them all, runs on the
        # event loop (:mod:`service.runtime.batcher`), as a lone request's or a whole cohort's does in one process
        self.rows_in_flight = 0

    def describe(self) -> dict[str, Any]:
        """What a front end shows of each model (GET /models) and cannot learn from the manifest."""
        return {ref: {"backend": m.backend, "providers": m.providers, "device": m.device, "precision": m.precision,
                      "max_batch_size": m.max_batch_size} for ref, m in self.registry.models.items()}

    async def serve(self, path: Path) -> asyncio.Server:
        path.unlink(missing_ok=True)
        return await asyncio.start_unix_server(self._front_end, path=str(path))

    async def _front_end(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        calls: dict[int, asyncio.Task[None]] = {}
        writer.write(pack({"kind": "hello", "models": self.describe(), "errors": self.registry.errors}))
        try:
            while True:
                header, body = await read_frame(reader)
                call = header.get("id")
                if header["kind"] == "cancel":
                    if call in calls:
                        calls[call].cancel()
                    continue
                run = self._step if header["kind"] == "step" else self._generate
                rows = frame_rows(header) if header["kind"] == "step" else 1
                task = asyncio.create_task(run(header, body, writer))
                calls[call] = task
                self.calls_in_flight += 1
                self.rows_in_flight += rows
                task.add_done_callback(lambda _, call=call, rows=rows: self._done(calls, call, rows))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the front end left: its calls are dropped (a decode search leaves the batch at the next step)
        finally:
            for task in list(calls.values()):
                task.cancel()
            writer.close()

    def _done(self, calls: dict[int, asyncio.Task[None]], call: int, rows: int) -> None:
        calls.pop(call, None)
        self.calls_in_flight -= 1
        self.rows_in_flight -= rows

    def _runner(self, header: Mapping[str, Any]) -> Any:
        return self.registry.models[header["model"]].batchers[header["graph"]]

    async def _step(self, header: Mapping[str, Any], body: bytearray, writer: asyncio.StreamWriter) -> None:
        try:
            outputs = await self._submit(self._runner(header), unpack(header["arrays"], body))
            frame = pack({"kind": "result", "id": header["id"]}, outputs)
        except Exception as error:  # the front end raises it again
            frame = pack({"kind": "error", "id": header["id"], **error_header(error)})
        if not writer.is_closing():
            writer.write(frame)

    @staticmethod
    async def _submit(runner: Any, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A frame's rows through the graph's batcher: as one call, or in parts of at most its largest batch (a front
        end's frames are no larger; a batch never is)."""
        rows = next(iter(inputs.values())).shape[0] if inputs else 0
        limit = runner.max_batch_size
        if rows <= limit:
            result: dict[str, np.ndarray] = await runner.submit(inputs)
            return result
        parts = await asyncio.gather(*(runner.submit({name: array[start : start + limit]
                                                     for name, array in inputs.items()})
                                       for start in range(0, rows, limit)))
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    async def _generate(self, header: Mapping[str, Any], body: bytearray, writer: asyncio.StreamWriter) -> None:
        call = header["id"]

        def on_token(ids: list[int]) -> None:
            if not writer.is_closing():
                writer.write(pack({"kind": "tokens", "id": call, "ids": list(map(int, ids))}))

        try:
            arrays = unpack(header["arrays"], body)
            fixed = {name[len(FIXED):]: a for name, a in arrays.items() if name.startswith(FIXED)}
            state = {name[len(STATE):]: a for name, a in arrays.items() if name.startswith(STATE)}
            search = search_from(header["search"], arrays[VOCAB], on_token if header.get("stream") else None)
            ids = await self._runner(header).generate(search, fixed, state)
            frame = pack({"kind": "result", "id": call, "ids": list(map(int, ids))})
        except Exception as error:
            frame = pack({"kind": "error", "id": call, **error_header(error)})
        if not writer.is_closing():
            writer.write(frame)
