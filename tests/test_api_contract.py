"""The API as a client meets it: one error body, request ids, metrics, docs offline, finish and replay
rules, CORS, gzip, defaults — over one app serving a tiny classifier, summarizer and forecaster, real Redis."""

import re

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.service_helpers import make_client
from tests.tiny_checkpoints import VARIABLES

LOOKBACK = 32
TEXT = ("Shares in the bank rose five per cent on Monday after it reported a rise in profits for the year. "
        "The chief executive said the results showed the strength of the business in a difficult market. ") * 3


@pytest.fixture(scope="module")
def repository(every_task_repository):
    return every_task_repository, None  # the forecaster's look-back is LOOKBACK (tests/tiny_checkpoints.py)


def rows(count):
    return (np.random.default_rng().standard_normal((count, len(VARIABLES))) * 3 + 10).round(3).tolist()


def assert_error_body(response, status):
    assert response.status_code == status, response.text
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"]
    assert body["request_id"] == response.headers["x-request-id"]
    assert set(body) <= {"detail", "errors", "expected_seq", "request_id"}
    return body


def test_every_error_has_one_shape_with_the_request_id(client, repository, redis_url, key_prefix):
    assert_error_body(client.get("/nope"), 404)
    assert_error_body(client.get("/classify"), 405)
    invalid = assert_error_body(client.post("/forecast", json={"rows": [["1.5"] * 7]}), 422)
    assert invalid["errors"][0] == {"loc": ["body", "rows", 0, 0], "msg": invalid["errors"][0]["msg"],
                                    "type": "float_type"} and "body.rows.0.0" in invalid["detail"]
    assert_error_body(client.post("/classify", content=b'{"text": "\xff"}',
                                  headers={"content-type": "application/json"}), 400)
    assert_error_body(client.post("/forecast", json={"rows": rows(2), "model": "nope"}), 404)
    session = client.post("/sessions", json={"task": "forecast"}).json()
    gap = assert_error_body(client.post(f"/sessions/{session['id']}/segments", json={"seq": 2, "rows": rows(1)}), 409)
    assert gap["expected_seq"] == 1
    with make_client(repository[0], redis_url, key_prefix, max_body_bytes=1024, api_keys=["k"]) as small:
        assert_error_body(small.post("/classify", json={"text": "x" * 2000}, headers={"x-api-key": "k"}), 413)
        assert_error_body(small.get("/models"), 401)


def test_request_id_is_taken_or_made_and_echoed(client):
    mine = client.get("/healthz", headers={"x-request-id": "abc-123.x"})
    assert mine.headers["x-request-id"] == "abc-123.x"
    made = client.get("/healthz").headers["x-request-id"]
    odd = client.get("/healthz", headers={"x-request-id": "no spaces\tor tabs"}).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made) and re.fullmatch(r"[0-9a-f]{32}", odd) and made != odd


def test_a_piece_is_matched_by_the_first_route_tried_and_the_reference_keeps_its_reading_order(client):
    from service.routers import sessions

    piece = {"type": "http", "method": "POST", "path": "/sessions/abc/segments", "root_path": ""}
    assert sessions.router.routes[0].matches(piece)[0].name == "FULL"
    paths = [path for path in client.app.openapi()["paths"] if path.startswith("/sessions")]
    assert paths == ["/sessions", "/sessions/{session_id}", "/sessions/{session_id}/segments",
                     "/sessions/{session_id}/finish"]


def test_docs_render_offline_every_asset_from_the_service(client):
    for page in ("/docs", "/redoc"):
        html = client.get(page)
        assert html.status_code == 200
        assets = re.findall(r'(?:src|href)=["\']([^"\']+)["\']', html.text) + re.findall(r"url: *'([^']+)'", html.text)
        assert assets, html.text
        for asset in assets:
            assert asset.startswith("/"), f"{page} loads {asset} from elsewhere"
            fetched = client.get(asset)
            assert fetched.status_code == 200 and len(fetched.content) > 100, asset
        assert "cdn" not in html.text.lower()


def test_models_mark_the_default_of_each_task(client):
    models = client.get("/models").json()
    assert {m["task"] for m in models if m["default"]} == {"classify", "summarize", "forecast"}
    assert sum(m["default"] for m in models) == 3


def test_finish_replay_and_expiry_rules(client):
    session = client.post("/sessions", json={"task": "summarize"}).json()
    url = f"/sessions/{session['id']}"
    piece = {"seq": 1, "text": TEXT}
    applied = client.post(f"{url}/segments", json=piece).json()
    first, second = client.get(url).json(), client.get(url).json()
    assert abs(first["expires_at"] - second["expires_at"]) < 0.005  # the same instant on every read (to the ms)
    final = client.post(f"{url}/finish", json={"max_length": 20})
    assert final.status_code == 200
    body = final.json()
    whole = client.post("/summarize", json={"text": TEXT, "max_length": 20}).json()
    assert {k: body[k] for k in whole} == whole  # the one-shot answer ...
    assert body["session"]["status"] == "finished" and body["session"]["seq"] == 1  # ... plus the session
    retry = client.post(f"{url}/segments", json=piece)  # the last seq again, after finish: a replay
    assert retry.status_code == 200 and retry.json()["replayed"] is True
    assert retry.json()["result"]["summary"] == body["summary"] and applied["replayed"] is False
    assert client.post(f"{url}/segments", json={"seq": 2, "text": "more"}).status_code == 409
    again = client.post(f"{url}/finish").json()
    assert again["summary"] == body["summary"]
    with client.stream("POST", f"{url}/finish", json={"stream": True}) as events:
        assert events.headers["content-type"].startswith("text/event-stream")
        text = events.read().decode()
    assert "event: token" in text and "event: done" in text and body["summary"].split()[0] in text


def test_cors_is_off_by_default_and_on_when_configured(client, repository, redis_url, key_prefix):
    preflight = {"origin": "https://app.example", "access-control-request-method": "POST"}
    assert "access-control-allow-origin" not in client.get("/healthz", headers={"origin": "https://app.example"}).headers
    with make_client(repository[0], redis_url, key_prefix, cors_origins=["https://app.example"]) as cors:
        answer = cors.options("/classify", headers=preflight)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "https://app.example"


def test_large_answers_are_gzipped_but_events_never(client):
    answer = client.post("/forecast", json={"rows": rows(LOOKBACK)}, headers={"accept-encoding": "gzip"})
    assert answer.headers["content-encoding"] == "gzip" and answer.json()["forecast"]
    small = client.get("/healthz", headers={"accept-encoding": "gzip"})
    assert "content-encoding" not in small.headers
    with client.stream("POST", "/summarize", json={"text": TEXT * 5, "stream": True},
                       headers={"accept-encoding": "gzip"}) as events:
        assert "content-encoding" not in events.headers
        assert b"event: done" in events.read()


def test_metrics_after_one_request_of_each_kind(client):
    """Every family and label, after one request of each kind: one-shot, session piece, finish, status, delete,
    an error, docs."""
    client.post("/classify", json={"text": TEXT})
    client.post("/summarize", json={"text": TEXT, "max_length": 12, "decoding": "free"})
    with client.stream("POST", "/summarize", json={"text": TEXT, "max_length": 12, "stream": True,
                                                   "decoding": "free"}) as events:
        events.read()
    client.post("/forecast", json={"rows": rows(LOOKBACK)})
    session = client.post("/sessions", json={"task": "classify"}).json()
    sid = session["id"]
    client.post(f"/sessions/{sid}/segments", json={"seq": 1, "text": TEXT})
    client.post(f"/sessions/{sid}/segments", json={"seq": 3, "text": TEXT})  # 409
    client.get(f"/sessions/{sid}")
    client.post(f"/sessions/{sid}/finish")
    client.delete(f"/sessions/{sid}")
    client.get("/docs"), client.get("/openapi.json")
    text = client.get("/metrics").text
    assert "_created" not in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "rtserve_time_to_first_token_seconds",
                 "rtserve_generated_tokens", "rtserve_segments_processed", "rtserve_batch_size",
                 "rtserve_requests", "rtserve_request_duration_seconds", "rtserve_step_duration_seconds",
                 "rtserve_batch_queue_seconds", "rtserve_session_state_bytes", "rtserve_active_sessions",
                 "rtserve_redis_operation_duration_seconds", "rtserve_event_loop_lag_seconds"):
        assert name in families, name
    requests = {(s.labels["route"], s.labels["status"]): s.labels["model"]
                for s in families["rtserve_requests"].samples}
    assert ("unmatched", "200") not in requests
    assert requests[("/docs", "200")] == "" and requests[("/openapi.json", "200")] == ""
    for route, status, model in (("/classify", "200", "rmt-tiny:1"), ("/summarize", "200", "srformer-tiny:1"),
                                 ("/forecast", "200", "rsa-tiny:1"), ("/sessions/{session_id}", "200", "rmt-tiny:1"),
                                 ("/sessions/{session_id}", "204", "rmt-tiny:1"),
                                 ("/sessions/{session_id}/segments", "409", "rmt-tiny:1"),
                                 ("/sessions/{session_id}/finish", "200", "rmt-tiny:1")):
        assert requests[(route, status)] == model, (route, status)
    # the session id never appears as a label value
    assert sid not in text
    segments = {s.labels["model"]: s.value for s in families["rtserve_segments_processed"].samples}
    assert segments["rmt-tiny:1"] >= 2 and segments["srformer-tiny:1"] >= 2 and segments["rsa-tiny:1"] >= 1
    ttft = {(s.labels["model"], s.labels["stream"]) for s in families["rtserve_time_to_first_token_seconds"].samples
            if s.name.endswith("_count") and s.value > 0}
    assert ttft == {("srformer-tiny:1", "true"), ("srformer-tiny:1", "false")}
    generated = {s.labels["model"]: s.value for s in families["rtserve_generated_tokens"].samples}
    assert 2 <= generated["srformer-tiny:1"] <= 24
    graphs = {(s.labels["model"], s.labels["graph"]) for s in families["rtserve_batch_size"].samples}
    assert {("srformer-tiny:1", "encode_window"), ("srformer-tiny:1", "decode_step"), ("rsa-tiny:1", "step")} <= graphs
    buckets = {s.labels["le"] for s in families["rtserve_step_duration_seconds"].samples if "le" in s.labels}
    assert {"0.0001", "0.00025", "0.0005"} <= buckets
