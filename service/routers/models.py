"""GET /models: what the repository holds."""

from __future__ import annotations

from fastapi import APIRouter

from service.auth import OwnerDep
from service.dependencies import RegistryDep
from service.schemas import ModelInfo

router = APIRouter(tags=["models"])


@router.get("/models", response_model=list[ModelInfo], summary="Loaded models, their versions and manifests")
async def list_models(registry: RegistryDep, owner: OwnerDep) -> list[ModelInfo]:
    return [ModelInfo(**entry) for entry in registry.describe()]
