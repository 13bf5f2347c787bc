"""JSON bodies read once, and the fast path a route's plain requests take through the same door.

Every route of the native API that takes a JSON body uses :class:`JSONBodyRoute` (the KServe v2 routes read theirs
themselves: a body there may carry binary tensors). Before its endpoint runs, the route reads the body once:

- a body sent without ``Content-Type: application/json`` is refused (415) with what to send instead (a plain
  ``curl -d`` sends a form);
- the body is parsed once, by orjson; the parsed value is what the endpoint's validation reads (no second parse).
  A body orjson refuses is parsed by the standard library, which names where and why it is not JSON (422), and
  which reads an integer past 64 bits as the number it is (an integer longer than Python's 4300-digit string
  limit as an infinite float, so that validation names the field and the rule it breaks rather than "There was an
  error parsing the body").

A route whose endpoint carries a *fast path* (:func:`with_fast_path`) then tries it: a function of the request that
answers the plain case (a body of exactly the expected types, :func:`plain_piece`, :func:`plain_body`) without
FastAPI's dependency solver, pydantic's validation and its serialization of the answer, and returns None for
anything else, which the endpoint then validates and names what is wrong. The fast path runs inside the middleware
stack, like the endpoint, and raises the same errors (the app's handlers answer them): the answer does not depend on
which of the two took the request. The busiest route's, a session's pieces, is taken before the router
(:class:`FastPathAtTheDoor`); the others' in the route. :func:`answer_json` serializes a fast path's answer once.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np
import orjson
from fastapi import HTTPException, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from service import result_json
from service.middleware import replaying
from service.runtime.pipeline import InputError
from service.schemas import FLOAT32_MAX, SegmentResponse, SessionInfo
from service.sessions import SessionMeta

FastPath = Callable[[Request], Awaitable[Response | None]]
_UNREAD = object()


class UnsupportedBody(Exception):
    """A body that is not declared as JSON (HTTP 415); the message says what to send."""


def _integer(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:  # longer than int's string limit: a number all the same
        return float(text)


def _json_of(body: bytes) -> Any:
    """``body`` parsed: by orjson, or where orjson refuses it by the standard library (integers past 64 bits), whose
    error names the place; :class:`InputError` for text that is not JSON, a 400 for bytes that are not UTF-8."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body, parse_int=_integer)
    except UnicodeDecodeError as error:
        raise HTTPException(400, f"the body is not UTF-8 text (byte {error.start} is 0x{body[error.start]:02x}): "
                                 "send JSON encoded as UTF-8") from None
    except json.JSONDecodeError as error:
        raise InputError(f"the body is not valid JSON: {error.msg} at line {error.lineno}, column {error.colno} "
                         f"(character {error.pos})", loc=("body",), kind="json_invalid") from None


def is_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


# in a request's scope: its body as parsed by the fast path at the door, which declined it (FastPathAtTheDoor)
DECLINED_AT_THE_DOOR = "rtserve.declined_at_the_door"


class JSONBodyRequest(Request):
    """A request whose JSON body is read once (:meth:`json`), by the route and the endpoint alike (and by the fast
    path at the door before them)."""

    _parsed: Any = _UNREAD

    async def json(self) -> Any:
        if self._parsed is _UNREAD:
            self._parsed = self.scope.get(DECLINED_AT_THE_DOOR, _UNREAD)
        if self._parsed is _UNREAD:
            self._parsed = _json_of(await self.body())
        return self._parsed


async def read_json(request: Request) -> Any:
    """The request's JSON body, parsed once (None where it has none); :class:`UnsupportedBody` for a body that is not
    declared JSON, :class:`InputError` for one that is not JSON."""
    body = await request.body()
    if not body:
        return None
    content_type = request.headers.get("content-type")
    if content_type is None or not is_json(content_type):
        said = f"`{content_type}`" if content_type else "none"
        raise UnsupportedBody(
            f"send the body as JSON with `Content-Type: application/json` (this request's Content-Type: {said}; "
            "with curl: --json '<body>', or -H 'Content-Type: application/json' -d '<body>')")
    return await request.json()


def with_fast_path(fast: FastPath) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give an endpoint a fast path (see the module's docstring); the route's class must be :class:`JSONBodyRoute`."""

    def mark(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        endpoint.fast_path = fast  # type: ignore[attr-defined]
        return endpoint

    return mark


async def take_fast_path(request: JSONBodyRequest, fast: FastPath | None) -> Response | None:
    """The body read and refused if it is not JSON (with what to send), then ``fast``'s answer: None where the
    endpoint has to validate the body."""
    await read_json(request)  # refused here, with what to send, before validation reads it
    if fast is None or DECLINED_AT_THE_DOOR in request.scope:  # declined once already
        return None
    return await fast(request)


class JSONBodyRoute(APIRoute):
    """The route class of every router whose operations take a JSON body."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()
        fast: FastPath | None = getattr(self.endpoint, "fast_path", None)

        async def read_json_body(request: Request) -> Response:
            request = JSONBodyRequest(request.scope, request.receive)
            answer = await take_fast_path(request, fast)
            return answer if answer is not None else await handler(request)

        return read_json_body


class FastPathAtTheDoor:
    """The fast path of the busiest route (a session's pieces), taken where the app's own middleware ends.

    Placed innermost among the app's middleware (inside the request's id and metrics, the shutdown's cut and the body
    limit, which have read the body), it answers a request of ``route`` that its fast path takes, as the route would,
    without the way there: Starlette's exception middleware, the router's match against every route, FastAPI's
    request and its dependency scopes, which cost a piece about a twentieth of its instructions. An error is answered
    by the app's own exception handlers, as the route's would be (an unexpected one goes on up, as it does from the
    route). Any other request, and a body the fast path leaves to validation, goes through the app as before (with
    its body again).
    """

    def __init__(self, app: ASGIApp, route: JSONBodyRoute, handlers: Mapping[Any, Any]) -> None:
        """``handlers``: the app's exception handlers (FastAPI.exception_handlers), complete when Starlette builds the
        middleware, at the first request. Those of Starlette's exception middleware are kept: by class, less the
        handler of every exception, which Starlette's server error middleware, further out, calls and then lets the
        error go on up, to be logged with its traceback."""
        self.app, self.route = app, route
        self.fast: FastPath = route.endpoint.fast_path  # type: ignore[attr-defined]
        self.handlers = {kind: handler for kind, handler in handlers.items()
                         if isinstance(kind, type) and kind is not Exception}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        match, found = self.route.matches(scope)
        if match is not Match.FULL:
            await self.app(scope, receive, send)
            return
        scope.update(found)  # path_params and route, as the router sets them (the metrics name the route by it)
        request = JSONBodyRequest(scope, receive)
        try:
            answer = await take_fast_path(request, self.fast)
        except Exception as error:
            # the handler Starlette's exception middleware would pick: the one of the error's nearest class
            handler = next((self.handlers[kind] for kind in type(error).__mro__ if kind in self.handlers), None)
            if handler is None:
                raise
            answer = await handler(request, error)
        if answer is None:  # validation names what is wrong: the app's way, with the body and what it parsed to
            scope[DECLINED_AT_THE_DOOR] = await request.json()
            await self.app(scope, replaying(await request.body(), receive), send)
            return
        await answer(scope, receive, send)


# ---- what a fast path takes: bodies of exactly the plain types ------------------------------------------------
def plain_rows(rows: Any, raw: bytes | str, strings_beside: int | None = None) -> np.ndarray | None:
    """``rows`` as validation takes them, as a float64 array ``(T, C)``, when they are at least one row of JSON
    numbers (int or float, never bool), finite and within float32's range; None otherwise (validation then names what
    is wrong). ``raw``: the body they were parsed from. The checks run in numpy, not per value: the rows become one
    array (None for ragged rows, strings, nulls, integers past 64 bits), and a body holding no ``true``/``false``
    holds no bool (in a body of only ``seq`` and ``rows`` a bool could be nowhere else; in any other a ``true``
    anywhere leaves the body to validation, which is right either way). ``strings_beside``: how many JSON strings the
    body holds outside ``rows`` (its keys, a model's name), where the caller knows: when the body has no other ``"``
    and no ``null``, ``rows`` holds only numbers and lists, and numpy reads them as float64 straight away, without
    first finding their type (which costs as much again)."""
    if type(rows) is not list or not rows or _may_hold_a_bool(raw):
        return None
    only_numbers = strings_beside is not None and _holds_no_other_string(raw, strings_beside)
    try:
        array = np.array(rows, dtype=np.float64) if only_numbers else np.array(rows)
    except (ValueError, OverflowError, TypeError):  # ragged rows; an empty object among them
        return None
    if array.ndim != 2 or array.dtype.kind not in "fi":
        return None
    if array.dtype.kind == "i":
        array = array.astype(np.float64)  # as pydantic reads a JSON integer: a float (the digest reads it)
    if array.size and not np.abs(array).max() <= FLOAT32_MAX:  # also False for NaN
        return None
    return array


def plain_text(text: Any, raw: bytes | str, strings_beside: int | None = None) -> str | None:
    """``text`` when it is a JSON string (validation takes it as it is); None otherwise. ``raw`` and
    ``strings_beside``: unread (the signature is :func:`plain_rows`')."""
    return text if type(text) is str else None


def _may_hold_a_bool(raw: bytes | str) -> bool:
    # a body of numbers holds no "u" and no "a": one byte is found far faster than four (memchr)
    if isinstance(raw, str):
        return ("u" in raw and "true" in raw) or ("a" in raw and "false" in raw)
    return (b"u" in raw and b"true" in raw) or (b"a" in raw and b"false" in raw)


def _holds_no_other_string(raw: bytes | str, strings: int) -> bool:
    # each JSON string is two quotes at least (an escaped one inside adds more); "u" is in every null (and true)
    if isinstance(raw, str):
        return raw.count('"') == 2 * strings and "u" not in raw
    return raw.count(b'"') == 2 * strings and b"u" not in raw


def plain_piece(body: Any, raw: bytes | str) -> tuple[int, str | None, np.ndarray | None] | None:
    """``(seq, text, rows)`` of a session piece that validation takes as it is; None for any other body, which
    validation then names what is wrong with. Only the plain types pass: ``seq`` an int (not a bool, not 8.0) from
    1, ``text`` a str or ``rows`` (:func:`plain_rows`), and no other field. ``raw``: the body as it came."""
    if type(body) is not dict or len(body) != 2:
        return None
    seq = body.get("seq")
    if type(seq) is not int or seq < 1:
        return None
    text = body.get("text")
    if type(text) is str:
        return seq, text, None
    numbers = plain_rows(body.get("rows"), raw, strings_beside=2)  # the keys "seq" and "rows"
    return None if numbers is None else (seq, None, numbers)


def plain_body(body: Any, field: str) -> dict[str, Any] | None:
    """A one-shot body: a JSON object holding ``field`` and at most a string ``model`` besides; None for any other."""
    if type(body) is not dict or field not in body or len(body) > 2:
        return None
    if len(body) == 2 and type(body.get("model")) is not str:
        return None
    return body


def session_fields(meta: SessionMeta) -> dict[str, Any]:
    """The session as the JSON object :class:`SessionInfo` serializes to."""
    return {"id": meta.id, "model": meta.model, "task": meta.task, "seq": meta.seq, "consumed": meta.consumed,
            "segments": meta.segments, "state_bytes": meta.state_bytes, "status": meta.status,
            "created_at": meta.created, "expires_at": meta.expires_at}


def info(meta: SessionMeta) -> SessionInfo:
    return SessionInfo(**session_fields(meta))


# the fields of each result SegmentResponse.result may be: a result with exactly one of these sets is what
# pydantic's union would validate and serialize it as (each other member lacks a required field)
RESULT_FIELDS = frozenset(frozenset(member.model_fields) for member in typing.get_args(
    SegmentResponse.model_fields["result"].annotation))


def piece_answer(meta: SessionMeta, result: dict[str, Any], replayed: bool, serialized: bytes = b"") -> bytes:
    """The :class:`SegmentResponse` of an applied (or replayed) piece, serialized once without validating it again
    (through pydantic only for a result of no plain shape). ``serialized``: ``result`` already as
    :func:`result_json.dumps` writes it (the commit's), spliced in as it is rather than written again."""
    if frozenset(result) not in RESULT_FIELDS:
        return SegmentResponse(session=info(meta), replayed=replayed, result=result).model_dump_json().encode()
    if not serialized:
        return result_json.dumps({"session": session_fields(meta), "replayed": replayed, "result": result})
    return b"".join((b'{"session":', result_json.dumps(session_fields(meta)),
                     b',"replayed":true,"result":' if replayed else b',"replayed":false,"result":', serialized, b"}"))


def answer_json(response_model: type[BaseModel], values: dict[str, Any]) -> Response:
    """``response_model(**values)`` as its JSON, serialized once with orjson when ``values`` are exactly its fields
    (what pydantic would emit, in its field order); through pydantic otherwise."""
    fields = response_model.model_fields
    if values.keys() != fields.keys():
        return Response(response_model(**values).model_dump_json(), media_type="application/json")
    return Response(result_json.dumps({name: values[name] for name in fields}), media_type="application/json")
