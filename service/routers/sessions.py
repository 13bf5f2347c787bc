"""Sessions: long inputs sent piece by piece; state in Redis, any replica continues any session."""

from __future__ import annotations

import time
from typing import Annotated

import orjson
from fastapi import APIRouter, Body, Path, Request, Response
from pydantic import BaseModel
from sse_starlette import EventSourceResponse

from models.families import TASKS
from service.auth import SECURED, OwnerDep, QuotaDep, owner_of_request, quota_of
from service.dependencies import FlowDep, MetricsDep, RegistryDep
from service.errors import BODY, check_rows, check_text, responses
from service.fast_path import JSONBodyRoute, info, piece_answer, plain_piece, session_fields, with_fast_path
from service.runtime.pipeline import InputError
from service.schemas import (
    FinishRequest,
    FinishResponse,
    RowsPiece,
    SegmentRequest,
    SegmentResponse,
    SessionCreate,
    SessionInfo,
)
from service.session_flow import Applied, SessionEnd, SessionFlow
from service.sse import GenerationMeter, replay_tokens, sse_answer, summary_events, wants_event_stream

router = APIRouter(prefix="/sessions", tags=["sessions"], route_class=JSONBodyRoute)

SessionId = Annotated[str, Path(description="The `id` that `POST /sessions` answered.",
                                examples=["0nJx3kq7VdW2c9aYbR5mTfLs8HhPzE1u"])]


def final_answer(end: SessionEnd) -> BaseModel:
    """The one-shot answer of the session's task (the ``finish`` part of its family), plus the session."""
    answer = end.model.family.part("finish")
    return answer(model=end.meta.model, session=info(end.meta), **end.final.result)


async def create_fast(request: Request) -> Response | None:
    """The create's fast path (:mod:`service.fast_path`): a body naming a `task` and/or a `model` by plain strings;
    None (the endpoint validates it) for any other body."""
    body = await request.json()
    if type(body) is not dict or not body or not body.keys() <= {"task", "model"}:
        return None
    task, name = body.get("task"), body.get("model")
    if (task is None and name is None) or (task is not None and task not in TASKS) or (
            name is not None and type(name) is not str):
        return None
    state = request.app.state
    owner = owner_of_request(request, state.settings)
    model = state.registry.resolve(name, task)
    request.state.model = model.ref
    host = request.client.host if request.client else None
    meta = await state.flow.create(model, owner, quota_of(state.settings, owner, host))
    return Response(orjson.dumps(session_fields(meta)), status_code=201, media_type="application/json")


@router.post(
    "", response_model=SessionInfo, status_code=201, responses=responses(*BODY, 401, 404, 429, 503),
    summary="Open a session for a task or a model",
    description="Name a `task` (its default model answers) or a `model`. Then send pieces with "
    "`POST /sessions/{session_id}/segments`, or over the session's stream (`/sessions/{session_id}/stream`, a "
    "WebSocket), and end with `POST /sessions/{session_id}/finish`.",
)
@with_fast_path(create_fast)
async def create_session(
    body: SessionCreate, request: Request, registry: RegistryDep, flow: FlowDep, owner: OwnerDep, quota: QuotaDep
) -> SessionInfo:
    if body.task is None and body.model is None:
        raise InputError("name a `task` (classify, summarize, forecast) or a `model`")
    model = registry.resolve(body.model, body.task)
    request.state.model = model.ref
    return info(await flow.create(model, owner, quota))


# Status and delete read no body and solve no dependency: the API key is checked by the one function the fast paths
# use (its schemes still shown in /docs: SECURED).
@router.get("/{session_id}", response_model=SessionInfo, responses=responses(401, 404, 503), openapi_extra=SECURED,
            summary="Session status", description="Where the session stands; does not move its expiry.")
async def session_status(session_id: SessionId, request: Request) -> Response:
    state = request.app.state
    meta = await state.flow.status(session_id, owner_of_request(request, state.settings))
    request.state.model = meta.model
    return Response(orjson.dumps(session_fields(meta)), media_type="application/json")


@router.delete("/{session_id}", status_code=204, responses=responses(401, 404, 503), openapi_extra=SECURED,
               summary="Delete a session", description="Drops the session's state at once (otherwise it expires "
               "when idle).")
async def delete_session(session_id: SessionId, request: Request) -> Response:
    state = request.app.state
    meta = await state.flow.status(session_id, owner_of_request(request, state.settings))
    request.state.model = meta.model
    await state.flow.delete(meta)
    return Response(status_code=204)


async def apply_piece(request: Request, flow: SessionFlow, session_id: str, owner: str, seq: int,
                      text: str | None, rows: list[list[float]] | None) -> Applied:
    settings = request.app.state.settings
    if rows is not None:
        check_rows(rows, settings)
    else:
        assert text is not None
        check_text(text, settings)
    applied = await flow.apply(session_id, owner, seq, text, rows)
    request.state.model = applied.meta.model
    return applied


async def add_segment_fast(request: Request) -> Response | None:
    """The route's fast path (:mod:`service.fast_path`): a plain piece answered without the dependency solver and
    pydantic, its answer serialized once; None (the endpoint validates it) for any other body."""
    piece = plain_piece(await request.json(), await request.body())
    if piece is None:
        return None
    seq, text, rows = piece
    owner = owner_of_request(request, request.app.state.settings)
    applied = await apply_piece(request, request.app.state.flow, request.path_params["session_id"], owner, seq,
                                text, rows)
    answer = piece_answer(applied.meta, applied.result, applied.replayed, applied.result_json)
    return Response(answer, media_type="application/json")


@router.post(
    "/{session_id}/segments", response_model=SegmentResponse, responses=responses(*BODY, 401, 404, 409, 429, 503),
    summary="Send the next piece (exactly once per seq)",
    description="`seq` is 1 for the first piece and grows by one. A retry of the last applied `seq` with the same "
    "content is answered from the stored result (`replayed`: true), also after the session was finished; a gap, "
    "a stale number or other content under an applied number is refused (409, `expected_seq`). Text sessions "
    "take `text`, forecast sessions `rows`.",
)
@with_fast_path(add_segment_fast)
async def add_segment(
    session_id: SessionId, body: Annotated[SegmentRequest, Body()], request: Request, flow: FlowDep, owner: OwnerDep,
) -> SegmentResponse:
    rows = body.rows if isinstance(body, RowsPiece) else None
    text = None if isinstance(body, RowsPiece) else body.text
    applied = await apply_piece(request, flow, session_id, owner, body.seq, text, rows)
    return SegmentResponse(session=info(applied.meta), replayed=applied.replayed, result=applied.result)


@router.post(
    "/{session_id}/finish", response_model=FinishResponse,
    responses=sse_answer("SummarizeFinish", "The one-shot answer of the session's task plus `session`; "
                         "summaries as Server-Sent Events with `stream` (or `Accept: text/event-stream`).")
    | responses(*BODY, 401, 404, 409, 503),
    summary="Finish: the final result (summaries may stream as Server-Sent Events)",
    description="Reads the rest of the document and answers exactly what the one-shot endpoint answers for the "
    "whole document, plus `session`. Finishing again answers the stored result (as events, with `stream`). A "
    "forecast session with fewer rows than the look-back answers `forecast` null.",
)
async def finish_session(
    session_id: SessionId, request: Request, flow: FlowDep, metrics: MetricsDep, owner: OwnerDep,
    body: FinishRequest | None = None,
) -> BaseModel | EventSourceResponse:
    started = time.perf_counter()
    stream = wants_event_stream(request, body.stream if body else False)
    options = body.options() if body else {}
    end = await flow.finish(session_id, owner, stream=stream, options=options)
    final, pipeline = end.final, end.model.pipeline
    request.state.model = end.meta.model
    generated = pipeline.generated_text  # None: the task answers whole, with or without `stream`
    meter = None
    if generated is not None and not end.replayed:
        assert pipeline.generated_tokens is not None, "a pipeline that generates text counts its tokens"
        meter = GenerationMeter(metrics, end.meta.model, stream, started, pipeline.generated_tokens)
    if generated is not None and stream:
        async def done() -> BaseModel:
            return final_answer(end)

        tokens = final.tokens if final.tokens is not None else replay_tokens(final.result.get(generated, ""))
        return EventSourceResponse(summary_events(request, tokens, done, meter))
    if meter is not None:
        meter.done(int(final.result.get(meter.counted, 0)))
    return final_answer(end)


# the route whose fast path the app takes at its door (service/fast_path.py FastPathAtTheDoor): a session's pieces
PIECE_ROUTE = next(route for route in router.routes if getattr(route, "endpoint", None) is add_segment)

# the API reference lists the routes as defined above; a request is matched against them with a session's pieces and
# its finish first (the busiest: each route tried before the one that fits costs the request a match)
ROUTES_IN_READING_ORDER = tuple(router.routes)
router.routes.sort(key=lambda route: 0 if getattr(route, "path", "").endswith(("/segments", "/finish")) else 1)
