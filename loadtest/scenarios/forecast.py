"""The ``rsa`` scenario: N forecast sessions (ETTh1 rows, equal pieces) create -> pieces -> finish, all at once vs
one after another; pieces/s, with the CPU each side spent per piece.
"""

from __future__ import annotations

import asyncio
from typing import Any

from loadtest import bench_inputs as inputs
from loadtest.bench_inputs import SessionInput
from loadtest.harness import Span
from loadtest.scenarios.common import Bench, concurrent_vs_sequential
from loadtest.sessions import open_session, send_pieces


async def forecast_flows(bench: Bench, model: str, sessions: list[SessionInput], concurrent: bool) -> Span:
    """The span of create -> pieces -> finish for every session, all at once or one after another."""
    client = bench.client

    async def flow(session: SessionInput) -> str:
        session_id = await open_session(client, model)
        await send_pieces(client, session_id, session)
        await client.post(f"/sessions/{session_id}/finish")
        return session_id

    started = bench.stopwatch.start()
    if concurrent:
        ids = await asyncio.gather(*(flow(session) for session in sessions))
    else:
        ids = [await flow(session) for session in sessions]
    span = bench.stopwatch.stop(started)
    await asyncio.gather(*(client.delete(f"/sessions/{session_id}") for session_id in ids))
    return span


async def run_rsa(bench: Bench) -> dict[str, Any]:
    model = bench.ref("forecast")
    settings = bench.models["forecast"]["manifest"]["settings"]
    values = inputs.etth1_values(bench.data, list(settings["variables"]))
    sessions = inputs.forecast_sessions(values, int(settings["lookback"]), bench.counts.rsa_sessions,
                                        bench.counts.rsa_piece_rows, bench.counts.rsa_extra_pieces)
    pieces = sum(len(s.pieces) for s in sessions)
    await forecast_flows(bench, model, sessions[:1], concurrent=False)  # warm-up, untimed

    async def once(concurrent: bool) -> tuple[Span, int]:
        await bench.settle()
        return await forecast_flows(bench, model, sessions, concurrent), pieces

    rates = await concurrent_vs_sequential(bench, once, unit="pieces", count_key=None)
    return {
        "model": model,
        "sessions": len(sessions),
        "pieces": pieces,
        "rows_per_piece": bench.counts.rsa_piece_rows,
        **rates,
    }
