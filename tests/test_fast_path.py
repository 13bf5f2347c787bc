"""The fast paths (a session's piece, a one-shot forecast or classification) answer exactly what the validated path
answers, and take only what they take."""

import json
import time

import numpy as np
import orjson
import pytest
from pydantic import TypeAdapter, ValidationError

from service import fast_path, result_json
from service.fast_path import answer_json, info, piece_answer, plain_piece
from service.routers import one_shot
from service.routers import sessions as sessions_router
from service.schemas import FLOAT32_MAX, ClassifyResponse, ForecastResponse, SegmentRequest, SegmentResponse
from service.sessions import SessionMeta, SessionStatus
from tests.tiny_checkpoints import VARIABLES

PIECES = TypeAdapter(SegmentRequest)


@pytest.fixture(scope="module")
def repository(forecast_repository):
    return forecast_repository


def validated(body):
    """(seq, text, rows) as pydantic reads the body, or None where it refuses it."""
    try:
        piece = PIECES.validate_python(body)
    except ValidationError:
        return None
    return piece.seq, getattr(piece, "text", None), getattr(piece, "rows", None)


def test_plain_piece_takes_what_validation_takes_with_the_same_values_and_nothing_else():
    rng = np.random.default_rng()
    floats = rng.standard_normal((5, 7)).tolist()
    ints = rng.integers(-1000, 1000, (3, 7)).tolist()
    bodies = [
        {"seq": 1, "rows": floats}, {"seq": 2, "rows": ints}, {"seq": 3, "rows": [ints[0][:3] + floats[0][3:]]},
        {"seq": 7, "text": "a piece"}, {"seq": 1, "text": ""}, {"seq": 1, "rows": [[]]},
        # refused by validation: the fast path must leave them to it
        {"seq": 0, "text": "x"}, {"seq": True, "text": "x"}, {"seq": "1", "text": "x"}, {"seq": 1},
        {"seq": 1, "text": "x", "rows": floats}, {"seq": 1, "text": "x", "extra": 1}, {"seq": 1, "rows": []},
        {"seq": 1, "rows": [[1.0, True]]}, {"seq": 1, "rows": [[1.0, "2"]]}, {"seq": 1, "rows": [1.0]},
        {"seq": 1, "rows": [[FLOAT32_MAX * 2]]}, {"seq": 1, "rows": [[float("nan")]]}, {"seq": 1, "text": 5},
        [1, 2], "text",
        # no string beside the keys, so read as float64 at once: what holds no number must still be refused
        {"seq": 1, "rows": [[1.0, None]]}, {"seq": 1, "rows": [[{}]]}, {"seq": 1, "rows": [{}]},
        {"seq": 1, "rows": [[[1.0]]]}, {"seq": 1, "rows": [[1.0], [2.0, 3.0]]}, {"seq": 1, "rows": [[]] * 2},
    ]
    for body in bodies:
        fast, slow = plain_piece(body, orjson.dumps(body)), validated(body)
        if slow is None:
            assert fast is None, body
        elif fast is not None:
            if fast[2] is not None:  # ints become floats, as validation makes them (the digest reads them)
                assert fast[2].dtype == np.float64
                fast = (fast[0], fast[1], fast[2].tolist())
                assert orjson.dumps(fast[2]) == orjson.dumps(slow[2])  # the same digest
            assert fast == slow, body
    # a string among the rows is never read as a number, whatever else the body holds
    for body in ({"seq": 1, "rows": [[1.5, "2"]]}, {"seq": 1, "rows": [["1.5"]]}):
        assert plain_piece(body, orjson.dumps(body)) is None
        assert plain_piece(body, orjson.dumps(body).decode()) is None
    # integers past 64 bits (the standard library parses them where orjson refuses): floats, as validation reads them
    for big in ({"seq": 1, "rows": [[10**30, 1.5]]}, {"seq": 1, "rows": [[10**400, 1.5]]}):
        fast, slow = plain_piece(big, json.dumps(big)), validated(big)
        assert (fast is None) if slow is None else (fast is None or fast[2].tolist() == slow[2]), big
    # validation takes these too; the fast path leaves them to it (an int sent as 2.0)
    assert plain_piece(body := {"seq": 2.0, "text": "x"}, orjson.dumps(body)) is None
    assert validated({"seq": 2.0, "text": "x"}) == (2, "x", None)


def test_one_shot_rows_are_read_as_validation_reads_them_whatever_strings_stand_beside_them():
    floats = np.random.default_rng().standard_normal((4, 7)).tolist()
    cases = [({"rows": floats}, floats), ({"rows": floats, "model": "m:1"}, floats),
             ({"rows": floats, "model": 'a "quoted" name'}, floats), ({"rows": [[1, 2]], "model": "m"}, [[1.0, 2.0]]),
             ({"rows": [[1.5, "2"]], "model": "m"}, None), ({"rows": [["1.5"]]}, None),
             ({"rows": [[1.5, None]], "model": "m"}, None), ({"rows": [[{}]]}, None)]
    for body, expected in cases:
        raw = orjson.dumps(body)
        rows = fast_path.plain_rows(body["rows"], raw, 2 * len(body) - 1)  # as the one-shot routes call it
        if expected is None:
            assert rows is None, body
        else:
            assert rows is not None and rows.dtype == np.float64 and rows.tolist() == expected, body


def meta(**fields):
    base = dict(id="s1", model="m:1", task="forecast", owner="o", quota="o", seq=3, created=1.5, deadline=9e9,
                consumed=30, segments=3, state_bytes=2800, piece_sha="", status=SessionStatus.OPEN,
                expires=time.time() + 60)
    return SessionMeta(**(base | fields))


RESULTS = [
    {"forecast": [[1.5, 2.0], [3.25, -1.0]], "horizon": 2, "variables": ["a", "b"], "rows_seen": 40,
     "rows_needed": 0},
    {"forecast": None, "horizon": 2, "variables": ["a", "b"], "rows_seen": 4, "rows_needed": 30},
    {"label": "mainstream", "probabilities": {"mainstream": 0.75, "hyperpartisan": 0.25}, "segments": 2,
     "tokens_read": 250, "tokens_total": 260, "truncated": False},
    {"label": None, "probabilities": {}, "segments": 0, "tokens_read": 3, "tokens_total": 3, "truncated": False},
    {"tokens_read": 510, "tokens_total": 600, "truncated": False, "encoded_tokens": 510, "windows": 1},
    {"summary": "Shares rose.", "summary_tokens": 4, "tokens_read": 600, "tokens_total": 600, "truncated": False,
     "decoding": "sentence"},
    {"summary": "Shares rose.", "summary_tokens": 4, "tokens_read": 600, "tokens_total": 600, "truncated": False,
     "decoding": "sentence", "not_in_the_schema": 1},  # not a plain shape: through the model, which drops it
]


@pytest.mark.parametrize("result", RESULTS)
@pytest.mark.parametrize("replayed", [False, True])
def test_the_answer_serialized_once_is_the_one_the_response_model_gives(result, replayed):
    session = meta(status=SessionStatus.FINISHED if replayed else SessionStatus.OPEN)
    fast = orjson.loads(piece_answer(session, result, replayed))
    spliced = orjson.loads(piece_answer(session, result, replayed, result_json.dumps(result)))  # the commit's JSON
    model = SegmentResponse(session=info(session), replayed=replayed, result=result).model_dump(mode="json")
    for answer in (fast, spliced, model):  # the clock at each call
        assert abs(answer["session"].pop("expires_at") - (session.expires_at)) < 5
    assert fast == model == spliced
    assert json.dumps(fast, sort_keys=True) == json.dumps(spliced, sort_keys=True)
    assert json.dumps(fast, sort_keys=True) == json.dumps(model, sort_keys=True)  # 1 and 1.0 alike


def test_fast_and_validated_pieces_answer_alike_and_a_retry_by_either_path_is_the_same_piece(client, monkeypatch):
    parsed = []
    loads = fast_path.orjson.loads

    def counting_loads(body):
        parsed.append(body)
        return loads(body)

    monkeypatch.setattr(fast_path.orjson, "loads", counting_loads)
    taken = []

    def counting(body, raw):
        piece = plain_piece(body, raw)
        taken.append(piece is not None)
        return piece

    monkeypatch.setattr(sessions_router, "plain_piece", counting)
    rng = np.random.default_rng()
    pieces = [rng.integers(0, 20, (12, len(VARIABLES))).tolist(), (rng.standard_normal((25, 7)) * 3).tolist()]
    answers = {}
    for path in ("fast", "validated"):
        session = client.post("/sessions", json={"task": "forecast"}).json()["id"]
        answers[path] = []
        for seq, rows in enumerate(pieces, start=1):
            body = {"seq": seq if path == "fast" else float(seq), "rows": rows}  # 2.0: validation's to read
            answer = client.post(f"/sessions/{session}/segments", json=body)
            assert answer.status_code == 200, answer.text
            answers[path].append(answer.json())
        # a retry of the last piece by the other path is the same piece (the same digest): answered, not applied
        retry = {"seq": float(len(pieces)) if path == "fast" else len(pieces), "rows": pieces[-1]}
        again = client.post(f"/sessions/{session}/segments", json=retry)
        assert again.status_code == 200 and again.json()["replayed"] is True, again.text
        assert again.json()["result"] == answers[path][-1]["result"]
    # the route's fast path takes each plain piece and leaves every other to validation
    assert taken.count(True) == 3 and taken.count(False) == 3
    bodies = [body for body in parsed if body.startswith((b'{"task"', b'{"seq"'))]  # not a stored result
    assert len(bodies) == 2 * (1 + len(pieces) + 1)  # each request body parsed once (create, pieces, retry)
    for fast, validated_answer in zip(answers["fast"], answers["validated"], strict=True):
        for answer in (fast, validated_answer):
            for key in ("id", "created_at", "expires_at"):
                answer["session"].pop(key)
        assert fast == validated_answer


ONE_SHOT_RESULTS = [(ForecastResponse, RESULTS[0]), (ForecastResponse, RESULTS[1]), (ClassifyResponse, RESULTS[2]),
                    (ClassifyResponse, RESULTS[3]), (ForecastResponse, RESULTS[0] | {"not_in_the_schema": 1})]


@pytest.mark.parametrize(("response_model", "result"), ONE_SHOT_RESULTS)
def test_a_one_shot_answer_serialized_once_is_the_one_the_response_model_gives(response_model, result):
    values = {"model": "m:1"} | result
    fast = answer_json(response_model, values).body
    assert fast == response_model(**values).model_dump_json().encode()  # byte for byte, in the model's field order


def test_one_shot_fast_and_validated_bodies_answer_alike(client, monkeypatch):
    """A plain body is answered by the route's fast path, one that only validation takes (``model`` null) by the
    endpoint; both answer the same forecast, and an unknown model the same 404."""
    taken = []
    read = fast_path.plain_body

    def counting(body, field):
        plain = read(body, field)
        taken.append(plain is not None)
        return plain

    monkeypatch.setattr(one_shot, "plain_body", counting)
    rows = np.random.default_rng().integers(0, 20, (40, len(VARIABLES))).tolist()
    fast = client.post("/forecast", json={"rows": rows})
    validated_answer = client.post("/forecast", json={"rows": rows, "model": None})
    assert taken == [True, False]
    assert fast.status_code == validated_answer.status_code == 200, (fast.text, validated_answer.text)
    assert fast.json() == validated_answer.json() and fast.json()["forecast"] is not None
    unknown = client.post("/forecast", json={"rows": rows, "model": "nope"})
    assert unknown.status_code == 404 and "nope" in unknown.json()["detail"]
    extra = client.post("/forecast", json={"rows": rows, "model": "nope", "extra": 1})
    assert extra.status_code == 422  # another field: validation's to refuse, before the model is looked up
    assert taken == [True, False, True, False]


def test_a_create_by_the_fast_path_answers_what_the_endpoint_answers(client, monkeypatch):
    """A body of plain strings is created by the route's fast path, one only validation reads (``task`` and ``model``
    both null) by the endpoint, which refuses it with its own 422; the fast path's answer is the response model's."""
    from service.routers import sessions as sessions_routes
    from service.schemas import SessionInfo

    taken = []
    original = sessions_routes.create_fast

    async def counting(request):
        try:
            answer = await original(request)
        except Exception:
            taken.append("raised")
            raise
        taken.append(answer is not None)
        return answer

    monkeypatch.setattr(sessions_routes.create_session, "fast_path", counting)
    created = client.post("/sessions", json={"task": "forecast"})
    assert created.status_code == 201 and SessionInfo.model_validate(created.json()).seq == 0
    status = client.get(f"/sessions/{created.json()['id']}").json()
    assert created.json()["model"] == "rsa-tiny:1" and status == {**created.json(), "expires_at": status["expires_at"]}
    neither = client.post("/sessions", json={"task": None, "model": None})
    assert neither.status_code == 422 and "name a `task`" in neither.json()["detail"]
    wrong = client.post("/sessions", json={"task": "translate"})
    assert wrong.status_code == 422 and "body.task" in wrong.json()["detail"]
    unknown = client.post("/sessions", json={"model": "nope"})
    assert unknown.status_code == 404 and "nope" in unknown.json()["detail"]
    assert taken == [True, False, False, "raised"]  # the unknown model: the fast path's 404, the endpoint's own


def test_a_plain_piece_is_answered_at_the_door_and_one_for_validation_through_the_router(client, monkeypatch):
    """A session's plain piece is answered where the app's own middleware ends (FastPathAtTheDoor), without reaching
    the router; a piece validation has to read goes on through the router to the route. Either way the answer, its
    errors (the app's handlers), its request id and its metrics (the route's template, the session's model) are the
    route's."""
    from prometheus_client.parser import text_string_to_metric_families
    from starlette.routing import Router

    routed = []
    call_router = Router.__call__

    async def counting(self, scope, receive, send):
        routed.append((scope["method"], scope["path"]))
        await call_router(self, scope, receive, send)

    def answered(model):
        families = text_string_to_metric_families(client.get("/metrics").text)
        requests = next(family for family in families if family.name == "rtserve_requests")
        return {sample.labels["status"]: sample.value for sample in requests.samples
                if sample.name == "rtserve_requests_total" and sample.labels["model"] == model
                and sample.labels["route"] == "/sessions/{session_id}/segments"}

    monkeypatch.setattr(Router, "__call__", counting)
    created = client.post("/sessions", json={"task": "forecast"}).json()
    session, model = created["id"], created["model"]
    before = answered(model)
    rows = [[1.0] * len(VARIABLES)] * 3
    plain = client.post(f"/sessions/{session}/segments", json={"seq": 1, "rows": rows})
    validated = client.post(f"/sessions/{session}/segments", json={"seq": 2.0, "rows": rows})  # 2.0: validation's
    gap = client.post(f"/sessions/{session}/segments", json={"seq": 9, "rows": rows}, headers={"X-Request-ID": "r-9"})
    text = client.post(f"/sessions/{session}/segments", content=b'{"seq": 3}', headers={"Content-Type": "text/plain"})
    assert plain.status_code == 200 and validated.status_code == 200, (plain.text, validated.text)
    assert plain.json()["session"]["seq"] == 1 and validated.json()["session"]["seq"] == 2
    assert gap.status_code == 409 and gap.json()["expected_seq"] == 3 and gap.headers["x-request-id"] == "r-9"
    assert gap.json()["request_id"] == "r-9"
    assert text.status_code == 415 and "Content-Type: application/json" in text.json()["detail"]
    pieces = [path for method, path in routed if path.endswith("/segments")]
    assert pieces == [f"/sessions/{session}/segments"]  # only the piece validation read reached the router
    after = answered(model)
    assert after.get("200", 0) - before.get("200", 0) == 2 and after.get("409", 0) - before.get("409", 0) == 1
