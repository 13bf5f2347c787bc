"""The forecast endpoint and forecasting sessions, over HTTP with a real Redis."""

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from export.exporter import export_checkpoint
from models.servable import build_servable
from tests.service_helpers import make_client, random_pieces
from tests.tiny_checkpoints import VARIABLES, tiny_forecaster

LOOKBACK, HORIZON = 32, 8


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("forecast")
    checkpoint = tiny_forecaster(root / "weights" / "rsa-tiny", "rsa", LOOKBACK, HORIZON)
    export_checkpoint(checkpoint, root / "repository", formats=("onnx",))
    return root / "repository", checkpoint


def series(rng, length):
    return (rng.standard_normal((length, len(VARIABLES))) * 3 + 10).round(3).tolist()


def eager_forecast(checkpoint, rows):
    step = build_servable(checkpoint).graph("step").module
    window = torch.zeros(1, LOOKBACK, len(VARIABLES))
    with torch.no_grad():
        out = step(window, torch.zeros(1, dtype=torch.int64), torch.tensor([rows], dtype=torch.float32))
    return out[2][0].numpy()


def test_forecast_matches_the_eager_model(client, repository):
    rows = series(np.random.default_rng(), 50)
    response = client.post("/forecast", json={"rows": rows})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "rsa-tiny:1" and body["variables"] == VARIABLES
    assert np.asarray(body["forecast"]).shape == (HORIZON, len(VARIABLES))
    np.testing.assert_allclose(body["forecast"], eager_forecast(repository[1], rows), atol=1e-4)


def test_short_series_says_rows_needed_and_ragged_or_empty_series_are_refused(client):
    short = client.post("/forecast", json={"rows": series(np.random.default_rng(), LOOKBACK - 1)})
    assert short.status_code == 200, short.text
    assert short.json()["forecast"] is None and short.json()["rows_needed"] == 1
    for wrong in ([[1.0] * 6 + ["2.5"]], [[1.0] * 6 + [True]]):  # numbers only: no strings, no booleans
        refused = client.post("/forecast", json={"rows": wrong})
        assert refused.status_code == 422 and refused.json()["errors"][0]["loc"][:4] == ["body", "rows", 0, 6]
    ragged = client.post("/forecast", json={"rows": [[1.0] * 7, [1.0] * 6]})
    assert ragged.status_code == 422 and "row 1 has 6 values" in ragged.json()["detail"]
    assert client.post("/forecast", json={"rows": []}).status_code == 422


def test_unknown_model_is_404(client):
    response = client.post("/forecast", json={"rows": [[0.0] * 7], "model": "nope"})
    assert response.status_code == 404 and "no model named 'nope'" in response.json()["detail"]
    assert client.post("/forecast", json={"rows": [[0.0] * 7], "model": "rsa-tiny:7"}).status_code == 404


def _open(client, **body):
    response = client.post("/sessions", json=body or {"task": "forecast"})
    assert response.status_code == 201, response.text
    return response.json()


def test_stream_equals_whole_for_forecasts(client):
    rng = np.random.default_rng()
    rows = series(rng, 120)
    whole = client.post("/forecast", json={"rows": rows}).json()["forecast"]
    session = _open(client)
    for seq, piece in enumerate(random_pieces(rows, rng, 25), start=1):
        response = client.post(f"/sessions/{session['id']}/segments", json={"seq": seq, "rows": piece})
        assert response.status_code == 200, response.text
    final = client.post(f"/sessions/{session['id']}/finish").json()
    np.testing.assert_allclose(final["forecast"], whole, atol=1e-5)
    status = client.get(f"/sessions/{session['id']}").json()
    assert status["consumed"] == 120 and status["status"] == "finished"
    assert status["state_bytes"] < 4 * LOOKBACK * len(VARIABLES) + 512  # bounded by the look-back


def test_two_replicas_sharing_redis_continue_each_others_sessions(repository, redis_url, key_prefix):
    rng = np.random.default_rng()
    rows = series(rng, 90)
    pieces = random_pieces(rows, rng, 20)
    with make_client(repository[0], redis_url, key_prefix) as first, \
            make_client(repository[0], redis_url, key_prefix) as second:
        assert first.app is not second.app
        session = _open(first)
        for seq, piece in enumerate(pieces, start=1):
            replica = first if seq % 2 else second
            response = replica.post(f"/sessions/{session['id']}/segments", json={"seq": seq, "rows": piece})
            assert response.status_code == 200, response.text
        alternated = second.post(f"/sessions/{session['id']}/finish").json()["forecast"]
        single = _open(first)
        for seq, piece in enumerate(pieces, start=1):
            first.post(f"/sessions/{single['id']}/segments", json={"seq": seq, "rows": piece})
        alone = first.post(f"/sessions/{single['id']}/finish").json()["forecast"]
    np.testing.assert_allclose(alternated, alone, atol=1e-6)


def test_each_seq_is_applied_exactly_once(client):
    rows = series(np.random.default_rng(), 40)
    session = _open(client)
    url = f"/sessions/{session['id']}/segments"
    first = client.post(url, json={"seq": 1, "rows": rows[:10]})
    assert first.json()["replayed"] is False
    retry = client.post(url, json={"seq": 1, "rows": rows[:10]})
    assert retry.status_code == 200 and retry.json()["replayed"] is True
    assert retry.json()["result"] == first.json()["result"]
    assert retry.json()["session"]["consumed"] == 10  # not applied twice
    gap = client.post(url, json={"seq": 3, "rows": rows[10:20]})
    assert gap.status_code == 409 and gap.json()["expected_seq"] == 2
    different = client.post(url, json={"seq": 1, "rows": rows[10:20]})
    assert different.status_code == 409 and different.json()["expected_seq"] == 2
    client.post(url, json={"seq": 2, "rows": rows[10:20]})
    stale = client.post(url, json={"seq": 1, "rows": rows[:10]})
    assert stale.status_code == 409 and "stale" in stale.json()["detail"]


def test_twenty_concurrent_copies_of_one_seq_apply_it_once(client):
    rows = series(np.random.default_rng(), 12)
    session = _open(client)
    url = f"/sessions/{session['id']}/segments"
    with ThreadPoolExecutor(max_workers=20) as pool:
        responses = list(pool.map(lambda _: client.post(url, json={"seq": 1, "rows": rows}), range(20)))
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
    assert sum(not r.json()["replayed"] for r in responses) == 1
    status = client.get(f"/sessions/{session['id']}").json()
    assert status["seq"] == 1 and status["consumed"] == 12 and status["segments"] == 1


def test_session_rules_wrong_piece_kind_and_deletion(client):
    session = _open(client)
    url = f"/sessions/{session['id']}"
    assert client.post(f"{url}/segments", json={"seq": 1, "text": "hello"}).status_code == 422
    both = client.post(f"{url}/segments", json={"seq": 1, "text": "hello", "rows": [[0.0] * 7]})
    assert both.status_code == 422 and both.json()["errors"]  # text or rows, never both
    early = client.post(f"{url}/finish")  # no forecast yet: it says how many rows the look-back needs
    assert early.status_code == 200 and early.json()["forecast"] is None
    assert early.json()["rows_needed"] == LOOKBACK and early.json()["session"]["status"] == "finished"
    assert client.delete(url).status_code == 204
    assert client.get(url).status_code == 404
    assert client.post(f"{url}/segments", json={"seq": 1, "rows": [[0.0] * 7]}).status_code == 404


def test_sessions_belong_to_the_api_key_that_created_them(repository, redis_url, key_prefix):
    with make_client(repository[0], redis_url, key_prefix, api_keys=["alice", "bob"]) as client:
        assert client.post("/sessions", json={"task": "forecast"}).status_code == 401
        alice = {"X-API-Key": "alice"}
        session = client.post("/sessions", json={"task": "forecast"}, headers=alice).json()
        url = f"/sessions/{session['id']}"
        assert client.get(url, headers=alice).status_code == 200
        assert client.get(url, headers={"Authorization": "Bearer bob"}).status_code == 404
        bob_piece = client.post(f"{url}/segments", json={"seq": 1, "rows": [[0.0] * 7]}, headers={"X-API-Key": "bob"})
        assert bob_piece.status_code == 404
        assert client.get(url, headers=alice).json()["seq"] == 0


def test_limits_answer_413_and_429(repository, redis_url, key_prefix):
    with make_client(repository[0], redis_url, key_prefix, max_body_bytes=2048, max_sessions_per_key=2,
                     max_segments_per_session=2, api_keys=["carol"]) as client:
        key = {"X-API-Key": "carol"}
        big = client.post("/forecast", json={"rows": [[1.0] * 7] * 200}, headers=key)
        assert big.status_code == 413 and "2048 bytes" in big.json()["detail"]
        sessions = [client.post("/sessions", json={"task": "forecast"}, headers=key) for _ in range(3)]
        assert [s.status_code for s in sessions] == [201, 201, 429]
        url = f"/sessions/{sessions[0].json()['id']}/segments"
        codes = [client.post(url, json={"seq": s, "rows": [[0.0] * 7]}, headers=key).status_code for s in (1, 2, 3)]
        assert codes == [200, 200, 429]


def test_redis_down_is_503_with_retry_after(repository):
    with make_client(repository[0], "redis://127.0.0.1:1/0", "x", redis_timeout_seconds=0.3) as client:
        response = client.post("/sessions", json={"task": "forecast"})
        assert response.status_code == 503 and response.headers["Retry-After"]
        assert "outcome of this request is unknown" in response.json()["detail"]


def test_metrics_cover_requests_batching_sessions_and_redis(client):
    from prometheus_client.parser import text_string_to_metric_families

    rows = series(np.random.default_rng(), 40)
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda _: client.post("/forecast", json={"rows": rows}), range(16)))
    session = _open(client)
    client.post(f"/sessions/{session['id']}/segments", json={"seq": 1, "rows": rows})
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    expected = {
        "rtserve_requests", "rtserve_request_duration_seconds", "rtserve_batch_queue_seconds", "rtserve_batch_size",
        "rtserve_step_duration_seconds", "rtserve_segments_processed", "rtserve_active_sessions",
        "rtserve_session_state_bytes", "rtserve_redis_operation_duration_seconds",
    }
    assert expected <= set(families), expected - set(families)
    requests = [s for s in families["rtserve_requests"].samples
                if s.labels["route"] == "/forecast" and s.labels["model"] == "rsa-tiny:1"]
    assert sum(s.value for s in requests if s.labels["status"] == "200") >= 16
    step = [s for s in families["rtserve_step_duration_seconds"].samples if s.name.endswith("_count")]
    assert step and step[0].labels["backend"] == "onnx"
    sizes = {s.name: s.value for s in families["rtserve_batch_size"].samples if s.labels.get("model") == "rsa-tiny:1"}
    assert sizes["rtserve_batch_size_sum"] > sizes["rtserve_batch_size_count"], "concurrent requests never batched"
    # no GPU here: the GPU families are absent, not zero
    assert not any(name.startswith("rtserve_gpu_") for name in families)


def _active_sessions(client) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    return {s.labels["model"]: s.value for s in families["rtserve_active_sessions"].samples}


def test_active_sessions_are_counted_in_redis_the_same_on_every_replica(repository, redis_url, key_prefix):
    prefix = f"{key_prefix}-live"  # a namespace of its own: other tests leave sessions open
    rows = series(np.random.default_rng(), 40)
    with make_client(repository[0], redis_url, prefix) as first, \
            make_client(repository[0], redis_url, prefix, session_ttl_seconds=1) as short_lived:
        kept, deleted = _open(first), _open(first)
        first.post(f"/sessions/{kept['id']}/segments", json={"seq": 1, "rows": rows})
        _open(short_lived)  # idles out after 1 s
        assert _active_sessions(first) == _active_sessions(short_lived) == {"rsa-tiny:1": 3.0}
        assert short_lived.post(f"/sessions/{kept['id']}/finish").status_code == 200  # finished on the other one
        assert short_lived.delete(f"/sessions/{deleted['id']}").status_code == 204
        time.sleep(1.2)
        assert _active_sessions(first) == _active_sessions(short_lived) == {"rsa-tiny:1": 0.0}


def test_intra_op_threads_setting_reaches_onnx_runtime(repository):
    from service.runtime.registry import load_model
    from service.settings import Settings

    entry = next(path.parent for path in repository[0].rglob("manifest.json"))
    model = load_model(entry, "onnx", Settings(intra_op_threads=1))
    (runner,) = (batcher.backend for batcher in model.batchers.values())
    assert runner.session.get_session_options().intra_op_num_threads == 1
