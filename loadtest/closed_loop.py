"""One closed-loop load client for every server the bench compares: N concurrent sessions, each sending its K
pieces in order and waiting for each answer, driven from several client processes, with the CPU of each side.
A run may hold more sessions than it keeps in flight (``concurrency``): they then follow one another in N slots,
so that a run lasts long enough to be measured while N sessions at a time is what the servers see.

Transports (:data:`TRANSPORTS`):

- ``rtserve-http``: ``POST /sessions``, then ``POST /sessions/{id}/segments`` with the piece's body
  (``{"seq", "rows"}`` or ``{"seq", "text"}``); afterwards ``finish`` and ``DELETE``.
- ``rtserve-ws``: the session stream. After ``POST /sessions``, ``ws://host/sessions/{id}/stream`` (the API key
  as ``X-API-Key`` at the upgrade); the first frame is ``{"event": "open", ...}``; a piece frame is the body of
  the segments route and its answer frame that route's 200 answer; ``{"finish": {}}`` answers the finish; an error
  frame is ``{"event": "error", "data", "status"}``. An rtserve that answers the upgrade with 404 or 403 does not
  serve the stream: the run says so (:attr:`Run.unavailable`) instead of failing.
- ``rtserve-ws-binary``: the same stream, each piece of rows sent as a binary frame (a 16-byte header: seq, rows,
  columns; then the rows' little-endian float32 values) instead of JSON text.
- ``triton-http``: KServe v2 ``POST /v2/models/{m}/infer``, JSON tensors, ``parameters.sequence_id`` with
  ``sequence_start`` on the first piece and ``sequence_end`` on the last.
- ``triton-http-binary``: the same request with the rows as binary tensor data (Triton's extension: the JSON header,
  then the float32 values; ``Inference-Header-Content-Length``), the answer JSON as before.

Every answer is checked: rtserve's ``session.seq`` and ``session.segments`` must equal the piece's number (one
piece, one step), Triton's ``STEPS`` output likewise. Bodies are prepared before the clock starts, sessions are
opened before it and finished after it; the clock runs from the first piece sent to the last answer.

Processes: :class:`ClientPool` keeps ``processes`` worker processes (spawned once; each runs asyncio + aiohttp
over its share of the sessions). A run: every worker opens its sessions and says ready; the parent reads the
server's CPU, says go, and reads the server's CPU again once every worker has its last answer. The client's CPU is
what its worker processes spent (user + system) over their window; :func:`client_limit` says when the client,
not the server, was what limited the run.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

TRANSPORTS = ("rtserve-http", "rtserve-ws", "rtserve-ws-binary", "triton-http", "triton-http-binary")
STREAMS = ("rtserve-ws", "rtserve-ws-binary")
# rtserve's transports by the names the profiling scripts take (benchmarks/piece_profile.py, piece_instructions.py)
RTSERVE_TRANSPORTS = {"http": "rtserve-http", "stream": "rtserve-ws", "binary-stream": "rtserve-ws-binary"}
TRITON = ("triton-http", "triton-http-binary")
BUSY_LIMIT = 0.9  # a client process busy this share of the run's wall time, or the cores this full: client-bound
REQUEST_TIMEOUT_SECONDS = 300.0


@dataclass(frozen=True)
class Target:
    """Where a run sends its pieces and how."""

    transport: str  # one of TRANSPORTS
    url: str  # http://127.0.0.1:port
    model: str  # rtserve: name:version; Triton: the model's name
    api_key: str | None = None  # rtserve's, when it has RTSERVE_API_KEYS
    text: bool = False  # Triton: the piece's text goes as TEXT (BYTES)
    piece_input: tuple[str, str] = ("values", "FP32")  # Triton, rows: the tensor the rows go in, its datatype
    outputs: tuple[str, ...] = ()  # Triton: the outputs to ask for (STEPS is added)


@dataclass
class Run:
    """What one closed-loop run measured."""

    transport: str
    sessions: int  # in flight at a time
    pieces: int  # answered
    wall_seconds: float
    latencies: list[float]  # seconds, every answered piece
    server_cpu_seconds: float
    client_cpu_seconds: float  # every client process, over its window
    client_busy: float  # the busiest client process's CPU / its wall time
    processes: int
    errors: list[str] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)  # each session's last answer (JSON), with keep_answers
    unavailable: str | None = None  # the transport is not served (e.g. no session stream)


# ---- the worker's side ----------------------------------------------------------------------------
def triton_body(body: bytes, target: Target, sequence_id: int, first: bool, last: bool, binary: bool = False) -> bytes:
    """rtserve's piece body as the KServe v2 request of the same piece; with ``binary``, its rows as binary tensor
    data: the JSON header, a newline, then the values, little-endian, of the input's datatype (FP32 or FP64)."""
    piece = json.loads(body)
    data = b""
    if target.text:
        inputs = [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [piece["text"]]}]
    else:
        rows = piece["rows"]
        name, datatype = target.piece_input
        inputs = [{"name": name, "shape": [1, len(rows), len(rows[0])], "datatype": datatype,
                   "data": [value for row in rows for value in row]}]
        if binary:
            import numpy as np

            data = np.asarray(inputs[0].pop("data"), dtype={"FP32": "<f4", "FP64": "<f8"}[datatype]).tobytes()
            inputs[0]["parameters"] = {"binary_data_size": len(data)}
    header = json.dumps({
        "parameters": {"sequence_id": sequence_id, "sequence_start": first, "sequence_end": last},
        "inputs": inputs, "outputs": [{"name": name} for name in (*target.outputs, "STEPS")],
    }, separators=(",", ":")).encode()
    return header + b"\n" + data if binary else header


def binary_piece(body: bytes) -> bytes:
    """A ``{"seq", "rows"}`` piece as the session stream's binary frame (the client's)."""
    from rtserve.client import binary_rows_frame

    piece = json.loads(body)
    return binary_rows_frame(piece["seq"], piece["rows"])


def triton_steps(answer: dict[str, Any]) -> int:
    return int(next(o for o in answer["outputs"] if o["name"] == "STEPS")["data"][0])


class Unavailable(Exception):
    """The server does not serve this transport."""


class SessionDriver:
    """One session over one transport: open (untimed), pieces (timed, each checked), close (untimed)."""

    def __init__(self, http: Any, target: Target, bodies: list[bytes], sequence_id: int) -> None:
        self.http, self.target, self.bodies = http, target, bodies
        self.sequence_id, self.session_id, self.ws = sequence_id, None, None
        self.latencies: list[float] = []
        self.last: Any = None

    async def open(self) -> None:
        import aiohttp

        if self.target.transport in TRITON:
            last, binary = len(self.bodies) - 1, self.target.transport == "triton-http-binary"
            self.bodies = [triton_body(body, self.target, self.sequence_id, k == 0, k == last, binary)
                           for k, body in enumerate(self.bodies)]
            return
        self.session_id = (await self._post("/sessions", json.dumps({"model": self.target.model}).encode()))["id"]
        if self.target.transport == "rtserve-ws-binary":
            self.bodies = [binary_piece(body) for body in self.bodies]
        if self.target.transport in STREAMS:
            headers = {"X-API-Key": self.target.api_key} if self.target.api_key else {}
            try:
                self.ws = await self.http.ws_connect(f"/sessions/{self.session_id}/stream", headers=headers,
                                                     max_msg_size=2**26)
            except aiohttp.WSServerHandshakeError as error:
                if error.status in (403, 404):
                    raise Unavailable(f"not served by this rtserve (HTTP {error.status} at the upgrade to "
                                      f"/sessions/{{id}}/stream)") from error
                raise
            opened = json.loads(await self.ws.receive_str())
            if opened.get("event") != "open":
                raise RuntimeError(f"the stream's first frame is not 'open': {str(opened)[:200]}")

    async def _post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> Any:
        async with self.http.post(path, data=body, headers=headers) as answer:
            content = await answer.read()
            if answer.status >= 400:
                raise RuntimeError(f"POST {path} answered {answer.status}: {content[:300].decode(errors='replace')}")
            return json.loads(content)

    async def _exchange(self, body: bytes) -> Any:
        if self.ws is not None:
            if self.target.transport == "rtserve-ws-binary":
                await self.ws.send_bytes(body)
            else:
                await self.ws.send_str(body.decode())
            answer = json.loads(await self.ws.receive_str())
            if answer.get("event") == "error":
                raise RuntimeError(f"error frame: {str(answer)[:300]}")
            return answer
        if self.target.transport == "triton-http-binary":
            header_length = body.index(b"\n")  # the JSON header, a newline (JSON's whitespace), the tensor data
            return await self._post(f"/v2/models/{self.target.model}/infer", body, {
                "Inference-Header-Content-Length": str(header_length + 1), "Content-Type": "application/octet-stream"})
        if self.target.transport == "triton-http":
            return await self._post(f"/v2/models/{self.target.model}/infer", body)
        return await self._post(f"/sessions/{self.session_id}/segments", body)

    async def pieces(self) -> None:
        for seq, body in enumerate(self.bodies, start=1):
            started = time.perf_counter()
            answer = await self._exchange(body)
            self.latencies.append(time.perf_counter() - started)
            if self.target.transport in TRITON:
                steps = triton_steps(answer)
            else:
                steps = answer["session"]["segments"] if answer["session"]["seq"] == seq else -1
            if steps != seq:
                raise RuntimeError(f"piece {seq} left the sequence at {steps} steps, not {seq}")
            self.last = answer

    async def close(self) -> None:
        if self.session_id is None:
            return
        if self.ws is not None and not self.ws.closed:
            await self.ws.send_str(json.dumps({"finish": {}}))
            await self.ws.receive_str()
            await self.ws.close()
        else:
            await self._post(f"/sessions/{self.session_id}/finish", b"{}")
        async with self.http.delete(f"/sessions/{self.session_id}"):
            pass


def _error(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error)[:300]}"


async def _run_share(connection: Any, target: Target, sessions: list[list[bytes]], first_id: int,
                     keep_answers: bool, slots: int) -> None:
    """One worker's share of a run, in the order the parent drives it (ready, go, done, clean): every session is
    opened before the clock starts; then ``slots`` sessions are in flight at a time, each slot's one after another."""
    import aiohttp

    headers = {"content-type": "application/json"} | ({"x-api-key": target.api_key} if target.api_key else {})
    connections = len(sessions) if target.transport in STREAMS else slots  # a stream holds its own
    http = aiohttp.ClientSession(target.url, headers=headers,
                                 timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS),
                                 connector=aiohttp.TCPConnector(limit=connections + 4))
    drivers = [SessionDriver(http, target, bodies, first_id + index) for index, bodies in enumerate(sessions)]
    failures: list[BaseException] = []

    async def open_in_slot(first: int) -> None:  # as many connections as slots, as in the timed part
        for driver in drivers[first::slots]:
            try:
                await driver.open()
            except Exception as error:  # noqa: BLE001 - reported to the parent
                failures.append(error)

    try:
        await asyncio.gather(*(open_in_slot(first) for first in range(slots)))
        unavailable = next((str(error) for error in failures if isinstance(error, Unavailable)), None)
        connection.send(("ready", unavailable, [_error(error) for error in failures][:3]))
        if connection.recv() == "go":
            cpu, started = time.process_time(), time.monotonic()

            async def slot(first: int) -> None:
                for driver in drivers[first::slots]:
                    await driver.pieces()

            done = await asyncio.gather(*(slot(first) for first in range(slots)), return_exceptions=True)
            ended, cpu = time.monotonic(), time.process_time() - cpu
            connection.send(("done", {
                "started": started, "ended": ended, "cpu": cpu,
                "latencies": [seconds for driver in drivers for seconds in driver.latencies],
                "errors": [_error(error) for error in done if isinstance(error, BaseException)],
                "answers": [driver.last for driver in drivers] if keep_answers else [],
            }))
            connection.recv()  # clean up once the parent has read the server's CPU
        closed = await asyncio.gather(*(driver.close() for driver in drivers), return_exceptions=True)
        connection.send(("clean", [_error(error) for error in closed if isinstance(error, BaseException)][:3]))
    finally:
        await http.close()


def worker_main(connection: Any) -> None:
    """A client process: runs its share of each run it is sent until told to stop."""
    while True:
        message = connection.recv()
        if message[0] == "stop":
            return
        _, target, sessions, first_id, keep_answers, slots = message
        try:
            asyncio.run(_run_share(connection, target, sessions, first_id, keep_answers, slots))
        except Exception as error:  # noqa: BLE001 - the parent hears of it instead of waiting forever
            connection.send(("failed", _error(error)))


# ---- the parent's side ----------------------------------------------------------------------------
def default_processes() -> int:
    """As many client processes as this process may run on cores."""
    return max(1, len(os.sched_getaffinity(0)))


class ClientPool:
    """``processes`` client processes, started once and reused by every run."""

    def __init__(self, processes: int) -> None:
        context = multiprocessing.get_context("spawn")  # not fork: the bench holds threads and an event loop
        self.connections, self.workers = [], []
        for _ in range(processes):
            parent, child = context.Pipe()
            worker = context.Process(target=worker_main, args=(child,), daemon=True)
            worker.start()
            self.connections.append(parent)
            self.workers.append(worker)
        self._next_id = (int(time.time() * 1000) % 10**9) * 10**6  # Triton sequence ids, unique across runs

    @property
    def processes(self) -> int:
        return len(self.workers)

    def _receive(self, connection: Any, expected: str) -> tuple[Any, ...]:
        message = connection.recv()
        if message[0] == "failed":
            raise RuntimeError(f"a client process failed: {message[1]}")
        if message[0] != expected:
            raise RuntimeError(f"a client process said {message[0]!r}, not {expected!r}")
        return message

    def run(self, target: Target, sessions: Sequence[list[bytes]], server_cpu: Callable[[], float],
            keep_answers: bool = False, concurrency: int | None = None) -> Run:
        """Every session's pieces, closed loop, spread over the client processes (round robin), at most
        ``concurrency`` sessions in flight (default: all of them at once)."""
        concurrency = min(concurrency or len(sessions), len(sessions))
        used = min(self.processes, concurrency)
        shares = [list(sessions[index::used]) for index in range(used)]
        for index, share in enumerate(shares):
            slots = len(range(index, concurrency, used))
            self.connections[index].send(("run", target, share, self._next_id, keep_answers, slots))
            self._next_id += len(share)
        ready = [self._receive(self.connections[index], "ready") for index in range(used)]
        unavailable = next((message[1] for message in ready if message[1]), None)
        setup_errors = [error for message in ready for error in message[2]]
        if unavailable or setup_errors:
            for index in range(used):
                self.connections[index].send("abort")
            for index in range(used):
                self._receive(self.connections[index], "clean")
            if unavailable:
                return Run(target.transport, concurrency, 0, 0.0, [], 0.0, 0.0, 0.0, used, [], [], unavailable)
            raise RuntimeError(f"{target.transport}: opening the sessions failed: {setup_errors[:3]}")
        server_before = server_cpu()
        for index in range(used):
            self.connections[index].send("go")
        done = [self._receive(self.connections[index], "done")[1] for index in range(used)]
        server_seconds = server_cpu() - server_before
        for index in range(used):
            self.connections[index].send("clean")
        for index in range(used):
            self._receive(self.connections[index], "clean")
        latencies = [seconds for share in done for seconds in share["latencies"]]
        wall = max(share["ended"] for share in done) - min(share["started"] for share in done)
        return Run(
            transport=target.transport, sessions=concurrency, pieces=len(latencies), wall_seconds=wall,
            latencies=latencies, server_cpu_seconds=server_seconds,
            client_cpu_seconds=sum(share["cpu"] for share in done),
            client_busy=max(share["cpu"] / max(share["ended"] - share["started"], 1e-9) for share in done),
            processes=used, errors=[error for share in done for error in share["errors"]],
            answers=in_session_order([share["answers"] for share in done]) if keep_answers else [],
        )

    def close(self) -> None:
        for connection in self.connections:
            try:
                connection.send(("stop",))
            except OSError:
                pass
        for worker in self.workers:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.terminate()


def in_session_order(shares: list[list[Any]]) -> list[Any]:
    """Undo the round robin: share ``i`` holds sessions ``i``, ``i + len(shares)``, ..."""
    ordered: list[Any] = [None] * sum(len(share) for share in shares)
    for index, share in enumerate(shares):
        ordered[index :: len(shares)] = share
    return ordered


def client_limit(run: Run, cores: int) -> str | None:
    """Why the client, not the server, limited this run; None when it did not."""
    if run.wall_seconds <= 0:
        return None
    if run.client_busy >= BUSY_LIMIT:
        return f"a client process was busy {run.client_busy:.0%} of the run"
    cores_busy = (run.server_cpu_seconds + run.client_cpu_seconds) / run.wall_seconds
    if cores_busy >= BUSY_LIMIT * cores and run.client_cpu_seconds > run.server_cpu_seconds:
        return (f"the {cores} cores were {cores_busy / cores:.0%} busy and the client took more CPU than the server "
                f"({run.client_cpu_seconds:.2f} s against {run.server_cpu_seconds:.2f} s)")
    return None


def figures(run: Run, cores: int) -> dict[str, Any]:
    """One run's figures for the report: pieces/s, latency percentiles, CPU per piece of each side."""
    import numpy as np

    if run.unavailable:
        return {"unavailable": run.unavailable}
    if not run.pieces:
        return {"pieces": 0, "errors": len(run.errors), "first_errors": run.errors[:3]}
    milliseconds = 1000 * np.asarray(run.latencies)
    return {
        "pieces": run.pieces,
        "pieces_per_second": run.pieces / run.wall_seconds,
        "p50_ms": float(np.percentile(milliseconds, 50)),
        "p99_ms": float(np.percentile(milliseconds, 99)),
        "server_cpu_ms_per_piece": 1000 * run.server_cpu_seconds / run.pieces,
        "client_cpu_ms_per_piece": 1000 * run.client_cpu_seconds / run.pieces,
        "client_busy": run.client_busy,
        "cores_busy": (run.server_cpu_seconds + run.client_cpu_seconds) / run.wall_seconds,
        "client_processes": run.processes,
        "client_limited": client_limit(run, cores),
        "errors": len(run.errors),
        "first_errors": run.errors[:3],
    }
