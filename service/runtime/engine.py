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
number of calls in flight on its one connection. When the socket breaks, every call in flight fails
with :class:`EngineUnavailable` (a 503; a piece's retry is safe, as after any 503).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import logging
import math
import multiprocessing
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from models.decoding import BeamSearch, GreedySearch, Search
from service.runtime.pipeline import InputError

log = logging.getLogger("rtserve.engine")

FRAME = struct.Struct("<II")  # header bytes, body bytes
CONNECT_SECONDS = 600.0  # a front end waits this long for the engine's socket (the engine loads every model first)


class EngineUnavailable(RuntimeError):
    """The engine process cannot be reached, or left while a call was in flight (HTTP 503)."""


# ---- the wire ------------------------------------------------------------------------------------
def pack(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None) -> bytes:
    """One frame: ``header`` plus the arrays' specs as JSON, then the arrays' bytes."""
    specs, parts = [], []
    for name, value in (arrays or {}).items():
        array = np.require(value, requirements="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        if array.dtype.hasobject:
            raise TypeError(f"array {name!r} holds Python objects; only numeric and bool arrays cross to the engine")
        specs.append([name, array.dtype.str, list(array.shape)])
        parts.append(array.tobytes())
    head = orjson.dumps({**header, "arrays": specs})
    body = b"".join(parts)
    return FRAME.pack(len(head), len(body)) + head + body


def unpack(specs: list[list[Any]], body: bytearray) -> dict[str, np.ndarray]:
    """The arrays of a frame's body: views of its (writable) bytes."""
    arrays, offset = {}, 0
    for name, dtype, shape in specs:
        kind = np.dtype(dtype)
        count = math.prod(shape)
        arrays[name] = np.frombuffer(body, kind, count, offset).reshape(shape)
        offset += count * kind.itemsize
    return arrays


async def read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytearray]:
    head_bytes, body_bytes = FRAME.unpack(await reader.readexactly(FRAME.size))
    header = orjson.loads(await reader.readexactly(head_bytes))
    body = bytearray(await reader.readexactly(body_bytes)) if body_bytes else bytearray()
    return header, body


def error_header(error: BaseException) -> dict[str, Any]:
    header: dict[str, Any] = {"type": type(error).__name__, "message": str(error)}
    if isinstance(error, InputError):
        header |= {"loc": list(error.loc) if error.loc is not None else None, "kind": error.kind}
    return header


def error_from(header: Mapping[str, Any]) -> Exception:
    """The engine's error raised again in the front end: an InputError, a builtin type, or a RuntimeError."""
    kind, message = header["type"], header["message"]
    if kind == "InputError":
        return InputError(message, loc=header.get("loc"), kind=header.get("kind", "value_error"))
    builtin = getattr(builtins, kind, None)
    if isinstance(builtin, type) and issubclass(builtin, Exception) and builtin is not EngineUnavailable:
        try:
            return builtin(message)
        except TypeError:
            pass
    return RuntimeError(f"the engine failed: {kind}: {message}")


def search_spec(search: Search) -> dict[str, Any]:
    """What the engine needs to rebuild a search (its vocabulary travels as an array)."""
    common = {"bos": int(search.bos), "eos": int(search.eos), "limit": int(search.limit),
              "no_repeat": int(search.no_repeat), "ends": sorted(int(i) for i in search.ends),
              "target": int(search.target), "min_length": int(search.min_length)}
    if isinstance(search, GreedySearch):
        return {"kind": "greedy", **common}
    if isinstance(search, BeamSearch):
        return {"kind": "beam", **common, "beams": search.rows, "length_penalty": search.length_penalty}
    raise TypeError(f"{type(search).__name__} cannot be sent to the engine")


def search_from(spec: Mapping[str, Any], vocab_ids: np.ndarray,
                on_token: Callable[[list[int]], None] | None) -> Search:
    common = (int(spec["bos"]), int(spec["eos"]), vocab_ids, int(spec["limit"]), int(spec["no_repeat"]))
    ends, target, min_length = frozenset(int(i) for i in spec["ends"]), int(spec["target"]), int(spec["min_length"])
    if spec["kind"] == "greedy":
        return GreedySearch(*common, on_token, ends, target, min_length)
    return BeamSearch(*common, int(spec["beams"]), float(spec["length_penalty"]), ends=ends, target=target,
                      min_length=min_length)


VOCAB = "__vocab_ids"  # the array of a generate frame that is the search's vocabulary
FIXED, STATE = "fixed:", "state:"  # prefixes of a generate frame's arrays


# ---- the engine process's side -------------------------------------------------------------------
class Engine:
    """Serves the models of ``registry`` (loaded with their graphs) to every front end that connects."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self.calls_in_flight = 0  # steps and searches of every front end, being served

    def alone(self) -> bool:
        """Whether the call being served is the engine's only one in flight: a light graph's step then runs on the
        event loop (:mod:`service.runtime.batcher`), as a lone request's does in one process."""
        return self.calls_in_flight == 1

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
                task = asyncio.create_task(run(header, body, writer))
                calls[call] = task
                self.calls_in_flight += 1
                task.add_done_callback(lambda _, call=call: self._done(calls, call))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the front end left: its calls are dropped (a decode search leaves the batch at the next step)
        finally:
            for task in list(calls.values()):
                task.cancel()
            writer.close()

    def _done(self, calls: dict[int, asyncio.Task[None]], call: int) -> None:
        calls.pop(call, None)
        self.calls_in_flight -= 1

    def _runner(self, header: Mapping[str, Any]) -> Any:
        return self.registry.models[header["model"]].batchers[header["graph"]]

    async def _step(self, header: Mapping[str, Any], body: bytearray, writer: asyncio.StreamWriter) -> None:
        try:
            outputs = await self._runner(header).submit(unpack(header["arrays"], body))
            frame = pack({"kind": "result", "id": header["id"]}, outputs)
        except Exception as error:  # the front end raises it again
            frame = pack({"kind": "error", "id": header["id"], **error_header(error)})
        if not writer.is_closing():
            writer.write(frame)

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


# ---- a front end's side --------------------------------------------------------------------------
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


# ---- the engine process --------------------------------------------------------------------------
async def serve_engine(socket_path: Path) -> None:
    """Load every model (graphs and batchers), serve them on ``socket_path`` until SIGTERM."""
    import signal

    from service.loop_lag import LoopLag
    from service.metrics import ServiceMetrics
    from service.runtime.registry import ModelRegistry
    from service.settings import Settings

    settings = Settings()
    metrics = ServiceMetrics(multiprocess_dir=settings.metrics_dir)  # the front ends' /metrics sum its batches
    registry = ModelRegistry(settings, metrics, alone=lambda: engine.alone())
    engine = Engine(registry)
    await registry.load_all()
    server = await engine.serve(socket_path)  # the socket appears once every model is loaded
    log.info("engine serving %d models on %s", len(registry.models), socket_path)
    loop_lag = LoopLag(observe=metrics.loop_lag.labels(loop="engine").observe)  # the one loop every front end feeds
    loop_lag.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await stop.wait()
    finally:
        loop_lag.stop()
        server.close()
        await registry.close()
        metrics.energy.close()
        socket_path.unlink(missing_ok=True)


def main() -> None:
    """``python -m service.runtime.engine <socket>``: the engine process (:mod:`service.workers` starts it)."""
    import signal
    import sys

    import uvloop

    from service.embedded_redis import die_with_parent
    from service.logs import configure_logging
    from service.runtime.devices import DeviceConfigError
    from service.settings import Settings

    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us after them
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    try:
        uvloop.run(serve_engine(Path(sys.argv[1])))  # the front ends' loop (uvicorn's): a fifth less CPU per call
    except DeviceConfigError as error:
        raise SystemExit(f"rtserve engine: {error}") from None


if __name__ == "__main__":
    main()
