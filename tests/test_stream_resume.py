"""A session's stream resumed on another replica: two `rtserve serve` processes on one Redis, behind a front door
that joins each connection to a replica as a load balancer passes a WebSocket on (loadtest.chaos.Forwarder), and
rtserve.client doing what it does for any user.

- The replica holding a stream is SIGKILLed with a piece in flight, applied (its answer lost at the door) or not:
  the client reconnects, to the other replica, whose `open` frame's seq is the session's seq in Redis; the piece in
  flight is answered (``replayed`` when it was applied), the state continues (the finish equals the one-shot answer
  for the whole input) and nothing is applied twice (the rows consumed are the rows sent, once).
- HTTP pieces, a stream, and that stream resumed on the other replica after the first began to drain (a close with
  1012), mixed in one session through the client's API.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter

import httpx
import numpy as np
import pytest
import redis

from loadtest.chaos import Forwarder, free_port
from rtserve.client import AsyncClient
from tests.service_helpers import start_rtserve
from tests.tiny_checkpoints import VARIABLES

PREFIX = f"stream-resume-{os.getpid()}"


class Replica:
    """One `rtserve serve` process on its own port, that a test may kill; :meth:`revive` starts it again."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.settings, self.port = settings, free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def revive(self) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        if self.process is not None:
            self.process.wait()
        self.process = start_rtserve(self.settings, self.port)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def pair(forecast_repository, redis_url):
    settings = {"RTSERVE_MODEL_REPOSITORY": str(forecast_repository[0]), "RTSERVE_REDIS_URL": redis_url,
                "RTSERVE_REDIS_KEY_PREFIX": PREFIX, "RTSERVE_LOG_LEVEL": "warning",
                "RTSERVE_SHUTDOWN_DRAIN_SECONDS": "0.5", "RTSERVE_INTRA_OP_THREADS": "1"}
    replicas = Replica(settings), Replica(settings)
    yield replicas
    for replica in replicas:
        replica.stop()


@pytest.fixture
def replicas(pair):
    """Both replicas running (one a test before killed is started again)."""
    for replica in pair:
        replica.revive()
    return pair


class LosingDoor(Forwarder):
    """The front door, which can lose what a replica sends back (from :meth:`lose_answers_of` on)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.losing: set[str] = set()

    def lose_answers_of(self, replica: str) -> None:
        self.losing.add(replica)

    def carries(self, replica: str, towards_client: bool) -> bool:
        return not (towards_client and replica in self.losing)


def rows(rng, count):
    return (rng.standard_normal((count, len(VARIABLES))) * 3 + 10).round(4).tolist()


def seq_in_redis(redis_url, session_id):
    return int(redis.Redis.from_url(redis_url).hget(f"{PREFIX}:{{{session_id}}}:meta", "seq"))


async def until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("applied", [True, False], ids=["applied-its-answer-lost", "not-applied"])
async def test_a_stream_resumes_on_the_other_replica_after_the_first_is_killed_mid_piece(replicas, redis_url,
                                                                                          applied):
    a, b = replicas
    rng = np.random.default_rng()
    pieces = [rows(rng, 7) for _ in range(9)]  # 63 rows, past the look-back (32): a forecast
    door = LosingDoor(lambda: [a.url, b.url])  # to A while it listens
    await door.start()
    try:
        async with AsyncClient(door.url, retries=5, backoff=0.05) as client:
            whole = await client.forecast([row for piece in pieces for row in piece])
            session = await client.session(task="forecast")
            for piece in pieces[:4]:
                await session.send(rows=piece)
            assert door.routes[-1] == a.url and session.opened["seq"] == 0  # the stream is on A
            if applied:  # A applies piece 5, and its answer is lost at the door
                door.lose_answers_of(a.url)
                in_flight = asyncio.create_task(session.send(rows=pieces[4]))
                await until(lambda: seq_in_redis(redis_url, session.id) == 5)
            else:  # A never reads piece 5
                a.process.send_signal(signal.SIGSTOP)
                in_flight = asyncio.create_task(session.send(rows=pieces[4]))
                await asyncio.sleep(0.2)
            a.process.kill()
            a.process.wait()
            where = seq_in_redis(redis_url, session.id)
            assert where == (5 if applied else 4)
            async with httpx.AsyncClient() as direct:
                assert (await direct.get(f"{b.url}/sessions/{session.id}")).json()["seq"] == where
            answer = await in_flight  # resent over a new connection, which the door joined to B
            assert door.routes[-1] == b.url and session.reconnects == Counter({"dropped": 1})
            assert session.opened["seq"] == where  # the open frame said where the session stood in Redis
            assert answer["replayed"] is applied and answer["session"]["seq"] == 5
            for piece in pieces[5:]:
                await session.send(rows=piece)
            final = await session.finish()
    finally:
        await door.stop()
    assert final["session"]["seq"] == 9 and final["session"]["consumed"] == 63  # each piece applied once
    np.testing.assert_allclose(final["forecast"], whole["forecast"], rtol=1e-5, atol=1e-5)


async def test_http_pieces_a_stream_and_a_resumed_stream_mix_in_one_session(replicas, redis_url):
    a, b = replicas
    rng = np.random.default_rng()
    pieces = [rows(rng, 6) for _ in range(12)]
    ready = [a.url, b.url]  # what the balancer's readiness probes let through, A first
    door = Forwarder(lambda: list(ready))
    await door.start()
    try:
        async with AsyncClient(door.url, retries=6, backoff=0.1) as client:
            whole = await client.forecast([row for piece in pieces for row in piece])
            over_http = await client.session(task="forecast", transport="http")
            for piece in pieces[:3]:
                await over_http.send(rows=piece)
            streamed = await client.resume(over_http.id)  # the stream, the default
            assert streamed.seq == 3 and streamed.transport == "stream"
            for piece in pieces[3:6]:
                await streamed.send(rows=piece)
            assert streamed.opened["seq"] == 3 and door.routes[-1] == a.url
            a.process.send_signal(signal.SIGTERM)  # A drains: its stream closes with 1012, its /readyz says 503
            async with httpx.AsyncClient() as direct:
                while (await direct.get(f"{a.url}/readyz")).status_code != 503:
                    await asyncio.sleep(0.01)
            ready.remove(a.url)
            for piece in pieces[6:9]:
                await streamed.send(rows=piece)
            assert streamed.reconnects == Counter({"closed 1012": 1}) and door.routes[-1] == b.url
            assert streamed.opened["seq"] == 6 == seq_in_redis(redis_url, streamed.id) - 3
            await streamed.close()
            again_over_http = await client.resume(streamed.id, transport="http")
            assert again_over_http.seq == 9
            for piece in pieces[9:]:
                await again_over_http.send(rows=piece)
            final = await again_over_http.finish()
    finally:
        await door.stop()
    assert final["session"]["seq"] == 12 and final["session"]["consumed"] == 72
    np.testing.assert_allclose(final["forecast"], whole["forecast"], rtol=1e-5, atol=1e-5)


async def test_the_door_stops_quietly_with_connections_open():
    """Stopping the front door cuts the connections it joined without an error report (Python 3.11's stream server
    reports a cancelled connection task as "Exception in callback", with a traceback)."""
    async def replica(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # holds the connection until the door closes it
        writer.close()

    upstream = await asyncio.start_server(replica, "127.0.0.1", 0)
    reported: list[dict] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    door = Forwarder(lambda: [f"http://127.0.0.1:{upstream.sockets[0].getsockname()[1]}"])
    try:
        await door.start()
        host, port = door.url.removeprefix("http://").split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"hello")
        await writer.drain()
        while not door.routes:  # joined to the replica
            await asyncio.sleep(0.01)
        await door.stop()
        await asyncio.sleep(0.05)  # the connection tasks' done callbacks run
        writer.close()
    finally:
        loop.set_exception_handler(None)
        upstream.close()
    assert reported == []
