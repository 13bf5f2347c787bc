"""Errors the service answers with, and the checks shared by handlers.

Every error is one JSON shape, :class:`service.schemas.ErrorBody`: a string ``detail`` that tells the caller
what to change, ``errors`` (validation: each field), ``expected_seq`` (409) and the ``request_id``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from service.fast_path import UnsupportedBody
from service.kserve.tensors import UnreadableBody
from service.middleware import error_body, route_template
from service.runtime.engine_wire import EngineUnavailable
from service.runtime.pipeline import InputError
from service.runtime.registry import UnknownModel
from service.schemas import PIECE_KINDS, VISIBLE_CHARACTER, ErrorBody
from service.sessions import SequenceConflict, SessionFinished, SessionLimit, SessionNotFound
from service.settings import Settings
from service.state_store import ServiceOverloaded, StateStoreUnavailable

log = logging.getLogger("rtserve")

_WHY: dict[int, str] = {
    400: "The body is not JSON text the service can read (e.g. not UTF-8); on /v2, also binary tensor data that "
         "disagree with their JSON header.",
    401: "Missing or unknown API key (only when `RTSERVE_API_KEYS` is set).",
    404: "Unknown model, or unknown / expired / foreign session.",
    408: "The request body did not arrive within `RTSERVE_REQUEST_READ_TIMEOUT_SECONDS`.",
    409: "Sequence gap, stale or conflicting piece, or a piece for a finished session; `expected_seq` says what "
         "to send next.",
    415: "The body is not declared as JSON: send it with `Content-Type: application/json`.",
    413: "Request body larger than `RTSERVE_MAX_BODY_BYTES`: send long inputs through a session.",
    422: "A field is missing or malformed (`errors` lists each), or input the model cannot take (too long, wrong "
         "row width, text for a forecast session, ...).",
    429: "Too many live sessions for this key (finishing, deleting or idle expiry frees a place; `Retry-After` says "
         "when the next one expires by itself), or too many pieces for this session.",
    503: "Redis unreachable, busy or out of memory, the replica too busy to read Redis's answers in time, or the "
         "replica shut down before the request finished: the "
         "outcome is unknown; `detail` says what a retry does (a piece: the same `seq`, applied at most once). "
         "Retry after `Retry-After` seconds.",
}

BODY = (400, 408, 413, 415, 422)  # what any route with a request body can answer
VISIBLE = re.compile(VISIBLE_CHARACTER)


def responses(*statuses: int, body: type[BaseModel] = ErrorBody) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of the error statuses a route can answer, each with the one error ``body`` (the
    KServe v2 routes': their protocol's)."""
    documented: dict[int | str, dict[str, Any]] = {}
    for status in sorted(set(statuses)):
        entry: dict[str, Any] = {"model": body, "description": _WHY[status]}
        if status == 503:
            entry["headers"] = {"Retry-After": {"description": "Seconds to wait before retrying.",
                                                "schema": {"type": "integer"}}}
        documented[status] = entry
    return documented


def check_text(text: str, settings: Settings, document: bool = False) -> None:
    """422 for text over the limit, text that is not Unicode (a lone UTF-16 surrogate), and, for a whole
    ``document`` (a one-shot request; a session's piece may be any cut of one), text without a visible character.

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
    if document and not VISIBLE.search(text):
        raise InputError("`text` has no visible character (it is empty, or only whitespace or control characters): "
                         "send the document's text", loc=("body", "text"), kind="no_text")


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
    return AsciiJSONResponse(error_body(request.scope, detail, **extra), status_code=status, headers=headers)


def _field_errors(errors: Sequence[Any], prefix: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    # a piece's kind (PIECE_KINDS), which pydantic puts in its errors' locations, is not a field: left out
    return [{"loc": [*prefix, *(part if isinstance(part, int) else str(part) for part in item.get("loc", ())
                                if part not in PIECE_KINDS)],
             "msg": str(item.get("msg", "")), "type": str(item.get("type", ""))} for item in errors]


def validation_body(errors: Sequence[Any], prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """The 422 body (less ``request_id``) of pydantic's ``errors``, their locations under ``prefix`` (``("body",)``
    for what a route validates itself)."""
    fields = _field_errors(errors, prefix)
    return {"detail": _summary(fields), "errors": fields}


def _summary(errors: list[dict[str, Any]]) -> str:
    """One sentence naming the fields: ``body.rows.0.1: Input should be a valid number; ...``."""
    parts = [f"{'.'.join(str(p) for p in item['loc']) or 'request'}: {item['msg']}" for item in errors[:5]]
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "invalid request: " + "; ".join(parts) + more


# what a service error means over HTTP: one table, read by the one handler, by streams already under way and by the
# session streams' error frames
STATUS: dict[type[Exception], int] = {
    UnknownModel: 404, SessionNotFound: 404, InputError: 422, SequenceConflict: 409, SessionFinished: 409,
    SessionLimit: 429, UnsupportedBody: 415, StateStoreUnavailable: 503, EngineUnavailable: 503, UnreadableBody: 400,
}

KSERVE_RETRY = ("send the same request again: one outside a sequence changes nothing, and a sequence's piece with "
                "parameters.sequence_seq is applied at most once (answered replayed: true if it did apply); without "
                "sequence_seq a retried piece may be applied twice")

# what retrying a request does, by route, for the answers whose outcome is unknown (503)
_RETRY = {
    ("POST", "/sessions"): "retry the create; if the first one did create a session, that session is left unused "
                           "and expires when idle",
    ("POST", "/sessions/{session_id}/segments"): "retry the same seq with the same content, which is always safe: "
                                                 "it is applied at most once (a piece that did apply answers "
                                                 "replayed: true)",
    ("POST", "/sessions/{session_id}/finish"): "finish again, which is always safe: a finished session answers its "
                                               "stored result",
    ("DELETE", "/sessions/{session_id}"): "delete again (a 404 then means the first delete went through)",
    ("", "/sessions/{session_id}/stream"): "connect again (to any replica) and send the same seq with the same "
                                           "content, which is always safe: it is applied at most once (a piece that "
                                           "did apply answers replayed: true)",
    **{("POST", path): KSERVE_RETRY for path in ("/v2/models/{model_name}/infer",
                                                 "/v2/models/{model_name}/versions/{model_version}/infer")},
    **{("GRPC", f"/inference.GRPCInferenceService/{method}"): KSERVE_RETRY
       for method in ("ModelInfer", "ModelStreamInfer")},
}


def retry_advice(scope: Scope) -> str:
    """What a client should do after an answer whose outcome is unknown, for the request's route."""
    return _RETRY.get((scope.get("method", ""), route_template(scope)),
                      "retry it after Retry-After seconds: it changes nothing on the server")


def error_answer(error: Exception, scope: Scope) -> tuple[int, dict[str, Any], dict[str, str] | None]:
    """Status, body (less ``request_id``) and headers answering ``error``, raised while serving ``scope``."""
    status = next((code for kind, code in STATUS.items() if isinstance(error, kind)), 500)
    body: dict[str, Any] = {"detail": str(error)}
    headers: dict[str, str] | None = None
    if isinstance(error, InputError) and error.loc is not None:
        body["errors"] = [{"loc": list(error.loc), "msg": str(error), "type": error.kind}]
    elif isinstance(error, SequenceConflict):
        body["expected_seq"] = error.expected
    elif isinstance(error, SessionLimit) and error.retry_after is not None:
        headers = {"Retry-After": str(error.retry_after)}
    elif isinstance(error, StateStoreUnavailable | EngineUnavailable):
        # A command may have reached Redis before the connection broke: the outcome is unknown, never
        # "nothing was changed". What a retry does is the route's (retry_advice). An overloaded replica says so
        # itself; it is not the store that failed.
        cause = (str(error) if isinstance(error, ServiceOverloaded | EngineUnavailable)
                 else f"session store unavailable: {error}")
        body["detail"] = f"{cause}. The outcome of this request is unknown: " + retry_advice(scope)
        headers = {"Retry-After": "1"}
    elif status == 500:
        body["detail"] = f"internal error ({type(error).__name__}); quote the request id when reporting it"
    return status, body, headers


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return _error(request, 422, **validation_body(error.errors()))

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

    async def service_error(request: Request, error: Exception) -> JSONResponse:
        status, body, headers = error_answer(error, request.scope)
        note_error(request.scope, error, status)
        return _error(request, status, headers=headers, **body)

    for kind in STATUS:
        app.add_exception_handler(kind, service_error)
    # Starlette's ServerErrorMiddleware calls this one, then re-raises: uvicorn logs the traceback
    app.add_exception_handler(Exception, service_error)


def note_error(scope: Scope, error: Exception, status: int) -> None:
    """What the service says of an error it answers: the model it concerns on the request (its metrics and access
    log name it), and its log line. A 4xx is the client's business: one DEBUG line. A 503 the service answers on
    purpose (Redis or the engine unavailable, the replica overloaded): one WARNING line. Any other error is the
    service's fault: its traceback is logged at ERROR by the server (uvicorn), once."""
    model = getattr(error, "model_ref", None)
    state = scope.setdefault("state", {})
    if model and not state.get("model"):
        state["model"] = model
    if status < 500:
        log.debug("answered %d: %s", status, error)
    elif type(error) in STATUS or isinstance(error, StateStoreUnavailable | EngineUnavailable):
        log.warning("answered %d: %s", status, error)
