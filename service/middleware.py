"""ASGI middleware: the request's id, metrics and access log (:class:`RequestScope`); its body read whole, bounded in
size (413) and time (408) (:class:`BodyLimitMiddleware`)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from typing import Any

from starlette.middleware.gzip import GZipMiddleware
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.logs import request_id_var
from service.metrics import ServiceMetrics

access_log = logging.getLogger("rtserve.access")

# a client's X-Request-ID is kept when it is short and plain (it goes into logs and headers as it is)
_CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")


def request_id_of(scope: Scope) -> str | None:
    state = scope.get("state")
    return state.get("request_id") if isinstance(state, dict) else None


def kserve_route(scope: Scope) -> bool:
    """A request to the KServe v2 routes (``/v2``, ``/v2/...``), whose errors have that protocol's body."""
    path = scope.get("path", "")
    return path == "/v2" or path.startswith("/v2/")


def error_body(scope: Scope, detail: str, **extra: Any) -> dict[str, Any]:
    """An error's body: KServe v2's ``{"error": ...}`` on its routes (the request id is in the X-Request-ID header),
    rtserve's ``{"detail", ..., "request_id"}`` (``extra`` fields that are not None) elsewhere."""
    if kserve_route(scope):
        return {"error": detail}
    return {"detail": detail, **{key: value for key, value in extra.items() if value is not None},
            "request_id": request_id_of(scope)}


def header(scope: Scope, name: bytes) -> bytes | None:
    """The request's first header ``name`` (lower case), as sent; None when it has none."""
    for key, value in scope.get("headers") or ():
        if key == name:
            return value
    return None


def take_request_id(scope: Scope) -> str:
    """The request's id, the client's ``X-Request-ID`` when it is plain (else a new one), put in its state."""
    sent = (header(scope, b"x-request-id") or b"").decode("latin-1")
    request_id = sent if sent and _CLIENT_REQUEST_ID.fullmatch(sent) else secrets.token_hex(16)
    scope.setdefault("state", {})["request_id"] = request_id
    return request_id


class RequestScope:
    """The outermost layer of every HTTP request: its id and its metrics, in one pass.

    - The request id: the client's ``X-Request-ID`` (1-128 characters of ``A-Za-z0-9._:/+=-``) or a new one, in the
      request's state and the logging context, echoed in the answer's ``X-Request-ID`` header.
    - The request's metrics (count and duration by route template, model and status) and its access log line
      (``RTSERVE_ACCESS_LOG``), with the route template, never the path: session ids stay out of logs. It sees every
      answer, a 413 of the body limit or a cut at shutdown included.
    """

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics, log_access: bool = False) -> None:
        self.app = app
        self.metrics = metrics
        self.log_access = log_access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = take_request_id(scope)
        token = request_id_var.set(request_id)
        header = (b"x-request-id", request_id.encode())
        status = 500

        async def answering(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        try:
            await self.app(scope, receive, answering)
        finally:
            record_request(self.metrics, route_template(scope), scope, status, time.perf_counter() - started,
                           self.log_access)
            request_id_var.reset(token)


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
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, send, 413, f"request body exceeds {self.max_bytes} bytes: {TOO_LARGE_HINT}")
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
                        await self._refuse(scope, send, 413,
                                           f"request body exceeds {self.max_bytes} bytes: {TOO_LARGE_HINT}")
                        return
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await self._refuse(scope, send, 408,
                               f"the request body did not arrive within {self.read_timeout_seconds:g} s")
            return
        await self.app(scope, replaying(b"".join(chunks), receive), send)

    @staticmethod
    async def _refuse(scope: Scope, send: Send, status: int, detail: str) -> None:
        body = json.dumps(error_body(scope, detail)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the whole ``body`` read already, in one message, then what ``receive`` gives (after
    the body: http.disconnect, for streaming responses)."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


TOO_LARGE_HINT = "send long inputs through a session in pieces"


PIECE_PATH = re.compile(r"/sessions/[^/]+/segments")


class CompressLargeAnswers(GZipMiddleware):
    """Starlette's gzip for clients that accept it (level 6, zlib's default), except a session piece's answer: a few
    KB at most, which costs more CPU to compress than it saves on a network (and pieces are the busiest route)."""

    def __init__(self, app: ASGIApp, minimum_size: int) -> None:
        super().__init__(app, minimum_size=minimum_size, compresslevel=6)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and PIECE_PATH.fullmatch(scope["path"]):
            await self.app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def record_request(metrics: ServiceMetrics, route: str, scope: Scope, status: int, seconds: float,
                   log_access: bool) -> None:
    """Count and time one request of ``route`` (its template) by model and status; its access log line."""
    state = scope.get("state") or {}
    model = state.get("model", "") if isinstance(state, dict) else ""
    labels = (route, model, str(status))
    metrics.labelled(metrics.requests, *labels).inc()
    metrics.labelled(metrics.request_seconds, *labels).observe(seconds)
    if log_access:
        access_log.info(
            "%s %s %d %.1f ms", scope.get("method", "WS"), route, status, seconds * 1000,
            extra={"method": scope.get("method", "WS"), "route": route, "status": status, "model": model,
                   "duration_ms": round(seconds * 1000, 3)},
        )


def route_template(scope: Scope) -> str:
    """The matched route's template (``/sessions/{session_id}``), the mount's path (docs assets), or ``unmatched``."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    if path:
        return path
    app = scope.get("app")
    for candidate in getattr(getattr(app, "router", None), "routes", ()):  # routes FastAPI does not mark
        match, _ = candidate.matches({**scope, "path": scope.get("path", "")})
        if match is not Match.NONE:  # PARTIAL: the path matched, the method did not (405)
            return getattr(candidate, "path", None) or "unmatched"
    return "unmatched"
