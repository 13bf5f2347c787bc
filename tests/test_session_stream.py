"""A session's stream (WebSocket ``/sessions/{id}/stream``): the same pieces, answers, errors and guarantees as the
HTTP piece route, over one connection.

- stream == whole for every task, a summary's token frames included;
- exactly once: a retried ``seq`` is answered ``replayed`` from the stored result, a conflicting one refused;
- HTTP pieces and streams mixed in one session, one after the other and at once;
- binary row frames are the pieces of their float32 values;
- bad frames get an ``error`` frame, apply nothing and leave the stream usable;
- the upgrade checks the API key and the session; a shutting-down replica closes with 1012, Redis gone with 1013.
"""

from __future__ import annotations

import json
import logging
import struct
from contextlib import contextmanager

import numpy as np
import pytest
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from service.embedded_redis import EmbeddedRedis
from tests.service_helpers import make_client, random_pieces
from tests.tiny_checkpoints import VARIABLES

TEXT = ("The committee met on Tuesday to weigh the proposal. Members argued over the costs, the schedule and the "
        "risks to the budget. After four hours the chair called a vote, and the measure passed narrowly. Critics "
        "said they would appeal the decision in the coming weeks. ") * 3


@pytest.fixture(scope="module")
def repository(every_task_repository):
    return every_task_repository, None


def rows(rng, count):
    return (rng.standard_normal((count, len(VARIABLES))) * 3 + 10).round(4).tolist()


def frame(ws):
    return json.loads(ws.receive_text())


@contextmanager
def open_stream(client, session_id, **headers):
    """The stream, and its ``open`` frame."""
    with client.websocket_connect(f"/sessions/{session_id}/stream", headers=headers) as ws:
        opened = frame(ws)
        assert opened["event"] == "open" and opened["session"]["id"] == session_id, opened
        yield ws, opened


def pieces_of(task, rng):
    if task == "forecast":
        return [{"rows": piece} for piece in random_pieces(rows(rng, 60), rng, 17)]
    return [{"text": "".join(piece)} for piece in random_pieces(list(TEXT), rng, 150)]


@pytest.mark.parametrize("task", ["forecast", "classify", "summarize"])
def test_a_document_streamed_over_a_stream_equals_the_whole_posted_at_once(client, task):
    rng = np.random.default_rng()
    pieces = pieces_of(task, rng)
    whole_body = ({"rows": [row for piece in pieces for row in piece["rows"]]} if task == "forecast"
                  else {"text": "".join(piece["text"] for piece in pieces)})
    whole = client.post(f"/{task}", json=whole_body)
    assert whole.status_code == 200, whole.text
    session = client.post("/sessions", json={"task": task}).json()
    with open_stream(client, session["id"]) as (ws, opened):
        assert opened["session"]["seq"] == 0
        for seq, piece in enumerate(pieces, start=1):
            ws.send_text(json.dumps({"seq": seq, **piece}))
            answer = frame(ws)
            assert answer.get("event") is None and answer["session"]["seq"] == seq and not answer["replayed"], answer
        ws.send_text(json.dumps({"finish": {}}))
        final = frame(ws)
    expected = whole.json()
    assert final["session"]["status"] == "finished" and final["session"]["seq"] == len(pieces)
    for key, value in expected.items():
        assert final[key] == value, key


def test_a_summary_finished_over_a_stream_sends_token_frames_then_done(client):
    session = client.post("/sessions", json={"task": "summarize"}).json()
    whole = client.post("/summarize", json={"text": TEXT, "decoding": "free", "beam_size": 1}).json()
    with open_stream(client, session["id"]) as (ws, _):
        ws.send_text(json.dumps({"seq": 1, "text": TEXT}))
        assert frame(ws)["session"]["seq"] == 1
        ws.send_text(json.dumps({"finish": {"stream": True, "decoding": "free", "beam_size": 1}}))
        tokens, event = [], frame(ws)
        while event["event"] == "token":
            tokens.append(event["data"]["text"])
            event = frame(ws)
    assert event["event"] == "done", event
    assert "".join(tokens).strip() == event["data"]["summary"].strip() == whole["summary"].strip()
    assert event["data"]["session"]["status"] == "finished"


def test_a_retried_seq_is_answered_from_the_stored_result_and_another_content_is_refused(client):
    rng = np.random.default_rng()
    session = client.post("/sessions", json={"task": "forecast"}).json()
    with open_stream(client, session["id"]) as (ws, _):
        first, second = rows(rng, 40), rows(rng, 5)
        ws.send_text(json.dumps({"seq": 1, "rows": first}))
        applied = frame(ws)
        ws.send_text(json.dumps({"seq": 1, "rows": first}))
        replayed = frame(ws)
        assert replayed["replayed"] and replayed["result"] == applied["result"]
        ws.send_text(json.dumps({"seq": 1, "rows": second}))
        refused = frame(ws)
        assert refused["event"] == "error" and refused["status"] == 409 and refused["data"]["expected_seq"] == 2
        ws.send_text(json.dumps({"seq": 3, "rows": second}))
        gap = frame(ws)
        assert gap["status"] == 409 and gap["data"]["expected_seq"] == 2
        ws.send_text(json.dumps({"seq": 2, "rows": second}))
        assert frame(ws)["session"]["seq"] == 2
    status = client.get(f"/sessions/{session['id']}").json()
    assert status["seq"] == 2 and status["consumed"] == 45  # each piece applied once


def test_http_pieces_and_streams_mix_in_one_session_and_give_the_whole_documents_answer(repository, redis_url,
                                                                                           key_prefix):
    """Pieces over HTTP, then a stream on one replica, an HTTP piece on another replica while that stream is open,
    the stream going on (it reads the session again), a second stream on the other replica, and HTTP again."""
    rng = np.random.default_rng()
    pieces = [rows(rng, 9) for _ in range(8)]
    with make_client(repository[0], redis_url, key_prefix) as a, make_client(repository[0], redis_url,
                                                                             key_prefix) as b:
        whole = a.post("/forecast", json={"rows": [row for piece in pieces for row in piece]}).json()
        session = a.post("/sessions", json={"task": "forecast"}).json()["id"]
        url = f"/sessions/{session}/segments"
        assert a.post(url, json={"seq": 1, "rows": pieces[0]}).status_code == 200
        with open_stream(a, session) as (ws, opened):
            assert opened["session"]["seq"] == 1
            ws.send_text(json.dumps({"seq": 2, "rows": pieces[1]}))
            assert frame(ws)["session"]["seq"] == 2
            # another replica takes piece 3 over HTTP while the stream holds the session: it goes ahead
            assert b.post(url, json={"seq": 3, "rows": pieces[2]}).json()["session"]["seq"] == 3
            ws.send_text(json.dumps({"seq": 3, "rows": pieces[2]}))  # the client's retry of it: already applied
            assert frame(ws)["replayed"] is True
            ws.send_text(json.dumps({"seq": 4, "rows": pieces[3]}))  # the stream's kept state is stale: read again
            assert frame(ws)["session"]["seq"] == 4
        with open_stream(b, session) as (ws, opened):
            assert opened["session"]["seq"] == 4
            for seq in (5, 6):
                ws.send_text(json.dumps({"seq": seq, "rows": pieces[seq - 1]}))
                assert frame(ws)["session"]["seq"] == seq
        assert a.post(url, json={"seq": 7, "rows": pieces[6]}).status_code == 200
        assert b.post(url, json={"seq": 8, "rows": pieces[7]}).status_code == 200
        final = a.post(f"/sessions/{session}/finish").json()
    assert final["forecast"] == whole["forecast"] and final["session"]["consumed"] == 72


def test_bad_frames_get_an_error_frame_apply_nothing_and_leave_the_stream_usable(repository, redis_url, key_prefix,
                                                                                caplog):
    rng = np.random.default_rng()
    with make_client(repository[0], redis_url, key_prefix, max_body_bytes=4000) as client:
        session = client.post("/sessions", json={"task": "forecast"}).json()["id"]
        caplog.set_level(logging.DEBUG, logger="rtserve")
        with open_stream(client, session) as (ws, _):
            bad = [
                ("not json {", 422, "not valid JSON"),
                (json.dumps({"seq": 1, "rows": rows(rng, 3), "colour": "red"}), 422, "body.colour"),
                (json.dumps({"seq": 1, "text": "words"}), 422, "send `rows`, not `text`"),
                (json.dumps({"seq": 1, "text": "x", "rows": rows(rng, 2)}), 422, "not both"),
                (json.dumps({"seq": 1, "rows": [[1.0, 2.0]]}), 422, "row 0 has 2 values"),
                (json.dumps({"seq": 1, "rows": rows(rng, 200)}), 413, "exceeds 4000"),
                (json.dumps({"seq": 5, "rows": rows(rng, 2)}), 409, "out of order"),
                (json.dumps({"finish": {"strem": True}}), 422, "finish.strem"),
            ]
            for text, status, says in bad:
                ws.send_text(text)
                error = frame(ws)
                assert error["event"] == "error" and error["status"] == status, (text[:40], error)
                assert says in error["data"]["detail"] and error["data"]["request_id"], error
            ws.send_text(json.dumps({"seq": 1, "rows": rows(rng, 3)}))
            assert frame(ws)["session"]["seq"] == 1  # nothing of the bad frames was applied
        assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
        assert client.get(f"/sessions/{session}").json()["consumed"] == 3


def test_the_upgrade_checks_the_api_key_and_the_session(repository, redis_url, key_prefix):
    with make_client(repository[0], redis_url, key_prefix, api_keys=["k1", "k2"]) as client:
        session = client.post("/sessions", json={"task": "forecast"}, headers={"x-api-key": "k1"}).json()["id"]
        for headers, status in (({}, 401), ({"x-api-key": "nope"}, 401), ({"x-api-key": "k2"}, 404)):
            with pytest.raises(WebSocketDenialResponse) as denied:
                client.websocket_connect(f"/sessions/{session}/stream", headers=headers).__enter__()
            assert denied.value.status_code == status
        with pytest.raises(WebSocketDenialResponse) as denied:
            client.websocket_connect("/sessions/no-such-session/stream", headers={"x-api-key": "k1"}).__enter__()
        assert denied.value.status_code == 404 and "does not exist" in denied.value.json()["detail"]
        with open_stream(client, session, **{"authorization": "Bearer k1"}) as (ws, opened):
            assert opened["session"]["seq"] == 0


def test_a_replica_that_begins_to_drain_answers_the_piece_in_flight_then_closes_with_1012(client):
    rng = np.random.default_rng()
    session = client.post("/sessions", json={"task": "forecast"}).json()["id"]
    with open_stream(client, session) as (ws, _):
        ws.send_text(json.dumps({"seq": 1, "rows": rows(rng, 4)}))
        assert frame(ws)["session"]["seq"] == 1
        shutdown = client.app.state.shutdown
        client.portal.call(lambda: shutdown.begin(lambda: None))
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert closed.value.code == 1012
    assert client.get(f"/sessions/{session}").json()["seq"] == 1
    with pytest.raises(WebSocketDenialResponse) as denied:  # no new stream while draining
        client.websocket_connect(f"/sessions/{session}/stream").__enter__()
    assert denied.value.status_code == 503


def test_redis_gone_answers_an_error_frame_then_closes_with_1013(repository, key_prefix):
    rng = np.random.default_rng()
    with EmbeddedRedis() as server, make_client(repository[0], server.url, key_prefix,
                                                redis_timeout_seconds=0.5) as client:
        session = client.post("/sessions", json={"task": "forecast"}).json()["id"]
        with open_stream(client, session) as (ws, _):
            ws.send_text(json.dumps({"seq": 1, "rows": rows(rng, 4)}))
            assert frame(ws)["session"]["seq"] == 1
            server.stop()
            ws.send_text(json.dumps({"seq": 2, "rows": rows(rng, 4)}))
            error = frame(ws)
            assert error["event"] == "error" and error["status"] == 503, error
            assert "same seq" in error["data"]["detail"]
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_text()
            assert closed.value.code == 1013


def test_a_piece_that_reaches_an_idle_stream_as_its_drain_begins_is_answered_or_left_unapplied(client):
    """The drain closes an idle stream at once; a piece already on its way is then either answered or not applied
    (its client sends it again elsewhere), never applied and left unanswered."""
    rng = np.random.default_rng()
    session = client.post("/sessions", json={"task": "forecast"}).json()["id"]
    with client.websocket_connect(f"/sessions/{session}/stream") as ws:
        assert json.loads(ws.receive_text())["event"] == "open"
        ws.send_text(json.dumps({"seq": 1, "rows": rows(rng, 4)}))
        assert json.loads(ws.receive_text())["session"]["seq"] == 1
        shutdown = client.app.state.shutdown
        piece = json.dumps({"seq": 2, "rows": rows(rng, 4)})

        async def piece_then_drain():  # piece 2 is in the stream's queue when the drain begins
            ws._receive_tx.send_nowait({"type": "websocket.receive", "text": piece})
            shutdown.begin(lambda: None)

        client.portal.call(piece_then_drain)
        answered = ws.receive()["type"] == "websocket.send"
    assert client.get(f"/sessions/{session}").json()["seq"] == (2 if answered else 1)


def binary(seq, values):
    """A binary piece frame: the header (seq, rows, columns), then the rows' float32 values."""
    array = np.asarray(values, dtype="<f4")
    return struct.pack("<QII", seq, *array.shape) + array.tobytes()


def test_binary_row_frames_are_the_pieces_of_their_float32_values(client):
    """A binary frame is the JSON piece of its float32 values: the same answers, the same session, a retry of it
    replayed, and stream == whole."""
    rng = np.random.default_rng()
    pieces = [np.asarray(rows(rng, count), dtype=np.float32) for count in (30, 1, 17)]
    as_json = [piece.astype(np.float64).tolist() for piece in pieces]  # the float32 values, written exactly
    whole = client.post("/forecast", json={"rows": [row for piece in as_json for row in piece]}).json()
    by_json = client.post("/sessions", json={"task": "forecast"}).json()["id"]
    by_binary = client.post("/sessions", json={"task": "forecast"}).json()["id"]
    with open_stream(client, by_json) as (ws, _):
        json_answers = []
        for seq, piece in enumerate(as_json, 1):
            ws.send_text(json.dumps({"seq": seq, "rows": piece}))
            json_answers.append(frame(ws))
    with open_stream(client, by_binary) as (ws, _):
        for seq, piece in enumerate(pieces, 1):
            ws.send_bytes(binary(seq, piece))
            answer = frame(ws)
            assert answer["result"] == json_answers[seq - 1]["result"] and not answer["replayed"]
        ws.send_bytes(binary(3, pieces[2]))  # a retry
        assert frame(ws)["replayed"] is True
        ws.send_text(json.dumps({"seq": 3, "rows": as_json[2]}))  # the same values as JSON: the same piece
        assert frame(ws)["replayed"] is True
        ws.send_text(json.dumps({"finish": {}}))
        final = frame(ws)
    assert final["forecast"] == whole["forecast"] and final["session"]["consumed"] == 48


def test_bad_binary_frames_get_an_error_frame_and_apply_nothing(client):
    rng = np.random.default_rng()
    good = np.asarray(rows(rng, 4), dtype=np.float32)
    nan = good.copy()
    nan[1, 0] = np.nan
    session = client.post("/sessions", json={"task": "forecast"}).json()["id"]
    with open_stream(client, session) as (ws, _):
        bad = [
            (b"\x01\x02", "this one has 2 bytes"),
            (binary(1, good)[:-4], f"header says 4 x {len(VARIABLES)} values"),
            (binary(0, good), "from 1"),
            (struct.pack("<QII", 1, 0, len(VARIABLES)), "`rows` is empty"),
            (binary(1, good[:, :2]), "row 0 has 2 values"),
            (binary(1, nan), "NaN"),
            (binary(2, good), "out of order"),
        ]
        for data, says in bad:
            ws.send_bytes(data)
            error = frame(ws)
            assert error["event"] == "error" and error["status"] in (409, 422), (says, error)
            assert says in error["data"]["detail"], (says, error)
        ws.send_bytes(binary(1, good))
        assert frame(ws)["session"]["seq"] == 1
    text_session = client.post("/sessions", json={"task": "classify"}).json()["id"]
    with open_stream(client, text_session) as (ws, _):
        ws.send_bytes(binary(1, good))
        error = frame(ws)
        assert error["status"] == 422 and "send `text`, not `rows`" in error["data"]["detail"]
    assert client.get(f"/sessions/{session}").json()["consumed"] == 4
    assert client.get(f"/sessions/{text_session}").json()["seq"] == 0
