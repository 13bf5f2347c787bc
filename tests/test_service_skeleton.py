from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.app import create_app
from service.fast_path import FastPathAtTheDoor
from service.settings import Settings


def _client(redis_url: str, key_prefix: str) -> TestClient:
    settings = Settings(redis_url=redis_url, redis_key_prefix=key_prefix, model_repository="/nonexistent")
    return TestClient(create_app(settings))


def test_healthz_and_readyz_answer_when_redis_is_reachable(redis_url, key_prefix):
    with _client(redis_url, key_prefix) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["redis"] == "ok"


def test_readyz_is_503_with_the_reason_when_redis_is_down():
    settings = Settings(redis_url="redis://127.0.0.1:1/0", redis_timeout_seconds=0.5)
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").status_code == 200  # alive, just not ready
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.headers["Retry-After"]
        assert "unreachable" in ready.json()["redis"]


def test_metrics_are_prometheus_text_with_rtserve_families(redis_url, key_prefix):
    with _client(redis_url, key_prefix) as client:
        response = client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        names = {family.name for family in text_string_to_metric_families(response.text)}
    assert {"rtserve_requests", "rtserve_request_duration_seconds", "rtserve_batch_size"} <= names


def test_openapi_docs_are_served(redis_url, key_prefix):
    with _client(redis_url, key_prefix) as client:
        assert client.get("/docs").status_code == 200
        schema = client.get("/openapi.json").json()
    assert {"/healthz", "/readyz", "/metrics"} <= set(schema["paths"])


def test_app_without_redis_url_starts_and_stops_its_own_redis(tmp_path):
    settings = Settings(redis_url=None, embedded_redis_dir=tmp_path / "redis")
    app = create_app(settings)
    with TestClient(app) as client:
        assert client.get("/readyz").json()["redis"] == "ok"
        assert app.state.store.url.startswith("unix://")
    assert not (tmp_path / "redis" / "redis.sock").exists()


def test_fastapis_own_opentelemetry_is_skipped_unless_asked_for(redis_url, key_prefix, monkeypatch):
    """Off (the default), no request looks up OpenTelemetry's global providers; on, every request does."""
    from fastapi.telemetry import _asgi

    looked_up: list[object] = []
    unconfigured = _asgi._unconfigured

    def recording(provider):
        looked_up.append(provider)
        return unconfigured(provider)

    monkeypatch.setattr(_asgi, "_unconfigured", recording)
    for opentelemetry in (False, True):
        looked_up.clear()
        settings = Settings(redis_url=redis_url, redis_key_prefix=key_prefix, model_repository="/nonexistent",
                            opentelemetry=opentelemetry)
        app = create_app(settings)
        with TestClient(app) as client:
            assert client.get("/healthz").status_code == 200 and client.get("/metrics").status_code == 200
        assert bool(looked_up) == opentelemetry, (opentelemetry, looked_up)
        # on, a session's pieces go through the router (FastAPI names the route on their spans there), not the door
        at_the_door = any(middleware.cls is FastPathAtTheDoor for middleware in app.user_middleware)
        assert at_the_door != opentelemetry


def test_a_started_app_freezes_what_startup_built_and_spaces_young_collections_out(redis_url, key_prefix):
    import gc

    from service.collector import YOUNG_COLLECTION_THRESHOLD

    before = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, *before[1:])  # CPython's default, as a process starts
    try:
        with _client(redis_url, key_prefix):
            assert gc.get_freeze_count() > 0
            assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, *before[1:])
    finally:
        gc.set_threshold(*before)


def test_every_readiness_door_says_not_ready_when_redis_is_down():
    """/readyz, KServe v2's /v2/health/ready and gRPC's ServerReady give one answer (service/readiness.py)."""
    from tritonclient.grpc import InferenceServerClient

    from loadtest.harness import free_port

    settings = Settings(redis_url="redis://127.0.0.1:1/0", redis_timeout_seconds=0.5, grpc_port=free_port(),
                        model_repository="/nonexistent")
    app = create_app(settings)
    with TestClient(app) as client:
        assert client.get("/readyz").json()["status"] == "unavailable"
        v2 = client.get("/v2/health/ready")
        assert v2.status_code == 503 and v2.headers["Retry-After"]
        assert v2.json()["error"].startswith("session store unavailable: ") and "unreachable" in v2.json()["error"]
        grpc_client = InferenceServerClient(f"127.0.0.1:{app.state.grpc_port}")
        try:
            assert grpc_client.is_server_live() and not grpc_client.is_server_ready()
        finally:
            grpc_client.close()


def test_readiness_names_the_first_thing_that_keeps_a_replica_from_serving():
    from service.readiness import ReplicaReadiness

    ready = ReplicaReadiness("ok", 3, 3, draining=False)
    assert ready.ready and ready.status == "ready" and ready.reason() == ""
    loading = ReplicaReadiness("ok", 2, 3, draining=False)
    assert not loading.ready and loading.status == "unavailable"
    assert loading.reason().startswith("not ready: 2 of 3 models loaded")
    draining = ReplicaReadiness("ok", 3, 3, draining=True)
    assert draining.status == "draining" and draining.reason() == "not ready: shutting down"
    both = ReplicaReadiness("Redis unreachable at redis://x", 3, 3, draining=True)  # Redis first: it decides all
    assert both.status == "draining" and both.reason() == "session store unavailable: Redis unreachable at redis://x"
