"""Graceful shutdown of real `rtserve serve` processes: SIGTERM drains, streams end with `done`, and work that
outlasts the grace gets a JSON 503 (a stream: an `error` event) while what was applied stays applied.

The replicas whose work must outlast a signal run ``tests/slow_serve.py``: the real server, each graph batch
made slower by a fixed sleep on the event loop. A second replica, in this process (a TestClient over the same
Redis and key prefix), retries what the stopped one left.
"""

import json
import signal
import subprocess
import threading
import time

import httpx
import pytest

from loadtest.chaos import free_port
from tests.service_helpers import make_client, start_rtserve
from tests.test_service_summarize import TEXT


def _settings(repository, redis_url, key_prefix, **extra):
    return {"RTSERVE_MODEL_REPOSITORY": str(repository), "RTSERVE_REDIS_URL": redis_url,
            "RTSERVE_REDIS_KEY_PREFIX": key_prefix, "RTSERVE_INTRA_OP_THREADS": "1", "RTSERVE_LOG_LEVEL": "info",
            **{f"RTSERVE_{name.upper()}": str(value) for name, value in extra.items()}}


def _stop(process, timeout=30):
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=timeout)
    return output


class Stream(threading.Thread):
    """A POST answered with Server-Sent Events, read in a thread: ``events`` as (name, data, after the signal)."""

    def __init__(self, url, body, headers=None):
        super().__init__(daemon=True)
        self.url, self.body, self.headers = url, body, headers or {}
        self.events: list[tuple[str, dict, bool]] = []
        self.status: int | None = None
        self.started, self.first_token, self.signalled = threading.Event(), threading.Event(), threading.Event()
        self.failure: Exception | None = None

    def run(self):
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=60,
                              headers={"accept": "text/event-stream", **self.headers}) as response:
                self.status = response.status_code
                self.started.set()
                name = None
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        name = line.split(":", 1)[1].strip()
                    elif line.startswith("data:"):
                        self.events.append((name, json.loads(line.split(":", 1)[1]), self.signalled.is_set()))
                        if name == "token":
                            self.first_token.set()
        except Exception as error:  # the test reads it: a stream cut without an end is what it must not see
            self.failure = error
        finally:
            self.started.set()
            self.first_token.set()


@pytest.mark.slow
def test_sigterm_during_summary_streams_lets_each_end_with_done(every_task_repository, redis_url, key_prefix):
    port = free_port()
    process = start_rtserve(_settings(every_task_repository, redis_url, key_prefix, shutdown_timeout_seconds=30),
                            port, output=subprocess.PIPE, command=("tests.slow_serve", "0.02"))
    base = f"http://127.0.0.1:{port}"
    with make_client(every_task_repository, redis_url, key_prefix) as other:
        session = other.post("/sessions", json={"task": "summarize"}).json()["id"]
        assert other.post(f"/sessions/{session}/segments", json={"seq": 1, "text": TEXT}).status_code == 200
        streams = [Stream(f"{base}/summarize", {"text": TEXT, "stream": True, "decoding": "free"}),
                   Stream(f"{base}/sessions/{session}/finish", {"stream": True, "decoding": "free"})]
        try:
            for stream in streams:
                stream.start()
            for stream in streams:
                assert stream.first_token.wait(30)
            for stream in streams:
                stream.signalled.set()
            process.send_signal(signal.SIGTERM)
            for stream in streams:
                stream.join(30)
        finally:
            output = _stop(process)
        for stream in streams:
            assert stream.failure is None, f"{stream.url}: {stream.failure!r}\n{output}"
            names = [name for name, _, _ in stream.events]
            assert names[-1] == "done" and names.count("done") == 1, names
            assert any(after for name, _, after in stream.events if name == "token"), "no token came after SIGTERM"
            done = stream.events[-1][1]
            assert "".join(data["text"] for name, data, _ in stream.events if name == "token") == done["summary"]
        assert other.get(f"/sessions/{session}").json()["status"] == "finished"
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output


@pytest.mark.slow
def test_work_that_outlasts_the_grace_gets_json_503s_and_the_applied_pieces_replay(
        every_task_repository, redis_url, key_prefix):
    port = free_port()
    process = start_rtserve(_settings(every_task_repository, redis_url, key_prefix, shutdown_timeout_seconds=0.5),
                            port, output=subprocess.PIPE, command=("tests.slow_serve", "1.5"))
    base = f"http://127.0.0.1:{port}"
    rows = [[float((i * 7 + j) % 11) for j in range(7)] for i in range(36)]  # look-back 32: three pieces of 12
    pieces = [rows[0:12], rows[12:24], rows[24:36]]
    answers = {}
    with make_client(every_task_repository, redis_url, key_prefix) as other, httpx.Client(timeout=60) as client:
        try:
            forecast = client.post(f"{base}/sessions", json={"task": "forecast"}).json()["id"]
            segments = f"/sessions/{forecast}/segments"
            assert client.post(base + segments, json={"seq": 1, "rows": pieces[0]}).status_code == 200
            summary = other.post("/sessions", json={"task": "summarize"}).json()["id"]
            assert other.post(f"/sessions/{summary}/segments", json={"seq": 1, "text": TEXT}).status_code == 200
            stream = Stream(f"{base}/sessions/{summary}/finish", {"stream": True, "decoding": "free"},
                            {"x-request-id": "cut-stream"})
            stream.start()
            assert client.post(base + segments, json={"seq": 2, "rows": pieces[1]}).status_code == 200

            def third_piece():
                answers[3] = httpx.post(base + segments, json={"seq": 3, "rows": pieces[2]}, timeout=60,
                                        headers={"x-request-id": "cut-piece"})

            sender = threading.Thread(target=third_piece)
            sender.start()
            assert stream.started.wait(30) and stream.status == 200
            time.sleep(0.2)  # the third piece's step has begun; it takes 1.5 s, the grace is 0.5 s
            process.send_signal(signal.SIGTERM)
            sender.join(30)
            stream.join(30)
        finally:
            output = _stop(process)

        cut = answers[3]
        assert cut.status_code == 503 and cut.headers["content-type"] == "application/json", cut.text
        assert cut.headers["retry-after"] == "1"
        assert cut.json()["request_id"] == "cut-piece" and "retry the same seq" in cut.json()["detail"]
        assert stream.failure is None, repr(stream.failure)
        name, data, _ = stream.events[-1]
        assert name == "error" and data["status"] == 503 and data["request_id"] == "cut-stream", stream.events[-1]
        assert [n for n, _, _ in stream.events].count("done") == 0

        # the other replica: what was applied replays, what was cut applies once, and nothing else changed
        replay = other.post(segments, json={"seq": 2, "rows": pieces[1]})
        assert replay.status_code == 200 and replay.json()["replayed"] is True
        third = other.post(segments, json={"seq": 3, "rows": pieces[2]})
        assert third.status_code == 200 and third.json()["replayed"] is False
        assert third.json()["session"]["consumed"] == 36
        finished = other.post(f"/sessions/{forecast}/finish").json()
        assert finished["forecast"] == other.post("/forecast", json={"rows": rows}).json()["forecast"]
        assert other.get(f"/sessions/{summary}").json()["status"] == "open"  # a cut finish finished nothing
        assert other.post(f"/sessions/{summary}/finish").status_code == 200
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "Internal Server Error" not in output


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_readyz_answers_503_at_once_on_sigterm_while_requests_are_still_served(
        forecast_repository, redis_url, key_prefix, workers):
    port = free_port()
    process = start_rtserve(_settings(forecast_repository[0], redis_url, key_prefix, workers=workers,
                                      shutdown_drain_seconds=2), port, output=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    rows = [[float(i + j) for j in range(7)] for i in range(32)]
    try:
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        while (ready := httpx.get(f"{base}/readyz", timeout=5)).status_code == 200:
            assert time.monotonic() - signalled < 1.0, "still ready 1 s after SIGTERM"
            time.sleep(0.02)
        assert ready.status_code == 503 and ready.json()["status"] == "draining" and ready.headers["retry-after"]
        for _ in range(4):  # new connections, to whichever worker takes them: all drain, all still serve
            assert httpx.get(f"{base}/readyz", timeout=5).status_code == 503
            served = httpx.post(f"{base}/forecast", json={"rows": rows}, timeout=30)
            assert served.status_code == 200 and served.json()["forecast"] is not None
            assert served.headers["connection"] == "close"  # keep-alive clients reconnect, to a ready replica
        assert time.monotonic() - signalled < 2.0, "the drain ended before its checks did: the test proves nothing"
    finally:
        output = _stop(process)
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "Application shutdown complete" in output
