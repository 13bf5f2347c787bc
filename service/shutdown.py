"""Graceful shutdown: drain, a grace for what runs, then an answer that says so for what is left.

On SIGTERM or SIGINT (:func:`service.server.drain_on_signals` hands the signal here before uvicorn sees it):

1. **Drain** (``RTSERVE_SHUTDOWN_DRAIN_SECONDS``): ``/readyz`` answers 503 ``draining`` at once, so load balancers
   and the kubelet stop routing here, while the replica keeps accepting and serving as before. Every answer now
   carries ``Connection: close``: a keep-alive client opens a new connection for its next request, which a load
   balancer sends to a replica still ready. Each session stream answers the piece it has in flight, then closes
   with 1012 (service restart): its client reconnects, to a replica still ready, and resumes; a new stream is
   refused (503).
2. **Grace** (``RTSERVE_SHUTDOWN_TIMEOUT_SECONDS``): uvicorn stops accepting and closes idle connections; requests
   in flight, Server-Sent Events streams included, run on to their end.
3. **Cut**: what still runs when the grace ends is cancelled and answered: a JSON 503 with ``Retry-After`` and the
   request id, or, on a stream already under way, an ``error`` event with the same body before the stream ends.
   uvicorn's own deadline comes :data:`CUT_MARGIN_SECONDS` later, so it never gets to answer its plain-text 500.

Nothing applied is undone. A piece whose commit reached Redis before the cut stays applied and its retry (same
``seq``, any replica) answers ``replayed``; a piece cut before its commit is applied by the retry. A second signal
during the drain ends the drain at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import retry_advice
from service.middleware import error_body, route_template
from service.sse import error_event_bytes

log = logging.getLogger("rtserve")

CUT_MARGIN_SECONDS = 2.0  # uvicorn's deadline after ours: time for the cut requests' answers to go out
RETRY_AFTER_SECONDS = 1


class Shutdown:
    """One replica's way out (one per app): the drain, then the grace, then the cut."""

    def __init__(self, drain_seconds: float, grace_seconds: float) -> None:
        self.drain_seconds, self.grace_seconds = drain_seconds, grace_seconds
        self.draining = False  # from the first signal on: /readyz answers 503
        self._cut_at: float | None = None  # loop time at which what still runs is cut; None until the grace begins
        self._drain_timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Timeout] = set()
        self._streams: set[Callable[[], None]] = set()  # each open stream's "close once the frame in flight is out"
        self.stream_pieces = 0  # session stream frames being answered
        self._on_stop: list[Callable[[], None]] = []  # other servers of this app (gRPC): stop accepting with uvicorn

    def begin(self, stop_accepting: Callable[[], None]) -> None:
        """A shutdown signal. The first starts the drain and calls ``stop_accepting`` (uvicorn's own signal handler)
        when it ends; one during the drain ends it now; one after it goes straight to ``stop_accepting`` (for
        uvicorn, a second Ctrl+C forces the exit)."""
        if not self.draining:
            self.draining = True
            for close_soon in list(self._streams):
                close_soon()
            log.info("shutting down: draining for %g s (/readyz answers 503, requests are still served), then "
                     "%g s of grace for requests in flight", self.drain_seconds, self.grace_seconds)
            self._drain_timer = asyncio.get_running_loop().call_later(self.drain_seconds, self._end_drain,
                                                                      stop_accepting)
        elif self._cut_at is None:
            assert self._drain_timer is not None
            self._drain_timer.cancel()
            self._end_drain(stop_accepting)
        else:
            stop_accepting()

    def _end_drain(self, stop_accepting: Callable[[], None]) -> None:
        self._cut_at = asyncio.get_running_loop().time() + self.grace_seconds
        for cut in self._running:
            cut.reschedule(self._cut_at)
        for stop in self._on_stop:
            stop()
        stop_accepting()

    def when_stopping(self, stop_accepting: Callable[[], None]) -> None:
        """Call ``stop_accepting`` when the drain ends, as uvicorn stops accepting (the gRPC server's own stop)."""
        self._on_stop.append(stop_accepting)

    @property
    def requests_in_flight(self) -> int:
        """Requests of this app that have not ended (each runs in :meth:`cut_off`), and session stream frames being
        answered (``stream_pieces``)."""
        return len(self._running) + self.stream_pieces

    @contextmanager
    def streaming(self, close_soon: Callable[[], None]) -> Iterator[None]:
        """An open session stream: ``close_soon`` is called when the drain begins (at once, if it has begun)."""
        self._streams.add(close_soon)
        try:
            if self.draining:
                close_soon()
            yield
        finally:
            self._streams.discard(close_soon)

    @asynccontextmanager
    async def cut_off(self) -> AsyncIterator[asyncio.Timeout]:
        """A scope cancelled when the grace ends (never, while the service is not shutting down)."""
        async with asyncio.timeout_at(self._cut_at) as cut:
            self._running.add(cut)
            try:
                yield cut
            finally:
                self._running.discard(cut)


class ShutdownMiddleware:
    """Runs each request in :meth:`Shutdown.cut_off` and answers for it when the grace ends; while draining, closes
    each connection after its answer."""

    def __init__(self, app: ASGIApp, shutdown: Shutdown) -> None:
        self.app = app
        self.shutdown = shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = ended = event_stream = False

        async def watching_send(message: Message) -> None:
            nonlocal started, ended, event_stream
            if message["type"] == "http.response.start":
                started = True
                event_stream = any(key == b"content-type" and value.startswith(b"text/event-stream")
                                   for key, value in message.get("headers", ()))
                if self.shutdown.draining:
                    headers = MutableHeaders(raw=list(message.get("headers", [])))
                    headers["connection"] = "close"  # replaces a stream's `keep-alive`
                    message = {**message, "headers": headers.raw}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        try:
            async with self.shutdown.cut_off() as cut:
                await self.app(scope, receive, watching_send)
        except TimeoutError:
            if not cut.expired():  # the app's own, not the cut
                raise
            if not ended:
                await answer_cut(scope, send, started, event_stream)


async def answer_cut(scope: Scope, send: Send, started: bool, event_stream: bool) -> None:
    """Answer a request cut at the end of the grace: a JSON 503 with ``Retry-After``, or, when its answer has
    started, an ``error`` event on a stream."""
    body = error_body(scope, "this replica is shutting down and the request did not finish within its grace "
                             f"(RTSERVE_SHUTDOWN_TIMEOUT_SECONDS); its outcome is unknown: {retry_advice(scope)}")
    log.warning("cut at the end of the shutdown grace: %s %s", scope.get("method"), route_template(scope))
    if not started:
        content = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(content)).encode()),
            (b"retry-after", str(RETRY_AFTER_SECONDS).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": content})
    elif event_stream:
        await send({"type": "http.response.body", "body": error_event_bytes(503, body), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    # else: a plain body already under way (no route answers in parts but streams): nothing can be added to
    # it, and uvicorn closes the connection; the client sees a short body
