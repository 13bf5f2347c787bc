"""rtserve.client and the CLI's client verbs against a real `rtserve serve` process, which also writes
JSON logs with an access log: every line is JSON, carries its request id, and names route templates, never ids."""

import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from loadtest.chaos import free_port
from rtserve.client import APIError, AsyncClient, Client
from tests.service_helpers import start_rtserve
from tests.tiny_checkpoints import VARIABLES

KEY = "client-key"
TEXT = ("Shares in the bank rose five per cent on Monday after it reported a rise in profits for the year. "
        "The chief executive said the results showed the strength of the business in a difficult market. ") * 4


@pytest.fixture(scope="module")
def server(tmp_path_factory, every_task_repository, redis_url):
    root = tmp_path_factory.mktemp("client")
    port = free_port()
    log = root / "server.log"
    with open(log, "w") as output:
        process = start_rtserve({"RTSERVE_MODEL_REPOSITORY": str(every_task_repository), "RTSERVE_REDIS_URL": redis_url,
                                 "RTSERVE_REDIS_KEY_PREFIX": f"client-{os.getpid()}", "RTSERVE_API_KEYS": KEY,
                                 "RTSERVE_LOG_FORMAT": "json", "RTSERVE_ACCESS_LOG": "true"}, port, output=output)
    yield f"http://127.0.0.1:{port}", log
    process.terminate()
    process.wait(timeout=20)


def rows(count):
    return (np.random.default_rng().standard_normal((count, len(VARIABLES))) * 3 + 10).round(3).tolist()


class LoseAnswers(httpx.HTTPTransport):
    """Sends each request whose path ends with ``suffix`` to the server, then loses the first ``times`` answers
    (a connection that breaks after the request went out)."""

    def __init__(self, suffix, times):
        super().__init__()
        self.suffix, self.times, self.sent = suffix, times, 0

    def handle_request(self, request):
        response = super().handle_request(request)
        if request.url.path.endswith(self.suffix):
            self.sent += 1
            if self.times > 0:
                self.times -= 1
                response.read()
                raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response


def test_one_shot_calls_streams_and_errors(server):
    url, _ = server
    with Client(url, api_key=KEY) as client:
        assert client.classify(TEXT)["label"] in ("mainstream", "hyperpartisan")
        whole = client.summarize(TEXT, max_length=20)
        stream = client.summarize_stream(TEXT, max_length=20)
        assert "".join(stream) == whole["summary"] and stream.result == whole
        assert len(client.forecast(rows(40))["forecast"]) == 8
        assert {m["task"] for m in client.models() if m["default"]} == {"classify", "summarize", "forecast"}
        with pytest.raises(APIError) as error:
            client.forecast([[1.0] * 3] * 40)
        assert error.value.status == 422 and "7 per row" in error.value.detail and error.value.request_id
    with Client(url, api_key="wrong") as stranger, pytest.raises(APIError) as error:
        stranger.models()
    assert error.value.status == 401


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_stream_ended_by_an_error_event_raises_its_error_after_the_text_before_it(kind):
    events = ('event: token\r\ndata: {"text": "Shares rose"}\r\n\r\nevent: error\r\ndata: {"status": 503, '
              '"detail": "this replica is shutting down", "request_id": "r-1"}\r\n\r\n')

    def answer(request):
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events.encode())

    seen = []
    with pytest.raises(APIError) as error:
        if kind == "sync":
            with Client("http://rtserve.test", transport=httpx.MockTransport(answer)) as client:
                seen.extend(client.summarize_stream("text"))
        else:
            async def read():
                async with AsyncClient("http://rtserve.test", transport=httpx.MockTransport(answer)) as client:
                    async for text in client.summarize_stream("text"):
                        seen.append(text)

            asyncio.run(read())
    assert seen == ["Shares rose"]
    assert error.value.status == 503 and error.value.request_id == "r-1" and "shutting down" in error.value.detail


def test_session_numbers_pieces_and_a_lost_answer_is_retried_exactly_once(server):
    url, _ = server
    transport = LoseAnswers("/segments", times=2)
    pieces = [TEXT[i : i + 97] for i in range(0, len(TEXT), 97)]
    with Client(url, api_key=KEY, transport=transport, backoff=0.01) as client:
        whole = client.classify(TEXT)
        with client.session(task="classify") as session:
            answers = [session.send(text=piece) for piece in pieces]
            final = session.finish()
    assert transport.sent == len(pieces) + 2  # the first piece went out three times ...
    assert [a["replayed"] for a in answers] == [True] + [False] * (len(pieces) - 1)  # ... and was applied once
    assert final["session"]["seq"] == len(pieces) and final["session"]["consumed"] == whole["tokens_read"]
    assert final["probabilities"] == pytest.approx(whole["probabilities"], abs=1e-5)


def test_async_client_and_a_streamed_finish(server):
    url, _ = server

    async def run():
        async with AsyncClient(url, api_key=KEY) as client:
            whole = await client.summarize(TEXT, max_length=24)
            session = await client.session(task="summarize")
            for start in range(0, len(TEXT), 150):
                await session.send(text=TEXT[start : start + 150])
            stream = session.finish_stream(max_length=24)
            text = "".join([piece async for piece in stream])
            forecast, classified = await asyncio.gather(client.forecast(rows(32)), client.classify(TEXT))
            return whole, text, stream.result, forecast, classified

    whole, text, done, forecast, classified = asyncio.run(run())
    assert text == whole["summary"] == done["summary"] and done["session"]["status"] == "finished"
    assert forecast["rows_needed"] == 0 and classified["label"]


def cli(url, *args, stdin=None):
    env = {**os.environ, "RTSERVE_URL": url, "RTSERVE_API_KEY": KEY}
    return subprocess.run([sys.executable, "-m", "rtserve.cli", *args], env=env, capture_output=True, text=True,
                          input=stdin, timeout=120)


def test_cli_verbs(server, tmp_path):
    url, _ = server
    document = tmp_path / "article.txt"
    document.write_text(TEXT)
    series = tmp_path / "series.csv"
    series.write_text("date," + ",".join(VARIABLES) + "\n" + "\n".join(
        f"2016-07-01 {h:02d}:00:00," + ",".join(map(str, row)) for h, row in enumerate(rows(40))))
    classified = cli(url, "classify", str(document))
    assert classified.returncode == 0, classified.stderr
    assert json.loads(classified.stdout)["label"] in ("mainstream", "hyperpartisan")
    summary = json.loads(cli(url, "summarize", str(document), "--max-length", "20").stdout)["summary"]
    streamed = cli(url, "summarize", str(document), "--max-length", "20", "--stream")
    assert streamed.returncode == 0 and streamed.stdout == summary + "\n"
    forecast = cli(url, "forecast", str(series), "--last", "32")
    assert forecast.returncode == 0 and json.loads(forecast.stdout)["rows_seen"] == 32, forecast.stderr
    through = cli(url, "session", "stream", str(series), "--task", "forecast", "--piece-rows", "7")
    assert through.returncode == 0 and json.loads(through.stdout)["session"]["seq"] == 6, through.stderr
    piped = cli(url, "session", "stream", "-", "--task", "summarize", "--piece-chars", "100", stdin=TEXT)
    session = json.loads(piped.stdout)["session"]
    status = cli(url, "session", "status", session["id"])
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["status"] == "finished"
    assert cli(url, "session", "delete", session["id"]).returncode == 0
    gone = cli(url, "session", "status", session["id"])
    assert gone.returncode == 1 and "404" in gone.stderr
    assert cli("http://127.0.0.1:9", "classify", str(document)).returncode == 1  # nothing listens there


def test_server_logs_are_json_with_request_ids_and_route_templates(server):
    url, log = server
    with Client(url, api_key=KEY) as client:
        session = client.session(task="forecast")
        session.send(rows=rows(3))
        session.status()
    response = httpx.get(f"{url}/sessions/{session.id}", headers={"X-API-Key": KEY, "X-Request-ID": "trace-42"})
    assert response.headers["x-request-id"] == "trace-42"
    time.sleep(0.2)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]  # every line is JSON
    assert all({"time", "level", "logger", "message", "request_id"} <= set(line) for line in lines)
    access = [line for line in lines if line["logger"] == "rtserve.access"]
    assert any(line["route"] == "/sessions/{session_id}" and line["request_id"] == "trace-42" for line in access)
    assert not any(session.id in json.dumps(line) for line in access)
    assert {line["route"] for line in access} >= {"/sessions", "/sessions/{session_id}/segments", "/readyz"}
