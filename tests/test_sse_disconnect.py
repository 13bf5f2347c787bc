"""A summary streamed as Server-Sent Events stops generating when the client leaves.

A real uvicorn server in a thread (so the client's disconnect travels the real path), its decode graph
wrapped to count steps and to take 20 ms each, so the summary would run for seconds if nobody stopped it.
"""

import json
import threading
import time

import httpx
import pytest
import uvicorn

from loadtest.chaos import free_port
from service.app import create_app
from service.settings import Settings
from tests.test_service_summarize import TEXT


class SlowCountingBackend:
    def __init__(self, inner):
        self.inner, self.name, self.providers, self.steps = inner, inner.name, inner.providers, 0

    def run(self, inputs, keep=()):
        self.steps += 1
        time.sleep(0.02)
        return self.inner.run(inputs, keep)

    def drop_kept(self):
        self.inner.drop_kept()


@pytest.fixture(scope="module")
def server(summarize_repository, redis_url, key_prefix):
    port = free_port()
    app = create_app(Settings(model_repository=summarize_repository[0], redis_url=redis_url,
                              redis_key_prefix=key_prefix))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    decode = app.state.registry.resolve("srformer-tiny", "summarize").batchers["decode_step"]
    decode.backend = counting = SlowCountingBackend(decode.backend)
    yield f"http://127.0.0.1:{port}", counting
    server.should_exit = True
    thread.join(timeout=20)


def _leave_after_first_token(base, path, body):
    with httpx.Client(base_url=base, timeout=30) as client, client.stream(
            "POST", path, json=body, headers={"accept": "text/event-stream"}) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("event:"):
                assert line.split(":", 1)[1].strip() == "token"
                break  # the client leaves: the connection closes with the `with`


@pytest.mark.parametrize("kind", ["one-shot", "session"])
def test_generation_stops_within_one_decode_step_of_the_client_leaving(server, kind):
    base, counting = server
    body = {"max_length": 120, "decoding": "free"}  # the decoder runs step by step (sentence copy runs none)
    path = "/summarize"
    if kind == "one-shot":
        body["text"] = TEXT
    else:
        session = httpx.post(f"{base}/sessions", json={"task": "summarize"}).json()
        assert httpx.post(f"{base}/sessions/{session['id']}/segments",
                          json={"seq": 1, "text": TEXT}).status_code == 200
        path = f"/sessions/{session['id']}/finish"
    counting.steps = 0
    _leave_after_first_token(base, path, body)
    at_leaving = counting.steps
    time.sleep(1.0)  # 50 more steps, had generation gone on
    after = counting.steps - at_leaving
    assert after <= 1, f"{after} decode steps ran after the client left"
    if kind == "session":  # the session was not finished by a stream nobody read: finish works in full
        final = httpx.post(f"{base}{path}", json={"max_length": 8}, timeout=30)
        assert final.status_code == 200 and json.loads(final.text)["session"]["status"] == "finished"
