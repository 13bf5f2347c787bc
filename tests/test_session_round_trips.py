"""A piece of a session this replica applied the last piece of costs one round trip to Redis (its commit), any
other piece two (its read, its commit), a retry one, a create one, a finish two and a delete two, counted on the
real connection (one Redis server)."""

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


def test_a_piece_costs_one_round_trip_where_its_state_is_kept_two_elsewhere_and_a_retry_one(client, round_trips):
    session = client.post("/sessions", json={"task": "forecast"}).json()
    url = f"/sessions/{session['id']}/segments"
    first = rows(10)
    assert client.post(url, json={"seq": 1, "rows": first}).status_code == 200
    assert client.post(url, json={"seq": 1, "rows": first}).json()["replayed"]  # both scripts loaded by now
    for seq in range(2, 6):
        piece = rows(7)
        if seq == 4:  # as on a replica that did not apply the last piece: the session is read first
            client.app.state.flow.cache.drop(session["id"])
        round_trips["count"] = 0
        applied = client.post(url, json={"seq": seq, "rows": piece})
        assert applied.status_code == 200 and not applied.json()["replayed"]
        expected = 2 if seq == 4 else 1
        assert round_trips["count"] == expected, f"piece {seq}: {round_trips['count']} round trips"
        round_trips["count"] = 0
        retry = client.post(url, json={"seq": seq, "rows": piece})
        assert retry.status_code == 200 and retry.json()["replayed"]
        assert retry.json()["result"] == applied.json()["result"]  # the stored result, to the last digit
        assert round_trips["count"] == 1
    status = client.get(f"/sessions/{session['id']}").json()
    assert status["seq"] == 5 and status["consumed"] == 10 + 4 * 7


def test_replicas_taking_turns_apply_every_piece_once_from_the_current_state(repository, redis_url, key_prefix):
    """Two replicas take a session's pieces in turns: each keeps the state of the pieces it applied, which the other
    moved past; the commit refuses the stale state, the piece is computed again from the session read back, and the
    results are those of one replica applying every piece."""
    from tests.service_helpers import make_client

    pieces = [rows(9) for _ in range(6)]
    with make_client(repository[0], redis_url, key_prefix) as a, make_client(repository[0], redis_url,
                                                                             key_prefix) as b:
        alone = a.post("/sessions", json={"task": "forecast"}).json()["id"]
        expected = [a.post(f"/sessions/{alone}/segments", json={"seq": seq, "rows": piece}).json()["result"]
                    for seq, piece in enumerate(pieces, start=1)]
        shared = a.post("/sessions", json={"task": "forecast"}).json()["id"]
        for seq, piece in enumerate(pieces, start=1):
            replica = (a, a, b, a, b, b)[seq - 1]
            answer = replica.post(f"/sessions/{shared}/segments", json={"seq": seq, "rows": piece})
            assert answer.status_code == 200 and not answer.json()["replayed"], answer.text
            assert answer.json()["result"] == expected[seq - 1]
        assert a.get(f"/sessions/{shared}").json()["seq"] == len(pieces)


def active_sessions(client, model: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(sample.value for family in text_string_to_metric_families(client.get("/metrics").text)
               if family.name == "rtserve_active_sessions" for sample in family.samples
               if sample.labels["model"] == model)


def test_a_create_costs_one_round_trip_a_finish_one_where_its_state_is_kept_two_elsewhere_and_a_delete_two(
        client, round_trips):
    """On one server the create's script reserves the quota, writes the session and its live-index entry (the
    active-session count rises), the finish's script takes it out of both indexes (the count falls back): on the
    replica that applied the last piece, from the state it kept; elsewhere after reading the session. A delete reads
    the session once (its owner) and drops it."""
    warm_up = client.post("/sessions", json={"task": "forecast"}).json()
    client.post(f"/sessions/{warm_up['id']}/finish")  # scripts loaded by now
    model = warm_up["model"]
    for kept in (True, False, True):
        before = active_sessions(client, model)
        round_trips["count"] = 0
        session = client.post("/sessions", json={"task": "forecast"}).json()
        assert round_trips["count"] == 1
        assert active_sessions(client, model) == before + 1
        url = f"/sessions/{session['id']}"
        assert client.post(f"{url}/segments", json={"seq": 1, "rows": rows(5)}).status_code == 200
        if not kept:
            client.app.state.flow.cache.drop(session["id"])  # as on another replica
        round_trips["count"] = 0
        assert client.post(f"{url}/finish").status_code == 200
        assert round_trips["count"] == (1 if kept else 2)  # (the snapshot), the finish
        assert active_sessions(client, model) == before
        round_trips["count"] = 0
        assert client.delete(url).status_code == 204
        assert round_trips["count"] == 2  # the owner's check, the drop
        assert client.get(url).status_code == 404


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
    """The begin script sends the last result back only when the piece is the last applied one (a piece computed
    from a kept state reads nothing)."""
    from service.sessions import SessionStore

    results_read = []
    original = SessionStore.begin

    async def recording(self, session_id, owner, seq):
        begun = await original(self, session_id, owner, seq)
        results_read.append(begun.last_result)
        return begun

    monkeypatch.setattr(SessionStore, "begin", recording)
    session = client.post("/sessions", json={"task": "forecast"}).json()
    url = f"/sessions/{session['id']}/segments"
    lookback = client.app.state.registry.models[session["model"]].pipeline.lookback
    first = client.post(url, json={"seq": 1, "rows": rows(lookback)}).json()
    piece = rows(3)
    applied = client.post(url, json={"seq": 2, "rows": piece}).json()
    assert first["result"]["forecast"] is not None  # a stored result worth not reading
    assert results_read == []  # pieces 1 and 2 were computed from the kept state: no read
    replayed = client.post(url, json={"seq": 2, "rows": piece}).json()
    assert replayed["replayed"] and results_read == [applied["result"]] == [replayed["result"]]
    client.app.state.flow.cache.drop(session["id"])
    client.post(url, json={"seq": 3, "rows": rows(3)})  # read first: the next piece, no stored result sent back
    assert results_read[1:] == [None]


async def test_the_commits_of_one_batch_go_in_one_round_trip_each_with_its_own_outcome(store, round_trips):
    """The pieces of one batched step ask for their commits in the same turn of the event loop: one round trip for all
    of them; a commit that lost its race (its session moved on) fails alone, the others apply."""
    import asyncio
    import dataclasses

    import numpy as np

    from service.metrics import ServiceMetrics
    from service.sessions import LostRace, Piece, SessionNotFound, SessionStore
    from service.settings import Settings

    sessions = SessionStore(store, Settings(), ServiceMetrics(collect_gpu=False))
    state = {"window": np.random.default_rng().standard_normal((1, 8, 3)).astype(np.float32)}
    metas = [await sessions.create("m:1", "forecast", "owner", state) for _ in range(8)]

    def piece(meta):
        return Piece(meta.seq + 1, f"sha-{meta.id}", state, {"n": meta.seq + 1}, units_read=8, segments=1)

    warm = await sessions.create("m:1", "forecast", "owner", state)
    await sessions.commit(warm, piece(warm), None, touch_indexes=True)  # the script loaded
    metas[3] = dataclasses.replace(metas[3], seq=5)  # computed from a state the session has moved past
    gone = dataclasses.replace(metas[0], id="no-such-session")
    round_trips["count"] = 0
    outcomes = await asyncio.gather(*(sessions.commit(meta, piece(meta), None, touch_indexes=True)
                                      for meta in [*metas, gone]), return_exceptions=True)
    assert round_trips["count"] == 1
    assert isinstance(outcomes[3], LostRace) and isinstance(outcomes[8], SessionNotFound)
    for index in (0, 1, 2, 4, 5, 6, 7):
        assert outcomes[index].seq == 1 and outcomes[index].consumed == 8, outcomes[index]
    stored = [int(await store.client.hget(sessions._keys(meta.id)["meta"], "seq")) for meta in metas]
    assert stored == [1, 1, 1, 0, 1, 1, 1, 1]  # the lost race wrote nothing
    await sessions.close()


async def test_a_commit_redis_refuses_in_a_batch_fails_alone(store, round_trips):
    """One commit of a batch that Redis refuses (here its session's meta is no hash: WRONGTYPE) fails with Redis's
    error and writes nothing; the commits beside it, in the same round trip, apply (each is its own script call)."""
    import asyncio

    import numpy as np
    from redis.exceptions import ResponseError

    from service.metrics import ServiceMetrics
    from service.sessions import Piece, SessionStore
    from service.settings import Settings

    sessions = SessionStore(store, Settings(), ServiceMetrics(collect_gpu=False))
    state = {"window": np.random.default_rng().standard_normal((1, 8, 3)).astype(np.float32)}
    metas = [await sessions.create("m:1", "forecast", "owner", state) for _ in range(4)]
    warm = await sessions.create("m:1", "forecast", "owner", state)
    await sessions.commit(warm, Piece(1, "sha", state, {"n": 1}, units_read=8, segments=1), None, True)  # loaded
    broken = sessions._keys(metas[2].id)["meta"]
    await store.client.delete(broken)
    await store.client.set(broken, "not a hash")
    round_trips["count"] = 0
    outcomes = await asyncio.gather(*(sessions.commit(meta, Piece(1, "sha", state, {"n": 1}, units_read=8, segments=1),
                                                      None, touch_indexes=True) for meta in metas),
                                    return_exceptions=True)
    assert round_trips["count"] == 1
    assert isinstance(outcomes[2], ResponseError) and "WRONGTYPE" in str(outcomes[2])
    assert [outcome.seq for index, outcome in enumerate(outcomes) if index != 2] == [1, 1, 1]
    assert await store.client.get(broken) == b"not a hash"
    assert await store.client.get(sessions._keys(metas[2].id)["state"]) is not None  # the create's, untouched
    await sessions.close()


def test_a_finish_from_a_kept_state_another_replica_moved_past_finishes_from_the_session_read(
        repository, redis_url, key_prefix):
    """A replica finishes a session it kept from the kept state only if the session is still there: after another
    replica applied a piece, finished it, or started it again under its id (a KServe v2 sequence's new incarnation,
    at the same seq), the finish reads the session and answers what a replica keeping nothing answers."""
    from tests.service_helpers import make_client

    def infer(replica, model, piece, **sequence):
        body = {"inputs": [{"name": "ROWS", "datatype": "FP32", "shape": [len(piece), len(piece[0])],
                            "data": [value for row in piece for value in row]}],
                "parameters": {"sequence_id": 77, **sequence}}
        answer = replica.post(f"/v2/models/{model}/infer", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()["parameters"]["session_id"]

    with make_client(repository[0], redis_url, key_prefix) as a, make_client(repository[0], redis_url,
                                                                             key_prefix) as b:
        lookback = next(iter(a.app.state.registry.models.values())).pipeline.lookback
        pieces = [rows(lookback) for _ in range(3)]  # each enough for a forecast

        def finish(replica, session_id):  # the finish answer: the session after it, and the final result
            answer = replica.post(f"/sessions/{session_id}/finish")
            assert answer.status_code == 200, answer.text
            body = answer.json()
            return body.pop("session"), body

        def whole(*chosen):  # the final result of a session of these pieces on one replica
            session = a.post("/sessions", json={"task": "forecast"}).json()["id"]
            for seq, piece in enumerate(chosen, start=1):
                a.post(f"/sessions/{session}/segments", json={"seq": seq, "rows": piece})
            return finish(a, session)[1]

        # another replica applied a piece after the one this replica kept
        shared = a.post("/sessions", json={"task": "forecast"}).json()
        a.post(f"/sessions/{shared['id']}/segments", json={"seq": 1, "rows": pieces[0]})
        b.post(f"/sessions/{shared['id']}/segments", json={"seq": 2, "rows": pieces[1]})
        session, result = finish(a, shared["id"])
        assert session["seq"] == 2 and result == whole(*pieces[:2]) != whole(pieces[0])
        # another replica finished it at the seq this replica kept: its stored result, answered again
        shared = a.post("/sessions", json={"task": "forecast"}).json()
        a.post(f"/sessions/{shared['id']}/segments", json={"seq": 1, "rows": pieces[0]})
        first = finish(b, shared["id"])[1]
        flow, replayed = a.app.state.flow, []
        original = flow.finish

        async def recording(*args, **options):
            end = await original(*args, **options)
            replayed.append(end.replayed)
            return end

        flow.finish = recording
        session, again = finish(a, shared["id"])
        del flow.finish
        assert again == first and session["status"] == "finished" and session["seq"] == 1 and replayed == [True]
        # started again elsewhere under its id, at the same seq: finished from the new incarnation's state
        model = shared["model"].split(":")[0]
        sequence = infer(a, model, pieces[0], sequence_start=True)
        assert infer(b, model, pieces[2], sequence_start=True) == sequence
        session, result = finish(a, sequence)
        assert session["seq"] == 1 and result == whole(pieces[2]) != whole(pieces[0])
