"""Errors the service answers with, and the checks shared by handlers.

Every error is JSON ``{"detail": ...}`` that tells the caller what to change.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from service.runtime.pipeline import InputError
from service.runtime.registry import UnknownModel
from service.schemas import ErrorBody
from service.sessions import SequenceConflict, SessionFinished, SessionLimit, SessionNotFound
from service.settings import Settings
from service.state_store import StateStoreUnavailable

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Missing or unknown API key."},
    404: {"model": ErrorBody, "description": "Unknown model, or unknown / expired / foreign session."},
    409: {"model": ErrorBody, "description": "Sequence gap, stale or conflicting piece, or finished session."},
    413: {"model": ErrorBody, "description": "Request body larger than RTSERVE_MAX_BODY_BYTES."},
    422: {"model": ErrorBody, "description": "Input the model cannot take (too long, wrong shape, ...)."},
    429: {"model": ErrorBody, "description": "Too many sessions for this key, or pieces for this session."},
    503: {"model": ErrorBody, "description": "Redis unreachable, busy or out of memory: the outcome is unknown; "
          "retry the same request (the same `seq` is safe) after `Retry-After` seconds."},
}


def check_text(text: str, settings: Settings) -> None:
    """422 for text over the limit, or text that is not Unicode: a lone UTF-16 surrogate.

    JSON's ``\\ud83d`` escapes can carry half of a surrogate pair (a client that cuts text by UTF-16
    length). Such text is refused, never repaired: a replacement character would change the document,
    and a session streamed in pieces would no longer equal the document posted whole.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InputError(
            f"text has a lone UTF-16 surrogate (U+{ord(text[error.start]):04X}) at character {error.start}: "
            "send whole characters (cut text at code points, never inside a surrogate pair)"
        ) from None
    if len(text) > settings.max_text_chars:
        raise InputError(
            f"text has {len(text)} characters, the limit is {settings.max_text_chars}: send it through a session "
            "in pieces"
        )


def check_rows(rows: list[list[float]], settings: Settings) -> None:
    if len(rows) > settings.max_rows:
        raise InputError(f"{len(rows)} rows, the limit is {settings.max_rows}: send them through a session")


class AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII characters escaped: an error that quotes a client's string (a model name, a
    validation error's input) renders even when that string holds a lone surrogate."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _error(status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return AsciiJSONResponse({"detail": detail, **extra}, status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer, rendered ASCII-safe (its input may quote a lone surrogate)
        return AsciiJSONResponse({"detail": jsonable_encoder(error.errors())}, status_code=422)

    @app.exception_handler(UnknownModel)
    async def unknown_model(request: Request, error: UnknownModel) -> JSONResponse:
        return _error(404, str(error.args[0]))

    @app.exception_handler(InputError)
    async def bad_input(request: Request, error: InputError) -> JSONResponse:
        return _error(422, str(error))

    @app.exception_handler(SessionNotFound)
    async def no_session(request: Request, error: SessionNotFound) -> JSONResponse:
        return _error(404, str(error.args[0]))

    @app.exception_handler(SequenceConflict)
    async def conflict(request: Request, error: SequenceConflict) -> JSONResponse:
        return _error(409, str(error), expected_seq=error.expected)

    @app.exception_handler(SessionFinished)
    async def finished(request: Request, error: SessionFinished) -> JSONResponse:
        return _error(409, str(error))

    @app.exception_handler(SessionLimit)
    async def limit(request: Request, error: SessionLimit) -> JSONResponse:
        return _error(429, str(error))

    @app.exception_handler(StateStoreUnavailable)
    async def redis_down(request: Request, error: StateStoreUnavailable) -> JSONResponse:
        # A command may have reached Redis before the connection broke: the outcome is unknown, never
        # "nothing was changed". A retry is safe: the same seq is applied at most once (a piece that did
        # apply comes back `replayed`), finish is idempotent, and a create that did happen expires idle.
        return _error(
            503,
            f"session store unavailable: {error}. The outcome of this request is unknown; retry it after "
            "Retry-After seconds: retrying the same seq is always safe (it is applied at most once)",
            {"Retry-After": "1"},
        )
