"""What a client's mistake gets: a 4xx that says what to send, and no alarm in the operator's log.

- A 4xx is the client's business: at most one DEBUG line, on every route and through every door (the fast path, the
  validated endpoint, a stream's frame). ERROR with a traceback is for what the service did wrong.
- A body without ``Content-Type: application/json`` is a 415 saying what to send; a body that is not JSON says where
  and why; a piece with both ``text`` and ``rows`` says which to drop.
- /docs: summaries read as plain text, the forecast example forecasts, free decoding and the shipped classifier say
  what they are for.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from tests.tiny_checkpoints import VARIABLES


@pytest.fixture(scope="module")
def repository(every_task_repository):
    return every_task_repository, None


def rows(count):
    return (np.random.default_rng().standard_normal((count, len(VARIABLES))) * 3 + 10).round(3).tolist()


def test_a_clients_mistakes_on_every_route_log_no_error(client, caplog):
    caplog.set_level(logging.DEBUG)
    forecast = client.post("/sessions", json={"task": "forecast"}).json()["id"]
    classify = client.post("/sessions", json={"task": "classify"}).json()["id"]
    assert client.post(f"/sessions/{forecast}/segments", json={"seq": 1, "rows": rows(4)}).status_code == 200
    mistakes = [
        # (method, path, body, status): 404, 409 and 422 through the fast path and through validation
        ("POST", "/sessions/no-such-session/segments", {"seq": 1, "rows": rows(2)}, 404),
        ("POST", "/sessions/no-such-session/segments", {"seq": 1.0, "rows": rows(2)}, 404),
        ("POST", f"/sessions/{forecast}/segments", {"seq": 5, "rows": rows(2)}, 409),
        ("POST", f"/sessions/{forecast}/segments", {"seq": 1, "rows": rows(3)}, 409),
        ("POST", f"/sessions/{forecast}/segments", {"seq": 2, "rows": rows(2), "colour": 1}, 422),
        ("POST", f"/sessions/{forecast}/segments", {"seq": 2, "text": "words"}, 422),
        ("POST", f"/sessions/{classify}/segments", {"seq": 1, "rows": rows(2)}, 422),
        ("POST", "/sessions", {"task": "translate"}, 422),
        ("POST", "/sessions", {"model": "nope"}, 404),
        ("GET", "/sessions/no-such-session", None, 404),
        ("DELETE", "/sessions/no-such-session", None, 404),
        ("POST", "/sessions/no-such-session/finish", None, 404),
        ("POST", f"/sessions/{classify}/finish", {"strem": True}, 422),
        ("POST", "/forecast", {"rows": [[1.0, 2.0]]}, 422),
        ("POST", "/forecast", {"rows": rows(40), "model": "nope"}, 404),
        ("POST", "/classify", {"text": ""}, 422),
        ("POST", "/summarize", {"text": "x", "beam_size": 99}, 422),
        ("GET", "/no-such-route", None, 404),
    ]
    for method, path, body, status in mistakes:
        answer = client.request(method, path, json=body)
        assert answer.status_code == status, (method, path, body, answer.text)
    with client.websocket_connect(f"/sessions/{forecast}/stream") as stream:
        assert json.loads(stream.receive_text())["event"] == "open"
        for frame in ({"seq": 9, "rows": rows(2)}, {"seq": 2, "text": "x"}, {"seq": 2, "rows": [[1.0]]}):
            stream.send_text(json.dumps(frame))
            assert json.loads(stream.receive_text())["status"] in (409, 422)
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert not errors, [record.getMessage() for record in errors]
    tracebacks = [record for record in caplog.records if record.exc_info]
    assert not tracebacks, [record.getMessage() for record in tracebacks]


def test_a_body_not_declared_json_is_a_415_saying_what_to_send(client):
    for headers in ({"content-type": "application/x-www-form-urlencoded"}, {"content-type": "text/plain"}, {}):
        answer = client.post("/forecast", content=json.dumps({"rows": rows(3)}), headers=headers)
        assert answer.status_code == 415, answer.text
        assert "Content-Type: application/json" in answer.json()["detail"] and answer.json()["request_id"]


def test_a_body_that_is_not_json_says_where_and_why(client):
    answer = client.post("/forecast", content=b'{"rows": [[1.0, 2.0], [3.0 4.0]]}',
                         headers={"content-type": "application/json"})
    assert answer.status_code == 422
    assert "not valid JSON: Expecting ',' delimiter at line 1, column 28 (character 27)" in answer.json()["detail"]


def test_a_piece_with_text_and_rows_says_which_to_drop(client):
    session = client.post("/sessions", json={"task": "classify"}).json()["id"]
    answer = client.post(f"/sessions/{session}/segments", json={"seq": 1, "text": "a", "rows": rows(1)})
    assert answer.status_code == 422
    detail = answer.json()["detail"]
    assert "not both" in detail and "drop the one this session does not read" in detail
    assert "Extra inputs" not in detail


def test_the_docs_read_as_a_manual(client):
    schema = client.get("/openapi.json").json()
    summaries = [operation["summary"] for path in schema["paths"].values() for operation in path.values()
                 if "summary" in operation]
    assert summaries and not [summary for summary in summaries if "`" in summary]  # Swagger shows them raw
    example = schema["components"]["schemas"]["ForecastRequest"]["properties"]["rows"]["examples"][0]
    tried = client.post("/forecast", json={"rows": example})
    assert tried.status_code == 200 and tried.json()["forecast"] is not None  # "Try it out" forecasts
    decoding = schema["components"]["schemas"]["SummarizeRequest"]["properties"]["decoding"]
    assert "word salad" in json.dumps(decoding)
    text = schema["components"]["schemas"]["ClassifyRequest"]["properties"]["text"]["description"]
    assert "whole news articles" in text and "arbitrary" in text
