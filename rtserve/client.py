"""A Python client of the rtserve HTTP API, sync (:class:`Client`) and async (:class:`AsyncClient`), on httpx.

    from rtserve.client import Client

    with Client("http://127.0.0.1:8000", api_key="...") as client:
        client.classify("The senator said ...")["label"]
        for text in client.summarize_stream(article):        # Server-Sent Events, whole words at a time
            print(text, end="", flush=True)
        with client.session(task="classify") as session:     # `seq` is counted for you
            for piece in pieces:
                session.send(text=piece)
            final = session.finish()                         # the one-shot answer, plus `session`

Retries: a 503 (Redis unavailable; ``Retry-After`` is honoured) or a transport error (connection refused, reset,
timed out) is retried up to ``retries`` times by sending the *same* request again — for a session piece, the same
``seq``. The server applies a ``seq`` at most once and answers a repeat from the stored result (``replayed``), and
finish is idempotent, so a piece that did reach the server before the connection broke is not applied twice:
exactly once. A retried ``POST /sessions`` may leave an unused session behind, which expires when idle. A stream
is retried only before its first event; one the server cannot complete once under way (e.g. its replica shut down)
ends with an `error` event, raised as :class:`APIError` (a session's finish stream: finish again).

Errors: any other 4xx/5xx raises :class:`APIError` with the server's ``detail``, ``errors``, ``expected_seq`` and
``request_id``. Defaults: ``RTSERVE_URL`` (else http://127.0.0.1:8000) and ``RTSERVE_API_KEY`` from the environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
RETRIED_STATUSES = (503,)


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


def _error(response: httpx.Response) -> APIError:
    try:
        body = response.json()
    except ValueError:
        body = {"detail": response.text}
    return APIError(response.status_code, body if isinstance(body, dict) else {"detail": str(body)})


def _retry_after(response: httpx.Response | None, attempt: int, backoff: float) -> float:
    if response is not None and response.headers.get("retry-after", "").isdigit():
        return float(response.headers["retry-after"])
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


def _stream_error(data: str) -> APIError:
    """The `error` event that ends a stream the server could not complete (its body says why, with ``status``)."""
    body = json.loads(data)
    return APIError(int(body.get("status", 500)), body)


class SummaryStream:
    """Iterates over the summary text as it arrives; ``result`` is the `done` answer once iteration ended."""

    def __init__(self, events: Iterator[tuple[str, str]]) -> None:
        self._events = events
        self.result: dict[str, Any] | None = None

    def __iter__(self) -> Iterator[str]:
        for event, data in self._events:
            if event == "token":
                yield json.loads(data)["text"]
            elif event == "done":
                self.result = json.loads(data)
            elif event == "error":
                raise _stream_error(data)


class AsyncSummaryStream:
    def __init__(self, events: AsyncGenerator[tuple[str, str], None]) -> None:
        self._events = events
        self.result: dict[str, Any] | None = None

    async def __aiter__(self) -> AsyncIterator[str]:
        try:
            async for event, data in self._events:
                if event == "token":
                    yield json.loads(data)["text"]
                elif event == "done":
                    self.result = json.loads(data)
                elif event == "error":
                    raise _stream_error(data)
        finally:  # the connection closes now, not when the event loop collects the generator
            await self._events.aclose()


class Client:
    """Synchronous client; use as a context manager or call :meth:`close`."""

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 120.0, retries: int = 3,
                 backoff: float = 0.5, transport: httpx.BaseTransport | None = None) -> None:
        self.url, headers = _url_and_headers(url, api_key)
        self.retries, self.backoff = retries, backoff
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One call, retried on 503 and transport errors; the JSON answer (None for 204)."""
        for attempt in range(self.retries + 1):
            response = None
            try:
                response = self.http.request(method, path, json=body)
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
            if (answer := _answer(response, method, attempt, self.retries)) is not _RETRY:
                return answer
            time.sleep(_retry_after(response, attempt, self.backoff))
        raise AssertionError("unreachable")

    def _events(self, path: str, body: dict[str, Any]) -> Iterator[tuple[str, str]]:
        for attempt in range(self.retries + 1):
            try:
                with self.http.stream("POST", path, json=body, headers={"Accept": "text/event-stream"}) as response:
                    if response.status_code in RETRIED_STATUSES and attempt < self.retries:
                        response.read()
                        time.sleep(_retry_after(response, attempt, self.backoff))
                        continue
                    if response.status_code >= 400:
                        response.read()
                        raise _error(response)
                    parser = _SSE()
                    for line in response.iter_lines():
                        if (event := parser.feed(line)) is not None:
                            yield event
                    return
            except httpx.ConnectError:  # nothing was sent: safe to try again
                if attempt == self.retries:
                    raise
                time.sleep(_retry_after(None, attempt, self.backoff))

    # ---- one-shot ------------------------------------------------------------------------------------------
    def classify(self, text: str, model: str | None = None) -> dict[str, Any]:
        return self.request("POST", "/classify", _options(text=text, model=model))

    def summarize(self, text: str, model: str | None = None, max_length: int | None = None,
                  beam_size: int | None = None, decoding: str | None = None) -> dict[str, Any]:
        return self.request("POST", "/summarize", _options(text=text, model=model, max_length=max_length,
                                                           beam_size=beam_size, decoding=decoding))

    def summarize_stream(self, text: str, model: str | None = None, max_length: int | None = None,
                         beam_size: int | None = None, decoding: str | None = None) -> SummaryStream:
        body = _options(text=text, model=model, max_length=max_length, beam_size=beam_size, decoding=decoding,
                        stream=True)
        return SummaryStream(self._events("/summarize", body))

    def forecast(self, rows: Sequence[Sequence[float]], model: str | None = None) -> dict[str, Any]:
        return self.request("POST", "/forecast", _options(rows=[list(map(float, row)) for row in rows], model=model))

    def models(self) -> list[dict[str, Any]]:
        return self.request("GET", "/models")

    # ---- sessions ------------------------------------------------------------------------------------------
    def session(self, task: str | None = None, model: str | None = None) -> Session:
        return Session(self, self.request("POST", "/sessions", _options(task=task, model=model)))

    def resume(self, session_id: str) -> Session:
        """A session opened elsewhere (its next ``seq`` is read from the server)."""
        return Session(self, self.request("GET", f"/sessions/{session_id}"))


class Session:
    """A session: :meth:`send` numbers the pieces, :meth:`finish` answers like the one-shot endpoint."""

    def __init__(self, client: Client, info: dict[str, Any]) -> None:
        self.client, self.info = client, info
        self.id: str = info["id"]
        self.seq: int = info["seq"]

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is not None and self.info.get("status") != "finished":  # failed half-way: free its state now
            try:
                self.delete()
            except (APIError, httpx.HTTPError):
                pass

    def send(self, text: str | None = None, rows: Sequence[Sequence[float]] | None = None) -> dict[str, Any]:
        body = _options(seq=self.seq + 1, text=text, rows=[list(map(float, r)) for r in rows] if rows else None)
        answer = self.client.request("POST", f"/sessions/{self.id}/segments", body)
        self.seq, self.info = answer["session"]["seq"], answer["session"]
        return answer

    def finish(self, max_length: int | None = None, beam_size: int | None = None,
               decoding: str | None = None) -> dict[str, Any]:
        answer = self.client.request("POST", f"/sessions/{self.id}/finish",
                                     _options(max_length=max_length, beam_size=beam_size, decoding=decoding))
        self.info = answer["session"]
        return answer

    def finish_stream(self, max_length: int | None = None, beam_size: int | None = None,
                      decoding: str | None = None) -> SummaryStream:
        body = _options(max_length=max_length, beam_size=beam_size, decoding=decoding, stream=True)
        return SummaryStream(self.client._events(f"/sessions/{self.id}/finish", body))

    def status(self) -> dict[str, Any]:
        self.info = self.client.request("GET", f"/sessions/{self.id}")
        return self.info

    def delete(self) -> None:
        self.client.request("DELETE", f"/sessions/{self.id}")


class AsyncClient:
    """The same calls as :class:`Client`, awaited; ``summarize_stream`` gives an async iterator."""

    def __init__(self, url: str | None = None, api_key: str | None = None, timeout: float = 120.0, retries: int = 3,
                 backoff: float = 0.5, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url, headers = _url_and_headers(url, api_key)
        self.retries, self.backoff = retries, backoff
        self.http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        for attempt in range(self.retries + 1):
            response = None
            try:
                response = await self.http.request(method, path, json=body)
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
            if (answer := _answer(response, method, attempt, self.retries)) is not _RETRY:
                return answer
            await asyncio.sleep(_retry_after(response, attempt, self.backoff))
        raise AssertionError("unreachable")

    async def _events(self, path: str, body: dict[str, Any]) -> AsyncGenerator[tuple[str, str], None]:
        for attempt in range(self.retries + 1):
            try:
                async with self.http.stream("POST", path, json=body,
                                            headers={"Accept": "text/event-stream"}) as response:
                    if response.status_code in RETRIED_STATUSES and attempt < self.retries:
                        await response.aread()
                        await asyncio.sleep(_retry_after(response, attempt, self.backoff))
                        continue
                    if response.status_code >= 400:
                        await response.aread()
                        raise _error(response)
                    parser = _SSE()
                    async for line in response.aiter_lines():
                        if (event := parser.feed(line)) is not None:
                            yield event
                    return
            except httpx.ConnectError:
                if attempt == self.retries:
                    raise
                await asyncio.sleep(_retry_after(None, attempt, self.backoff))

    async def classify(self, text: str, model: str | None = None) -> dict[str, Any]:
        return await self.request("POST", "/classify", _options(text=text, model=model))

    async def summarize(self, text: str, model: str | None = None, max_length: int | None = None,
                        beam_size: int | None = None, decoding: str | None = None) -> dict[str, Any]:
        return await self.request("POST", "/summarize", _options(text=text, model=model, max_length=max_length,
                                                                 beam_size=beam_size, decoding=decoding))

    def summarize_stream(self, text: str, model: str | None = None, max_length: int | None = None,
                         beam_size: int | None = None, decoding: str | None = None) -> AsyncSummaryStream:
        body = _options(text=text, model=model, max_length=max_length, beam_size=beam_size, decoding=decoding,
                        stream=True)
        return AsyncSummaryStream(self._events("/summarize", body))

    async def forecast(self, rows: Sequence[Sequence[float]], model: str | None = None) -> dict[str, Any]:
        return await self.request("POST", "/forecast",
                                  _options(rows=[list(map(float, row)) for row in rows], model=model))

    async def models(self) -> list[dict[str, Any]]:
        return await self.request("GET", "/models")

    async def session(self, task: str | None = None, model: str | None = None) -> AsyncSession:
        return AsyncSession(self, await self.request("POST", "/sessions", _options(task=task, model=model)))


class AsyncSession:
    def __init__(self, client: AsyncClient, info: dict[str, Any]) -> None:
        self.client, self.info = client, info
        self.id: str = info["id"]
        self.seq: int = info["seq"]

    async def send(self, text: str | None = None, rows: Sequence[Sequence[float]] | None = None) -> dict[str, Any]:
        body = _options(seq=self.seq + 1, text=text, rows=[list(map(float, r)) for r in rows] if rows else None)
        answer = await self.client.request("POST", f"/sessions/{self.id}/segments", body)
        self.seq, self.info = answer["session"]["seq"], answer["session"]
        return answer

    async def finish(self, max_length: int | None = None, beam_size: int | None = None,
               decoding: str | None = None) -> dict[str, Any]:
        answer = await self.client.request("POST", f"/sessions/{self.id}/finish",
                                           _options(max_length=max_length, beam_size=beam_size, decoding=decoding))
        self.info = answer["session"]
        return answer

    def finish_stream(self, max_length: int | None = None, beam_size: int | None = None,
                      decoding: str | None = None) -> AsyncSummaryStream:
        body = _options(max_length=max_length, beam_size=beam_size, decoding=decoding, stream=True)
        return AsyncSummaryStream(self.client._events(f"/sessions/{self.id}/finish", body))

    async def status(self) -> dict[str, Any]:
        self.info = await self.client.request("GET", f"/sessions/{self.id}")
        return self.info

    async def delete(self) -> None:
        await self.client.request("DELETE", f"/sessions/{self.id}")
