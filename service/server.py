"""Run the service under uvicorn, with graceful shutdown on SIGINT/SIGTERM.

uvloop and httptools (C implementations of the event loop and the HTTP parser) are required
dependencies; the per-request access log is off unless ``RTSERVE_ACCESS_LOG`` is set.
"""

from __future__ import annotations

import logging

import uvicorn

from service.app import create_app
from service.settings import Settings


def run(host: str | None = None, port: int | None = None) -> None:
    settings = Settings()
    overrides = {key: value for key, value in {"host": host, "port": port}.items() if value is not None}
    if overrides:
        settings = settings.model_copy(update=overrides)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=int(settings.shutdown_timeout_seconds),
    )
