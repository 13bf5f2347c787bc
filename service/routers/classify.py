"""POST /classify: a document of any length -> label and probabilities."""

from __future__ import annotations

from fastapi import APIRouter, Request

from service.auth import OwnerDep
from service.dependencies import RegistryDep, SettingsDep
from service.errors import ERROR_RESPONSES, check_text
from service.runtime.pipeline import run_whole
from service.schemas import ClassifyRequest, ClassifyResponse

router = APIRouter(tags=["classify"])


@router.post("/classify", response_model=ClassifyResponse, responses=ERROR_RESPONSES,
             summary="Classify a long document, segment by segment")
async def classify(
    body: ClassifyRequest, request: Request, registry: RegistryDep, settings: SettingsDep, owner: OwnerDep
) -> ClassifyResponse:
    check_text(body.text, settings)  # the input first: a 422 says what to change whatever the model
    model = registry.resolve(body.model, "classify")
    request.state.model = model.ref
    _, finished = await run_whole(model.pipeline, body.text)
    return ClassifyResponse(model=model.ref, **finished.result)
