"""The Redis connection of the service (redis-py asyncio): the client, readiness checks, errors as 503s.

Keys are namespaced and cluster-safe: ``<prefix>:{<session-id>}:<part>``, so
all keys of one session fall in one hash slot and can be touched by one Lua
script (service/sessions/scripts.py). Values are safetensors bytes (see :mod:`service.tensor_codec`).

The client is a plain ``Redis`` (one server, or a Sentinel-managed primary behind
one address) or, with ``RTSERVE_REDIS_CLUSTER=true``, a ``RedisCluster`` that
learns the slot map from the URL's node and follows MOVED/ASK and failovers.

Every operation runs in :meth:`StateStore.operation`: Redis's errors become the service's (503s), and on one
server the whole operation (its round trip, and redis-py's retries on a broken connection) has
``RTSERVE_REDIS_TIMEOUT_SECONDS`` to finish. That one deadline replaces redis-py's socket timeout, which cost
every command a task and a timer for its send and another timer for its read (a tenth of a millisecond of CPU
per session piece, docs/serving.md); a Redis that stops answering is cut off as before. Time the service's own
event loop ran behind lengthens the deadline (:class:`Operation`): it is Redis's, not the loop's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from types import TracebackType
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.connection import HiredisRespSerializer
from redis.driver_info import DriverInfo
from redis.exceptions import ClusterDownError, OutOfMemoryError, ResponseError, SlotNotCoveredError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.loop_lag import LoopLag

# What a connection tells Redis about its client (CLIENT SETINFO), read once: redis-py looks its own version up in the
# installed packages' metadata for every connection it makes otherwise (0.3 ms of CPU each, half of a new connection's)
DRIVER_INFO = DriverInfo()


class StateStoreUnavailable(RuntimeError):
    """Redis could not be reached or refused the write; the caller should retry later (HTTP 503).

    The outcome of the request is unknown (a command may have been applied before the connection
    broke): the message says so, and retrying the same request is safe.
    """


class ServiceOverloaded(StateStoreUnavailable):
    """A Redis operation ran out of time while the service's own event loop ran far behind: the replica, not Redis,
    is too busy (HTTP 503, outcome unknown as for :class:`StateStoreUnavailable`)."""


class StateStoreOutOfMemory(StateStoreUnavailable):
    """Redis refused a write at ``maxmemory`` (policy ``noeviction``): nothing was written."""


def _describe(url: str) -> str:
    """The URL without credentials, for error messages."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


REDIS_DOWN_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
# A cluster in the middle of a failover: CLUSTERDOWN, TRYAGAIN, or a slot no reachable primary serves yet.
CLUSTER_DOWN_ERRORS = (ClusterDownError, TryAgainError, SlotNotCoveredError)


class StateStore:
    def __init__(
        self, client: aioredis.Redis | RedisCluster, url: str, prefix: str = "rtserve", cluster: bool = False,
        deadline_seconds: float | None = None,
    ) -> None:
        """``deadline_seconds``: how long one :meth:`operation` may take (None: no deadline of its own)."""
        self.client = client
        self.url = url
        self.prefix = prefix
        self.cluster = cluster  # True: a RedisCluster client; keys of one session still share one slot
        self.deadline_seconds = deadline_seconds
        self.loop_lag: LoopLag | None = None  # the running loop's lag, which lengthens each operation's deadline

    @classmethod
    def from_url(
        cls, url: str, prefix: str = "rtserve", timeout_seconds: float = 2.0, max_connections: int = 256,
        pool_timeout_seconds: float = 10.0, cluster: bool = False,
    ) -> StateStore:
        """A client whose pool, when all ``max_connections`` are busy, makes a request wait for one
        (:class:`WaitingConnectionPool`, up to ``pool_timeout_seconds``).

        redis-py's default pool raises at once when full, which would turn ordinary bursts into false 503s.
        A broken connection (a pooled socket that a restarted Redis closed) is retried twice on a fresh
        one: every write the service sends is idempotent when repeated (compare-and-set scripts,
        ZADD/SET of the same values), so a repeat can never apply a piece twice. Each operation has
        ``timeout_seconds`` once it has a connection (:meth:`operation`), a new connection's connect included.

        With ``cluster``, ``url`` names any one node of a Redis Cluster; ``max_connections`` is then per
        node, and redis-py's cluster pool does not wait for a free connection: past that many concurrent
        commands on one node a request answers 503 at once. A command that meets a node going down
        (a failover) is retried up to 3 times with backoff while the client refreshes the slot map; there
        each command's socket has ``timeout_seconds``, so that a failover's retries are not cut short.
        """
        if cluster:
            client = RedisCluster.from_url(
                url,
                max_connections=max_connections,
                socket_timeout=timeout_seconds,
                socket_connect_timeout=timeout_seconds,
                decode_responses=False,
                retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3),
                driver_info=DRIVER_INFO,
            )
            return cls(client, url, prefix, cluster=True)
        pool = WaitingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=pool_timeout_seconds,
            socket_timeout=None,  # each operation's deadline instead (Operation): redis-py's default is 5 s
            socket_connect_timeout=None,  # within the operation's deadline, which leaves out the loop's own lag
            decode_responses=False,
            retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.2), 2, supported_errors=(RedisConnectionError,)),
            driver_info=DRIVER_INFO,
        )
        return cls(aioredis.Redis.from_pool(pool), url, prefix, deadline_seconds=timeout_seconds)

    def key(self, session_id: str, part: str) -> str:
        """``<prefix>:{<session-id>}:<part>`` — the braces pin a session to one cluster hash slot."""
        return f"{self.prefix}:{{{session_id}}}:{part}"

    def operation(self, timer: AbstractContextManager[Any] | None = None) -> Operation:
        """``async with store.operation(): <Redis commands>`` — within the deadline, Redis's errors as the
        service's (:class:`Operation`); ``timer`` (a metric's) times the commands."""
        return Operation(self, timer)

    async def round_trip(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Each of ``commands``' replies, an error reply as its exception (not raised), all sent in one round trip.

        On one server: the commands in one write over one pooled connection, their replies read back in order; a
        pipeline less redis-py's per-command bookkeeping (its command stack, its checks of each command before the
        write, a coroutine per reply for its callbacks), which costs more than the commands' packing and parsing. The
        connection's own retry (the pool's, as its pipelines use it) sends them again when the pooled connection was
        broken (a restarted Redis closed it): every write the service sends is idempotent when repeated. A read cut off
        mid-reply (the operation's deadline) leaves the connection closed, never reused.
        On a cluster: redis-py's pipeline, which splits the commands by node and sends to the nodes in parallel."""
        if self.cluster:
            async with self.client.pipeline(transaction=False) as pipe:
                for command in commands:
                    pipe.execute_command(*command)
                return list(await pipe.execute(raise_on_error=False))
        packed = [pack(command) for command in commands]
        pool = self.client.connection_pool
        connection = await pool.get_connection()

        async def send_and_read() -> list[Any]:
            await connection.send_packed_command(packed, check_health=False)
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(await connection.read_response())
                except ResponseError as error:  # this command's own: the others' replies follow it
                    replies.append(error)
            return replies

        async def broken(error: Exception) -> None:
            await connection.disconnect()  # reconnected by the next try

        try:
            return await connection.retry.call_with_retry(send_and_read, broken)
        finally:
            await pool.release(connection)

    def as_error(self, error: BaseException) -> StateStoreUnavailable | None:
        """The service's error for one of Redis's: :class:`StateStoreUnavailable` with the server named (or
        :class:`StateStoreOutOfMemory`); None for any other error, which is the caller's own."""
        if isinstance(error, REDIS_DOWN_ERRORS):
            return StateStoreUnavailable(f"Redis at {_describe(self.url)} is unreachable: {error}")
        if isinstance(error, CLUSTER_DOWN_ERRORS):
            return StateStoreUnavailable(f"Redis Cluster at {_describe(self.url)} is failing over or down: {error}")
        # OutOfMemoryError, or EXECABORT of a transaction for the same reason
        if isinstance(error, ResponseError) and (isinstance(error, OutOfMemoryError) or "maxmemory" in str(error)):
            return StateStoreOutOfMemory(
                f"Redis at {_describe(self.url)} is out of memory (maxmemory reached) and refused the write"
            )
        return None

    async def ping(self) -> bool:
        async with self.operation():
            return bool(await self.client.ping())

    async def check_writable(self) -> list[str]:
        """A short-lived write (out of memory raises :class:`StateStoreOutOfMemory`), then what to warn about.

        Sessions must never be evicted: any ``maxmemory-policy`` but ``noeviction`` can drop a session's
        keys one by one, leaving half a session. Warns (does not fail) when Redis is set so.
        On a cluster the write lands on one primary and the policy of every primary is read.
        """
        async with self.operation():
            if self.cluster:
                await self.client.set(f"{self.prefix}:readyz", b"1", px=1000)
                per_node = await self.client.info("memory", target_nodes=RedisCluster.PRIMARIES)
                memories = dict(per_node)
            else:
                async with self.client.pipeline(transaction=False) as pipe:
                    pipe.set(f"{self.prefix}:readyz", b"1", px=1000).info("memory")
                    _, memory = await pipe.execute()
                memories = {"": memory}
        warnings = []
        for node, memory in sorted(memories.items()):
            policy = memory.get("maxmemory_policy", "noeviction")
            policy = policy.decode() if isinstance(policy, bytes) else str(policy)
            if policy != "noeviction":
                where = f" on {node}" if node else ""
                warnings.append(f"Redis maxmemory-policy is {policy}{where}: it may evict sessions (whole or in "
                                "part); rtserve requires noeviction")
        return warnings

    async def close(self) -> None:
        await self.client.aclose()


RUNNING_OPERATION: ContextVar[Operation | None] = ContextVar("rtserve_redis_operation", default=None)


_SERIALIZER = HiredisRespSerializer()


def pack(command: tuple[Any, ...]) -> bytes:
    """One command in Redis's protocol, packed by hiredis (C): the bytes redis-py's own hiredis serializer (which its
    synchronous connections use) writes, without its pass over every argument in Python for the rare one hiredis
    does not take (a bytearray, a memoryview) or a command name of two words (``SCRIPT LOAD``), both left to it."""
    name = command[0]
    if type(name) is str and " " not in name:
        try:
            return hiredis.pack_command(command)
        except TypeError:
            pass
    return _SERIALIZER.pack(*command)[0]


class HiredisPacking:
    """A connection that packs each command with hiredis (:func:`pack`; asyncio redis-py packs in Python): the same
    bytes on the wire (tests/test_state_store.py), a tenth of the CPU for a commit's dozen arguments."""

    def pack_command(self, *args: Any) -> list[bytes]:
        return [pack(args)]


def hiredis_packing(connection_class: type) -> type:
    """``connection_class`` (redis-py's TCP, Unix socket or TLS connection) packing with hiredis."""
    return type(f"Hiredis{connection_class.__name__}", (HiredisPacking, connection_class), {})


class WaitingConnectionPool(aioredis.ConnectionPool):
    """redis-py's connection pool, except that a command finding all ``max_connections`` busy waits for one, up to
    ``timeout`` seconds, instead of failing at once ("No connection available." after that, a 503).

    redis-py's ``BlockingConnectionPool`` does the same with a condition and a timer that every command pays for,
    busy pool or not (a twentieth of the event loop's time per session piece, docs/serving.md); here a free
    connection costs one semaphore count, and only a command that must wait arms a timer.
    """

    def __init__(self, timeout: float = 10.0, **options: Any) -> None:
        super().__init__(**options)
        self.connection_class = hiredis_packing(self.connection_class)
        self.timeout = timeout
        self._free = asyncio.Semaphore(self.max_connections)
        self._holding: set[int] = set()  # connections handed out, each holding one count of ``_free``

    async def get_connection(self, *ignored: Any, **named: Any) -> Any:  # redis-py's signature; both unused
        if self._free.locked():
            operation = RUNNING_OPERATION.get()
            if operation is not None:
                operation.pause()  # the wait is the pool's to bound, not the operation's deadline
            try:
                async with asyncio.timeout(self.timeout):
                    await self._free.acquire()
            except TimeoutError as error:
                raise RedisConnectionError("No connection available.") from error
            finally:
                if operation is not None:
                    operation.resume()
        else:
            await self._free.acquire()  # a free connection: returns at once
        try:
            connection = await super().get_connection()
        except BaseException:  # redis-py released the connection it took, if any: its count is ours to give back
            self._free.release()
            raise
        self._holding.add(id(connection))
        return connection

    async def release(self, connection: Any) -> None:
        try:
            await super().release(connection)
        finally:
            if id(connection) in self._holding:  # once per hand-out, whoever releases it and however often
                self._holding.discard(id(connection))
                self._free.release()


LAG_ALLOWANCE = 2.0  # the loop's own lag lengthens an operation's deadline by at most this many deadlines


class Operation:
    """One operation against Redis (:meth:`StateStore.operation`): cut off after the store's deadline, which a
    cancelled command leaves with its connection closed (redis-py never reuses a connection that was cancelled
    mid-reply), and any error of Redis's raised as the service's. A class, not a generator: it runs twice per
    session piece.

    The deadline is Redis's, not the service's own. A wait for a free connection stops the clock (the pool bounds
    it with ``RTSERVE_REDIS_POOL_TIMEOUT_SECONDS``); the operation then has the whole deadline again. Time the event
    loop ran behind (the store's :class:`~service.loop_lag.LoopLag`) lengthens it, up to ``LAG_ALLOWANCE``
    deadlines: under a burst a reply can sit unread while the loop serves the callbacks queued before it, and
    cutting it off then would answer "Redis did not answer" for Redis's prompt answer. An operation cut off
    after the loop ran behind for half its deadline or more raises :class:`ServiceOverloaded`.
    """

    __slots__ = ("store", "timer", "_deadline", "_running", "_handle", "_started", "_behind_at_start", "_behind")

    def __init__(self, store: StateStore, timer: AbstractContextManager[Any] | None = None) -> None:
        self.store, self.timer = store, timer
        self._deadline: asyncio.Timeout | None = None
        self._running: Token[Operation | None] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._started = self._behind_at_start = self._behind = 0.0

    async def __aenter__(self) -> None:
        if self.store.deadline_seconds is not None:
            self._deadline = asyncio.timeout(None)  # armed by _expire once the deadline has really passed
            await self._deadline.__aenter__()
            self.resume()
        self._running = RUNNING_OPERATION.set(self)
        if self.timer is not None:
            self.timer.__enter__()

    def pause(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def resume(self) -> None:
        """(Re)start the clock: the whole deadline from now."""
        if self._deadline is None or self.store.deadline_seconds is None:
            return
        loop = asyncio.get_running_loop()
        lag = self.store.loop_lag
        self._started = loop.time()
        self._behind_at_start = lag.seconds_behind() if lag is not None else 0.0
        self._handle = loop.call_at(self._started + self.store.deadline_seconds, self._expire)

    def _expire(self) -> None:
        """The deadline, lengthened by the loop's lag since the clock started, has passed: cut the operation off;
        otherwise look again when the lengthened deadline comes."""
        assert self._deadline is not None and self.store.deadline_seconds is not None
        loop, lag, seconds = asyncio.get_running_loop(), self.store.loop_lag, self.store.deadline_seconds
        self._behind = lag.seconds_behind() - self._behind_at_start if lag is not None else 0.0
        until = self._started + seconds + min(self._behind, LAG_ALLOWANCE * seconds)
        if until > loop.time():
            self._handle = loop.call_at(until, self._expire)
        else:
            self._handle = None
            self._deadline.reschedule(loop.time())  # asyncio's timeout cancels the task: TimeoutError on exit

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        if self.timer is not None:
            self.timer.__exit__(kind, error, traceback)
        if self._running is not None:
            RUNNING_OPERATION.reset(self._running)
        if self._deadline is not None:
            self.pause()
            try:
                await self._deadline.__aexit__(kind, error, traceback)  # our own cancellation -> TimeoutError
            except TimeoutError as timed_out:
                raise self._cut_off() from timed_out
        if error is not None and (ours := self.store.as_error(error)) is not None:
            raise ours from error

    def _cut_off(self) -> StateStoreUnavailable:
        seconds = self.store.deadline_seconds
        assert seconds is not None
        waited = asyncio.get_running_loop().time() - self._started
        if self._behind >= seconds / 2:
            return ServiceOverloaded(
                f"this replica is overloaded: its event loop ran {self._behind:.2f} s behind while it waited "
                f"{waited:.2f} s for Redis at {_describe(self.store.url)} (the deadline, RTSERVE_REDIS_TIMEOUT_SECONDS="
                f"{seconds:g}, lengthened by that lag, {LAG_ALLOWANCE * seconds:g} s at most)"
            )
        return StateStoreUnavailable(f"Redis at {_describe(self.store.url)} did not answer within {seconds:g} s")
