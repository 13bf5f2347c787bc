"""The forecast endpoint and forecasting sessions, over HTTP with a real Redis.

The rules every session keeps (seq, replay, finish, delete, ownership, limits, expiry) are in
test_session_rules.py; here, what is particular to forecasting.
"""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from models.serving.servable import build_servable
from tests.service_helpers import make_client, random_pieces
from tests.tiny_checkpoints import VARIABLES

LOOKBACK, HORIZON = 32, 8


@pytest.fixture(scope="module")
def repository(forecast_repository):
    """The shared tiny RSA forecaster: look-back LOOKBACK, horizon HORIZON."""
    return forecast_repository


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


def test_rows_outside_the_models_range_are_422_naming_the_value_and_a_200_never_holds_null(client):
    described = {m["name"]: m for m in client.get("/models").json()}["rsa-tiny"]
    low, high = described["value_range"]["MUFL"]  # the training mean ± 1e12 standard deviations
    assert low < -1e11 and high > 1e11 and described["value_range"].keys() == set(VARIABLES)
    rows = series(np.random.default_rng(), LOOKBACK)
    overflowing = [[3e38] * len(VARIABLES)] * LOOKBACK  # within float32, but not what the model's arithmetic carries
    just_outside = [list(row) for row in rows]
    just_outside[5][2] = high * 1.01
    session = client.post("/sessions", json={"task": "forecast"}).json()["id"]
    for refused in (client.post("/forecast", json={"rows": overflowing}),
                    client.post("/forecast", json={"rows": just_outside}),
                    client.post(f"/sessions/{session}/segments", json={"seq": 1, "rows": just_outside})):
        assert refused.status_code == 422, refused.text
        (error,) = refused.json()["errors"]
        assert error["loc"][:2] == ["body", "rows"] and error["type"] == "value_range"
        assert "outside what this model takes" in refused.json()["detail"] and "value_range" in refused.json()["detail"]
    assert client.post("/forecast", json={"rows": just_outside}).json()["errors"][0]["loc"] == ["body", "rows", 5, 2]
    assert client.get(f"/sessions/{session}").json()["seq"] == 0  # nothing applied
    inside = [list(row) for row in rows]
    inside[5][2] = high * 0.5
    answer = client.post("/forecast", json={"rows": inside})
    assert answer.status_code == 200 and np.isfinite(np.asarray(answer.json()["forecast"], dtype=float)).all()


def test_each_malformed_number_is_a_422_that_names_its_field_and_rule(client):
    json_body = {"content-type": "application/json"}
    number = '[[%s, 1, 1, 1, 1, 1, 1]]'
    for text, rule in (("NaN", "finite number"), ("Infinity", "finite number"), ("1" + "0" * 5000, "finite number"),
                       ("1e39", "float32's range")):
        answer = client.post("/forecast", content=f'{{"rows": {number % text}}}', headers=json_body)
        assert answer.status_code == 422, answer.text
        assert answer.json()["errors"][0]["loc"] == ["body", "rows", 0, 0] and rule in answer.json()["detail"]
    session = client.post("/sessions", json={"task": "forecast"}).json()["id"]
    piece = client.post(f"/sessions/{session}/segments", json={"seq": 1, "rows": [["x", 1, 1, 1, 1, 1, 1]]})
    assert piece.status_code == 422
    assert [e["loc"] for e in piece.json()["errors"]] == [["body", "rows", 0, 0]]  # about rows only, never text
    huge_seq = client.post(f"/sessions/{session}/segments", content='{"seq": 1%s, "rows": [[1, 1, 1, 1, 1, 1, 1]]}'
                           % ("0" * 5000), headers=json_body)
    assert huge_seq.status_code == 422 and huge_seq.json()["errors"][0]["loc"] == ["body", "seq"]
    neither = client.post(f"/sessions/{session}/segments", json={"seq": 1})
    assert neither.status_code == 422 and "`text`" in neither.json()["detail"] and "`rows`" in neither.json()["detail"]


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


def test_a_forecast_session_finished_before_its_look_back_says_how_many_rows_it_needs(client):
    session = _open(client)
    url = f"/sessions/{session['id']}"
    assert client.post(f"{url}/segments", json={"seq": 1, "rows": [[0.0] * 7] * (LOOKBACK - 1)}).status_code == 200
    early = client.post(f"{url}/finish")
    assert early.status_code == 200 and early.json()["forecast"] is None
    assert early.json()["rows_needed"] == 1 and early.json()["session"]["status"] == "finished"


def test_a_forecast_body_over_max_body_bytes_is_413(repository, redis_url, key_prefix):
    with make_client(repository[0], redis_url, key_prefix, max_body_bytes=2048) as client:
        big = client.post("/forecast", json={"rows": [[1.0] * 7] * 200})
        assert big.status_code == 413 and "2048 bytes" in big.json()["detail"]
        assert client.post("/forecast", json={"rows": [[1.0] * 7] * LOOKBACK}).status_code == 200


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


def test_intra_op_threads_setting_reaches_onnx_runtime(repository):
    from service.runtime.registry import load_model
    from service.settings import Settings

    entry = next(path.parent for path in repository[0].rglob("manifest.json"))
    model = load_model(entry, "onnx", Settings(intra_op_threads=1))
    (runner,) = (batcher.backend for batcher in model.batchers.values())
    assert runner.session.get_session_options().intra_op_num_threads == 1


def test_a_lone_piece_of_a_light_graph_runs_on_the_event_loop_and_concurrent_ones_are_batched(repository, redis_url,
                                                                                              key_prefix):
    """The tiny forecaster's step is light (its export measured it; ``intra_op_threads`` 1 in its manifest): a piece
    that is the service's only request runs it on the event loop; concurrent requests still share batches."""
    import threading

    with make_client(repository[0], redis_url, key_prefix) as client:
        model = client.app.state.registry.models["rsa-tiny:1"]
        assert model.manifest["graphs"][0]["intra_op_threads"] == 1
        batcher = model.batchers["step"]
        threads: list[str] = []
        run = batcher.backend.run

        def recording_run(inputs, keep=()):
            threads.append(threading.current_thread().name)
            return run(inputs, keep)

        batcher.backend.run = recording_run
        session = _open(client)
        rows = series(np.random.default_rng(), 40)
        assert client.post(f"/sessions/{session['id']}/segments", json={"seq": 1, "rows": rows}).status_code == 200
        assert len(threads) == 1 and not threads[0].startswith("rsa-tiny:1-step")  # not the worker's thread
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = list(pool.map(lambda _: client.post("/forecast", json={"rows": rows}), range(16)))
        assert all(answer.status_code == 200 for answer in answers)
        assert len(threads) < 17, "concurrent requests each ran alone"
