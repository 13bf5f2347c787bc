"""Server-Sent Events for summaries: `token` events with the text as it is generated, then `done` with the answer;
or, when the answer cannot be completed once the stream is under way, an `error` event (the error body the request
would have had, with its `status`) as the last event. A stream never ends without one of the two.

The OpenAPI declaration (:func:`sse_content`) names the events the way OpenAPI 3.2 describes sequential media
types: ``itemSchema`` is the schema of one event (``event`` and ``data``, the data being JSON text whose schema is
``contentSchema``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from pydantic import BaseModel
from sse_starlette.event import ServerSentEvent

from service.errors import error_answer
from service.metrics import ServiceMetrics

log = logging.getLogger("rtserve")


def wants_event_stream(request: Request, stream_flag: bool) -> bool:
    return stream_flag or "text/event-stream" in request.headers.get("accept", "")


def sse_content(done_schema: str) -> dict[str, Any]:
    """The ``text/event-stream`` media type of a 200 answer whose `done` event carries ``done_schema``."""

    def event(name: str, schema: str, description: str) -> dict[str, Any]:
        return {
            "type": "object", "description": description, "required": ["event", "data"],
            "properties": {
                "event": {"const": name},
                "data": {"type": "string", "contentMediaType": "application/json",
                         "contentSchema": {"$ref": f"#/components/schemas/{schema}"}},
            },
        }

    one_event = {"oneOf": [
        event("token", "TokenEvent", "The next piece of summary text."),
        event("done", done_schema, "The whole answer, as the JSON answer would hold it; the last event."),
        event("error", "ErrorEvent", "The answer could not be completed (e.g. the replica shut down, the session "
              "store failed): the error body the request would have had, with its `status`; the last event."),
    ]}
    return {
        "text/event-stream": {
            # OpenAPI 3.2: `schema` is the whole stream (its events, in order), `itemSchema` one event
            "schema": {"type": "array", "items": one_event,
                       "description": "Server-Sent Events: `token` events, then one `done` (or one `error`)."},
            "itemSchema": one_event,
            "example": 'event: token\r\ndata: {"text": "Shares"}\r\n\r\nevent: token\r\ndata: {"text": " in the bank '
                       'rose 5%."}\r\n\r\nevent: done\r\ndata: {"summary": "Shares in the bank rose 5%.", ...}\r\n\r\n',
        }
    }


def sse_answer(done_schema: str, description: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` of a 200 that is JSON or, with ``stream``, Server-Sent Events ending in ``done_schema``."""
    return {200: {"content": sse_content(done_schema), "description": description}}


class GenerationMeter:
    """Time to first token and tokens generated, for one summary (streamed or not); ``counted`` is the answer's
    field that counts the generated tokens."""

    def __init__(self, metrics: ServiceMetrics, model: str, stream: bool, started: float | None = None,
                 counted: str = "summary_tokens") -> None:
        self.metrics, self.model, self.stream = metrics, model, "true" if stream else "false"
        self.counted = counted
        self.started = time.perf_counter() if started is None else started
        self.first_seen = False

    def first_token(self) -> None:
        if not self.first_seen:
            self.first_seen = True
            self.metrics.time_to_first_token.labels(model=self.model, stream=self.stream).observe(
                time.perf_counter() - self.started)

    def done(self, summary_tokens: int) -> None:
        if summary_tokens > 0:
            self.first_token()  # a JSON answer: its first token reaches the client with the whole answer
        self.metrics.generated_tokens.labels(model=self.model).inc(summary_tokens)


def error_event(status: int, body: dict[str, Any]) -> dict[str, str]:
    """The `error` event: the error body (``detail``, ``request_id``, ...) plus the ``status`` it would have had."""
    return {"event": "error", "data": json.dumps({"status": status, **body})}


def error_event_bytes(status: int, body: dict[str, Any]) -> bytes:
    """:func:`error_event` as sse-starlette writes events on the wire."""
    return ServerSentEvent(**error_event(status, body)).encode()


async def summary_events(
    request: Request, tokens: AsyncIterator[str], done: Callable[[], Awaitable[BaseModel]],
    meter: GenerationMeter | None = None,
) -> AsyncIterator[dict[str, str]]:
    """`token` events from ``tokens``, then `done` with the answer ``done()`` builds once they are all out, or an
    `error` event when either fails (the status is sent already: the error can only be told as an event)."""
    try:
        async for token in tokens:
            if meter is not None:
                meter.first_token()
            yield {"event": "token", "data": json.dumps({"text": token})}
        answer = await done()
    except Exception as error:
        status, body, _ = error_answer(error, request.scope)
        if status == 500:
            log.exception("summary stream failed")
        yield error_event(status, {**body, "request_id": getattr(request.state, "request_id", None)})
        return
    if meter is not None:
        meter.done(int(getattr(answer, meter.counted, 0)))
    yield {"event": "done", "data": answer.model_dump_json()}


async def replay_tokens(summary: str) -> AsyncIterator[str]:
    """A stored summary sent again: one `token` event."""
    if summary:
        yield summary
