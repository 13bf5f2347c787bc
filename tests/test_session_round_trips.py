"""An applied piece costs two round trips to Redis, a retry one, counted on the real connection."""

import numpy as np
import pytest
from redis.asyncio.connection import AbstractConnection

from tests.tiny_checkpoints import VARIABLES


@pytest.fixture(scope="module")
def repository(forecast_repository):
    return forecast_repository


@pytest.fixture
def round_trips(monkeypatch):
    """Counts every write of a request (one command, or one whole pipeline) to any Redis connection."""
    sent = {"count": 0}
    original = AbstractConnection.send_packed_command

    async def counting(self, command, check_health=True):
        sent["count"] += 1
        return await original(self, command, check_health)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
    return sent


def rows(n):
    return (np.random.default_rng().standard_normal((n, len(VARIABLES))) * 3 + 10).round(3).tolist()


def test_an_applied_piece_costs_two_round_trips_and_a_retry_one(client, round_trips):
    session = client.post("/sessions", json={"task": "forecast"}).json()
    url = f"/sessions/{session['id']}/segments"
    assert client.post(url, json={"seq": 1, "rows": rows(10)}).status_code == 200  # scripts loaded by now
    for seq in range(2, 6):
        piece = rows(7)
        round_trips["count"] = 0
        applied = client.post(url, json={"seq": seq, "rows": piece})
        assert applied.status_code == 200 and not applied.json()["replayed"]
        assert round_trips["count"] == 2, f"piece {seq}: {round_trips['count']} round trips"
        round_trips["count"] = 0
        retry = client.post(url, json={"seq": seq, "rows": piece})
        assert retry.status_code == 200 and retry.json()["replayed"]
        assert retry.json()["result"] == applied.json()["result"]  # the stored result, to the last digit
        assert round_trips["count"] == 1
    status = client.get(f"/sessions/{session['id']}").json()
    assert status["seq"] == 5 and status["consumed"] == 10 + 4 * 7


def test_a_piece_still_applies_after_redis_forgets_its_scripts(client):
    import redis as sync_redis

    session = client.post("/sessions", json={"task": "forecast"}).json()
    url = f"/sessions/{session['id']}/segments"
    assert client.post(url, json={"seq": 1, "rows": rows(5)}).status_code == 200
    settings = client.app.state.settings
    sync_redis.Redis.from_url(settings.redis_url).script_flush()  # as after a Redis restart
    response = client.post(url, json={"seq": 2, "rows": rows(5)})
    assert response.status_code == 200 and response.json()["session"]["seq"] == 2


def test_the_stored_result_is_read_only_for_a_retry(client, monkeypatch):
    """The begin script sends the last result back only when the piece is the last applied one."""
    from service.sessions import SessionStore

    results_read = []
    original = SessionStore.begin

    async def recording(self, session_id, owner, seq):
        reply = await original(self, session_id, owner, seq)
        results_read.append(reply[2])
        return reply

    monkeypatch.setattr(SessionStore, "begin", recording)
    session = client.post("/sessions", json={"task": "forecast"}).json()
    url = f"/sessions/{session['id']}/segments"
    lookback = client.app.state.registry.models[session["model"]].pipeline.lookback
    first = client.post(url, json={"seq": 1, "rows": rows(lookback)}).json()
    piece = rows(3)
    applied = client.post(url, json={"seq": 2, "rows": piece}).json()
    assert first["result"]["forecast"] is not None  # a stored result worth not reading
    assert results_read == [None, None]  # pieces 1 and 2: the next piece each time
    replayed = client.post(url, json={"seq": 2, "rows": piece}).json()
    assert replayed["replayed"] and results_read[2] == applied["result"] == replayed["result"]
