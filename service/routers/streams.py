"""A session's stream: one WebSocket carries one session's pieces and their answers (``/sessions/{id}/stream``).

The session is created by ``POST /sessions``; the API key is checked once, at the upgrade. Frames are JSON text:

- the server's first frame is ``{"event": "open", "session": <the session, with its seq>, "binary_rows": true}``
  (``binary_rows``: it takes the binary frames below);
- a piece frame is exactly the body of ``POST /sessions/{id}/segments`` (``{"seq", "text"}`` or ``{"seq", "rows"}``),
  and its answer frame is exactly that route's 200 answer;
- ``{"finish": {...}}`` carries the finish route's body; its answer is the finish answer, or for a summary with
  ``"stream": true``, ``{"event": "token", "data": {"text": ...}}`` frames then one ``{"event": "done", "data":
  <the answer>}``, as the Server-Sent Events of the finish route send them;
- an error is ``{"event": "error", "data": <the route's error body>, "status": <code>}``; after a 4xx the stream
  stays open and nothing of the frame was applied.

A piece of rows may also come as a binary frame (:func:`binary_rows`): a 16-byte header (``seq``, rows, columns as
little-endian uint64, uint32, uint32), then the rows' float32 values, little-endian, row after row. It is the piece
``{"seq", "rows"}`` of those values, with the same answer: no number is parsed from text, and nothing is lost, since
a forecaster reads float32.

Each piece goes through the same session flow as an HTTP piece (:mod:`service.session_flow`): its new state is
committed to Redis (compare-and-set on ``seq``) before its answer frame is sent, so an acknowledged piece is exactly
as durable as over HTTP, and a retried ``seq`` is answered ``replayed``. While the stream is open this replica holds
the session's lease and keeps its state in memory (pinned in :class:`~service.sessions.cache.StateCache`): a piece
costs its commit, one round trip shared with the other pieces of its batch, and no read. HTTP pieces and streams (on
this replica or another, one after the other or at once) may be mixed in one session: the commits order them.

The replica shutting down sends the answer of the piece in flight, then closes with 1012 (service restart); Redis
or the engine unavailable closes with 1013 (try again later) after the error frame. A client reconnects to any
replica and resumes from the ``seq`` of the ``open`` frame.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import TypeAdapter, ValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from service import result_json
from service.auth import owner_of_request
from service.errors import check_rows, check_text, error_answer, note_error, validation_body
from service.fast_path import piece_answer, plain_piece, session_fields
from service.logs import request_id_var
from service.middleware import record_request, take_request_id
from service.routers.sessions import final_answer
from service.runtime.pipeline import InputError
from service.schemas import FinishRequest, RowsPiece, SegmentRequest
from service.session_flow import SessionFlow
from service.sessions import SessionMeta
from service.shutdown import Shutdown

log = logging.getLogger("rtserve")

router = APIRouter(tags=["sessions"])

ROUTE = "/sessions/{session_id}/stream"
SERVICE_RESTART, TRY_AGAIN_LATER, INTERNAL_ERROR = 1012, 1013, 1011  # WebSocket close codes (RFC 6455, IANA)
CLIENT_LEFT = 499  # the status the metrics record for a frame whose client left before its answer (nginx's)
PIECES = TypeAdapter(SegmentRequest)
FINISH = TypeAdapter(FinishRequest)
ROWS_HEADER = struct.Struct("<QII")  # a binary piece's seq, rows and columns; its float32 values follow


def binary_rows(frame: bytes) -> tuple[int, np.ndarray]:
    """``(seq, rows)`` of a binary piece frame, the rows as a float64 array ``(T, C)`` of its float32 values;
    :class:`InputError` (a 422) for a frame of another layout."""
    layout = (f"a binary frame is a piece of rows: a {ROWS_HEADER.size}-byte header (seq, rows, columns: "
              "little-endian uint64, uint32, uint32), then rows x columns little-endian float32 values")
    if len(frame) < ROWS_HEADER.size:
        raise InputError(f"{layout}; this one has {len(frame)} bytes")
    seq, rows, columns = ROWS_HEADER.unpack_from(frame)
    expected = ROWS_HEADER.size + 4 * rows * columns
    if len(frame) != expected:
        raise InputError(f"{layout}; its header says {rows} x {columns} values ({expected} bytes in all), the frame "
                         f"has {len(frame)} bytes")
    if seq < 1:
        raise InputError("`seq` numbers the session's pieces from 1", loc=("body", "seq"))
    if rows == 0:
        raise InputError("`rows` is empty: send at least one row", loc=("body", "rows"))
    values = np.frombuffer(frame, dtype="<f4", count=rows * columns, offset=ROWS_HEADER.size)
    return seq, values.reshape(rows, columns).astype(np.float64)


class ClientLeft(Exception):
    """The client is gone: its answer cannot be sent."""


class Stream:
    """One open stream: reads a frame, answers it, until the client leaves or the replica shuts down."""

    def __init__(self, websocket: WebSocket, session_id: str, owner: str, request_id: str) -> None:
        self.websocket, self.session_id, self.owner, self.request_id = websocket, session_id, owner, request_id
        state = websocket.app.state
        self.flow: SessionFlow = state.flow
        self.settings, self.metrics, self.shutdown = state.settings, state.metrics, state.shutdown
        self.model = ""  # the session's model, for the metrics
        self.waiting = False  # waiting for the client's next frame (a shutdown then closes at once)
        self.closing = False  # the replica is shutting down: close after the frame in flight
        self._closer: asyncio.Task[None] | None = None

    async def run(self, meta: SessionMeta) -> None:
        self.model = meta.model
        await self._send({"event": "open", "session": session_fields(meta), "binary_rows": True})
        while not self.closing:
            self.waiting = True
            message = await self.websocket.receive()
            self.waiting = False
            if message["type"] == "websocket.disconnect":
                return
            if self._closer is not None:  # a frame that arrived as the drain closed the stream: left unapplied
                return  # (its client sends it again, to a replica still serving)
            started = time.perf_counter()
            frame = message.get("text")
            if frame is None:
                frame = message.get("bytes") or b""
            try:
                status = await self._answer(frame)
            except ClientLeft:  # nobody to answer (a piece may have been applied: its retry is answered replayed)
                record_request(self.metrics, ROUTE, self.websocket.scope, CLIENT_LEFT,
                               time.perf_counter() - started, self.settings.access_log)
                return
            record_request(self.metrics, ROUTE, self.websocket.scope, status, time.perf_counter() - started,
                           self.settings.access_log)
            if status == 503:  # Redis or the engine is gone: the client should come back later, to any replica
                await self.websocket.close(TRY_AGAIN_LATER)
                return
            if status == 500:
                await self.websocket.close(INTERNAL_ERROR)
                return
        if self._closer is None:
            await self.websocket.close(SERVICE_RESTART)

    def close_soon(self) -> None:
        """The replica is shutting down: close with 1012 now if idle, else once the frame in flight is answered."""
        self.closing = True
        if self.waiting:  # the pending receive then ends with the close
            self._closer = asyncio.get_running_loop().create_task(self.websocket.close(SERVICE_RESTART))

    async def _answer(self, frame: str | bytes) -> int:
        """Answer one frame; the status it would have had over HTTP."""
        if len(frame) > self.settings.max_body_bytes:
            return await self._refuse(413, f"frame of {len(frame)} bytes exceeds {self.settings.max_body_bytes} "
                                           "(RTSERVE_MAX_BODY_BYTES): send the input in more pieces")
        try:
            self.shutdown.stream_pieces += 1  # a request in flight, for the batcher's lone-request rule
            if type(frame) is bytes:
                return await self._binary_piece(frame)
            try:
                body = orjson.loads(frame)
            except orjson.JSONDecodeError as error:
                return await self._refuse(422, f"the frame is not valid JSON: {error}")
            if type(body) is dict and "finish" in body:
                return await self._finish(body)
            return await self._piece(body, frame)
        except ClientLeft:
            raise
        except Exception as error:
            return await self._error(error)
        finally:
            self.shutdown.stream_pieces -= 1

    async def _piece(self, body: Any, frame: str | bytes) -> int:
        piece = plain_piece(body, frame)
        if piece is None:  # validation names what is wrong (the route's 422), or reads what it takes (seq 2.0)
            try:
                checked = PIECES.validate_python(body)
            except ValidationError as error:
                return await self._validation_error(error)
            rows = checked.rows if isinstance(checked, RowsPiece) else None
            piece = (checked.seq, None if rows is not None else checked.text, rows)
        seq, text, rows = piece
        if rows is not None:
            check_rows(rows, self.settings)
        else:
            assert text is not None
            check_text(text, self.settings)
        return await self._apply(seq, text, rows)

    async def _binary_piece(self, frame: bytes) -> int:
        seq, rows = binary_rows(frame)
        check_rows(rows, self.settings)
        return await self._apply(seq, None, rows)

    async def _apply(self, seq: int, text: str | None, rows: np.ndarray | None) -> int:
        applied = await self.flow.apply(self.session_id, self.owner, seq, text, rows)
        answer = piece_answer(applied.meta, applied.result, applied.replayed, applied.result_json)
        await self._send_text(answer.decode())
        return 200

    async def _finish(self, body: dict[str, Any]) -> int:
        if len(body) != 1:
            return await self._refuse(422, "a finish frame is {\"finish\": {...}} and nothing else")
        try:
            request = FINISH.validate_python(body["finish"] if body["finish"] is not None else {})
        except ValidationError as error:
            return await self._validation_error(error, ("finish",))
        end = await self.flow.finish(self.session_id, self.owner, stream=request.stream, options=request.options())
        generated = end.model.pipeline.generated_text
        if generated is not None and request.stream:
            tokens = end.final.tokens
            if tokens is not None:
                try:
                    async for token in tokens:
                        await self._send({"event": "token", "data": {"text": token}})
                finally:  # a client that left ends the search at its next step (the session stays unfinished)
                    await tokens.aclose()  # type: ignore[attr-defined]
            elif end.final.result.get(generated):  # finished before: the stored summary, as one token
                await self._send({"event": "token", "data": {"text": end.final.result[generated]}})
            await self._send({"event": "done", "data": final_answer(end).model_dump(mode="json")})
        else:
            await self._send_text(final_answer(end).model_dump_json())
        return 200

    async def _error(self, error: Exception) -> int:
        status, body, _ = error_answer(error, self.websocket.scope)
        note_error(self.websocket.scope, error, status)
        if status == 500:
            log.error("session stream: unexpected error answering a frame", exc_info=error)
        await self._send({"event": "error", "data": {**body, "request_id": self.request_id}, "status": status})
        return status

    async def _validation_error(self, error: ValidationError, prefix: tuple[str, ...] = ()) -> int:
        body = validation_body(error.errors(), ("body", *prefix))
        await self._send({"event": "error", "data": {**body, "request_id": self.request_id}, "status": 422})
        return 422

    async def _refuse(self, status: int, detail: str) -> int:
        await self._send({"event": "error", "data": {"detail": detail, "request_id": self.request_id},
                          "status": status})
        return status

    async def _send(self, frame: dict[str, Any]) -> None:
        await self._send_text(result_json.dumps(frame).decode())

    async def _send_text(self, text: str) -> None:
        """One frame to the client; :class:`ClientLeft` when it is gone (or the stream was closed under it)."""
        try:
            await self.websocket.send({"type": "websocket.send", "text": text})
        except (WebSocketDisconnect, RuntimeError) as gone:  # Starlette's: disconnected, or sent after a close
            raise ClientLeft from gone


@router.websocket(ROUTE, name="session_stream")
async def session_stream(websocket: WebSocket, session_id: str) -> None:
    """The session's stream (module docstring). Refused at the upgrade, with the HTTP error the routes answer: a
    missing or unknown API key (401), an unknown session (404), a replica shutting down or Redis unavailable (503)."""
    request_id = take_request_id(websocket.scope)
    token = request_id_var.set(request_id)
    shutdown: Shutdown = websocket.app.state.shutdown
    flow: SessionFlow = websocket.app.state.flow
    try:
        if shutdown.draining:
            await _deny(websocket, 503, "this replica is shutting down: connect again (to any replica) and resume "
                                        "from the `seq` of the `open` frame", request_id)
            return
        try:
            owner = owner_of_request(websocket, websocket.app.state.settings)
            meta, lease = await flow.open_stream(session_id, owner)
        except HTTPException as error:  # the API key
            await _deny(websocket, error.status_code, str(error.detail), request_id)
            return
        except Exception as error:
            status, body, _ = error_answer(error, websocket.scope)
            note_error(websocket.scope, error, status)
            if status == 500:  # the service's fault: its traceback, once
                log.error("session stream: unexpected error opening a stream", exc_info=error)
            await _deny(websocket, status, body["detail"], request_id)
            return
        stream = Stream(websocket, session_id, owner, request_id)
        try:
            await websocket.accept()
            with shutdown.streaming(stream.close_soon):
                # in a task of its own: each frame resumes the stream's own few frames, not the dozen of the ASGI
                # middleware and routing that await it (re-entered on every resume otherwise); cancelled with them
                await asyncio.get_running_loop().create_task(stream.run(meta))
        finally:
            flow.close_stream(session_id, lease)
    finally:
        request_id_var.reset(token)


async def _deny(websocket: WebSocket, status: int, detail: str, request_id: str) -> None:
    """Refuse the upgrade with an HTTP answer where the server can send one (ASGI's denial response), else close."""
    body = orjson.dumps({"detail": detail, "request_id": request_id})
    headers = {"retry-after": "1"} if status == 503 else None
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(Response(body, status_code=status, media_type="application/json",
                                                      headers=headers))
    else:
        await websocket.close(TRY_AGAIN_LATER if status == 503 else 1008, reason=detail[:120])

