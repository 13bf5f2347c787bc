"""ASGI middleware: request body read whole, bounded in size (413) and time (408); request metrics by route,
model and status."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.metrics import ServiceMetrics


class BodyLimitMiddleware:
    """Reads the whole request body before the app sees it: 413 over ``max_bytes``, 408 when slower than
    ``read_timeout_seconds``.

    Declared bodies over the limit are refused before a byte is read; chunked bodies (no Content-Length)
    when they cross it. Reading here, not in the app, matters: an error raised inside the app's own body
    read is turned by FastAPI into a 400 "error parsing the body", and a client that sends half a body
    and stalls would hold a connection and a task for ever.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout_seconds: float = 10.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_seconds = read_timeout_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send, 413, f"request body exceeds {self.max_bytes} bytes: {TOO_LARGE_HINT}")
            return
        chunks: list[bytes] = []
        received = 0
        try:
            async with asyncio.timeout(self.read_timeout_seconds):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return  # the client left: nobody to answer
                    chunks.append(message.get("body", b""))
                    received += len(chunks[-1])
                    if received > self.max_bytes:
                        await self._refuse(send, 413, f"request body exceeds {self.max_bytes} bytes: {TOO_LARGE_HINT}")
                        return
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await self._refuse(send, 408, f"the request body did not arrive within {self.read_timeout_seconds:g} s")
            return
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: http.disconnect, for streaming responses

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(send: Send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


TOO_LARGE_HINT = "send long inputs through a session in pieces"


class RequestMetricsMiddleware:
    """Counts and times every request by route template, model (set by the handler) and status."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            route: Any = scope.get("route")
            path = getattr(route, "path", None) or "unmatched"
            state = scope.get("state") or {}
            model = state.get("model", "") if isinstance(state, dict) else ""
            labels = {"route": path, "model": model, "status": str(status)}
            self.metrics.requests.labels(**labels).inc()
            self.metrics.request_seconds.labels(**labels).observe(time.perf_counter() - started)
