"""Run the service under uvicorn, with graceful shutdown on SIGINT/SIGTERM.

uvloop and httptools (C implementations of the event loop and the HTTP parser) are required
dependencies; the per-request access log (the service's own: route templates, request ids) is off unless
``RTSERVE_ACCESS_LOG`` is set; ``RTSERVE_LOG_FORMAT=json`` makes every line a JSON object.

No connection is held for a slow or silent client: uvicorn closes idle keep-alive connections
(``RTSERVE_KEEP_ALIVE_TIMEOUT_SECONDS``), :class:`HeaderTimeoutProtocol` closes a connection whose
request headers do not arrive within ``RTSERVE_REQUEST_READ_TIMEOUT_SECONDS`` of its first byte (or of
the connection), and the body middleware answers 408 to a body slower than that.

With ``RTSERVE_WORKERS`` above 1, uvicorn's supervisor runs that many worker processes on the port, each built
by :func:`worker_app` after :func:`service.workers.shared_by_workers` made what they share.

SIGTERM and SIGINT go to the app's :class:`service.shutdown.Shutdown` first (:func:`drain_on_signals`): it drains,
then hands the signal to uvicorn, whose shutdown stops accepting; the app cuts what outlives the grace. Each
process serving requests (the one process, or every worker: the supervisor passes SIGTERM on to them) drains on
its own.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import signal
from functools import partial
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from sse_starlette.sse import AppStatus
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.app import create_app
from service.embedded_redis import die_with_parent
from service.logs import configure_logging, uvicorn_log_config
from service.metrics import ServiceMetrics
from service.settings import Settings
from service.shutdown import CUT_MARGIN_SECONDS, Shutdown
from service.workers import EngineStartError, MetricsDirError, shared_by_workers


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus a deadline for each request's headers.

    uvicorn arms no timer before a request's headers are complete: a client that connects and sends
    nothing, or half a header, holds the connection for ever.
    """

    header_timeout_seconds = 10.0  # set from the settings by the process that serves (one server per process)

    @classmethod
    def configure(cls, settings: Settings) -> type[HeaderTimeoutProtocol]:
        cls.header_timeout_seconds = settings.request_read_timeout_seconds
        return cls

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_seconds, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # idle from here: uvicorn's keep-alive timer takes over
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def drain_on_signals(shutdown: Shutdown) -> None:
    """Put ``shutdown`` in front of the SIGTERM and SIGINT handlers uvicorn installed: a signal starts the drain,
    and uvicorn gets it when the drain ends (:meth:`Shutdown.begin`).

    Called from uvicorn's app factory, which runs inside ``Server.serve`` on the event loop, after uvicorn put its
    handlers in place. The handler only schedules work on the loop (``call_soon_threadsafe``, safe in a signal
    handler); uvicorn restores the handlers it replaced when it stops.
    """
    loop = asyncio.get_running_loop()
    AppStatus.disable_automatic_graceful_drain()  # sse-starlette would cancel every stream at the signal

    for number in (signal.SIGTERM, signal.SIGINT):
        uvicorn_handler = signal.getsignal(number)
        if not callable(uvicorn_handler):
            continue

        def handle(signum: int, frame: FrameType | None, uvicorn_handler: Any = uvicorn_handler) -> None:
            loop.call_soon_threadsafe(shutdown.begin, partial(uvicorn_handler, signum, None))

        signal.signal(number, handle)


def serving_app(settings: Settings, metrics: ServiceMetrics | None = None) -> FastAPI:
    """The app of a process that serves requests, draining on SIGTERM (uvicorn's factory)."""
    app = create_app(settings, metrics)
    drain_on_signals(app.state.shutdown)
    return app


def worker_app() -> FastAPI:
    """The app of one worker among several (uvicorn's factory, called in the worker process)."""
    die_with_parent()
    supervisor = multiprocessing.parent_process()
    if supervisor is not None and not supervisor.is_alive():  # it died before we asked to die with it
        raise SystemExit("rtserve: the worker's parent process is gone")
    settings = Settings()  # the parent's environment, plus what shared_by_workers set
    configure_logging(settings.log_level, settings.log_format)
    HeaderTimeoutProtocol.configure(settings)
    return serving_app(settings, ServiceMetrics(multiprocess_dir=settings.metrics_dir))


def run(host: str | None = None, port: int | None = None) -> None:
    settings = Settings()
    overrides = {key: value for key, value in {"host": host, "port": port}.items() if value is not None}
    if overrides:
        settings = settings.model_copy(update=overrides)
    configure_logging(settings.log_level, settings.log_format)
    options: dict[str, Any] = dict(
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=uvicorn_log_config(),  # ours: request ids, text or JSON
        access_log=False,  # the service writes its own (route templates, request ids): RTSERVE_ACCESS_LOG
        loop="uvloop",
        timeout_keep_alive=settings.keep_alive_timeout_seconds,
        # the grace runs from the end of the drain in both; the app cuts first and answers what it cut
        timeout_graceful_shutdown=math.ceil(settings.shutdown_timeout_seconds + CUT_MARGIN_SECONDS),
    )
    if settings.workers == 1:
        uvicorn.run(partial(serving_app, settings), factory=True, http=HeaderTimeoutProtocol.configure(settings),
                    **options)
        return
    try:
        with shared_by_workers(settings):  # spawned, each worker reads it from the environment (worker_app)
            uvicorn.run("service.server:worker_app", factory=True, workers=settings.workers,
                        http=HeaderTimeoutProtocol, **options)
    except (MetricsDirError, EngineStartError) as error:  # raised before any worker started
        raise SystemExit(f"rtserve: {error}") from None
