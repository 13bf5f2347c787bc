"""rtserve.client and the CLI's client verbs against a real `rtserve serve` process, which also writes
JSON logs with an access log: every line is JSON, carries its request id, and names route templates, never ids.

A session's pieces over its stream (the default) and over HTTP give the same answers and errors, with the client and
with the CLI; a stream answer lost on the way back is answered again, replayed; a stream rides out its replica
draining and starting again; a service without streams gets the pieces over HTTP."""

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections import Counter

import httpx
import numpy as np
import pytest
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosedError, InvalidStatus
from websockets.http11 import Response

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
        with client.session(task="classify", transport="http") as session:
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
        session = client.session(task="forecast", transport="http")
        session.send(rows=rows(3))
        session.status()
    response = httpx.get(f"{url}/sessions/{session.id}", headers={"X-API-Key": KEY, "X-Request-ID": "trace-42"})
    assert response.headers["x-request-id"] == "trace-42"
    from websockets.sync.client import connect

    with connect(f"{url.replace('http', 'ws', 1)}/sessions/{session.id}/stream",
                 additional_headers={"X-API-Key": KEY}) as stream:  # uvicorn's own line would name the session
        assert json.loads(stream.recv())["event"] == "open"
        stream.send(json.dumps({"seq": 2, "rows": rows(2)}))
        assert json.loads(stream.recv())["session"]["seq"] == 2
    time.sleep(0.2)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]  # every line is JSON
    assert all({"time", "level", "logger", "message", "request_id"} <= set(line) for line in lines)
    access = [line for line in lines if line["logger"] == "rtserve.access"]
    assert any(line["route"] == "/sessions/{session_id}" and line["request_id"] == "trace-42" for line in access)
    assert not any(session.id in json.dumps(line) for line in lines)
    assert {line["route"] for line in access} >= {"/sessions", "/sessions/{session_id}/segments", "/readyz",
                                                  "/sessions/{session_id}/stream"}


def write_series(path, header, table):
    """A CSV file: ``header`` (None: no header row) and ``table``'s rows, a date column first."""
    lines = [",".join(["date", *header])] if header is not None else []
    lines += [",".join([f"2016-07-01 {h:02d}:00:00", *map(str, row)]) for h, row in enumerate(table)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_forecast_reorders_columns_by_name(server, tmp_path):
    url, _ = server
    series = rows(40)
    with Client(url, api_key=KEY) as client:
        expected = client.forecast(series)
    order = [6, 2, 0, 5, 1, 4, 3]  # the file's columns in another order, named in another case, with one extra
    header = [VARIABLES[i].lower() if i % 2 else VARIABLES[i] for i in order] + ["note"]
    shuffled = write_series(tmp_path / "shuffled.csv", header, [[row[i] for i in order] + [1.0] for row in series])
    done = cli(url, "forecast", str(shuffled))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["variables"] == expected["variables"] == VARIABLES
    np.testing.assert_allclose(answer["forecast"], expected["forecast"], atol=1e-6)


def test_forecast_columns_name_the_files_columns_for_the_models_variables_in_its_order(server, tmp_path):
    url, _ = server
    series = rows(40)
    with Client(url, api_key=KEY) as client:
        expected = client.forecast(series)
    names = [f"sensor {i}" for i in range(len(VARIABLES))]  # a header that names the variables otherwise
    order = [3, 0, 6, 1, 5, 2, 4]
    renamed = write_series(tmp_path / "renamed.csv", [names[i] for i in order], [[row[i] for i in order]
                                                                                for row in series])
    done = cli(url, "forecast", str(renamed), "--columns", ",".join(names))
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(json.loads(done.stdout)["forecast"], expected["forecast"], atol=1e-6)
    named = write_series(tmp_path / "named.csv", VARIABLES, series)  # the model's names, listed out of its order
    swapped = cli(url, "forecast", str(named), "--columns", ",".join([VARIABLES[1], VARIABLES[0], *VARIABLES[2:]]))
    assert swapped.returncode == 1 and swapped.stdout == ""
    assert swapped.stderr.count("\n") == 1 and f"puts '{VARIABLES[1]}' where rsa-tiny:1 reads '{VARIABLES[0]}'" \
        in swapped.stderr


@pytest.mark.parametrize(("header", "says"), [
    (VARIABLES[:-1], f"has no column for rsa-tiny:1's variable {VARIABLES[-1]}"),
    ([*VARIABLES, VARIABLES[-1]], f"2 columns are called '{VARIABLES[-1]}'"),
    ([*VARIABLES, VARIABLES[0].lower()], f"2 columns are called '{VARIABLES[0]}'"),
], ids=["a-variable-missing", "a-name-twice", "names-that-differ-in-case-only"])
def test_forecast_refuses_a_file_whose_columns_do_not_name_each_variable_once(header, says, server, tmp_path):
    url, _ = server
    table = [row + [0.5] * (len(header) - len(row)) for row in rows(40)]
    done = cli(url, "forecast", str(write_series(tmp_path / "series.csv", header, [r[:len(header)] for r in table])))
    assert done.returncode == 1 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("rtserve forecast: ") and says in done.stderr


@pytest.mark.parametrize("choose", [["--task", "forecast"], ["--model", "rsa-tiny"]], ids=["task", "model"])
def test_session_stream_reorders_forecast_columns_by_name(choose, server, tmp_path):
    url, _ = server
    series = rows(40)
    with Client(url, api_key=KEY) as client:
        expected = client.forecast(series)
    order = list(reversed(range(len(VARIABLES))))
    shuffled = write_series(tmp_path / "shuffled.csv", [VARIABLES[i] for i in order],
                            [[row[i] for i in order] for row in series])
    done = cli(url, "session", "stream", str(shuffled), *choose, "--piece-rows", "9")
    assert done.returncode == 0, done.stderr
    final = json.loads(done.stdout)
    assert final["session"]["seq"] == 5
    np.testing.assert_allclose(final["forecast"], expected["forecast"], atol=1e-5)


def test_streamed_summary_says_how_much_of_the_document_was_read(server, tmp_path):
    url, _ = server
    long = tmp_path / "long.txt"
    long.write_text(TEXT * 3)
    whole = json.loads(cli(url, "summarize", str(long), "--max-length", "20").stdout)
    assert whole["truncated"] and whole["tokens_read"] < whole["tokens_total"]  # the JSON answer says so itself
    note = (f"(read {whole['tokens_read']:,} of {whole['tokens_total']:,} tokens: the model reads the first "
            f"{whole['tokens_read']:,}; the rest was not summarized)")
    streamed = cli(url, "summarize", str(long), "--max-length", "20", "--stream")
    assert streamed.returncode == 0 and streamed.stdout == whole["summary"] + "\n"
    assert streamed.stderr.splitlines() == [note]
    through = cli(url, "session", "stream", str(long), "--task", "summarize", "--stream", "--piece-chars", "400")
    assert through.returncode == 0 and note in through.stderr.splitlines(), through.stderr
    short = tmp_path / "short.txt"
    short.write_text(TEXT)
    whole = json.loads(cli(url, "summarize", str(short)).stdout)
    assert not whole["truncated"]
    assert cli(url, "summarize", str(short), "--stream").stderr.splitlines() == [
        f"(read all {whole['tokens_total']:,} tokens)"]


# ---- a session's stream ---------------------------------------------------------------------------------------


def pieces_of(task):
    if task == "forecast":
        return [{"rows": rows(9)} for _ in range(5)]
    return [{"text": TEXT[start : start + 97]} for start in range(0, len(TEXT), 97)]


def assert_same(got, expected, where="answer"):
    """The same JSON, numbers to float tolerance (another batch may add in another order)."""
    if isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), where
        for key in expected:
            assert_same(got[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(got, list) and len(got) == len(expected), where
        for index, (item, wanted) in enumerate(zip(got, expected, strict=True)):
            assert_same(item, wanted, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), where
    else:
        assert got == expected, where


def without_session(answer):
    return {key: value for key, value in answer.items() if key != "session"}


@pytest.mark.parametrize("task", ["forecast", "classify", "summarize"])
def test_a_session_over_its_stream_answers_as_over_http(server, task):
    url, _ = server
    pieces = pieces_of(task)
    options = {"max_length": 20} if task == "summarize" else {}

    def over(transport):
        with Client(url, api_key=KEY) as client, client.session(task=task, transport=transport) as session:
            answers = [session.send(**piece) for piece in pieces]
            final = session.finish(**options)
            assert session.transport == transport and not session.reconnects
            assert session.binary_rows is (transport == "stream")  # a forecast's rows then went as binary frames
        return answers, final

    async def over_the_stream_awaited():
        async with AsyncClient(url, api_key=KEY) as client:
            async with await client.session(task=task) as session:
                answers = [await session.send(**piece) for piece in pieces]
                if task != "summarize":
                    return answers, await session.finish(**options)
                stream = session.finish_stream(**options)  # token frames, then done
                text = "".join([piece async for piece in stream])
                assert text == stream.result["summary"]
                return answers, stream.result

    http_answers, http_final = over("http")
    for answers, final in (over("stream"), asyncio.run(over_the_stream_awaited())):
        assert [answer["replayed"] for answer in answers] == [False] * len(pieces)
        assert [answer["session"]["seq"] for answer in answers] == list(range(1, len(pieces) + 1))
        assert_same([answer["result"] for answer in answers], [answer["result"] for answer in http_answers])
        assert_same(without_session(final), without_session(http_final))
        assert final["session"]["status"] == "finished"
        assert final["session"]["consumed"] == http_final["session"]["consumed"]


def test_a_refused_piece_raises_the_same_error_over_the_stream_and_the_stream_goes_on(server):
    url, _ = server
    refused = {}
    with Client(url, api_key=KEY) as client:
        for transport in ("http", "stream"):
            with client.session(task="forecast", transport=transport) as session:
                with pytest.raises(APIError) as narrow:
                    session.send(rows=[[1.0] * 3] * 4)
                session.seq += 1  # a piece out of order
                with pytest.raises(APIError) as gap:
                    session.send(rows=rows(4))
                session.seq -= 1
                assert session.send(rows=rows(4))["session"]["seq"] == 1  # nothing refused was applied
                assert not session.reconnects  # a 4xx leaves the stream open
                refused[transport] = narrow.value, gap.value
    for over_http, over_stream in zip(refused["http"], refused["stream"], strict=True):
        assert (over_stream.status, over_stream.detail, over_stream.errors, over_stream.expected_seq) == (
            over_http.status, over_http.detail, over_http.errors, over_http.expected_seq)
        assert over_stream.request_id
    assert refused["stream"][0].status == 422 and refused["stream"][1].expected_seq == 1


def lost(frame, seq):
    """Whether ``frame`` is the answer to piece ``seq`` (not the `open` frame, which also carries the session)."""
    answer = json.loads(frame)
    return "result" in answer and answer["session"]["seq"] == seq


class LosesAnAnswer(Client):
    """Loses the answer to piece ``seq`` once, as a connection that broke after the piece went out."""

    seq = 3

    def _receive_frame(self, connection):
        frame = super()._receive_frame(connection)
        if self.seq is not None and lost(frame, self.seq):
            self.seq = None
            connection.close()
            raise ConnectionClosedError(None, None)
        return frame


class AsyncLosesAnAnswer(AsyncClient):
    seq = 3

    async def _receive_frame(self, connection):
        frame = await super()._receive_frame(connection)
        if self.seq is not None and lost(frame, self.seq):
            self.seq = None
            await connection.close()
            raise ConnectionClosedError(None, None)
        return frame


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_stream_answer_lost_on_the_way_back_is_sent_again_and_answered_replayed(server, kind):
    url, _ = server
    pieces = [rows(9) for _ in range(5)]

    def sync():
        with LosesAnAnswer(url, api_key=KEY, backoff=0.01) as client, client.session(task="forecast") as session:
            return [session.send(rows=piece) for piece in pieces], session.finish(), session

    async def awaited():
        async with AsyncLosesAnAnswer(url, api_key=KEY, backoff=0.01) as client:
            async with await client.session(task="forecast") as session:
                return [await session.send(rows=piece) for piece in pieces], await session.finish(), session

    answers, final, session = sync() if kind == "sync" else asyncio.run(awaited())
    assert [answer["replayed"] for answer in answers] == [False, False, True, False, False]
    assert session.reconnects == Counter({"dropped": 1}) and session.opened["seq"] == 3  # piece 3 was applied
    assert answers[2]["session"]["seq"] == 3 and answers[2]["result"]["rows_seen"] == 27
    assert final["session"]["seq"] == 5 and final["session"]["consumed"] == 45  # each piece applied once


class CutAfterTheFirstToken(Client):
    """Drops the stream right after the first token frame of a finish, as a replica dying mid-summary would."""

    cut = False

    def _receive_frame(self, connection):
        if self.cut is None:
            self.cut = True
            connection.close()
            raise ConnectionClosedError(None, None)
        frame = super()._receive_frame(connection)
        if self.cut is False and json.loads(frame).get("event") == "token":
            self.cut = None  # at the next frame
        return frame


@pytest.mark.parametrize("decoding", [{"decoding": "sentence"}, {"decoding": "free", "beam_size": 1}],
                         ids=["a-sentence-then-cut-before-done", "free-cut-after-its-first-word"])
def test_a_summary_finish_cut_mid_stream_goes_on_where_its_text_stopped(server, decoding):
    """Sent again, the finish streams the summary from its start (generated again, or the stored one as one token):
    the caller gets the rest of it."""
    url, _ = server
    with Client(url, api_key=KEY) as client:
        whole = client.summarize(TEXT, max_length=24, **decoding)
    with CutAfterTheFirstToken(url, api_key=KEY, backoff=0.01) as client, client.session(task="summarize") as session:
        for start in range(0, len(TEXT), 150):
            session.send(text=TEXT[start : start + 150])
        stream = session.finish_stream(max_length=24, **decoding)
        pieces = list(stream)
    assert client.cut and session.reconnects == Counter({"dropped": 1})
    assert "".join(pieces) == stream.result["summary"] == whole["summary"]  # the text once, none of it twice
    assert stream.result["session"]["status"] == "finished"
    if decoding["decoding"] == "free":
        assert len(pieces) > 2, pieces  # the cut came mid-summary


def test_a_stream_rides_out_its_replica_draining_and_starting_again(forecast_repository, redis_url):
    """One replica: SIGTERM closes the stream (1012), upgrades are refused while it drains (503), then nothing
    listens until it is back on its port; the client waits it out and resumes."""
    port = free_port()
    settings = {"RTSERVE_MODEL_REPOSITORY": str(forecast_repository[0]), "RTSERVE_REDIS_URL": redis_url,
                "RTSERVE_REDIS_KEY_PREFIX": f"client-restart-{os.getpid()}", "RTSERVE_SHUTDOWN_DRAIN_SECONDS": "0.3"}
    url = f"http://127.0.0.1:{port}"
    processes = [start_rtserve(settings, port)]

    def start_again():
        processes[0].wait(timeout=30)
        processes.append(start_rtserve(settings, port))

    pieces = [rows(9) for _ in range(6)]
    again = threading.Thread(target=start_again)
    try:
        with Client(url, api_key="", retries=8, backoff=0.2) as client:
            whole = client.forecast([row for piece in pieces for row in piece])
            with client.session(task="forecast") as session:
                for piece in pieces[:3]:
                    session.send(rows=piece)
                processes[0].send_signal(signal.SIGTERM)
                while httpx.get(f"{url}/readyz").status_code != 503:  # draining: the stream was closed
                    time.sleep(0.01)
                again.start()
                for piece in pieces[3:]:
                    session.send(rows=piece)
                final = session.finish()
    finally:
        if again.is_alive():
            again.join()
        for process in processes:
            process.kill()
            process.wait()
    assert session.reconnects["closed 1012"] == 1 and len(processes) == 2, session.reconnects
    assert session.opened["seq"] == 3 and final["session"]["consumed"] == 54
    np.testing.assert_allclose(final["forecast"], whole["forecast"], rtol=1e-5, atol=1e-5)


class NoStreams(Client):
    """Its upgrades are refused as a service without streams refuses them (403), or a service behind a proxy that does
    not pass WebSockets on (404 for the unknown route)."""

    refusal = 403, b""
    upgrades = 0

    def _connect(self, path):
        self.upgrades += 1
        status, body = self.refusal
        raise InvalidStatus(Response(status, "refused", Headers(), body))


def mock_service(known=True):
    """A service's session routes, mocked: pieces applied in order, ``known``: whether the session exists."""
    seen = []

    def answer(request):
        seen.append(f"{request.method} {request.url.path}")
        session = {"id": "s-1", "seq": 0, "status": "open"}
        if request.url.path == "/sessions":
            return httpx.Response(201, json=session)
        if not known:
            return httpx.Response(404, json={"detail": "session s-1 does not exist or has expired",
                                             "request_id": "r-1"})
        if request.url.path.endswith("/segments"):
            seq = json.loads(request.content)["seq"]
            return httpx.Response(200, json={"session": {**session, "seq": seq}, "replayed": False, "result": {}})
        return httpx.Response(200, json=session)

    return httpx.MockTransport(answer), seen


@pytest.mark.parametrize("refusal", [(403, b""), (404, b'{"detail": "no route", "request_id": "r-0"}')],
                         ids=["no-stream-route", "a-proxy-without-websockets"])
def test_a_service_without_streams_gets_the_pieces_over_http(refusal):
    transport, seen = mock_service()
    with NoStreams("http://rtserve.test", transport=transport) as client:
        client.refusal = refusal
        with client.session(task="forecast") as session:
            assert [session.send(rows=[[1.0] * 7])["session"]["seq"] for _ in range(2)] == [1, 2]
        assert session.transport == "http" and client.streams_offered is False
        later = client.session(task="forecast")  # the client remembers: no second upgrade
        assert later.transport == "http" and later.send(rows=[[1.0] * 7])["session"]["seq"] == 1
    assert client.upgrades == 1 and seen.count("POST /sessions/s-1/segments") == 3


def test_an_unknown_session_is_told_over_the_stream_as_over_http():
    transport, _ = mock_service(known=False)
    with NoStreams("http://rtserve.test", transport=transport) as client:
        client.refusal = 404, b'{"detail": "session s-1 does not exist or has expired", "request_id": "r-2"}'
        session = client.session(task="forecast")
        with pytest.raises(APIError) as error:
            session.send(rows=[[1.0] * 7])
    assert error.value.status == 404 and "does not exist" in error.value.detail
    assert client.streams_offered is None  # not learnt: the session was unknown


@pytest.mark.parametrize("task", ["forecast", "classify", "summarize"])
def test_cli_session_stream_answers_alike_over_either_transport(server, tmp_path, task):
    url, _ = server
    if task == "forecast":
        document = write_series(tmp_path / "series.csv", VARIABLES, rows(40))
        cut = ["--piece-rows", "9"]
    else:
        document = tmp_path / "article.txt"
        document.write_text(TEXT)
        cut = ["--piece-chars", "150"]
    over_http = cli(url, "session", "stream", str(document), "--task", task, *cut, "--transport", "http")
    over_stream = cli(url, "session", "stream", str(document), "--task", task, *cut)  # the default
    assert over_http.returncode == over_stream.returncode == 0, over_stream.stderr
    assert "pieces sent over HTTP" in over_http.stderr and "pieces sent over its stream" in over_stream.stderr
    assert_same(without_session(json.loads(over_stream.stdout)), without_session(json.loads(over_http.stdout)))
    if task == "summarize":  # token frames printed as they come, as with Server-Sent Events
        printed = cli(url, "session", "stream", str(document), "--task", task, *cut, "--stream")
        assert printed.returncode == 0 and printed.stdout == json.loads(over_http.stdout)["summary"] + "\n"


def test_a_client_leaving_its_stream_mid_summary_is_no_error_of_the_replica(server):
    """A client that closes its stream while the replica streams a summary's tokens has left, as one closing a
    Server-Sent Events stream has: no ERROR line, no traceback, no `Exception in ASGI application`."""
    from websockets.sync.client import connect

    url, log = server
    lines_before = len(log.read_text().splitlines())
    session = httpx.post(f"{url}/sessions", json={"task": "summarize"}, headers={"X-API-Key": KEY}).json()["id"]
    with connect(f"{url.replace('http', 'ws', 1)}/sessions/{session}/stream",
                 additional_headers={"X-API-Key": KEY}) as stream:
        assert json.loads(stream.recv())["event"] == "open"
        stream.send(json.dumps({"seq": 1, "text": TEXT}))
        assert json.loads(stream.recv())["session"]["seq"] == 1
        stream.send(json.dumps({"finish": {"stream": True, "decoding": "free", "beam_size": 1, "max_length": 24}}))
        assert json.loads(stream.recv())["event"] == "token"
    time.sleep(0.5)
    new = [json.loads(line) for line in log.read_text().splitlines()[lines_before:]]
    assert not [line["message"] for line in new if line["level"] == "ERROR"]


def test_rows_go_as_a_binary_frame_only_when_they_are_one_rectangle_of_float32_numbers():
    from rtserve.client import _binary_rows

    frame = _binary_rows({"seq": 3, "rows": [[1.0, 2.5], [-3.0, 4.0]]})
    assert struct.unpack_from("<QII", frame) == (3, 2, 2)
    assert np.frombuffer(frame, "<f4", offset=16).tolist() == [1.0, 2.5, -3.0, 4.0]
    for other in ({"seq": 1, "text": "words"}, {"seq": 1, "rows": []}, {"seq": 1, "rows": [[1.0], [1.0, 2.0]]},
                  {"seq": 1, "rows": [[1e39]]}, {"seq": 1, "rows": [[float("nan")]]}, {"finish": {}}):
        assert _binary_rows(other) is None, other  # sent as JSON: the replica says what is wrong, as over HTTP
