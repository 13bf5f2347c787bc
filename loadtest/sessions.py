"""Driving rtserve sessions over HTTP: open, send pieces one after another (each must apply exactly one step),
finish and delete; a served run of many sessions at once, timed from the first piece to the last answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

from loadtest.bench_inputs import SessionInput
from loadtest.harness import BenchError, Client, Samples
from loadtest.metrics import add_delta, metric_delta


@dataclass
class PiecesRun:
    """One served run: every session's pieces, timed from the first piece sent to the last answer."""

    wall_seconds: float
    piece_seconds: list[float]
    steps: int
    client_cpu_seconds: float


async def open_session(client: Client, model: str) -> str:
    created = await client.post("/sessions", json.dumps({"model": model}).encode())
    return str(created["id"])


async def close_session(client: Client, session_id: str) -> None:
    await client.post(f"/sessions/{session_id}/finish")
    await client.delete(f"/sessions/{session_id}")


async def send_pieces(client: Client, session_id: str, session: SessionInput, first: int = 1) -> list[float]:
    """Each piece after the previous answer; every piece must apply exactly one step. ``first``: the ``seq`` of
    the first piece (``session`` holding the rest of a session's pieces from there)."""
    path = f"/sessions/{session_id}/segments"
    latencies = []
    for seq, body in enumerate(session.pieces, start=first):
        started = time.perf_counter()
        answer = await client.post(path, body)
        latencies.append(time.perf_counter() - started)
        if answer["session"]["segments"] != seq:
            raise BenchError(f"piece {seq} left the session at {answer['session']['segments']} steps, not {seq}: "
                             "the pieces no longer match the model's segments")
    return latencies


async def served_pieces(
    client: Client, model: str, sessions: Sequence[SessionInput], metrics: Samples | None = None,
) -> PiecesRun:
    """Open every session, send all their pieces concurrently (timed), then finish and delete them.

    ``metrics``, when given, accumulates the ``/metrics`` delta of the pieces alone (scraped just
    before the first piece and just after the last answer, outside the timed span).
    """
    ids = await asyncio.gather(*(open_session(client, model) for _ in sessions))
    before = await client.metrics() if metrics is not None else {}
    cpu_before, started = time.process_time(), time.perf_counter()
    latencies = await asyncio.gather(*(send_pieces(client, i, s) for i, s in zip(ids, sessions, strict=True)))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_before
    if metrics is not None:
        add_delta(metrics, metric_delta(before, await client.metrics()))
    await asyncio.gather(*(close_session(client, session_id) for session_id in ids))
    flat = [seconds for per_session in latencies for seconds in per_session]
    return PiecesRun(wall, flat, len(flat), cpu)


async def whole_session(client: Client, model: str, session: SessionInput) -> float:
    """Create -> every piece -> finish, timed; the session is deleted afterwards, untimed."""
    started = time.perf_counter()
    session_id = await open_session(client, model)
    await send_pieces(client, session_id, session)
    await client.post(f"/sessions/{session_id}/finish")
    seconds = time.perf_counter() - started
    await client.delete(f"/sessions/{session_id}")
    return seconds
