"""Shared things handlers receive through ``Depends``.

Each getter is ``async def`` although it only reads ``app.state``: FastAPI runs a plain ``def``
dependency in its thread pool, a thread hop per dependency per request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.metrics import ServiceMetrics
from service.runtime.registry import ModelRegistry
from service.session_flow import SessionFlow
from service.settings import Settings
from service.state_store import StateStore


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> StateStore:
    return request.app.state.store


async def get_metrics(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[StateStore, Depends(get_store)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]


async def get_registry(request: Request) -> ModelRegistry:
    return request.app.state.registry


async def get_flow(request: Request) -> SessionFlow:
    return request.app.state.flow


RegistryDep = Annotated[ModelRegistry, Depends(get_registry)]
FlowDep = Annotated[SessionFlow, Depends(get_flow)]
