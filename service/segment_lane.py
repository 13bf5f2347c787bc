"""The session piece's own way in: a plain piece answered without the middleware stack and the router.

A streamed session sends many small pieces, and for a light model the work around a piece is most of its cost
(an RSA step takes 0.2 ms; its piece cost the service 2.3 ms of CPU, docs/serving.md). :class:`SegmentLane` is
the outermost of the app's middleware. It takes a request only when it is plainly a piece:

- ``POST /sessions/{session_id}/segments``, with no ``Origin`` header (the CORS middleware answers those),
- ``Content-Type: application/json`` and a declared ``Content-Length`` within ``RTSERVE_MAX_BODY_BYTES``,
- a body that arrives with its headers and that :func:`service.schemas.plain_piece` takes as it is.

For such a request it does what the layers it passes over do, with their own parts: the request id
(:func:`service.middleware.take_request_id`, echoed in ``X-Request-ID``), the shutdown's cut-off and
``Connection: close`` while draining (:class:`service.shutdown.Shutdown`), the route's fast path
(:func:`service.routers.sessions.add_segment_fast`), errors answered by the app's own exception handlers, and the
request metrics and access log (:func:`service.middleware.record_request`). Its answers are never
gzip-compressed: a piece's answer is a few KB at most, which costs more CPU to compress than it saves on a network.

Any other request goes to the stack unchanged, and so does a piece the lane declines after reading its body (the
body is handed on as it came), so every refusal and every other answer is the stack's own.
"""

from __future__ import annotations

import logging
import re
import time
from types import SimpleNamespace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.logs import request_id_var
from service.metrics import ServiceMetrics
from service.middleware import record_request, take_request_id
from service.shutdown import Shutdown, answer_cut

log = logging.getLogger("rtserve")

ROUTE = "/sessions/{session_id}/segments"
_PATH = re.compile(r"/sessions/([^/]+)/segments")
# what the parts it uses read of a request's matched route (``scope["route"]``): its template
_MATCHED = SimpleNamespace(path=ROUTE)


class SegmentLane:
    def __init__(self, app: ASGIApp, max_bytes: int, shutdown: Shutdown, metrics: ServiceMetrics,
                 log_access: bool = False) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.shutdown = shutdown
        self.metrics, self.log_access = metrics, log_access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _PATH.fullmatch(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        declared = _plain_headers(scope, self.max_bytes) if match is not None else None
        if declared is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        message = await receive()
        if message["type"] != "http.request" or message.get("more_body", False) or len(message["body"]) != declared:
            await self.app(scope, _handing_on(message, receive), send)  # a body in parts: the stack reads it
            return
        from service.routers.sessions import answer_piece, read_plain_piece

        request = Request(scope, _handing_on(message, receive))
        piece = await read_plain_piece(request)
        if piece is None:  # not a plain piece: the stack validates it and names what is wrong
            await self.app(scope, _handing_on(message, receive), send)
            return
        request_id = take_request_id(scope)
        token = request_id_var.set(request_id)
        scope["path_params"], scope["route"] = {"session_id": match.group(1)}, _MATCHED
        answer = _Answer(send, request_id, self.shutdown)
        status = 500
        try:
            async with self.shutdown.cut_off() as cut:
                try:
                    response = await answer_piece(request, piece)
                except Exception as error:
                    response = await _handled(request, error)
                status = response.status_code
                await response(scope, receive, answer.send)
        except TimeoutError:
            if not cut.expired():
                raise
            status = 503
            if not answer.started:  # else uvicorn closes the connection on the short body
                await answer_cut(scope, send, started=False, event_stream=False)
        finally:
            request_id_var.reset(token)
            record_request(self.metrics, ROUTE, scope, status, time.perf_counter() - started, self.log_access)


def _plain_headers(scope: Scope, max_bytes: int) -> int | None:
    """The declared body length of a JSON request without an ``Origin`` header and within ``max_bytes``;
    None for any other request."""
    length = None
    json_body = False
    for name, value in scope["headers"]:
        if name == b"content-length":
            length = value
        elif name == b"content-type":
            json_body = value.partition(b";")[0].strip().lower() == b"application/json"
        elif name == b"origin":
            return None
    if not json_body or length is None or not length.isdigit() or int(length) > max_bytes:
        return None
    return int(length)


def _handing_on(first: Message, receive: Receive) -> Receive:
    """``receive`` with ``first``, a message already read, in front."""
    pending = [first]

    async def handed_on() -> Message:
        return pending.pop() if pending else await receive()

    return handed_on


async def _handled(request: Request, error: Exception) -> Response:
    """The answer of the app's handler for ``error`` (the nearest class in its MRO); an error no handler but the
    catch-all takes is logged with its traceback, as the stack logs it."""
    handlers: dict[Any, Any] = request.app.exception_handlers
    handler = next(handlers[kind] for kind in type(error).__mro__ if kind in handlers)
    if Exception in handlers and handler is handlers[Exception]:
        log.error("exception in the segment route", exc_info=error)
    return await handler(request, error)


class _Answer:
    """The lane's ``send``: the request id on the answer, ``Connection: close`` while draining; knows whether the
    answer has started."""

    def __init__(self, send: Send, request_id: str, shutdown: Shutdown) -> None:
        self._send, self.request_id, self.shutdown = send, request_id, shutdown
        self.started = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            headers = [*message.get("headers", []), (b"x-request-id", self.request_id.encode())]
            if self.shutdown.draining:
                headers.append((b"connection", b"close"))
            message = {**message, "headers": headers}
        await self._send(message)
