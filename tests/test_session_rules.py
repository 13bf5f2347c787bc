"""The rules every session keeps, whatever its task, over HTTP with a real Redis.

Create, pieces applied exactly once by ``seq`` (retries replayed, gaps and stale or changed pieces 409),
finish, delete, ownership by API key, limits, expiry, and replicas sharing one Redis. Shown on the
tiny forecaster, the cheapest model; forecast-specific behaviour is in test_service_forecast.py.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import redis as sync_redis

from tests.service_helpers import make_client, random_pieces
from tests.tiny_checkpoints import VARIABLES


@pytest.fixture(scope="module")
def repository(forecast_repository):
    return forecast_repository


def series(rng, length):
    return (rng.standard_normal((length, len(VARIABLES))) * 3 + 10).round(3).tolist()


def _open(client, **body):
    response = client.post("/sessions", json=body or {"task": "forecast"})
    assert response.status_code == 201, response.text
    return response.json()


def test_any_replica_sharing_redis_continues_a_session_with_the_same_result(repository, redis_url, key_prefix):
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


def test_a_seq_applies_once_a_retry_is_replayed_and_gaps_changed_or_stale_pieces_are_409(client):
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


def test_a_retry_of_a_piece_an_earlier_release_applied_is_replayed(repository, redis_url, key_prefix):
    from service.sessions.digest import json_piece_digest, piece_digest

    rows = series(np.random.default_rng(), 20)
    rows[0][0] = 1e-05  # json writes 1e-05, orjson 1e-5: the two digests differ
    assert json_piece_digest(rows[:10]) != piece_digest(rows[:10])
    with make_client(repository[0], redis_url, key_prefix) as client:
        session = _open(client)
        url = f"/sessions/{session['id']}/segments"
        first = client.post(url, json={"seq": 1, "rows": rows[:10]})
        assert first.status_code == 200 and first.json()["replayed"] is False
        admin = sync_redis.Redis.from_url(redis_url)  # as a replica of an earlier release records the piece
        admin.hset(f"{key_prefix}:{{{session['id']}}}:meta", "piece_sha", json_piece_digest(rows[:10]))
        retry = client.post(url, json={"seq": 1, "rows": rows[:10]})
        assert retry.status_code == 200 and retry.json()["replayed"] is True
        assert retry.json()["result"] == first.json()["result"]
        different = client.post(url, json={"seq": 1, "rows": rows[10:]})
        assert different.status_code == 409


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


def test_finish_twice_gives_the_same_result_and_a_piece_after_finish_is_409(client):
    rows = series(np.random.default_rng(), 40)
    session = _open(client)
    url = f"/sessions/{session['id']}"
    assert client.post(f"{url}/segments", json={"seq": 1, "rows": rows}).status_code == 200
    first = client.post(f"{url}/finish")
    again = client.post(f"{url}/finish")
    assert first.status_code == again.status_code == 200, again.text
    assert again.json()["forecast"] == first.json()["forecast"] and again.json()["session"]["status"] == "finished"
    late = client.post(f"{url}/segments", json={"seq": 2, "rows": rows})
    assert late.status_code == 409 and "is finished" in late.json()["detail"]
    assert client.get(url).json()["seq"] == 1


def test_a_piece_of_the_wrong_kind_is_422_and_a_deleted_session_is_404(client):
    session = _open(client)
    url = f"/sessions/{session['id']}"
    assert client.post(f"{url}/segments", json={"seq": 1, "text": "hello"}).status_code == 422  # rows expected
    both = client.post(f"{url}/segments", json={"seq": 1, "text": "hello", "rows": [[0.0] * 7]})
    assert both.status_code == 422 and both.json()["errors"]  # text or rows, never both
    assert client.get(url).json()["seq"] == 0
    assert client.delete(url).status_code == 204
    assert client.get(url).status_code == 404
    assert client.post(f"{url}/segments", json={"seq": 1, "rows": [[0.0] * 7]}).status_code == 404
    assert client.post(f"{url}/finish").status_code == 404


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


def test_sessions_per_key_and_pieces_per_session_beyond_their_limits_are_429(repository, redis_url, key_prefix):
    with make_client(repository[0], redis_url, key_prefix, max_sessions_per_key=2, max_segments_per_session=2,
                     api_keys=["carol"]) as client:
        key = {"X-API-Key": "carol"}
        sessions = [client.post("/sessions", json={"task": "forecast"}, headers=key) for _ in range(3)]
        assert [s.status_code for s in sessions] == [201, 201, 429]
        url = f"/sessions/{sessions[0].json()['id']}/segments"
        codes = [client.post(url, json={"seq": s, "rows": [[0.0] * 7]}, headers=key).status_code for s in (1, 2, 3)]
        assert codes == [200, 200, 429]


def test_finishing_or_deleting_a_session_frees_its_place_in_the_quota(repository, redis_url, key_prefix):
    admin = sync_redis.Redis.from_url(redis_url)
    with make_client(repository[0], redis_url, key_prefix, max_sessions_per_key=2, api_keys=["dana"]) as client:
        key = {"X-API-Key": "dana"}
        first, second = (client.post("/sessions", json={"task": "forecast"}, headers=key).json() for _ in range(2))
        full = client.post("/sessions", json={"task": "forecast"}, headers=key)
        assert full.status_code == 429 and int(full.headers["retry-after"]) > 0
        assert "finished" in full.json()["detail"] and "deleted" in full.json()["detail"]
        rows = series(np.random.default_rng(), 40)
        url = f"/sessions/{first['id']}"
        assert client.post(f"{url}/segments", json={"seq": 1, "rows": rows}, headers=key).status_code == 200
        finished = client.post(f"{url}/finish", headers=key).json()
        third = client.post("/sessions", json={"task": "forecast"}, headers=key)
        assert third.status_code == 201, third.text  # the finished one no longer counts
        assert client.delete(f"/sessions/{second['id']}", headers=key).status_code == 204
        assert client.post("/sessions", json={"task": "forecast"}, headers=key).status_code == 201
        assert client.post("/sessions", json={"task": "forecast"}, headers=key).status_code == 429
        # a finished session keeps only what it answers again: its state is gone, its answers replay
        assert not admin.exists(f"{key_prefix}:{{{first['id']}}}:state", f"{key_prefix}:{{{first['id']}}}:chunks")
        assert finished["session"]["state_bytes"] == 0
        again = client.post(f"{url}/finish", headers=key).json()
        assert again["forecast"] == finished["forecast"]
        replayed = client.post(f"{url}/segments", json={"seq": 1, "rows": rows}, headers=key)
        assert replayed.status_code == 200 and replayed.json()["replayed"] is True
        assert replayed.json()["result"]["forecast"] == finished["forecast"]


def test_creating_a_session_while_redis_is_down_is_503_with_retry_after(repository):
    with make_client(repository[0], "redis://127.0.0.1:1/0", "x", redis_timeout_seconds=0.3) as client:
        response = client.post("/sessions", json={"task": "forecast"})
        assert response.status_code == 503 and response.headers["Retry-After"]
        detail = response.json()["detail"]
        assert "outcome of this request is unknown" in detail and "retry the create" in detail
        assert "seq" not in detail  # a create has none


def test_an_idle_session_expires_after_its_ttl_and_leaves_no_keys(repository, redis_url, key_prefix):
    prefix = f"{key_prefix}-expiry"  # a namespace of its own, to count its keys
    admin = sync_redis.Redis.from_url(redis_url)
    with make_client(repository[0], redis_url, prefix, session_ttl_seconds=1) as client:
        session = _open(client)
        url = f"/sessions/{session['id']}"
        piece = client.post(f"{url}/segments", json={"seq": 1, "rows": series(np.random.default_rng(), 8)})
        assert piece.status_code == 200, piece.text
        assert list(admin.scan_iter(match=f"{prefix}:{{{session['id']}}}:*"))  # meta and state are stored
        deadline = time.monotonic() + 5
        while client.get(url).status_code != 404:
            assert time.monotonic() < deadline, "the session outlived its 1 s TTL"
            time.sleep(0.1)
        assert client.post(f"{url}/segments", json={"seq": 2, "rows": [[0.0] * 7]}).status_code == 404
    assert list(admin.scan_iter(match=f"{prefix}:{{{session['id']}}}:*")) == []
    admin.close()


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


def test_a_session_id_never_starts_with_a_dash(monkeypatch):
    # A shell and the CLI read "-QuS1..." as an option: `rtserve session status <id>` would fail on one id in 64.
    from service.sessions import meta
    drawn = iter(["-QuS19uU0VkgxBD", "_x-", "QuS19uU0VkgxBD"])
    monkeypatch.setattr(meta.secrets, "token_urlsafe", lambda nbytes: next(drawn))
    assert meta.new_session_id() == "_x-"
    assert meta.new_session_id() == "QuS19uU0VkgxBD"
