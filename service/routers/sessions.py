"""Sessions: long inputs sent piece by piece; state in Redis, any replica continues any session."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from sse_starlette import EventSourceResponse

from service.auth import OwnerDep, QuotaDep
from service.dependencies import FlowDep, RegistryDep, SettingsDep
from service.errors import ERROR_RESPONSES, check_rows, check_text
from service.runtime.pipeline import InputError
from service.schemas import (
    FinishRequest,
    FinishResponse,
    SegmentRequest,
    SegmentResponse,
    SessionCreate,
    SessionInfo,
)
from service.sessions import SessionMeta
from service.sse import summary_events, wants_event_stream

router = APIRouter(prefix="/sessions", tags=["sessions"])


def info(meta: SessionMeta) -> SessionInfo:
    return SessionInfo(
        id=meta.id, model=meta.model, task=meta.task, seq=meta.seq, consumed=meta.consumed,  # type: ignore[arg-type]
        segments=meta.segments, state_bytes=meta.state_bytes, status=meta.status,  # type: ignore[arg-type]
        created_at=meta.created, expires_at=meta.expires_at,
    )


@router.post("", response_model=SessionInfo, status_code=201, responses=ERROR_RESPONSES,
             summary="Open a session for a task or a model")
async def create_session(
    body: SessionCreate, request: Request, registry: RegistryDep, flow: FlowDep, owner: OwnerDep, quota: QuotaDep
) -> SessionInfo:
    if body.task is None and body.model is None:
        raise InputError("name a `task` (classify, summarize, forecast) or a `model`")
    model = registry.resolve(body.model, body.task)
    request.state.model = model.ref
    return info(await flow.create(model, owner, quota))


@router.get("/{session_id}", response_model=SessionInfo, responses=ERROR_RESPONSES, summary="Session status")
async def session_status(session_id: str, flow: FlowDep, owner: OwnerDep) -> SessionInfo:
    return info(await flow.status(session_id, owner))


@router.delete("/{session_id}", status_code=204, responses=ERROR_RESPONSES, summary="Delete a session")
async def delete_session(session_id: str, flow: FlowDep, owner: OwnerDep) -> Response:
    await flow.delete(session_id, owner)
    return Response(status_code=204)


@router.post("/{session_id}/segments", response_model=SegmentResponse, responses=ERROR_RESPONSES,
             summary="Send the next piece (exactly once per `seq`)")
async def add_segment(
    session_id: str, body: SegmentRequest, request: Request, flow: FlowDep, settings: SettingsDep, owner: OwnerDep
) -> SegmentResponse:
    if body.rows is not None:
        check_rows(body.rows, settings)
    if body.text is not None:
        check_text(body.text, settings)
    applied = await flow.apply(session_id, owner, body.seq, body.text, body.rows,
                               note_model=lambda ref: setattr(request.state, "model", ref))
    return SegmentResponse(session=info(applied.meta), replayed=applied.replayed, result=applied.result)


@router.post("/{session_id}/finish", response_model=FinishResponse, responses=ERROR_RESPONSES,
             summary="Finish: the final result (summaries may stream as Server-Sent Events)")
async def finish_session(
    session_id: str, request: Request, flow: FlowDep, owner: OwnerDep, body: FinishRequest | None = None
) -> FinishResponse | EventSourceResponse:
    stream = wants_event_stream(request, body.stream if body else False)
    options = {"max_length": body.max_length, "beam_size": body.beam_size} if body else {}
    meta, finished = await flow.finish(session_id, owner, stream=stream, options=options)
    request.state.model = meta.model
    if finished.tokens is not None:
        return EventSourceResponse(summary_events(finished, meta.model))
    return FinishResponse(session=info(meta), result=finished.result)
