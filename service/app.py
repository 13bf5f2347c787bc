"""The FastAPI app factory.

``create_app(settings)`` builds an app whose lifespan connects to Redis (or
starts an embedded one when ``RTSERVE_REDIS_URL`` is unset), loads every
model of the repository, and closes all of it on shutdown. Several apps may
live in one process (tests run two replicas side by side): nothing here is
global.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import rtserve
from service.embedded_redis import EmbeddedRedis
from service.errors import install_error_handlers
from service.metrics import ServiceMetrics
from service.middleware import BodyLimitMiddleware, RequestMetricsMiddleware
from service.routers import classify, forecast, health, models, sessions, summarize
from service.runtime.registry import ModelRegistry
from service.session_flow import SessionFlow
from service.sessions import SessionStore
from service.settings import Settings
from service.state_store import StateStore

log = logging.getLogger("rtserve")


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    metrics: ServiceMetrics = app.state.metrics
    embedded: EmbeddedRedis | None = None
    redis_url = settings.redis_url
    if not redis_url:
        embedded = EmbeddedRedis(settings.embedded_redis_dir)
        redis_url = embedded.start()
        log.info("started embedded Redis at %s", redis_url)
    store = StateStore.from_url(redis_url, settings.redis_key_prefix, settings.redis_timeout_seconds,
                                settings.redis_max_connections, settings.redis_pool_timeout_seconds,
                                cluster=settings.redis_cluster)
    registry = ModelRegistry(settings, metrics)
    app.state.store = store
    app.state.models = registry
    app.state.flow = SessionFlow(SessionStore(store, settings, metrics), registry, metrics)
    try:
        await registry.load_all()
        yield
    finally:
        await registry.close()
        await store.close()
        if embedded is not None:
            embedded.stop()
            log.info("stopped embedded Redis")


def create_app(settings: Settings | None = None, metrics: ServiceMetrics | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = metrics or ServiceMetrics()
    app = FastAPI(
        title="rtserve",
        version=rtserve.__version__,
        description=(
            "Serving recurrent transformers segment by segment: long-document classification (RMT), "
            "summarization (SRformer) and time-series forecasting (RSA, R-Transformer), one-shot or "
            "streamed through sessions whose recurrent state lives in Redis."
        ),
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    install_error_handlers(app)
    for router in (health.router, models.router, classify.router, summarize.router, forecast.router,
                   sessions.router):
        app.include_router(router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes,
                       read_timeout_seconds=settings.request_read_timeout_seconds)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)  # outermost: sees 413s too
    return app
