"""The segment lane (service/segment_lane.py) answers a plain session piece as the middleware stack and the router
do, and leaves every other request to them."""

import numpy as np
import pytest

from service.middleware import RequestIdMiddleware
from tests.service_helpers import make_client
from tests.tiny_checkpoints import VARIABLES

STACK = {"origin": "https://elsewhere.example"}  # with no CORS configured, the stack serves it as any request


@pytest.fixture(scope="module")
def repository(forecast_repository):
    return forecast_repository[0]


@pytest.fixture
def stack_calls(monkeypatch):
    """How many requests went through the middleware stack."""
    calls = []
    inner = RequestIdMiddleware.__call__

    async def counted(self, scope, receive, send):
        if scope["type"] == "http":
            calls.append(scope["path"])
        await inner(self, scope, receive, send)

    monkeypatch.setattr(RequestIdMiddleware, "__call__", counted)
    return calls


def rows(rng, count):
    return rng.standard_normal((count, len(VARIABLES))).round(4).tolist()


def without_request_id(answer):
    body = answer.json()
    body.pop("request_id", None)
    if "session" in body:  # two sessions: their own ids and times
        body["session"] = {k: v for k, v in body["session"].items() if k not in ("id", "created_at", "expires_at")}
    return answer.status_code, body


def test_a_plain_piece_takes_the_lane_and_is_answered_as_the_stack_answers_it(repository, redis_url, key_prefix,
                                                                               stack_calls):
    rng = np.random.default_rng()
    pieces = [rows(rng, n) for n in (20, 12, 5)]
    with make_client(repository, redis_url, key_prefix) as client:
        lane, stack = (client.post("/sessions", json={"task": "forecast"}).json()["id"] for _ in range(2))
        stack_calls.clear()
        for seq, piece in enumerate(pieces, start=1):
            through_lane = client.post(f"/sessions/{lane}/segments", json={"seq": seq, "rows": piece},
                                       headers={"x-request-id": f"lane-{seq}"})
            assert stack_calls == []  # the lane answered it
            through_stack = client.post(f"/sessions/{stack}/segments", json={"seq": seq, "rows": piece},
                                        headers={**STACK, "x-request-id": f"stack-{seq}"})
            assert stack_calls == [f"/sessions/{stack}/segments"]
            stack_calls.clear()
            assert through_lane.headers["x-request-id"] == f"lane-{seq}"
            assert through_lane.headers["content-type"] == through_stack.headers["content-type"]
            assert without_request_id(through_lane) == without_request_id(through_stack)
        assert through_lane.json()["result"]["forecast"] is not None
        # a retry is replayed, the same either way
        again = client.post(f"/sessions/{lane}/segments", json={"seq": 3, "rows": pieces[2]})
        assert again.json()["replayed"] and without_request_id(again)[1]["result"] == through_lane.json()["result"]
        # errors: the app's own handlers answer them, with the request id
        for seq, piece, session in ((5, pieces[0], None), (3, pieces[0], None), (1, pieces[0], "no-such-session")):
            answers = [client.post(f"/sessions/{session or name}/segments", json={"seq": seq, "rows": piece},
                                   headers={**headers, "x-request-id": "errs"})
                       for name, headers in ((lane, {}), (stack, STACK))]
            assert answers[0].status_code in (404, 409) and answers[0].json()["request_id"] == "errs"
            assert without_request_id(answers[0]) == without_request_id(answers[1])
        counted = [line for line in client.get("/metrics").text.splitlines()
                   if line.startswith("rtserve_requests_total") and 'route="/sessions/{session_id}/segments"' in line
                   and 'status="200"' in line]
        assert len(counted) == 1 and 'model="rsa-tiny:1"' in counted[0]
        assert float(counted[0].rsplit(" ", 1)[1]) == 2 * len(pieces) + 1  # both ways, and the retry


def test_what_is_not_plainly_a_piece_goes_to_the_stack(repository, redis_url, key_prefix, stack_calls):
    rng = np.random.default_rng()
    with make_client(repository, redis_url, key_prefix, api_keys=["k1"]) as client:
        key = {"x-api-key": "k1"}
        session = client.post("/sessions", json={"task": "forecast"}, headers=key).json()["id"]
        stack_calls.clear()
        # no key: the lane answers the 401 as the stack does
        refused = client.post(f"/sessions/{session}/segments", json={"seq": 1, "rows": rows(rng, 3)})
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer" and stack_calls == []
        assert without_request_id(refused) == without_request_id(
            client.post(f"/sessions/{session}/segments", json={"seq": 1, "rows": rows(rng, 3)}, headers=STACK))
        stack_calls.clear()
        # validation's cases: the stack's 422, naming the field
        extra = client.post(f"/sessions/{session}/segments", json={"seq": 1, "rows": rows(rng, 3), "x": 1},
                            headers=key)
        boolean = client.post(f"/sessions/{session}/segments", json={"seq": True, "rows": rows(rng, 3)}, headers=key)
        assert extra.status_code == boolean.status_code == 422
        assert len(stack_calls) == 2
        # a body sent in parts (no Content-Length) and a body that is not JSON: the stack reads them
        stack_calls.clear()
        chunked = client.post(f"/sessions/{session}/segments", headers={**key, "content-type": "application/json"},
                              content=iter([b'{"seq": 1, ', b'"rows": [[1, 2, 3, 4, 5, 6, 7]]}']))
        broken = client.post(f"/sessions/{session}/segments", headers={**key, "content-type": "application/json"},
                             content=b'{"seq": 1, "rows": [[1, 2')
        assert chunked.status_code == 200 and chunked.json()["session"]["seq"] == 1
        assert broken.status_code == 422 and len(stack_calls) == 2
        # other routes never take the lane
        stack_calls.clear()
        assert client.get(f"/sessions/{session}", headers=key).status_code == 200 and len(stack_calls) == 1


def test_while_draining_a_piece_closes_its_connection(repository, redis_url, key_prefix, stack_calls):
    rng = np.random.default_rng()
    with make_client(repository, redis_url, key_prefix) as client:
        session = client.post("/sessions", json={"task": "forecast"}).json()["id"]
        stack_calls.clear()
        client.app.state.shutdown.draining = True
        answer = client.post(f"/sessions/{session}/segments", json={"seq": 1, "rows": rows(rng, 4)})
        client.app.state.shutdown.draining = False
        assert answer.status_code == 200 and answer.headers["connection"] == "close" and stack_calls == []
