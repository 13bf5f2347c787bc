"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, Field

from service.dependencies import FlowDep, MetricsDep
from service.readiness import readiness
from service.state_store import StateStoreUnavailable

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str = Field(description="`ok` when the process is alive.", examples=["ok"])


class Readiness(BaseModel):
    status: str = Field(description="`ready`, `unavailable`, or `draining` (shutting down: still serving what it is "
                        "sent, but send nothing new).", examples=["ready"])
    redis: str = Field(description="`ok` or why Redis cannot be used.", examples=["ok"])
    models_loaded: int = Field(description="How many models are loaded and can serve.", examples=[5])
    models_expected: int = Field(description="How many models the repository holds.", examples=[5])
    warnings: list[str] = Field(
        default_factory=list,
        description="Settings that endanger sessions without making the service unready (e.g. a Redis "
        "maxmemory-policy other than noeviction).",
        examples=[[]],
    )


@router.get("/healthz", response_model=Health, summary="The process is alive",
            description="200 while the process runs (a liveness probe); needs no key, touches nothing.")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Redis is reachable and accepts writes, and every model in the repository is loaded",
    description="A readiness probe: 200 when the service can serve, 503 (with `Retry-After`) and the reason "
    "otherwise; 503 `draining` from the moment the process is told to stop (SIGTERM). Needs no key.",
    responses={503: {"model": Readiness, "description": "Not ready: see `status`, `redis` and `models_loaded`."}},
)
async def readyz(request: Request, response: Response) -> Readiness:
    state = request.app.state
    now = await readiness(state.store, state.registry, state.shutdown)
    if not now.ready:
        response.status_code = 503
        response.headers["Retry-After"] = "1"
    return Readiness(status=now.status, redis=now.redis, models_loaded=now.models_loaded,
                     models_expected=now.models_expected, warnings=now.warnings)


@router.get(
    "/metrics", summary="Prometheus metrics (text exposition format)", response_class=Response,
    description="Every `rtserve_*` family (see the README's Metrics table) and the process collector. Needs no key.",
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"},
                                                "example": 'rtserve_requests_total{route="/classify",model='
                                                           '"rmt-hyperpartisan:1",status="200"} 12.0\n'}},
                     "description": "Prometheus text format."}},
)
async def metrics(metrics: MetricsDep, flow: FlowDep) -> Response:
    try:
        await flow.refresh_active_sessions()
    except StateStoreUnavailable as error:  # the other families still answer; the gauge keeps its last value
        log.warning("active-session count not refreshed: %s", error)
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)
