"""POST /classify: a document of any length -> label and probabilities."""

from __future__ import annotations

from fastapi import APIRouter

from service.errors import BODY, check_text, responses
from service.json_body import JSONBodyRoute
from service.routers.one_shot import OneShotDep
from service.runtime.pipeline import run_whole
from service.schemas import ClassifyRequest, ClassifyResponse

router = APIRouter(tags=["classify"], route_class=JSONBodyRoute)


@router.post(
    "/classify", response_model=ClassifyResponse, responses=responses(*BODY, 401, 404),
    summary="Classify a long document, segment by segment",
    description="The model reads the document one segment at a time, carrying its memory from segment to "
    "segment, and answers the label of the last segment's memory. The same answer as streaming the document "
    "through a classify session and finishing it.",
)
async def classify(body: ClassifyRequest, call: OneShotDep) -> ClassifyResponse:
    check_text(body.text, call.settings, document=True)  # the input first: a 422 says what to change
    model = call.model(body.model, "classify")
    _, finished = await run_whole(model, body.text)
    return ClassifyResponse(model=model.ref, **finished.result)
