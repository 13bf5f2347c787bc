"""The summarization scenarios: ``articles`` (one-shot ``/summarize`` of different articles, all at once vs one
after another: decode tokens/s) and ``decode`` (sessions holding whole encoder windows, then every finish at
once vs one after another: the decoder's throughput, which continuous batching across documents is for).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from loadtest import bench_inputs as inputs
from loadtest.bench_inputs import SessionInput
from loadtest.harness import Client, Span
from loadtest.scenarios.common import Bench, concurrent_vs_sequential
from loadtest.sessions import close_session, open_session, send_pieces


async def summarize_all(bench: Bench, bodies: list[bytes], concurrent: bool) -> tuple[Span, int]:
    """The span and summary tokens of every article, all at once or one after another."""
    client, started = bench.client, bench.stopwatch.start()
    if concurrent:
        answers = await asyncio.gather(*(client.post("/summarize", body) for body in bodies))
    else:
        answers = [await client.post("/summarize", body) for body in bodies]
    span = bench.stopwatch.stop(started)
    return span, sum(int(answer["summary_tokens"]) for answer in answers)


async def run_articles(bench: Bench) -> dict[str, Any]:
    model = bench.ref("summarize")
    texts = [text[: bench.counts.article_chars] for text in inputs.bbc_texts(bench.data, bench.counts.articles)]
    bodies = [json.dumps({"text": text, "model": model, "decoding": "free"}).encode() for text in texts]
    await summarize_all(bench, bodies[:1], concurrent=False)  # warm-up, untimed

    async def once(concurrent: bool) -> tuple[Span, int]:
        await bench.settle()
        return await summarize_all(bench, bodies, concurrent)

    rates = await concurrent_vs_sequential(bench, once)
    return {"model": model, "articles": len(bodies), **rates}


FREE_DECODING = json.dumps({"decoding": "free"}).encode()  # the decoder's work, not sentence copy's


async def finish_all(bench: Bench, ids: list[str], concurrent: bool) -> tuple[Span, int]:
    """The span and summary tokens of finishing every session, all at once or one after another."""
    client, started = bench.client, bench.stopwatch.start()
    if concurrent:
        answers = await asyncio.gather(*(client.post(f"/sessions/{i}/finish", FREE_DECODING) for i in ids))
    else:
        answers = [await client.post(f"/sessions/{i}/finish", FREE_DECODING) for i in ids]
    span = bench.stopwatch.stop(started)
    return span, sum(int(answer["summary_tokens"]) for answer in answers)


async def read_documents(client: Client, model: str, sessions: list[SessionInput]) -> list[str]:
    """Open a session per document and send its pieces (untimed); the session ids."""
    ids = await asyncio.gather(*(open_session(client, model) for _ in sessions))
    for session_id, session in zip(ids, sessions, strict=True):
        await send_pieces(client, session_id, session)
    return list(ids)


async def run_decode(bench: Bench) -> dict[str, Any]:
    model = bench.ref("summarize")
    entry, manifest = bench.entry("summarize")
    texts = inputs.bbc_texts(bench.data, bench.counts.articles * 4)
    sessions = inputs.decode_sessions(entry, manifest, texts, bench.counts.articles)
    await finish_all(bench, await read_documents(bench.client, model, sessions[:1]), False)  # warm-up

    async def once(concurrent: bool) -> tuple[Span, int]:
        ids = await read_documents(bench.client, model, sessions)  # untimed
        await bench.settle()
        timed = await finish_all(bench, ids, concurrent)
        await asyncio.gather(*(close_session(bench.client, session_id) for session_id in ids))
        return timed

    rates = await concurrent_vs_sequential(bench, once)
    return {"model": model, "articles": len(sessions), "windows": [len(s.pieces) for s in sessions], **rates}
