"""Sessions on a real Redis Cluster (six redis-server processes on loopback), failover included.

Every Lua script the service runs must touch the keys of one hash slot: the cluster client refuses a
script whose keys span slots (``EVALSHA - all keys must map to the same key slot``), so streaming sessions
through the whole API here shows it. The failover tests kill a primary (SIGKILL) while sessions are
open; the replica is promoted by the cluster itself (node timeout 1 s).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.sessions import LIVE_INDEX_SHARDS
from tests.redis_cluster import LocalRedisCluster
from tests.service_helpers import make_client, random_pieces
from tests.tiny_checkpoints import VARIABLES

LOOKBACK, HORIZON = 32, 8
PREFIX = "rtserve-cluster-test"


@pytest.fixture(scope="module")
def repository(forecast_repository):
    return forecast_repository  # rsa-tiny: look-back LOOKBACK, horizon HORIZON (tests/tiny_checkpoints.py)


@pytest.fixture
def cluster():
    with LocalRedisCluster() as local:
        yield local


def cluster_client(repository, cluster, **overrides):
    return make_client(repository[0], cluster.url, PREFIX, redis_cluster=True, **overrides)


def series(rng, length):
    return (rng.standard_normal((length, len(VARIABLES))) * 3 + 10).round(3).tolist()


def active_sessions(client) -> float:
    families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
    return sum(sample.value for sample in families["rtserve_active_sessions"].samples)


def send(client, session_id, pieces, seq, deadline_s=30.0):
    """Send piece ``seq`` the way a client should: retry on 503; on 409 ask the session where it stands.

    Returns the next seq to send (seq + 1, or an earlier one when the session lost pieces) and the answer.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        response = client.post(f"/sessions/{session_id}/segments", json={"seq": seq, "rows": pieces[seq - 1]})
        if response.status_code == 200:
            return seq + 1, response
        if response.status_code == 409:  # a gap: the session's newest pieces were lost with a primary
            status = client.get(f"/sessions/{session_id}")
            if status.status_code == 200:
                return status.json()["seq"] + 1, response
        assert response.status_code in (409, 503), response.text
        assert time.monotonic() < deadline, f"piece {seq} still refused: {response.text}"
        time.sleep(0.1)


def test_sessions_stream_on_a_redis_cluster_as_on_one_server(repository, cluster):
    rng = np.random.default_rng()
    with cluster_client(repository, cluster, max_sessions_per_key=6) as client:
        assert client.get("/readyz").json()["status"] == "ready"
        documents = [series(rng, 90) for _ in range(6)]
        sessions = [client.post("/sessions", json={"task": "forecast"}).json()["id"] for _ in documents]
        # the six sessions live on more than one primary: the test exercises several slots and nodes. Their ids are
        # random, so now and then (3 draws in 729 with three primaries) all six land on one: one is drawn again
        for _ in range(20):
            homes = {cluster.primary_of(f"{PREFIX}:{{{session_id}}}:meta") for session_id in sessions}
            if len(homes) >= 2:
                break
            assert client.delete(f"/sessions/{sessions.pop()}").status_code == 204
            sessions.append(client.post("/sessions", json={"task": "forecast"}).json()["id"])
        assert len(homes) >= 2
        limited = client.post("/sessions", json={"task": "forecast"})
        assert limited.status_code == 429  # the quota index (one key, one slot) counts across nodes
        assert active_sessions(client) == 6  # the sum over the live index's shards
        pieces = [random_pieces(rows, rng, 25) for rows in documents]
        for session_id, session_pieces in zip(sessions, pieces, strict=True):
            for seq in range(1, len(session_pieces) + 1):
                applied = client.post(f"/sessions/{session_id}/segments",
                                      json={"seq": seq, "rows": session_pieces[seq - 1]})
                assert applied.status_code == 200, applied.text
            retry = client.post(f"/sessions/{session_id}/segments", json={"seq": seq, "rows": session_pieces[-1]})
            assert retry.status_code == 200 and retry.json()["replayed"]
        for session_id, rows in zip(sessions[:3], documents, strict=False):
            whole = client.post("/forecast", json={"rows": rows}).json()["forecast"]
            final = client.post(f"/sessions/{session_id}/finish")
            assert final.status_code == 200, final.text
            np.testing.assert_allclose(final.json()["forecast"], whole, atol=1e-5)
        assert active_sessions(client) == 3  # finished sessions leave the live index
        for session_id in sessions[3:]:
            assert client.delete(f"/sessions/{session_id}").status_code == 204
            assert client.get(f"/sessions/{session_id}").status_code == 404
        assert active_sessions(client) == 0
        assert client.post("/sessions", json={"task": "forecast"}).status_code == 201  # quota freed by deletes
    live_keys = [key for port in cluster.live_ports() if cluster.role(port) == "master"
                 for key in cluster.client(port).scan_iter(match=f"{PREFIX}:live:*")]
    assert {key.decode().rsplit(":", 1)[1] for key in live_keys} <= {str(n) for n in range(LIVE_INDEX_SHARDS)}


def test_sessions_continue_when_a_primary_is_killed(repository, cluster):
    """SIGKILL the primary of a session mid-stream: the replica takes over and every session goes on."""
    rng = np.random.default_rng()
    with cluster_client(repository, cluster) as client:
        documents = [series(rng, 100) for _ in range(4)]
        pieces = [random_pieces(rows, rng, 12) for rows in documents]
        sessions = [client.post("/sessions", json={"task": "forecast"}).json()["id"] for _ in documents]
        next_seq = [1] * len(sessions)
        for i, session_id in enumerate(sessions):  # half of each document before the failure
            while next_seq[i] <= len(pieces[i]) // 2:
                next_seq[i], _ = send(client, session_id, pieces[i], next_seq[i])
        victim = cluster.primary_of(f"{PREFIX}:{{{sessions[0]}}}:meta")
        replica = cluster.replica_of(victim)
        cluster.kill(victim)
        for i, session_id in enumerate(sessions):  # the rest, while the cluster fails over
            while next_seq[i] <= len(pieces[i]):
                next_seq[i], _ = send(client, session_id, pieces[i], next_seq[i])
        assert cluster.wait_until_serving(f"{PREFIX}:{{{sessions[0]}}}:meta") == replica  # promoted
        for session_id, rows in zip(sessions, documents, strict=True):
            whole = client.post("/forecast", json={"rows": rows}).json()["forecast"]
            final = client.post(f"/sessions/{session_id}/finish")
            assert final.status_code == 200, final.text
            np.testing.assert_allclose(final.json()["forecast"], whole, atol=1e-5)
        assert client.get("/readyz").json()["status"] == "ready"


def test_a_failover_loses_the_pieces_the_replica_had_not_received(repository, cluster):
    """Replication is asynchronous: a piece acknowledged by a primary that dies before its replica got it
    is lost. The session rolls back to the replica's copy; the client sees a 409 gap and resends."""
    rng = np.random.default_rng()
    rows = series(rng, 80)
    pieces = random_pieces(rows, rng, 10)
    with cluster_client(repository, cluster) as client:
        session_id = client.post("/sessions", json={"task": "forecast"}).json()["id"]
        for seq in (1, 2, 3):
            assert send(client, session_id, pieces, seq)[0] == seq + 1
        key = f"{PREFIX}:{{{session_id}}}:meta"
        victim = cluster.primary_of(key)
        replica = cluster.replica_of(victim)
        assert cluster.client(victim).execute_command("WAIT", 1, 2000) == 1  # pieces 1-3 are on the replica
        # Cut the replication link while the replica cannot reconnect: what the primary acknowledges now
        # exists on the primary alone (as when the link or the replica lags behind).
        cluster.pause(replica)
        try:
            cluster.client(victim).execute_command("CLIENT", "KILL", "TYPE", "replica")
            acknowledged = client.post(f"/sessions/{session_id}/segments", json={"seq": 4, "rows": pieces[3]})
            assert acknowledged.status_code == 200 and acknowledged.json()["session"]["seq"] == 4
            cluster.kill(victim)
        finally:
            cluster.resume(replica)
        assert cluster.wait_until_serving(key) == replica
        deadline = time.monotonic() + 30
        while (status := client.get(f"/sessions/{session_id}")).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status.status_code == 200 and status.json()["seq"] == 3  # piece 4 was lost with the primary
        seq, answer = send(client, session_id, pieces, 5)  # the client goes on, is told of the gap ...
        assert answer.status_code == 409 and seq == 4
        while seq <= len(pieces):  # ... and resends from piece 4
            seq, _ = send(client, session_id, pieces, seq)
        whole = client.post("/forecast", json={"rows": rows}).json()["forecast"]
        final = client.post(f"/sessions/{session_id}/finish").json()
        np.testing.assert_allclose(final["forecast"], whole, atol=1e-5)


def test_a_piece_on_a_cluster_costs_one_request_where_its_state_is_kept_and_two_steps_elsewhere(repository, cluster,
                                                                                                monkeypatch):
    """Kept state (this replica applied the last piece): the commit only, one request to the session's node (its
    index entries were moved less than a minute ago). Elsewhere: begin, one request to the session's node; then the
    commit plus the two index updates, one request per node that holds them (1 to 3), sent in parallel. A retry:
    one request."""
    from redis.asyncio.connection import AbstractConnection

    sent: list[int] = []
    original = AbstractConnection.send_packed_command

    async def counting(self, command, check_health=True):
        sent.append(self.port)
        return await original(self, command, check_health)

    rng = np.random.default_rng()
    with cluster_client(repository, cluster) as client:
        session_id = client.post("/sessions", json={"task": "forecast"}).json()["id"]
        rows = series(rng, 60)
        pieces = random_pieces(rows, rng, 10)
        assert send(client, session_id, pieces, 1)[0] == 2
        retry = client.post(f"/sessions/{session_id}/segments", json={"seq": 1, "rows": pieces[0]})
        assert retry.json()["replayed"]  # both scripts loaded, connections open
        monkeypatch.setattr(AbstractConnection, "send_packed_command", counting)
        home = cluster.primary_of(f"{PREFIX}:{{{session_id}}}:meta")
        for seq in range(2, len(pieces) + 1):
            elsewhere = seq % 2 == 0
            if elsewhere:  # as on a replica that did not apply the last piece
                client.app.state.flow.cache.drop(session_id)
            sent.clear()
            applied = client.post(f"/sessions/{session_id}/segments", json={"seq": seq, "rows": pieces[seq - 1]})
            assert applied.status_code == 200 and not applied.json()["replayed"]
            if elsewhere:  # the begin, then the commit's pipeline: one request per node, in no fixed order
                assert sent[0] == home and home in sent[1:] and 2 <= len(sent) <= 4, sent
                assert len(set(sent[1:])) == len(sent) - 1, sent
            else:
                assert sent == [home], sent
            sent.clear()
            retry = client.post(f"/sessions/{session_id}/segments", json={"seq": seq, "rows": pieces[seq - 1]})
            assert retry.status_code == 200 and retry.json()["replayed"] and sent == [home]


async def test_the_lock_keeper_renews_locks_of_every_slot_in_one_pipeline(cluster):
    """On a cluster each lock is its own script call (the locks of different sessions live in different slots),
    all of them in one pipeline sent to every node that holds one."""
    from service.metrics import ServiceMetrics
    from service.sessions import SessionStore
    from service.settings import Settings
    from service.state_store import StateStore

    store = StateStore.from_url(cluster.url, prefix=PREFIX, cluster=True)
    sessions = SessionStore(store, Settings(session_lock_seconds=5), ServiceMetrics(collect_gpu=False))
    held = [(f"s{i}", f"token{i}") for i in range(12)]
    for session_id, token in held[1:]:
        await store.client.set(sessions._keys(session_id)["lock"], token, px=1000)
    assert len({cluster.primary_of(sessions._keys(session_id)["lock"]) for session_id, _ in held}) > 1
    assert await sessions.leases.renew(held) == [False] + [True] * 11
    assert 4000 < await store.client.pttl(sessions._keys("s5")["lock"]) <= 5000
    await store.close()
