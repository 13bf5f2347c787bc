"""POST /classify: a document of any length -> label and probabilities."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from service.errors import BODY, check_text, responses
from service.fast_path import JSONBodyRoute, answer_json, plain_body, with_fast_path
from service.routers.one_shot import OneShot, OneShotDep, one_shot_call
from service.runtime.pipeline import run_whole
from service.schemas import ClassifyRequest, ClassifyResponse

router = APIRouter(tags=["classify"], route_class=JSONBodyRoute)


async def classification_of(call: OneShot, name: str | None, text: str) -> dict[str, Any]:
    """The fields of :class:`ClassifyResponse` for ``text``."""
    check_text(text, call.settings, document=True)  # the input first: a 422 says what to change
    model = call.model(name, "classify")
    _, finished = await run_whole(model, text)
    return {"model": model.ref, **finished.result}


async def classify_fast(request: Request) -> Response | None:
    """The route's fast path (:mod:`service.fast_path`): plain text answered; None for any other body."""
    body = plain_body(await request.json(), "text")
    if body is None or type(body["text"]) is not str:
        return None
    return answer_json(ClassifyResponse,
                       await classification_of(one_shot_call(request), body.get("model"), body["text"]))


@router.post(
    "/classify", response_model=ClassifyResponse, responses=responses(*BODY, 401, 404),
    summary="Classify a long document, segment by segment",
    description="The model reads the document one segment at a time, carrying its memory from segment to "
    "segment, and answers the label of the last segment's memory. The same answer as streaming the document "
    "through a classify session and finishing it.",
)
@with_fast_path(classify_fast)
async def classify(body: ClassifyRequest, call: OneShotDep) -> ClassifyResponse:
    return ClassifyResponse(**await classification_of(call, body.model, body.text))
