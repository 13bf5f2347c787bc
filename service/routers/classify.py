"""POST /classify: a document of any length -> label and probabilities."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.errors import check_text
from service.fast_path import JSONBodyRoute, plain_text
from service.routers.one_shot import OneShot, OneShotDep, one_shot_route
from service.runtime.pipeline import run_whole
from service.schemas import ClassifyRequest, ClassifyResponse

router = APIRouter(tags=["classify"], route_class=JSONBodyRoute)


async def classification_of(call: OneShot, name: str | None, text: str) -> dict[str, Any]:
    """The fields of :class:`ClassifyResponse` for ``text``."""
    check_text(text, call.settings, document=True)  # the input first: a 422 says what to change
    model = call.model(name, "classify")
    _, finished = await run_whole(model, text)
    return {"model": model.ref, **finished.result}


@one_shot_route(
    router, "/classify", ClassifyResponse, classification_of, field="text", plain=plain_text,
    summary="Classify a long document, segment by segment",
    description="The model reads the document one segment at a time, carrying its memory from segment to "
    "segment, and answers the label of the last segment's memory. The same answer as streaming the document "
    "through a classify session and finishing it.",
)
async def classify(body: ClassifyRequest, call: OneShotDep) -> ClassifyResponse:
    return ClassifyResponse(**await classification_of(call, body.model, body.text))
