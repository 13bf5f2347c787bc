"""POST /summarize: a document -> its summary, whole or as Server-Sent Events."""

from __future__ import annotations

from fastapi import APIRouter
from sse_starlette import EventSourceResponse

from service.errors import BODY, check_text, responses
from service.fast_path import JSONBodyRoute
from service.routers.one_shot import OneShotDep
from service.runtime.pipeline import run_whole
from service.schemas import SummarizeRequest, SummarizeResponse
from service.sse import GenerationMeter, sse_answer, summary_events, wants_event_stream

router = APIRouter(tags=["summarize"], route_class=JSONBodyRoute)


@router.post(
    "/summarize", response_model=SummarizeResponse,
    responses=sse_answer("SummarizeResponse", "The summary: JSON, or Server-Sent Events with `stream` (or "
                         "`Accept: text/event-stream`).") | responses(*BODY, 401, 404),
    summary="Summarize a document (with stream: true, as Server-Sent Events)",
    description="The encoder reads the document window by window (recurrent memory between windows). With "
    "`decoding` sentence (the default of models with a salience head) the summary is the document's own "
    "sentences the model scores highest, up to its summary length, in the document's order; with `free` the "
    "decoder writes it with greedy or beam search. With `stream`, sentence copy sends a sentence at a time, "
    "greedy search the text word by word as it is generated, beam search all of it at the end.",
)
async def summarize(body: SummarizeRequest, call: OneShotDep) -> SummarizeResponse | EventSourceResponse:
    check_text(body.text, call.settings, document=True)  # the input first: a 422 says what to change
    model = call.model(body.model, "summarize")
    stream = wants_event_stream(call.request, body.stream)
    meter = GenerationMeter(call.metrics, model.ref, stream)
    options = body.options()
    _, finished = await run_whole(model, body.text, stream=stream, options=options)
    if finished.tokens is not None:
        async def done() -> SummarizeResponse:
            return SummarizeResponse(model=model.ref, **finished.result)

        return EventSourceResponse(summary_events(call.request, finished.tokens, done, meter))
    meter.done(int(finished.result["summary_tokens"]))
    return SummarizeResponse(model=model.ref, **finished.result)
