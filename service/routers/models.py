"""GET /models: what the repository holds."""

from __future__ import annotations

from fastapi import APIRouter

from service.auth import OwnerDep
from service.dependencies import RegistryDep
from service.errors import responses
from service.schemas import ModelInfo

router = APIRouter(tags=["models"])


@router.get(
    "/models", response_model=list[ModelInfo], responses=responses(401),
    summary="Loaded models, their versions and manifests",
    description="Every loaded model; `default` marks the one that answers a task when a request names no model.",
)
async def list_models(registry: RegistryDep, owner: OwnerDep) -> list[ModelInfo]:
    return [ModelInfo(**entry) for entry in registry.describe()]
