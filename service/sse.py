"""Server-Sent Events for summaries: one `token` event per generated piece, then `done` with the result."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import Request

from service.runtime.pipeline import Finished


def wants_event_stream(request: Request, stream_flag: bool) -> bool:
    return stream_flag or "text/event-stream" in request.headers.get("accept", "")


async def summary_events(finished: Finished, model: str | None = None) -> AsyncIterator[dict[str, str]]:
    assert finished.tokens is not None
    async for token in finished.tokens:
        yield {"event": "token", "data": json.dumps({"text": token})}
    result = dict(finished.result)
    if model is not None:
        result["model"] = model
    yield {"event": "done", "data": json.dumps(result)}
