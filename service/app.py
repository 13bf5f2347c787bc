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
from importlib.metadata import version
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi

from service.collector import settle_after_startup
from service.embedded_redis import EmbeddedRedis
from service.errors import install_error_handlers
from service.fast_path import FastPathAtTheDoor
from service.kserve.inference import Inference
from service.loop_lag import LoopLag
from service.metrics import ServiceMetrics
from service.middleware import BodyLimitMiddleware, CompressLargeAnswers, RequestScope
from service.routers import classify, docs, forecast, health, models, sessions, streams, summarize, v2
from service.runtime.engine_client import EngineClient
from service.runtime.registry import ModelRegistry
from service.schemas import ErrorEvent, TokenEvent
from service.session_flow import SessionFlow
from service.sessions import SessionStore
from service.sessions.cache import StateCache
from service.settings import Settings
from service.shutdown import Shutdown, ShutdownMiddleware
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
    store.loop_lag = loop_lag = LoopLag(observe=metrics.loop_lag.labels(loop="http").observe)
    loop_lag.start()
    engine = EngineClient(settings.engine_socket) if settings.engine_socket else None
    if engine is not None:  # a front end: the engine process loads and runs the graphs
        await engine.connect()
    shutdown: Shutdown = app.state.shutdown
    registry = ModelRegistry(settings, metrics, engine, in_flight=lambda: shutdown.requests_in_flight)
    app.state.store = store
    app.state.registry = registry
    sessions = SessionStore(store, settings, metrics)
    app.state.flow = SessionFlow(sessions, registry, metrics, StateCache(settings.state_cache_bytes))
    app.state.inference = inference = Inference(registry, app.state.flow, settings, lambda: shutdown.draining)
    grpc_server = None
    try:
        await registry.load_all()
        if settings.grpc_port is not None:  # imported only then: the generated protobuf modules take ~0.2 s
            from service.kserve.grpc_service import GrpcServer, InferenceServicer

            grpc_server = GrpcServer(InferenceServicer(inference, settings, metrics, shutdown, store), settings)
            app.state.grpc_port = await grpc_server.start()
            shutdown.when_stopping(grpc_server.stop_accepting)
        settle_after_startup()  # the cyclic collector: startup's heap frozen, young collections spaced out
        yield
    finally:
        if grpc_server is not None:
            await grpc_server.stop()
        await sessions.close()
        await registry.close()
        metrics.energy.close()
        if engine is not None:
            await engine.close()
        await store.close()
        loop_lag.stop()
        if embedded is not None:
            embedded.stop()
            log.info("stopped embedded Redis")


DESCRIPTION = """\
Serving recurrent transformers segment by segment: long-document classification (RMT), summarization (SRformer)
and time-series forecasting (RSA, R-Transformer), one-shot or streamed through sessions whose recurrent state
lives in Redis.

- **Authentication**: with `RTSERVE_API_KEYS` set, send a key as `X-API-Key: <key>` or `Authorization: Bearer
  <key>` (the *Authorize* button). Without it, no key is needed.
- **Errors**: every error is `{"detail": "...", "request_id": "..."}`; validation errors (422) add `errors`, one
  entry per field; sequence conflicts (409) add `expected_seq`.
- **Request ids**: send `X-Request-ID` (1-128 characters of `A-Za-z0-9._:/+=-`) or one is made; it comes back in
  the `X-Request-ID` header, in error bodies and in every log line of the request.
- **Sessions**: `POST /sessions`, then pieces with `seq` 1, 2, ... (a retry of the same `seq` is answered from
  the stored result, exactly once), then `finish`: the one-shot answer for the whole input, plus `session`.
"""

# a request is matched against the routes in this order until one fits: the pieces' routes first (the busiest)
MATCH_ORDER = (sessions.router, forecast.router, classify.router, streams.router, v2.router, summarize.router,
               health.router, models.router, docs.router)
# the API reference lists them in reading order
READING_ORDER = (health.router, models.router, classify.router, summarize.router, forecast.router, sessions.router,
                 streams.router, v2.router, docs.router)


def create_app(settings: Settings | None = None, metrics: ServiceMetrics | None = None) -> FastAPI:
    settings = settings or Settings()
    metrics = metrics or ServiceMetrics()
    app = FastAPI(
        title="rtserve", version=version("rtserve"), description=DESCRIPTION, lifespan=_lifespan,
        docs_url=None, redoc_url=None, openapi_url=None,  # served by routers/docs.py, with local assets
        telemetry=None if settings.opentelemetry else {"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.shutdown = shutdown = Shutdown(settings.shutdown_drain_seconds, settings.shutdown_timeout_seconds)
    install_error_handlers(app)
    for router in MATCH_ORDER:
        app.include_router(router)
    app.mount(docs.ASSETS_URL, docs.assets(), name="docs-assets")
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    # the last added is the outermost; innermost, a session's pieces take their fast path without the router (with
    # FastAPI's OpenTelemetry on, through it: the router names a request's route on its span)
    if not settings.opentelemetry:
        app.add_middleware(FastPathAtTheDoor, route=sessions.PIECE_ROUTE, handlers=app.exception_handlers)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes,
                       read_timeout_seconds=settings.request_read_timeout_seconds)
    if settings.gzip_minimum_bytes > 0:  # never text/event-stream, nor a session piece's answer
        app.add_middleware(CompressLargeAnswers, minimum_size=settings.gzip_minimum_bytes)
    app.add_middleware(ShutdownMiddleware, shutdown=shutdown)  # inside CORS: a cut request's 503 has its headers
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Content-Type", "Authorization", "X-API-Key", "X-Request-ID", "Accept"],
                           expose_headers=["X-Request-ID", "Retry-After"])
    # outermost: every answer and log line carries the request id; the metrics see every answer, 413s too
    app.add_middleware(RequestScope, metrics=metrics, log_access=settings.access_log)
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, plus the SSE event schema, less the 422 FastAPI adds to routes that cannot answer it."""
    if app.openapi_schema:
        return app.openapi_schema
    # each router's routes as its module defines them (the sessions' match in another order: the busiest first)
    routes = [route for router in READING_ORDER
              for route in (sessions.ROUTES_IN_READING_ORDER if router is sessions.router else router.routes)]
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=routes,
                         tags=app.openapi_tags)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for event in (TokenEvent, ErrorEvent, *v2.EXTRA_SCHEMAS):
        event_schema = event.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(event_schema.pop("$defs", {}))
        components[event.__name__] = event_schema
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            answer = operation.get("responses", {}).get("422")
            if answer and "HTTPValidationError" in str(answer):  # path parameters that are plain strings
                del operation["responses"]["422"]
    if "HTTPValidationError" not in str(schema["paths"]):
        components.pop("HTTPValidationError", None)
        components.pop("ValidationError", None)
    settings: Settings = app.state.settings
    registry: ModelRegistry | None = getattr(app.state, "registry", None)
    models = list((registry.models if registry else {}).values())
    widths = sorted({m.pipeline.row_width for m in models if m.pipeline.row_width is not None})
    ranges = [bound for m in models if m.pipeline.value_range for bound in m.pipeline.value_range.values()]
    for name in sorted(_request_bodies(schema["paths"])):  # the limits of what a request sends, as settings say
        properties = components[name].get("properties", {})
        if "text" in properties:
            properties["text"]["maxLength"] = settings.max_text_chars
        if "rows" in properties:
            rows = properties["rows"]
            rows["maxItems"] = settings.max_rows
            if widths:  # what this deployment's models read: a row of another width is refused (422)
                rows["items"] |= {"minItems": widths[0], "maxItems": widths[-1]}
                rows["description"] += f" Models loaded here read {' or '.join(map(str, widths))} values per row."
            if ranges:  # within every variable's value_range (GET /models has each variable's own, wider)
                low, high = max(bound[0] for bound in ranges), min(bound[1] for bound in ranges)
                rows["items"]["items"] |= {"minimum": low, "maximum": high}
                rows["description"] += f" Every value between {low:.3g} and {high:.3g} is taken."
    examples = [m.pipeline.example for m in models if m.pipeline.input_kind == "rows" and m.pipeline.example]
    if examples and "ForecastRequest" in components:  # "Try it out" sends a look-back's rows: a real forecast
        components["ForecastRequest"]["properties"]["rows"]["examples"] = [examples[0]]
    if registry is not None and registry.loaded_count() == registry.expected_count():
        app.openapi_schema = schema  # complete: kept (before the models are loaded, built again next time)
    return schema


def _request_bodies(paths: dict[str, Any]) -> set[str]:
    """The component schemas that request bodies name (``$ref``), also through ``anyOf``."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                names.add(ref.rsplit("/", 1)[1])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in paths.values():
        for operation in path.values():
            walk(operation.get("requestBody"))
    return names
