import os
import signal
import uuid
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager

import numpy as np
import pytest

from service.embedded_redis import EmbeddedRedis
from service.state_store import StateStore, StateStoreUnavailable
from service.tensor_codec import decode_tensors, encode_tensors


@contextmanager
def answering_nothing(redis: EmbeddedRedis) -> Iterator[None]:
    """A Redis that keeps its sockets open but answers nothing (SIGSTOP), until the block ends."""
    assert redis.pid is not None
    os.kill(redis.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(redis.pid, signal.SIGCONT)


def _random_state(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "memory": rng.standard_normal((2, 4, 8)).astype(np.float32),
        "memory_half": rng.standard_normal((3, 5)).astype(np.float16),
        "kv_sum": rng.standard_normal((1, 2, 3, 4)).astype(np.float64),
        "token_ids": rng.integers(0, 30_000, size=(1, 17), dtype=np.int64),
        "rows_seen": np.asarray(rng.integers(0, 1000), dtype=np.int32),  # 0-d
        "pending_text": np.frombuffer("naïve café ".encode(), dtype=np.uint8).copy(),
        "mask": rng.random((2, 9)) > 0.5,
        "empty": np.zeros((0, 384), dtype=np.float32),
    }


def test_codec_round_trip_keeps_dtype_shape_and_values():
    state = _random_state(np.random.default_rng())
    decoded = decode_tensors(encode_tensors(state, {"model": "rmt"}))
    assert set(decoded) == set(state)
    for name, array in state.items():
        assert decoded[name].dtype == array.dtype, name
        assert decoded[name].shape == array.shape, name
        np.testing.assert_array_equal(decoded[name], array)


def test_codec_bytes_are_what_safetensors_writes():
    """The codec's own call of safetensors' serializer writes what ``safetensors.numpy.save`` writes: every dtype, a
    0-d array, an empty one, a transposed (not C-contiguous) one, a big-endian one, with and without metadata."""
    from safetensors.numpy import save

    rng = np.random.default_rng()
    cases = [_random_state(rng), {"t": rng.standard_normal((3, 5)).T, "scalar": np.array(2.5, dtype=np.float32),
                                  "empty": np.zeros((0, 4), np.float16)},
             {"big": np.arange(6, dtype=">f4").reshape(2, 3)}]
    for arrays in cases:
        for metadata in (None, {"model": "rmt"}):
            contiguous = {name: np.require(value, requirements="C") for name, value in arrays.items()}
            assert encode_tensors(arrays, metadata) == save(contiguous, metadata=metadata)


def test_codec_bytes_are_not_pickle():
    payload = encode_tensors({"x": np.arange(3, dtype=np.int64)})
    header_length = int.from_bytes(payload[:8], "little")
    assert payload[8:9] == b"{" and b'"dtype":"I64"' in payload[8 : 8 + header_length]
    assert not payload.startswith(b"\x80")  # the pickle protocol marker


async def test_encoded_state_survives_a_round_trip_through_real_redis(store: StateStore):
    """The bytes sessions store (``encode_tensors``) come back from a real Redis decodable and unchanged."""
    state = _random_state(np.random.default_rng())
    key = store.key(uuid.uuid4().hex, "state")
    payload = encode_tensors(state, {"model": "rmt"})
    assert await store.client.set(key, payload, ex=60)
    stored = await store.client.get(key)
    assert stored == payload
    loaded = decode_tensors(stored)
    for name, array in state.items():
        assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape
        np.testing.assert_array_equal(loaded[name], array)
    assert await store.client.delete(key) == 1


def test_keys_are_namespaced_and_cluster_safe(key_prefix: str, redis_url: str):
    store = StateStore.from_url(redis_url, prefix=key_prefix)
    assert store.key("abc", "state") == f"{key_prefix}:{{abc}}:state"


async def test_unreachable_redis_raises_a_clear_error():
    store = StateStore.from_url("redis://127.0.0.1:1/0", timeout_seconds=0.5)
    with pytest.raises(StateStoreUnavailable, match=r"Redis at redis://127\.0\.0\.1:1/0 is unreachable"):
        await store.ping()
    with pytest.raises(StateStoreUnavailable):
        await store.check_writable()  # the write /readyz makes
    await store.close()


async def test_error_message_hides_credentials():
    store = StateStore.from_url("redis://user:secret@127.0.0.1:1/0", timeout_seconds=0.5)
    with pytest.raises(StateStoreUnavailable) as caught:
        await store.ping()
    assert "secret" not in str(caught.value)
    await store.close()


async def test_a_redis_that_stops_answering_is_cut_off_at_the_deadline_and_the_next_operation_works(tmp_path):
    """A Redis that keeps its sockets open but answers nothing (SIGSTOP): the operation fails within its deadline
    with an error that says so; its connection, cancelled mid-reply, is never reused once Redis answers again."""
    import asyncio
    import time

    with EmbeddedRedis(tmp_path) as redis:
        store = StateStore.from_url(redis.url, timeout_seconds=0.3)
        await store.client.set("k", b"before")
        with answering_nothing(redis):
            started = time.monotonic()
            with pytest.raises(StateStoreUnavailable, match=r"did not answer within 0\.3 s"):
                async with store.operation():
                    await store.client.get("k")
            assert time.monotonic() - started < 1.0
        await asyncio.sleep(0.05)
        async with store.operation():
            await store.client.set("k", b"after")
            assert await store.client.get("k") == b"after"
        assert await store.ping()
        await store.close()


async def test_the_loop_lag_is_summed_from_a_ticker_that_wakes_late():
    """A loop held 0.2 s: the ticker's lateness is summed (the pending tick's counted before it runs) and each
    tick's lateness is observed; an idle loop runs almost nothing behind."""
    import asyncio
    import time

    from service.loop_lag import LoopLag

    observed: list[float] = []
    lag = LoopLag(interval=0.01, observe=observed.append)
    lag.start()
    await asyncio.sleep(0.1)
    idle = lag.seconds_behind()
    time.sleep(0.2)  # the loop held
    assert lag.seconds_behind() >= idle + 0.18  # counted before the late tick has run
    await asyncio.sleep(0.05)
    lag.stop()
    assert idle < 0.05
    assert max(observed) >= 0.18 and lag.seconds_behind() >= idle + 0.18


async def test_a_reply_waiting_behind_a_busy_event_loop_is_not_cut_off_as_redis_slowness(redis_url: str, monkeypatch):
    """An operation of two commands; Redis answers each at once, but the event loop is held (0.15 s) from the
    moment the first is sent, past the 0.1 s deadline, so its reply waits unread: with the loop's lag measured,
    the deadline is lengthened by it and the operation succeeds; without it the operation is cut off as "Redis did
    not answer" (what a burst of requests used to get)."""
    import asyncio
    import time

    from redis.asyncio.connection import AbstractConnection

    from service.loop_lag import LoopLag

    send = AbstractConnection.send_packed_command
    holding = False

    async def send_then_hold_the_loop(self, *args, **options):
        await send(self, *args, **options)
        if holding:
            asyncio.get_running_loop().call_soon(time.sleep, 0.15)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", send_then_hold_the_loop)

    async def held_operation(store: StateStore) -> list[bytes | None]:
        nonlocal holding
        await store.client.ping()  # connected
        holding = True
        try:
            async with store.operation():
                first = await store.client.get("missing-key")
                holding = False
                return [first, await store.client.get("missing-key")]
        finally:
            holding = False

    store = StateStore.from_url(redis_url, timeout_seconds=0.1)
    with pytest.raises(StateStoreUnavailable, match=r"did not answer within 0\.1 s"):
        await held_operation(store)
    await store.close()

    store = StateStore.from_url(redis_url, timeout_seconds=0.1)
    store.loop_lag = LoopLag()
    store.loop_lag.start()
    assert await held_operation(store) == [None, None]
    store.loop_lag.stop()
    await store.close()


async def test_an_operation_cut_off_while_the_loop_ran_far_behind_says_the_replica_is_overloaded(tmp_path):
    """Redis stopped (SIGSTOP) and the event loop held 0.4 s, four deadlines: the operation still ends (the lag
    lengthens a deadline at most twice over), as overloaded, not as Redis's silence; the same store with the loop
    idle says Redis did not answer, within its deadline."""
    import asyncio
    import time

    from service.errors import error_answer
    from service.loop_lag import LoopLag
    from service.state_store import ServiceOverloaded

    with EmbeddedRedis(tmp_path) as redis:
        store = StateStore.from_url(redis.url, timeout_seconds=0.1)
        store.loop_lag = LoopLag()
        store.loop_lag.start()
        await store.client.ping()
        with answering_nothing(redis):
            asyncio.get_running_loop().call_soon(time.sleep, 0.4)
            with pytest.raises(ServiceOverloaded, match=r"overloaded: its event loop ran 0\.\d+ s behind") as raised:
                async with store.operation():
                    await store.client.get("k")
            started = time.monotonic()
            with pytest.raises(StateStoreUnavailable, match=r"did not answer within 0\.1 s"):
                async with store.operation():
                    await store.client.get("k")
            assert time.monotonic() - started < 0.5
        store.loop_lag.stop()
        await store.close()
    status, body, headers = error_answer(raised.value, {"method": "POST", "path": "/sessions", "type": "http"})
    assert status == 503 and headers == {"Retry-After": "1"}
    assert body["detail"].startswith("this replica is overloaded") and "outcome of this request is unknown" in \
        body["detail"]


async def test_a_full_pool_makes_commands_wait_for_a_connection_and_fails_only_past_its_timeout(redis_url: str):
    """Two connections, six commands that each hold one for 0.2 s: all six are answered (in three rounds); with a
    wait shorter than a round, those that cannot get a connection in time fail as Redis unavailable (503)."""
    import asyncio
    import time

    key = f"test:{uuid.uuid4().hex}:empty"
    store = StateStore.from_url(redis_url, timeout_seconds=5.0, max_connections=2, pool_timeout_seconds=2.0)

    async def hold() -> None:
        async with store.operation():
            await store.client.blpop([key], timeout=0.2)  # nothing to pop: holds its connection 0.2 s

    started = time.monotonic()
    await asyncio.gather(*(hold() for _ in range(6)))
    assert 0.55 < time.monotonic() - started < 2.0
    assert len(store.client.connection_pool._in_use_connections) == 0
    await store.close()

    impatient = StateStore.from_url(redis_url, timeout_seconds=5.0, max_connections=2, pool_timeout_seconds=0.05)

    async def hold_briefly() -> None:
        async with impatient.operation():
            await impatient.client.blpop([key], timeout=0.2)

    outcomes = await asyncio.gather(*(hold_briefly() for _ in range(4)), return_exceptions=True)
    failed = [o for o in outcomes if isinstance(o, StateStoreUnavailable)]
    assert len(failed) == 2 and all("No connection available" in str(o) for o in failed), outcomes
    assert outcomes.count(None) == 2
    await impatient.close()


async def test_a_connection_that_fails_to_connect_gives_back_its_place_in_the_pool_once(redis_url: str, monkeypatch):
    """redis-py releases a connection whose connect fails inside ``get_connection``; the place it held in the pool
    is given back once, not twice: one connection still means one command at a time, the next waiting."""
    import asyncio

    from redis.exceptions import ConnectionError as RedisConnectionError

    from service.state_store import WaitingConnectionPool

    store = StateStore.from_url(redis_url, timeout_seconds=5.0, max_connections=1, pool_timeout_seconds=2.0)
    pool = store.client.connection_pool
    assert isinstance(pool, WaitingConnectionPool)
    ensure = WaitingConnectionPool.ensure_connection
    failures = iter([True, True])

    async def failing_once(self, connection):
        if next(failures, False):
            raise RedisConnectionError("connect failed")
        return await ensure(self, connection)

    monkeypatch.setattr(WaitingConnectionPool, "ensure_connection", failing_once)
    for _ in range(2):
        with pytest.raises(StateStoreUnavailable):
            async with store.operation():
                await store.client.get("k")
    key = f"test:{uuid.uuid4().hex}:empty"

    async def hold() -> None:
        async with store.operation():
            await store.client.blpop([key], timeout=0.2)

    await asyncio.gather(hold(), hold(), hold())  # one at a time: a doubled place would meet "Too many connections"
    await store.close()


async def test_a_new_connection_names_its_client_without_looking_its_version_up_again(redis_url: str, monkeypatch):
    """Every connection the pool makes carries the driver's name and version (what CLIENT SETINFO tells a Redis 7.2+)
    read once, not redis-py's lookup in the installed packages' metadata per connection (half a new connection's
    CPU)."""
    import redis
    import redis.utils

    store = StateStore.from_url(redis_url, timeout_seconds=5.0, max_connections=8)

    def looked_up() -> str:
        raise AssertionError("redis-py looked its version up for a new connection")

    monkeypatch.setattr(redis.utils, "get_lib_version", looked_up)
    pool = store.client.connection_pool
    connections = [await pool.get_connection() for _ in range(3)]
    assert {(c.driver_info.formatted_name, c.driver_info.lib_version) for c in connections} == {
        ("redis-py", redis.__version__)}
    for connection in connections:
        await pool.release(connection)
    async with store.operation():
        assert await store.client.ping()
    await store.close()


async def test_a_wait_for_a_free_connection_is_not_charged_to_the_operations_deadline(redis_url: str):
    """One connection, four operations that hold it 0.2 s each (Redis ends a blocking pop on its 10 Hz clock: up to
    0.3 s), a 0.5 s deadline: the last waits 0.6 s or more for the connection and still has its whole deadline
    once it has one (a burst is not a Redis that stopped answering)."""
    import asyncio

    key = f"test:{uuid.uuid4().hex}:empty"
    store = StateStore.from_url(redis_url, timeout_seconds=0.5, max_connections=1, pool_timeout_seconds=3.0)

    async def hold() -> None:
        async with store.operation():
            await store.client.blpop([key], timeout=0.2)

    await asyncio.gather(*(hold() for _ in range(4)))
    await store.close()


async def test_every_held_lock_is_renewed_in_one_round_trip_and_a_lost_one_is_let_go(redis_url: str, key_prefix: str,
                                                                                      monkeypatch):
    """The lock keeper renews all the locks it holds with one pipeline per beat, whatever their number (script
    calls of at most RENEWED_PER_CALL locks each): a lock that is no longer ours is dropped, a script Redis lost
    is loaded again, and ours outlive their first lease."""
    import asyncio
    import time

    from redis.asyncio.connection import AbstractConnection

    from service.metrics import ServiceMetrics
    from service.sessions import SessionStore
    from service.sessions import lease as sessions_module
    from service.settings import Settings

    monkeypatch.setattr(sessions_module, "RENEWED_PER_CALL", 5)  # 12 locks: three calls in each round trip

    store = StateStore.from_url(redis_url, prefix=key_prefix)
    sessions = SessionStore(store, Settings(session_lock_seconds=0.6), ServiceMetrics(collect_gpu=False))
    beat = 0.2  # a third of the lease
    held = [(f"s{i}", f"token{i}") for i in range(12)]
    for session_id, token in held:
        await store.client.set(sessions._keys(session_id)["lock"], token, px=600)
    await store.client.set(sessions._keys("s0")["lock"], "another replica's", px=600)
    await store.client.script_flush()  # as after a restart: the refresh script is gone

    assert await sessions.leases.renew(held) == [False] + [True] * 11
    sent: list[int] = []
    original = AbstractConnection.send_packed_command

    async def counting(self, command, check_health=True):
        sent.append(1)
        return await original(self, command, check_health)

    AbstractConnection.send_packed_command = counting
    try:
        async with AsyncExitStack() as stack:
            for key in held:
                await stack.enter_async_context(sessions.leases.holding(*key))
            started = time.monotonic()
            await asyncio.sleep(1.0)  # past the first lease: only renewals keep the locks
            beats = (time.monotonic() - started) / beat
            assert 3 <= len(sent) <= beats + 1, f"{len(sent)} round trips for 12 locks over {beats:.1f} beats"
            assert await store.client.get(sessions._keys("s1")["lock"]) == b"token1"
            assert await store.client.get(sessions._keys("s0")["lock"]) is None
            assert ("s0", "token0") not in sessions.leases._held and ("s1", "token1") in sessions.leases._held
    finally:
        AbstractConnection.send_packed_command = original
        await sessions.close()
        await store.close()


def test_commands_packed_with_hiredis_are_the_bytes_redis_py_sends():
    from redis.asyncio.connection import Connection

    from service.state_store import hiredis_packing

    plain, packed = Connection(), hiredis_packing(Connection)()
    for command in (("EVALSHA", "abc", 2, "k1", "k2", b"\x00state", 1.5, -3), ("SCRIPT LOAD", "return 1"),
                    (b"GET", "clé"), ("GET", "clé"), ("SET", "k", bytearray(b"v")), ("SET", "k", memoryview(b"v"))):
        assert b"".join(packed.pack_command(*command)) == b"".join(plain.pack_command(*command)), command


async def test_a_round_trip_answers_each_command_in_order_with_an_error_reply_in_its_place(store: StateStore):
    from redis.exceptions import NoScriptError, ResponseError

    key = store.key("round-trip", "k")
    replies = await store.round_trip([("SET", key, b"\x00v"), ("EVALSHA", "0" * 40, 0), ("INCR", key),
                                      ("GET", key), ("SCRIPT EXISTS", "0" * 40)])
    assert replies[0] == b"OK"  # Redis's own reply: a round trip applies none of redis-py's reply callbacks
    assert isinstance(replies[1], NoScriptError)  # the script Redis lost, as the commits' reload looks for
    assert isinstance(replies[2], ResponseError) and not isinstance(replies[2], NoScriptError)  # not an integer
    assert replies[3:] == [b"\x00v", [0]]  # the replies after an error are still each command's own
    assert await store.client.get(key) == b"\x00v"  # and the connection went back to the pool in step


async def test_a_round_trip_meeting_a_broken_pooled_connection_sends_its_commands_again_on_a_fresh_one(
        store: StateStore):
    key = store.key("round-trip", "broken")
    await store.client.ping()  # a pooled connection, then closed under the pool as a restarted Redis closes it
    pool = store.client.connection_pool
    connection = await pool.get_connection()
    connection._writer.transport.abort()
    await pool.release(connection)
    assert await store.round_trip([("SET", key, b"1"), ("GET", key)]) == [b"OK", b"1"]


async def test_a_piece_asking_for_the_lock_takes_it_waits_for_another_piece_or_goes_ahead_of_a_stream(
        redis_url: str, key_prefix: str):
    from service.metrics import ServiceMetrics
    from service.sessions import SessionStore
    from service.sessions.lease import stream_token
    from service.settings import Settings

    store = StateStore.from_url(redis_url, prefix=key_prefix)
    sessions = SessionStore(store, Settings(), ServiceMetrics(collect_gpu=False))
    try:
        token, busy = await sessions.leases.take_for_piece("free", 3)
        assert token is not None and token.startswith("3:") and not busy
        assert await store.client.get(sessions._keys("free")["lock"]) == token.encode()
        assert await sessions.leases.take_for_piece("free", 4) == (None, True)  # another piece's request holds it
        await store.client.set(sessions._keys("streamed")["lock"], stream_token(), px=60_000)
        assert await sessions.leases.take_for_piece("streamed", 1) == (None, False)  # a stream: go ahead
    finally:
        await sessions.close()
