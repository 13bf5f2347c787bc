"""A Python client of the rtserve API, sync (:class:`Client`) and async (:class:`AsyncClient`), on httpx and websockets.

    from rtserve.client import Client

    with Client("http://127.0.0.1:8000", api_key="...") as client:
        client.classify("The senator said ...")["label"]
        for text in client.summarize_stream(article):        # Server-Sent Events, whole words at a time
            print(text, end="", flush=True)
        with client.session(task="classify") as session:     # `seq` is counted for you
            for piece in pieces:
                session.send(text=piece)                     # over the session's stream
            final = session.finish()                         # the one-shot answer, plus `session`

A session's pieces travel one of two ways (``client.session(..., transport=...)``):

- ``"stream"``, the default: the session's WebSocket (``/sessions/{id}/stream``), opened at the first piece and kept
  open until the session is finished or closed. A piece is one frame each way: no HTTP request to parse and route,
  and the replica holding the stream keeps the session's state in memory, so it reads nothing from Redis for the
  next piece (over HTTP, a load balancer may send each piece to another replica, which must read it). Rows go as
  binary frames of float32 values where the replica says it takes them (its ``open`` frame), as JSON otherwise.
  Where the service does not offer the stream (an older service, or a proxy that does not pass WebSockets on), the
  session goes over HTTP by itself, and so do the client's later sessions; ``session.transport`` says which it uses.
- ``"http"``: one ``POST /sessions/{id}/segments`` per piece.

Retries, the same guarantees either way: a 503 (Redis unavailable; ``Retry-After`` is honoured) or a broken
connection (refused, reset, timed out) is retried up to ``retries`` times by sending the *same* request again — for a
session piece, the same ``seq`` and content. The server applies a ``seq`` at most once and answers a repeat from the
stored result (``replayed``), and finish is idempotent, so a piece that reached the server before the connection
broke is not applied twice: exactly once. A stream reconnects (to the same URL: a load balancer picks the replica)
after a dropped connection, a close with 1012 (the replica is restarting) or 1013 (Redis unavailable), or an
``error`` frame of status 503, reads where the session stands from the ``open`` frame, and sends the frame in flight
again: a piece the server applied before the connection broke (its ``seq`` is at most the ``open`` frame's) is
answered ``replayed``, which gives the caller the answer that was lost. ``session.reconnects`` counts them, by reason.
A retried ``POST /sessions`` may leave an unused session behind, which expires when idle. A Server-Sent Events
stream is retried only before its first event; one the server cannot complete once under way (e.g. its replica shut
down) ends with an `error` event, raised as :class:`APIError` (a session's finish stream: finish again). A summary
finished over a session's stream continues after a reconnect where the text given so far ends.

Errors: any other 4xx/5xx raises :class:`APIError` with the server's ``detail``, ``errors``, ``expected_seq`` and
``request_id``, over either transport; a connection that cannot be made or keeps breaking raises httpx's transport
errors (``httpx.ConnectError``, ``httpx.ReadError``, timeouts), over either transport. Defaults: ``RTSERVE_URL``
(else http://127.0.0.1:8000) and ``RTSERVE_API_KEY`` from the environment.

How the code is laid out: every call is written once, as a *plan* (a generator) that yields the I/O it needs —
an HTTP request, a frame to send or receive, a pause — and is sent each outcome back (an error is raised at its
``yield``). :class:`Client` does each step with blocking calls, :class:`AsyncClient` awaits it; retries, resumes and
the reading of answers are the plans', shared by both.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import struct
import time
from collections import Counter
from collections.abc import AsyncIterator, Generator, Iterator, Sequence
from contextlib import AsyncExitStack, ExitStack, aclosing
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import numpy as np
import websockets.asyncio.client
import websockets.sync.client
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidMessage, InvalidStatus

DEFAULT_URL = "http://127.0.0.1:8000"
RETRIED_STATUSES = (503,)
Transport = Literal["stream", "http"]
STREAM_OPTIONS: dict[str, Any] = {
    "compression": None,  # frames are small JSON; deflating each would cost the replica CPU on every piece
    "max_size": None,  # the server's answers, as httpx reads them: whole
    "close_timeout": 2,  # a connection whose replica died is not waited on for long
}

Plan = Generator[Any, Any, Any]  # yields steps (below), is sent each step's outcome, returns the call's answer


class APIError(Exception):
    """An error answer: ``status``, and the error body's ``detail``, ``errors``, ``expected_seq``, ``request_id``."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status = status
        self.body = body
        self.detail: str = str(body.get("detail", ""))
        self.errors: list[dict[str, Any]] | None = body.get("errors")
        self.expected_seq: int | None = body.get("expected_seq")
        self.request_id: str | None = body.get("request_id")
        super().__init__(f"{status}: {self.detail} (request id {self.request_id})")


def _json_object(text: str | bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(text)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _error(response: httpx.Response) -> APIError:
    return APIError(response.status_code, _json_object(response.content) or {"detail": response.text})


def _retry_after(headers: Any, attempt: int, backoff: float) -> float:
    """The wait before retry ``attempt`` + 1: the answer's ``Retry-After``, else exponential backoff."""
    if headers is not None and headers.get("retry-after", "").isdigit():
        return float(headers["retry-after"])
    return backoff * 2**attempt


def _url_and_headers(url: str | None, api_key: str | None) -> tuple[str, dict[str, str]]:
    """The server and the key header: arguments first, then ``RTSERVE_URL`` / ``RTSERVE_API_KEY``."""
    api_key = api_key if api_key is not None else os.environ.get("RTSERVE_API_KEY")
    return (url or os.environ.get("RTSERVE_URL") or DEFAULT_URL).rstrip("/"), {"X-API-Key": api_key} if api_key else {}


_RETRY = object()  # what :func:`_answer` returns when the request should be sent again


def _answer(response: httpx.Response | None, method: str, attempt: int, retries: int) -> Any:
    """The JSON answer (None for 204), :data:`_RETRY`, or raises :class:`APIError`; ``response`` is None after
    a transport error (re-raised by the caller on the last attempt)."""
    if response is None or (response.status_code in RETRIED_STATUSES and attempt < retries):
        return _RETRY
    if response.status_code >= 400:
        if method == "DELETE" and response.status_code == 404 and attempt > 0:
            return None  # the first try deleted it, its answer was lost
        raise _error(response)
    return None if response.status_code == 204 else response.json()


def _options(**options: Any) -> dict[str, Any]:
    return {key: value for key, value in options.items() if value is not None}


def _rows(rows: Sequence[Sequence[float]] | None) -> list[list[float]] | None:
    return [list(map(float, row)) for row in rows] if rows is not None else None


def binary_rows_frame(seq: int, values: np.ndarray) -> bytes:
    """The session stream's binary frame of a piece of rows: seq, rows, columns (little-endian uint64, uint32,
    uint32), then ``values`` (rows x columns) as little-endian float32, row after row."""
    values = np.ascontiguousarray(values, dtype="<f4")
    return struct.pack("<QII", seq, *values.shape) + values.tobytes()


def _binary_rows(frame: dict[str, Any]) -> bytes | None:
    """A piece of rows as the stream's binary frame (:func:`binary_rows_frame`; float32 is what a forecaster reads);
    None for any other frame, or rows that are not one rectangle of finite float32 numbers (sent as JSON, for the
    replica to say what is wrong)."""
    rows = frame.get("rows")
    if rows is None or set(frame) != {"seq", "rows"} or not rows:
        return None
    try:
        values = np.asarray(rows, dtype=np.float64)
    except ValueError:  # ragged
        return None
    with np.errstate(over="ignore"):  # past float32's range: infinite, and sent as JSON
        narrow = values.astype("<f4")
    if values.ndim != 2 or not np.isfinite(narrow).all():
        return None
    return binary_rows_frame(frame["seq"], narrow)


class _SSE:
    """Server-Sent Events, parsed line by line: (event, data) pairs."""

    def __init__(self) -> None:
        self.event, self.data = "message", []

    def feed(self, line: str) -> tuple[str, str] | None:
        if not line:
            if not self.data:
                return None
            event, data = self.event, "\n".join(self.data)
            self.event, self.data = "message", []
            return event, data
        if line.startswith(":"):
            return None  # a comment (keep-alive ping)
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            self.event = value
        elif field == "data":
            self.data.append(value)
        return None


def _summary_event(event: str, data: dict[str, Any]) -> tuple[str, Any] | None:
    """A summary stream's event as the caller gets it: ("token", text) or ("done", the answer); an `error` event (the
    server could not complete the stream; its body says why, with ``status``) is raised; others are skipped."""
    if event == "token":
        return "token", data["text"]
    if event == "done":
        return "done", data
    if event == "error":
        raise APIError(int(data.get("status", 500)), data)
    return None


def _beyond(said: str, heard: str) -> str:
    """What ``heard``, a summary streamed again after a reconnect, adds to ``said``, the text the caller already has.
    The same state gives the same summary (decoding draws nothing at random): anything else is refused."""
    if heard.startswith(said):
        return heard[len(said):]
    if said.startswith(heard):
        return ""
    raise APIError(503, {"detail": "the summary's stream broke, and the finish sent again streamed another text than "
                                   "the one given so far: finish again for the stored summary"})


# ---- steps: what a plan yields ---------------------------------------------------------------------------------


class IO:
    """One I/O operation a plan asks for: the client's method ``_<operation>`` called with ``arguments`` (blocking in
    :class:`Client`, awaited in :class:`AsyncClient`); the plan is sent its outcome, or has its error raised at the
    ``yield``. The operations:

    - ``request`` (method, path, body): the response, read (a transport error raised);
    - ``open_events`` (path, body): an :class:`_EventSource`, its response read up to the body (an error's body read
      too); it is closed when the plan ends;
    - ``next_line`` (source): the event source's next line, None at its end;
    - ``connect`` (path): a WebSocket (a refused upgrade raises ``InvalidStatus``);
    - ``send_frame`` (connection, text or bytes); ``receive_frame`` (connection): the next text frame
      (``ConnectionClosed`` once the connection is closed, ``TimeoutError`` after the client's timeout);
      ``disconnect`` (connection);
    - ``sleep`` (seconds).
    """

    __slots__ = ("operation", "arguments")

    def __init__(self, operation: str, *arguments: Any) -> None:
        self.operation, self.arguments = operation, arguments

    def __repr__(self) -> str:
        return f"IO({self.operation!r}, ...)"


@dataclass(frozen=True)
class Emit:
    """Not I/O: a value handed to the caller of a streaming call before the plan ends (a summary's text)."""

    value: Any


@dataclass(frozen=True)
class Done:
    """The plan returned ``answer``."""

    answer: Any


@dataclass(frozen=True)
class _EventSource:
    response: httpx.Response
    lines: Any  # the response's (async) iterator of lines


def _advance(plan: Plan, sent: Any, error: BaseException | None) -> Any:
    """The plan's next step after ``sent`` (or ``error``, raised at its ``yield``); :class:`Done` once it returned."""
    try:
        return plan.throw(error) if error is not None else plan.send(sent)
    except StopIteration as end:
        return Done(end.value)


# ---- a stream that broke: why, how long to wait, and what to raise when the attempts run out -------------------


@dataclass(frozen=True)
class _Broken:
    reason: str  # counted in ``session.reconnects``
    error: Exception  # raised when no attempt is left
    headers: Any = None  # the refusal's headers, where there was one (its Retry-After)


class _Unavailable(Exception):
    """A 503 on a session's stream: the upgrade refused (the replica drains, or Redis is unavailable), or an `error`
    frame (Redis or the engine unavailable: the replica closes the stream with 1013, and the frame's outcome is
    unknown). Tried again on a new connection."""

    def __init__(self, broken: _Broken) -> None:
        super().__init__(str(broken.error))
        self.broken = broken


def _diagnose(error: Exception, url: str) -> _Broken | None:
    """What a failure of the session's stream at ``url`` means, or None for one that is not the connection's (raised
    as is)."""
    if isinstance(error, _Unavailable):
        return error.broken
    request = httpx.Request("GET", url)  # what the httpx error names
    if isinstance(error, ConnectionClosed):
        code = error.rcvd.code if error.rcvd is not None else None
        reason = f"closed {code}" if code is not None else "dropped"
        return _Broken(reason, httpx.ReadError(f"the session's stream was closed ({reason})", request=request))
    if isinstance(error, TimeoutError):
        return _Broken("timed out", httpx.ReadTimeout(f"the session's stream timed out: {error}", request=request))
    if isinstance(error, OSError | InvalidMessage):
        reason = "dropped at the upgrade" if isinstance(error, InvalidMessage) else "unreachable"
        return _Broken(reason, httpx.ConnectError(f"cannot open the session's stream: {error}", request=request))
    return None


_NO_STREAM = object()  # what a stream's plan returns when the service turned out not to offer it


# ---- the calls, written once ------------------------------------------------------------------------------------


class _Calls:
    """The client's calls, for :class:`Client` and :class:`AsyncClient` alike (as redis-py shares its commands): each
    builds a plan and hands it to ``_run``, which gives its answer (Client) or an awaitable of it (AsyncClient)."""

    def __init__(self, url: str | None, api_key: str | None, timeout: float, retries: int, backoff: float) -> None:
        self.url, self.headers = _url_and_headers(url, api_key)
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.streams_offered: bool | None = None  # whether the service offers session streams, once a session knows

    def _run(self, plan: Plan) -> Any:
        raise NotImplementedError

    def _summary_stream(self, plan: Plan) -> Any:
        raise NotImplementedError

    def _new_session(self, info: dict[str, Any], transport: Transport) -> Any:
        raise NotImplementedError

    # ---- plans shared by every call
    def _exchange(self, method: str, path: str, body: dict[str, Any] | None = None) -> Plan:
        """One call, retried on 503 and transport errors; the JSON answer (None for 204)."""
        for attempt in range(self.retries + 1):
            response = None
            try:
                response = yield IO("request", method, path, body)
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
            if (answer := _answer(response, method, attempt, self.retries)) is not _RETRY:
                return answer
            yield IO("sleep", _retry_after(response.headers if response is not None else None, attempt, self.backoff))
        raise AssertionError("unreachable")

    def _events(self, path: str, body: dict[str, Any]) -> Plan:
        """A POST answered with Server-Sent Events: emits ("token", text) as they come, then ("done", answer), and
        returns the answer."""
        for attempt in range(self.retries + 1):
            try:
                source = yield IO("open_events", path, body)
            except httpx.ConnectError:  # nothing was sent: safe to try again
                if attempt == self.retries:
                    raise
                yield IO("sleep", _retry_after(None, attempt, self.backoff))
                continue
            if source.response.status_code in RETRIED_STATUSES and attempt < self.retries:
                yield IO("sleep", _retry_after(source.response.headers, attempt, self.backoff))
                continue
            if source.response.status_code >= 400:
                raise _error(source.response)
            parser, answer = _SSE(), None
            while (line := (yield IO("next_line", source))) is not None:
                if (event := parser.feed(line)) is not None:
                    if (item := _summary_event(event[0], json.loads(event[1]))) is not None:
                        yield Emit(item)
                        answer = item[1] if item[0] == "done" else answer
            return answer
        raise AssertionError("unreachable")

    def _open_session(self, method: str, path: str, body: dict[str, Any] | None, transport: Transport) -> Plan:
        if transport not in ("stream", "http"):
            raise ValueError(f"transport is 'stream' or 'http', not {transport!r}")
        return self._new_session((yield from self._exchange(method, path, body)), transport)

    # ---- one-shot
    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One call, retried on 503 and transport errors; the JSON answer (None for 204)."""
        return self._run(self._exchange(method, path, body))

    def classify(self, text: str, model: str | None = None) -> Any:
        return self.request("POST", "/classify", _options(text=text, model=model))

    def summarize(self, text: str, model: str | None = None, max_length: int | None = None,
                  beam_size: int | None = None, decoding: str | None = None) -> Any:
        return self.request("POST", "/summarize", _options(text=text, model=model, max_length=max_length,
                                                           beam_size=beam_size, decoding=decoding))

    def summarize_stream(self, text: str, model: str | None = None, max_length: int | None = None,
                         beam_size: int | None = None, decoding: str | None = None) -> Any:
        """The summary as it is generated: iterate over its text (``async for`` with AsyncClient); ``result`` is
        the `done` answer once iteration ended."""
        body = _options(text=text, model=model, max_length=max_length, beam_size=beam_size, decoding=decoding,
                        stream=True)
        return self._summary_stream(self._events("/summarize", body))

    def forecast(self, rows: Sequence[Sequence[float]], model: str | None = None) -> Any:
        return self.request("POST", "/forecast", _options(rows=_rows(rows), model=model))

    def models(self) -> Any:
        return self.request("GET", "/models")

    # ---- sessions
    def session(self, task: str | None = None, model: str | None = None, transport: Transport = "stream") -> Any:
        """A new session (of ``task``'s default model, or of ``model``) whose pieces go over ``transport``."""
        return self._run(self._open_session("POST", "/sessions", _options(task=task, model=model), transport))

    def resume(self, session_id: str, transport: Transport = "stream") -> Any:
        """A session opened elsewhere (its next ``seq`` is read from the server)."""
        return self._run(self._open_session("GET", f"/sessions/{session_id}", None, transport))


class _SessionCalls:
    """A session's calls, for :class:`Session` and :class:`AsyncSession` alike: :meth:`send` numbers the pieces,
    :meth:`finish` answers like the one-shot endpoint. Over the stream, a piece or a finish is sent again (the same
    frame) until it is answered, reconnecting as the module docstring says."""

    def __init__(self, client: _Calls, info: dict[str, Any], transport: Transport) -> None:
        self.client, self.info = client, info
        self.id: str = info["id"]
        self.seq: int = info["seq"]
        self.transport: Transport = "http" if client.streams_offered is False else transport
        self.opened: dict[str, Any] | None = None  # the session as the stream's last `open` frame told it
        self.binary_rows = False  # the replica at the stream's end takes rows as binary frames (its `open` frame)
        self.reconnects: Counter[str] = Counter()  # the stream's reconnects, by reason ("closed 1012", "dropped", ...)
        self._connection: Any = None  # the stream, while open

    @property
    def path(self) -> str:
        return f"/sessions/{self.id}"

    def send(self, text: str | None = None, rows: Sequence[Sequence[float]] | None = None) -> Any:
        """The next piece (``text`` or ``rows``); the running result after it."""
        return self.client._run(self._piece(_options(seq=self.seq + 1, text=text, rows=_rows(rows))))

    def finish(self, max_length: int | None = None, beam_size: int | None = None, decoding: str | None = None) -> Any:
        """The one-shot endpoint's answer for the whole input, plus ``session``."""
        options = _options(max_length=max_length, beam_size=beam_size, decoding=decoding)
        return self.client._run(self._finish(options))

    def finish_stream(self, max_length: int | None = None, beam_size: int | None = None,
                      decoding: str | None = None) -> Any:
        """A summary session's finish, its text as it is generated (iterate; ``result`` is the answer)."""
        options = _options(max_length=max_length, beam_size=beam_size, decoding=decoding, stream=True)
        return self.client._summary_stream(self._finish(options))

    def status(self) -> Any:
        return self.client._run(self._status())

    def delete(self) -> Any:
        return self.client._run(self._delete())

    def close(self) -> Any:
        """Closes the session's stream, if open; the session stays (send again to reopen it, or resume elsewhere)."""
        return self.client._run(self._close_stream())

    # ---- plans
    def _piece(self, body: dict[str, Any]) -> Plan:
        answer = _NO_STREAM
        if self.transport == "stream":
            answer = yield from self._over_stream(body)
        if answer is _NO_STREAM:
            answer = yield from self.client._exchange("POST", f"{self.path}/segments", body)
        self.seq, self.info = answer["session"]["seq"], answer["session"]
        return answer

    def _finish(self, options: dict[str, Any]) -> Plan:
        """The finish; with ``stream`` in ``options`` it emits the summary's text, then ("done", answer)."""
        answer = _NO_STREAM
        if self.transport == "stream":
            answer = yield from self._over_stream({"finish": options})
            yield from self._close_stream()  # nothing more to send
        if answer is _NO_STREAM:
            path = f"{self.path}/finish"
            events = options.get("stream")
            answer = yield from (self.client._events(path, options) if events else self.client._exchange(
                "POST", path, options))
        if answer is not None:  # None: an event stream that ended without `done`
            self.info = answer["session"]
        return answer

    def _status(self) -> Plan:
        self.info = yield from self.client._exchange("GET", self.path)
        return self.info

    def _delete(self) -> Plan:
        yield from self._close_stream()
        return (yield from self.client._exchange("DELETE", self.path))

    def _end(self, failed: bool) -> Plan:
        """Leaving the session's ``with`` block: the stream closed, and a session that failed half-way deleted (its
        state freed now, not when it expires)."""
        yield from self._close_stream()
        if failed and self.info.get("status") != "finished":
            try:
                yield from self.client._exchange("DELETE", self.path)
            except (APIError, httpx.HTTPError):
                pass

    def _close_stream(self) -> Plan:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            yield IO("disconnect", connection)

    def _open_stream(self) -> Plan:
        """Opens the stream and reads its `open` frame (where the session stands); returns False when the service
        does not offer the stream: an older service refuses the upgrade (403), a proxy that does not pass WebSockets
        on sends it as a plain GET, which finds no route (404, while the session is there), another answers it
        otherwise. rtserve's own refusals raise its error, as over HTTP; a 503 is tried again."""
        try:
            connection = yield IO("connect", f"{self.path}/stream")
        except InvalidStatus as refused:
            response = refused.response
            body = _json_object(bytes(response.body or b""))
            if response.status_code in RETRIED_STATUSES:
                raise _Unavailable(_Broken("refused 503", APIError(response.status_code, body or {"detail": "refused"}),
                                           response.headers)) from None
            if response.status_code == 404:  # no such session, or no such route: the session's route tells which
                yield from self.client._exchange("GET", self.path)  # raises the session's 404
            elif body is not None and "request_id" in body:  # rtserve's refusal (a key it does not know: 401)
                raise APIError(response.status_code, body) from None
            self.client.streams_offered = False
            return False
        except InvalidHandshake as refused:
            if isinstance(refused, InvalidMessage):  # the connection broke during the upgrade
                raise
            self.client.streams_offered = False  # answered, but not with an upgrade
            return False
        self._connection = connection
        self.client.streams_offered = True
        opened = json.loads((yield IO("receive_frame", connection)))
        self.opened = opened["session"]
        self.binary_rows = opened.get("binary_rows") is True
        return True

    def _over_stream(self, frame: dict[str, Any]) -> Plan:
        """``frame`` (a piece, or ``{"finish": ...}``) sent over the stream: its answer, or :data:`_NO_STREAM` when
        the service does not offer the stream. A summary's token frames are emitted as they come, then
        ("done", answer).

        The same frame is sent again until it is answered: after a dropped connection, a close, or an `error` frame
        of status 503, the stream is opened again (through the same URL: the load balancer picks a replica) and the
        `open` frame says where the session stands. A piece whose seq is at most that seq was applied (its answer was
        lost on the way back): sent again with the same seq and content it is answered ``replayed``, with the result
        it had. A later one was not applied: now it is. Each attempt waits longer (``backoff``, doubled each time, or
        the server's Retry-After); after ``retries`` in a row the last failure is raised."""
        # the frame as sent, each form made once and only if sent: binary rows where the replica takes them, else JSON
        binary, text = functools.cache(lambda: _binary_rows(frame)), functools.cache(lambda: json.dumps(frame))
        said = ""  # a summary's text emitted so far: after a reconnect the finish streams the summary from its start
        for attempt in range(self.client.retries + 1):
            try:
                if self._connection is None and not (yield from self._open_stream()):
                    self.transport = "http"
                    return _NO_STREAM
                yield IO("send_frame", self._connection, (self.binary_rows and binary()) or text())
                heard = ""
                while True:
                    reply = json.loads((yield IO("receive_frame", self._connection)))
                    event = reply.get("event")
                    if event is None:  # a piece's or a finish's answer
                        return reply
                    if event == "error" and reply.get("status") in RETRIED_STATUSES:
                        raise _Unavailable(_Broken("error 503", APIError(reply["status"], reply["data"])))
                    if event == "error":  # a 4xx: nothing was applied, and the stream stays open
                        if reply["status"] >= 500:  # the replica closes the stream after it (1011)
                            yield from self._close_stream()
                        raise APIError(reply["status"], reply["data"])
                    kind, value = _summary_event(event, reply["data"]) or (None, None)
                    if kind == "token":
                        heard += value
                        if more := _beyond(said, heard):
                            said += more
                            yield Emit(("token", more))
                    elif kind == "done":
                        yield Emit(("done", value))
                        return value
            except Exception as error:
                broken = _diagnose(error, f"{self.client.url}{self.path}/stream")
                if broken is None:
                    raise
                yield from self._close_stream()
                if attempt == self.client.retries:
                    raise broken.error from error
                self.reconnects[broken.reason] += 1
                yield IO("sleep", _retry_after(broken.headers, attempt, self.client.backoff))
        raise AssertionError("unreachable")


# ---- the two clients: the I/O of each step ------------------------------------------------------------------------


class Client(_Calls):
    """Synchronous client; use as a context manager or call :meth:`close`. ``transport``: an httpx transport for the
    HTTP calls (tests mock the server with one), not a session's transport."""

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 120.0, retries: int = 3,
                 backoff: float = 0.5, transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(url, api_key, timeout, retries, backoff)
        self.http = httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout, transport=transport)
        self._streams: set[websockets.sync.client.ClientConnection] = set()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the HTTP connections and any session stream still open."""
        for connection in list(self._streams):
            self._disconnect(connection)
        self.http.close()

    def _run(self, plan: Plan) -> Any:
        for step in self._steps(plan):
            if isinstance(step, Done):
                return step.answer
        raise AssertionError("unreachable")

    def _summary_stream(self, plan: Plan) -> SummaryStream:
        return SummaryStream(step.value for step in self._steps(plan) if isinstance(step, Emit))

    def _new_session(self, info: dict[str, Any], transport: Transport) -> Session:
        return Session(self, info, transport)

    def _steps(self, plan: Plan) -> Iterator[Emit | Done]:
        """Runs ``plan``, doing each I/O step it yields; yields what it emits, and last, :class:`Done`."""
        sent, error = None, None
        with ExitStack() as opened:  # what the plan opened, closed when it ends (or is abandoned)
            opened.callback(plan.close)
            while not isinstance(step := _advance(plan, sent, error), Done):
                sent, error = None, None
                if isinstance(step, Emit):
                    yield step
                    continue
                try:
                    sent = getattr(self, f"_{step.operation}")(*step.arguments)
                except Exception as raised:  # raised in the plan, at its yield
                    error = raised
                if isinstance(sent, _EventSource):
                    opened.callback(sent.response.close)
        yield step

    def _request(self, method: str, path: str, body: dict[str, Any] | None) -> httpx.Response:
        return self.http.request(method, path, json=body)

    def _open_events(self, path: str, body: dict[str, Any]) -> _EventSource:
        request = self.http.build_request("POST", path, json=body, headers={"Accept": "text/event-stream"})
        response = self.http.send(request, stream=True)
        if response.status_code >= 400:
            response.read()
        return _EventSource(response, response.iter_lines())

    def _next_line(self, source: _EventSource) -> str | None:
        return next(source.lines, None)

    def _connect(self, path: str) -> websockets.sync.client.ClientConnection:
        connection = websockets.sync.client.connect(
            "ws" + self.url.removeprefix("http") + path, additional_headers=self.headers, open_timeout=self.timeout,
            legacy=True, **STREAM_OPTIONS)
        self._streams.add(connection)
        return connection

    def _send_frame(self, connection: websockets.sync.client.ClientConnection, frame: str | bytes) -> None:
        connection.send(frame)

    def _receive_frame(self, connection: websockets.sync.client.ClientConnection) -> str:
        return str(connection.recv(timeout=self.timeout))

    def _disconnect(self, connection: websockets.sync.client.ClientConnection) -> None:
        self._streams.discard(connection)
        connection.close()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class AsyncClient(_Calls):
    """The same calls as :class:`Client`, awaited; ``summarize_stream`` and ``finish_stream`` give async iterators."""

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 120.0, retries: int = 3,
                 backoff: float = 0.5, transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(url, api_key, timeout, retries, backoff)
        self.http = httpx.AsyncClient(base_url=self.url, headers=self.headers, timeout=timeout, transport=transport)
        self._streams: set[websockets.asyncio.client.ClientConnection] = set()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the HTTP connections and any session stream still open."""
        for connection in list(self._streams):
            await self._disconnect(connection)
        await self.http.aclose()

    async def _run(self, plan: Plan) -> Any:
        async with aclosing(self._steps(plan)) as steps:
            async for step in steps:
                if isinstance(step, Done):
                    return step.answer
        raise AssertionError("unreachable")

    def _summary_stream(self, plan: Plan) -> AsyncSummaryStream:
        return AsyncSummaryStream(self._steps(plan))

    def _new_session(self, info: dict[str, Any], transport: Transport) -> AsyncSession:
        return AsyncSession(self, info, transport)

    async def _steps(self, plan: Plan) -> AsyncIterator[Emit | Done]:
        """Runs ``plan``, awaiting each I/O step it yields; yields what it emits, and last, :class:`Done`."""
        sent, error = None, None
        async with AsyncExitStack() as opened:  # what the plan opened, closed when it ends (or is abandoned)
            opened.callback(plan.close)
            while not isinstance(step := _advance(plan, sent, error), Done):
                sent, error = None, None
                if isinstance(step, Emit):
                    yield step
                    continue
                try:
                    sent = await getattr(self, f"_{step.operation}")(*step.arguments)
                except Exception as raised:  # raised in the plan, at its yield
                    error = raised
                if isinstance(sent, _EventSource):
                    opened.push_async_callback(sent.response.aclose)
        yield step

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> httpx.Response:
        return await self.http.request(method, path, json=body)

    async def _open_events(self, path: str, body: dict[str, Any]) -> _EventSource:
        request = self.http.build_request("POST", path, json=body, headers={"Accept": "text/event-stream"})
        response = await self.http.send(request, stream=True)
        if response.status_code >= 400:
            await response.aread()
        return _EventSource(response, response.aiter_lines())

    async def _next_line(self, source: _EventSource) -> str | None:
        return await anext(source.lines, None)

    async def _connect(self, path: str) -> websockets.asyncio.client.ClientConnection:
        connection = await websockets.asyncio.client.connect(
            "ws" + self.url.removeprefix("http") + path, additional_headers=self.headers, open_timeout=self.timeout,
            **STREAM_OPTIONS)
        self._streams.add(connection)
        return connection

    async def _send_frame(self, connection: websockets.asyncio.client.ClientConnection, frame: str | bytes) -> None:
        await connection.send(frame)

    async def _receive_frame(self, connection: websockets.asyncio.client.ClientConnection) -> str:
        async with asyncio.timeout(self.timeout):
            return str(await connection.recv())

    async def _disconnect(self, connection: websockets.asyncio.client.ClientConnection) -> None:
        self._streams.discard(connection)
        await connection.close()

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class Session(_SessionCalls):
    """A session of :class:`Client`; as a context manager it closes its stream at the end, and deletes the session if
    the block failed before finishing it."""

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self.client._run(self._end(failed=kind is not None))


class AsyncSession(_SessionCalls):
    """A session of :class:`AsyncClient`: the same calls, awaited (``async with`` as :class:`Session`'s ``with``)."""

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, kind: object, *exc: object) -> None:
        await self.client._run(self._end(failed=kind is not None))


class SummaryStream:
    """Iterates over the summary text as it arrives; ``result`` is the `done` answer once iteration ended."""

    def __init__(self, events: Iterator[tuple[str, Any]]) -> None:
        self._events = events
        self.result: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[str]:
        for kind, value in self._events:
            if kind == "token":
                yield value
            else:
                self.result = value


class AsyncSummaryStream:
    """:class:`SummaryStream` with ``async for``."""

    def __init__(self, steps: AsyncIterator[Emit | Done]) -> None:
        self._steps = steps
        self.result: dict[str, Any] | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        async with aclosing(self._steps) as steps:  # the connection closes now, not when the loop collects it
            async for step in steps:
                if isinstance(step, Emit):
                    kind, value = step.value
                    if kind == "token":
                        yield value
                    else:
                        self.result = value
