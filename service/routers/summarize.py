"""POST /summarize: a document -> its summary, whole or as Server-Sent Events."""

from __future__ import annotations

from fastapi import APIRouter, Request
from sse_starlette import EventSourceResponse

from service.auth import OwnerDep
from service.dependencies import MetricsDep, RegistryDep, SettingsDep
from service.errors import BODY, check_text, responses
from service.runtime.pipeline import run_whole
from service.schemas import SummarizeRequest, SummarizeResponse
from service.sse import GenerationMeter, sse_content, summary_events, wants_event_stream

router = APIRouter(tags=["summarize"])


@router.post(
    "/summarize", response_model=SummarizeResponse,
    responses={200: {"content": sse_content("SummarizeResponse"),
                     "description": "The summary: JSON, or Server-Sent Events with `stream` (or "
                     "`Accept: text/event-stream`)."},
               **responses(*BODY, 401, 404)},
    summary="Summarize a document (add `\"stream\": true` for Server-Sent Events)",
    description="The encoder reads the document window by window (recurrent memory between windows); the "
    "decoder then writes the summary with greedy or beam search. With `stream`, greedy search sends the text "
    "word by word as it is generated; beam search sends it once, at the end.",
)
async def summarize(
    body: SummarizeRequest, request: Request, registry: RegistryDep, settings: SettingsDep, metrics: MetricsDep,
    owner: OwnerDep,
) -> SummarizeResponse | EventSourceResponse:
    check_text(body.text, settings)  # the input first: a 422 says what to change whatever the model
    model = registry.resolve(body.model, "summarize")
    request.state.model = model.ref
    stream = wants_event_stream(request, body.stream)
    meter = GenerationMeter(metrics, model.ref, stream)
    options = {"max_length": body.max_length, "beam_size": body.beam_size}
    _, finished = await run_whole(model, body.text, stream=stream, options=options)
    if finished.tokens is not None:
        async def done() -> SummarizeResponse:
            return SummarizeResponse(model=model.ref, **finished.result)

        return EventSourceResponse(summary_events(finished.tokens, done, meter))
    meter.done(int(finished.result["summary_tokens"]))
    return SummarizeResponse(model=model.ref, **finished.result)
