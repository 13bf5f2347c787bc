"""POST /summarize: a document -> its summary, whole or as Server-Sent Events."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sse_starlette import EventSourceResponse

from service.auth import OwnerDep
from service.dependencies import RegistryDep, SettingsDep
from service.errors import ERROR_RESPONSES, check_text
from service.runtime.pipeline import run_whole
from service.schemas import SummarizeRequest, SummarizeResponse
from service.sse import summary_events, wants_event_stream

router = APIRouter(tags=["summarize"])


@router.post("/summarize", response_model=SummarizeResponse, responses=ERROR_RESPONSES,
             summary="Summarize a document (add `\"stream\": true` for Server-Sent Events)")
async def summarize(
    body: SummarizeRequest, request: Request, registry: RegistryDep, settings: SettingsDep, owner: OwnerDep
) -> SummarizeResponse | EventSourceResponse:
    check_text(body.text, settings)  # the input first: a 422 says what to change whatever the model
    model = registry.resolve(body.model, "summarize")
    request.state.model = model.ref
    stream = wants_event_stream(request, body.stream)
    options = {"max_length": body.max_length, "beam_size": body.beam_size}
    _, finished = await run_whole(model.pipeline, body.text, stream=stream, options=options)
    if finished.tokens is not None:
        return EventSourceResponse(summary_events(finished, model.ref))
    return SummarizeResponse(model=model.ref, **finished.result)
