"""Errors the service answers with, and the checks shared by handlers.

Every error is one JSON shape, :class:`service.schemas.ErrorBody`: a string ``detail`` that tells the caller
what to change, ``errors`` (validation: each field), ``expected_seq`` (409) and the ``request_id``.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.runtime.pipeline import InputError
from service.runtime.registry import UnknownModel
from service.schemas import ErrorBody
from service.sessions import SequenceConflict, SessionFinished, SessionLimit, SessionNotFound
from service.settings import Settings
from service.state_store import StateStoreUnavailable

_WHY: dict[int, str] = {
    400: "The body is not JSON text the service can read (e.g. not UTF-8).",
    401: "Missing or unknown API key (only when `RTSERVE_API_KEYS` is set).",
    404: "Unknown model, or unknown / expired / foreign session.",
    408: "The request body did not arrive within `RTSERVE_REQUEST_READ_TIMEOUT_SECONDS`.",
    409: "Sequence gap, stale or conflicting piece, or a piece for a finished session; `expected_seq` says what "
         "to send next.",
    413: "Request body larger than `RTSERVE_MAX_BODY_BYTES`: send long inputs through a session.",
    422: "A field is missing or malformed (`errors` lists each), or input the model cannot take (too long, wrong "
         "row width, text for a forecast session, ...).",
    429: "Too many sessions for this key, or pieces for this session.",
    503: "Redis unreachable, busy or out of memory: the outcome is unknown; retry the same request (the same `seq` "
         "is safe) after `Retry-After` seconds.",
}

BODY = (400, 408, 413, 422)  # what any route with a request body can answer


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of the error statuses a route can answer, each with the one error body."""
    documented: dict[int | str, dict[str, Any]] = {}
    for status in sorted(set(statuses)):
        entry: dict[str, Any] = {"model": ErrorBody, "description": _WHY[status]}
        if status == 503:
            entry["headers"] = {"Retry-After": {"description": "Seconds to wait before retrying.",
                                                "schema": {"type": "integer"}}}
        documented[status] = entry
    return documented


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


def _error(request: Request, status: int, detail: str, headers: dict[str, str] | None = None,
           **extra: Any) -> JSONResponse:
    body = {"detail": detail, **{key: value for key, value in extra.items() if value is not None},
            "request_id": getattr(request.state, "request_id", None)}
    return AsciiJSONResponse(body, status_code=status, headers=headers)


def _field_errors(error: RequestValidationError) -> list[dict[str, Any]]:
    return [{"loc": [part if isinstance(part, int) else str(part) for part in item.get("loc", ())],
             "msg": str(item.get("msg", "")), "type": str(item.get("type", ""))} for item in error.errors()]


def _summary(errors: list[dict[str, Any]]) -> str:
    """One sentence naming the fields: ``body.rows.0.1: Input should be a valid number; ...``."""
    parts = [f"{'.'.join(str(p) for p in item['loc']) or 'request'}: {item['msg']}" for item in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid request: " + "; ".join(parts) + more


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = _field_errors(error)
        return _error(request, 422, _summary(errors), errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> Response:
        if error.status_code in (204, 304):  # no body allowed
            return Response(status_code=error.status_code, headers=error.headers)
        detail = error.detail if isinstance(error.detail, str) else json.dumps(jsonable_encoder(error.detail))
        if error.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.url.path}: see /docs for the routes"
        elif error.status_code == 405 and detail == "Method Not Allowed":
            detail = f"{request.method} is not allowed on {request.url.path}: see /docs"
        return _error(request, error.status_code, detail, error.headers)

    @app.exception_handler(UnknownModel)
    async def unknown_model(request: Request, error: UnknownModel) -> JSONResponse:
        return _error(request, 404, str(error.args[0]))

    @app.exception_handler(InputError)
    async def bad_input(request: Request, error: InputError) -> JSONResponse:
        return _error(request, 422, str(error))

    @app.exception_handler(SessionNotFound)
    async def no_session(request: Request, error: SessionNotFound) -> JSONResponse:
        return _error(request, 404, str(error.args[0]))

    @app.exception_handler(SequenceConflict)
    async def conflict(request: Request, error: SequenceConflict) -> JSONResponse:
        return _error(request, 409, str(error), expected_seq=error.expected)

    @app.exception_handler(SessionFinished)
    async def finished(request: Request, error: SessionFinished) -> JSONResponse:
        return _error(request, 409, str(error))

    @app.exception_handler(SessionLimit)
    async def limit(request: Request, error: SessionLimit) -> JSONResponse:
        return _error(request, 429, str(error))

    @app.exception_handler(StateStoreUnavailable)
    async def redis_down(request: Request, error: StateStoreUnavailable) -> JSONResponse:
        # A command may have reached Redis before the connection broke: the outcome is unknown, never
        # "nothing was changed". A retry is safe: the same seq is applied at most once (a piece that did
        # apply comes back `replayed`), finish is idempotent, and a create that did happen expires idle.
        return _error(
            request, 503,
            f"session store unavailable: {error}. The outcome of this request is unknown; retry it after "
            "Retry-After seconds: retrying the same seq is always safe (it is applied at most once)",
            {"Retry-After": "1"},
        )

    @app.exception_handler(Exception)
    async def server_error(request: Request, error: Exception) -> JSONResponse:
        # Starlette's ServerErrorMiddleware calls this, then re-raises: uvicorn logs the traceback
        return _error(request, 500, f"internal error ({type(error).__name__}); quote the request id when reporting it")
