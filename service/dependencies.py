"""Shared things handlers receive through ``Depends``.

Each getter is ``async def`` although it only reads ``app.state``: FastAPI runs a plain ``def``
dependency in its thread pool, a thread hop per dependency per request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Request

from service.metrics import ServiceMetrics
from service.runtime.registry import ModelRegistry
from service.session_flow import SessionFlow
from service.settings import Settings
from service.state_store import StateStore


def app_state(name: str) -> Callable[[Request], Awaitable[Any]]:
    """A dependency that returns ``app.state.<name>`` (what the lifespan or the app factory put there)."""

    async def get(request: Request) -> Any:
        return getattr(request.app.state, name)

    return get


SettingsDep = Annotated[Settings, Depends(app_state("settings"))]
StoreDep = Annotated[StateStore, Depends(app_state("store"))]
MetricsDep = Annotated[ServiceMetrics, Depends(app_state("metrics"))]
RegistryDep = Annotated[ModelRegistry, Depends(app_state("registry"))]
FlowDep = Annotated[SessionFlow, Depends(app_state("flow"))]
