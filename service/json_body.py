"""Request bodies read as the JSON they are (an integer of any length is a number), and routes with a fast path.

Python's ``json`` refuses to make an int of an integer longer than 4300 digits (``sys.int_max_str_digits``, a
guard against quadratic conversion), and FastAPI answers that with a 400 "There was an error parsing the body" that
names nothing. Such an integer is read as a float instead (infinite: past every float's range), so that validation
names the field and the rule it breaks (``body.rows.0.0: Input should be a finite number``). Bodies without one
are parsed as before, by the one ``json.loads`` call.

A route whose endpoint carries a *fast path* (:func:`with_fast_path`) tries it first: a function of the request
that answers the plain case (a body of the expected types and nothing else) without FastAPI's dependency solver,
validation and answer serialization, and returns None for anything else, which the endpoint then handles as
before. The fast path raises the same errors as the endpoint (the app's handlers answer them), so the answer
does not depend on which of the two took the request.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute


def _integer(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:  # longer than int's string limit: a number all the same
        return float(text)


class JSONBodyRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(body)
            except json.JSONDecodeError:
                raise
            except ValueError:  # an integer past int's string limit (or text that is not UTF-8, raised again)
                self._json = json.loads(body, parse_int=_integer)
        return self._json


FastPath = Callable[[Request], Awaitable[Response | None]]


async def fast_json(request: Request) -> Any:
    """A fast path's read of the body: what orjson reads of a body declared ``application/json``; None for any
    other body, or one orjson refuses (the endpoint's parser then reads it and names what is wrong)."""
    if request.headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
        return None
    try:
        return orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return None


def with_fast_path(fast: FastPath) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give an endpoint a fast path (see the module's docstring); the route's class must be :class:`JSONBodyRoute`."""

    def mark(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        endpoint.fast_path = fast  # type: ignore[attr-defined]
        return endpoint

    return mark


class JSONBodyRoute(APIRoute):
    """The route class of every router whose operations take a JSON body."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()
        fast: FastPath | None = getattr(self.endpoint, "fast_path", None)

        async def read_json_body(request: Request) -> Response:
            request = JSONBodyRequest(request.scope, request.receive)
            if fast is not None:  # the body it reads stays with the request, for the endpoint if it declines
                answer = await fast(request)
                if answer is not None:
                    return answer
            return await handler(request)

        return read_json_body
