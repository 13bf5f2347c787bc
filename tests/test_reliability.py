"""Reliability and security of one replica, in process, over a real Redis.

Each test names a failure a service like this can have and shows it cannot happen here: a quota that holds under
parallel creates, a 503 that tells the truth, no 500 for any header or text, 413 for any oversize body,
a lock left by a dead replica that stalls nobody, Redis out of memory answered 503.
"""

import json
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import redis as sync_redis
from redis.asyncio.connection import AbstractConnection

from service.embedded_redis import EmbeddedRedis
from tests.service_helpers import make_client
from tests.tiny_checkpoints import VARIABLES


@pytest.fixture(scope="module")
def repository(forecast_repository):
    return forecast_repository


def rows(n):
    return (np.random.default_rng().standard_normal((n, len(VARIABLES))) * 3 + 10).round(3).tolist()


class ClientFromHeader:
    """Sets the ASGI client address from an `x-test-client` header, to play several clients in one process."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            address = dict(scope["headers"]).get(b"x-test-client")
            if address:
                scope = dict(scope, client=(address.decode(), 4000))
        await self.app(scope, receive, send)


def test_the_session_quota_is_exact_under_100_parallel_creates(repository, redis_url, key_prefix):
    with make_client(repository[0], redis_url, f"{key_prefix}-quota", max_sessions_per_key=5,
                     api_keys=["k-quota"]) as client:
        headers = {"X-API-Key": "k-quota"}
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(lambda _: client.post("/sessions", json={"task": "forecast"}, headers=headers),
                                    range(100)))
        statuses = sorted(a.status_code for a in answers)
        assert statuses.count(201) == 5 and statuses.count(429) == 95, statuses
        # deleting one frees exactly one place
        created = next(a.json()["id"] for a in answers if a.status_code == 201)
        assert client.delete(f"/sessions/{created}", headers=headers).status_code == 204
        assert client.post("/sessions", json={"task": "forecast"}, headers=headers).status_code == 201
        assert client.post("/sessions", json={"task": "forecast"}, headers=headers).status_code == 429


def test_without_api_keys_the_quota_is_per_client_address(repository, redis_url, key_prefix):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    settings = Settings(model_repository=repository[0], redis_url=redis_url,
                        redis_key_prefix=f"{key_prefix}-anon", max_sessions_per_key=3)
    with TestClient(ClientFromHeader(create_app(settings))) as client:
        greedy = [client.post("/sessions", json={"task": "forecast"}, headers={"x-test-client": "10.0.0.1"})
                  for _ in range(4)]
        assert [a.status_code for a in greedy] == [201, 201, 201, 429]
        other = client.post("/sessions", json={"task": "forecast"}, headers={"x-test-client": "10.0.0.2"})
        assert other.status_code == 201, other.text  # one client cannot lock the others out
        # sessions stay visible to any client without keys (no authentication is configured)
        seen = client.get(f"/sessions/{greedy[0].json()['id']}", headers={"x-test-client": "10.0.0.2"})
        assert seen.status_code == 200


def test_a_non_ascii_api_key_is_401_not_500(repository, redis_url, key_prefix):
    with make_client(repository[0], redis_url, key_prefix, api_keys=["k-ascii", "clé"]) as client:
        for value in ("clé".encode(), b"\xff\xfe", "ключ".encode()):
            answer = client.get("/models", headers={"X-API-Key": value})
            assert answer.status_code == 401, answer.text
            bearer = client.get("/models", headers={"Authorization": b"Bearer " + value})
            assert bearer.status_code == 401, bearer.text
        assert client.get("/models", headers={"X-API-Key": "k-ascii"}).status_code == 200


def test_a_lone_surrogate_in_text_is_422_saying_where_and_in_any_field_never_500(repository, redis_url, key_prefix):
    json_body = {"content-type": "application/json"}
    with make_client(repository[0], redis_url, key_prefix) as client:
        session = client.post("/sessions", json={"task": "forecast"}).json()  # text is checked before the model
        for url, body in [("/summarize", b'{"text": "abc \\ud83d def"}'),
                          ("/summarize", b'{"text": "abc \\ud83d def", "stream": true}'),
                          (f"/sessions/{session['id']}/segments", b'{"seq": 1, "text": "half a pair \\ud83d"}')]:
            answer = client.post(url, content=body, headers=json_body)
            assert answer.status_code == 422, answer.text
            assert "surrogate (U+D83D) at character" in answer.json()["detail"]
        assert "character 4" in client.post("/summarize", content=b'{"text": "abc \\ud83d"}',
                                            headers=json_body).json()["detail"]
        assert client.get(f"/sessions/{session['id']}").json()["seq"] == 0  # nothing was applied
        # a surrogate anywhere else is quoted back in an ASCII-escaped error, never a 500
        for url, body in [("/summarize", b'{"text": "ok", "model": "x\\udc00"}'),
                          ("/forecast", b'{"rows": [[1.0]], "model": "\\ud800"}'),
                          ("/sessions", b'{"task": "\\ud800"}'),
                          (f"/sessions/{session['id']}/segments", b'{"seq": "\\ud800"}'),
                          ("/sessions/%ED%A0%80/finish", b"{}")]:
            answer = client.post(url, content=body, headers=json_body)
            assert answer.status_code in (404, 422), (url, answer.status_code, answer.text)
            assert answer.json()["detail"]


def test_an_oversize_chunked_body_is_413(repository, redis_url, key_prefix):
    with make_client(repository[0], redis_url, key_prefix, max_body_bytes=4096) as client:
        def chunks():
            yield b'{"text": "'
            for _ in range(10):
                yield b"x" * 1000
            yield b'"}'

        answer = client.post("/summarize", content=chunks(), headers={"content-type": "application/json"})
        assert answer.status_code == 413, answer.text
        assert "4096 bytes" in answer.json()["detail"]
        small = client.post("/forecast", content=iter([b'{"rows": ', json.dumps(rows(40)).encode(), b"}"]),
                            headers={"content-type": "application/json"})
        assert small.status_code == 200, small.text  # a chunked body under the limit still reads whole


def test_a_lock_left_by_a_dead_replica_stalls_its_session_under_two_seconds(repository, redis_url, key_prefix):
    with make_client(repository[0], redis_url, key_prefix) as client:
        session = client.post("/sessions", json={"task": "forecast"}).json()
        url = f"/sessions/{session['id']}/segments"
        assert client.post(url, json={"seq": 1, "rows": rows(8)}).status_code == 200
        # a replica takes the lock for piece 2 the way it does before its step, then dies (never commits); this
        # replica no longer keeps the session's state (it restarted, or dropped it), so it reads the session
        sessions = client.app.state.flow.sessions
        dead_token = client.portal.call(sessions.begin, session["id"], "anonymous", 2).token
        assert dead_token is not None
        client.app.state.flow.cache.drop(session["id"])
        commands = {"count": 0}
        original = AbstractConnection.send_packed_command

        async def counting(self, command, check_health=True):
            commands["count"] += 1
            return await original(self, command, check_health)

        AbstractConnection.send_packed_command = counting
        try:
            started = time.monotonic()
            answer = client.post(url, json={"seq": 2, "rows": rows(8)})
            waited = time.monotonic() - started
        finally:
            AbstractConnection.send_packed_command = original
        assert answer.status_code == 200 and answer.json()["session"]["seq"] == 2, answer.text
        assert waited < 2.0, f"the session stalled {waited:.1f} s behind a dead replica's lock"
        assert commands["count"] < 40, f"{commands['count']} Redis commands while waiting"


@pytest.mark.parametrize("kept", [False, True], ids=["read-first", "kept-heavy-step"])
def test_the_lock_is_refreshed_while_a_long_step_runs(repository, redis_url, key_prefix, kept, monkeypatch):
    """A step longer than the lease keeps its lock: a second replica waits instead of computing it twice. The
    piece takes the lock whether it reads the session first or is computed from a kept state (a step that is not
    light: a light one takes no lock)."""
    import asyncio

    from service.runtime.registry import LoadedModel

    monkeypatch.setattr(LoadedModel, "light", property(lambda self: False))
    with make_client(repository[0], redis_url, key_prefix) as a, make_client(repository[0], redis_url,
                                                                             key_prefix) as b:
        session = a.post("/sessions", json={"task": "forecast"}).json()
        if not kept:
            a.app.state.flow.cache.drop(session["id"])
        url = f"/sessions/{session['id']}/segments"
        pipeline = a.app.state.registry.resolve("rsa-tiny", "forecast").pipeline
        original, steps = pipeline.consume, {"count": 0}

        async def slow_consume(state, piece):
            steps["count"] += 1
            await asyncio.sleep(a.app.state.settings.session_lock_seconds * 2.5)
            return await original(state, piece)

        pipeline.consume = slow_consume
        piece = rows(8)
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(a.post, url, json={"seq": 1, "rows": piece})
            time.sleep(0.3)
            second = b.post(url, json={"seq": 1, "rows": piece})
            assert first.result().status_code == 200 and not first.result().json()["replayed"]
        assert second.status_code == 200 and second.json()["replayed"], second.text
        assert steps["count"] == 1


def test_redis_out_of_memory_is_503_with_retry_after_and_not_ready(repository, key_prefix):
    with EmbeddedRedis() as server, make_client(repository[0], server.url, key_prefix) as client:
        session = client.post("/sessions", json={"task": "forecast"}).json()
        url = f"/sessions/{session['id']}/segments"
        assert client.post(url, json={"seq": 1, "rows": rows(8)}).status_code == 200
        admin = sync_redis.Redis.from_url(server.url)
        admin.config_set("maxmemory", 1)  # every write is refused: OOM command not allowed
        try:
            for answer in (client.post("/sessions", json={"task": "forecast"}),
                           client.post(url, json={"seq": 2, "rows": rows(8)}),
                           client.post(f"/sessions/{session['id']}/finish")):
                assert answer.status_code == 503, answer.text
                assert answer.headers["retry-after"] and "out of memory" in answer.json()["detail"]
            ready = client.get("/readyz")
            assert ready.status_code == 503 and "out of memory" in ready.json()["redis"]
        finally:
            admin.config_set("maxmemory", 0)
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["models_loaded"] == ready.json()["models_expected"] > 0
        assert client.get(f"/sessions/{session['id']}").json()["seq"] == 1  # nothing half-written
        assert client.post(url, json={"seq": 2, "rows": rows(8)}).status_code == 200
        admin.close()


def test_readyz_warns_when_redis_may_evict_sessions(repository, key_prefix):
    with EmbeddedRedis() as server, make_client(repository[0], server.url, key_prefix) as client:
        admin = sync_redis.Redis.from_url(server.url)
        admin.config_set("maxmemory-policy", "volatile-ttl")
        ready = client.get("/readyz")
        assert ready.status_code == 200 and "noeviction" in " ".join(ready.json()["warnings"])
        admin.config_set("maxmemory-policy", "noeviction")
        assert client.get("/readyz").json()["warnings"] == []
        admin.close()


def test_a_503_never_claims_nothing_was_changed(repository, key_prefix):
    with EmbeddedRedis() as server, make_client(repository[0], server.url, key_prefix) as client:
        session = client.post("/sessions", json={"task": "forecast"}).json()
        server.stop()
        answer = client.post(f"/sessions/{session['id']}/segments", json={"seq": 1, "rows": rows(8)})
        assert answer.status_code == 503 and answer.headers["retry-after"]
        detail = answer.json()["detail"]
        assert "nothing was changed" not in detail and "same seq" in detail, detail
