"""The Redis connection of the service (redis-py asyncio): the client, readiness checks, errors as 503s.

Keys are namespaced and cluster-safe: ``<prefix>:{<session-id>}:<part>``, so
all keys of one session fall in one hash slot and can be touched by one Lua
script (service/sessions.py). Values are safetensors bytes (see :mod:`service.tensor_codec`).

The client is a plain ``Redis`` (one server, or a Sentinel-managed primary behind
one address) or, with ``RTSERVE_REDIS_CLUSTER=true``, a ``RedisCluster`` that
learns the slot map from the URL's node and follows MOVED/ASK and failovers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ClusterDownError, OutOfMemoryError, ResponseError, SlotNotCoveredError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class StateStoreUnavailable(RuntimeError):
    """Redis could not be reached or refused the write; the caller should retry later (HTTP 503).

    The outcome of the request is unknown (a command may have been applied before the connection
    broke): the message says so, and retrying the same request is safe.
    """


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
        self, client: aioredis.Redis | RedisCluster, url: str, prefix: str = "rtserve", cluster: bool = False
    ) -> None:
        self.client = client
        self.url = url
        self.prefix = prefix
        self.cluster = cluster  # True: a RedisCluster client; keys of one session still share one slot

    @classmethod
    def from_url(
        cls, url: str, prefix: str = "rtserve", timeout_seconds: float = 2.0, max_connections: int = 256,
        pool_timeout_seconds: float = 10.0, cluster: bool = False,
    ) -> StateStore:
        """A client whose pool, when all ``max_connections`` are busy, makes a request wait for one.

        redis-py's default pool raises at once when full, which would turn ordinary bursts into false 503s.
        A broken connection (a pooled socket that a restarted Redis closed) is retried twice on a fresh
        one: every write the service sends is idempotent when repeated (compare-and-set scripts,
        ZADD/SET of the same values), so a repeat can never apply a piece twice.

        With ``cluster``, ``url`` names any one node of a Redis Cluster; ``max_connections`` is then per
        node, and redis-py's cluster pool does not wait for a free connection: past that many concurrent
        commands on one node a request answers 503 at once. A command that meets a node going down
        (a failover) is retried up to 3 times with backoff while the client refreshes the slot map.
        """
        if cluster:
            client = RedisCluster.from_url(
                url,
                max_connections=max_connections,
                socket_timeout=timeout_seconds,
                socket_connect_timeout=timeout_seconds,
                decode_responses=False,
                retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3),
            )
            return cls(client, url, prefix, cluster=True)
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=pool_timeout_seconds,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            decode_responses=False,
            retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.2), 2, supported_errors=(RedisConnectionError,)),
        )
        return cls(aioredis.Redis.from_pool(pool), url, prefix)

    def key(self, session_id: str, part: str) -> str:
        """``<prefix>:{<session-id>}:<part>`` — the braces pin a session to one cluster hash slot."""
        return f"{self.prefix}:{{{session_id}}}:{part}"

    @contextmanager
    def unavailable_as_error(self) -> Iterator[None]:
        """Turn a lost connection into :class:`StateStoreUnavailable` with the server named."""
        try:
            yield
        except REDIS_DOWN_ERRORS as error:
            raise StateStoreUnavailable(f"Redis at {_describe(self.url)} is unreachable: {error}") from error
        except CLUSTER_DOWN_ERRORS as error:
            raise StateStoreUnavailable(
                f"Redis Cluster at {_describe(self.url)} is failing over or down: {error}"
            ) from error
        except ResponseError as error:  # OutOfMemoryError, or EXECABORT of a transaction for the same reason
            if not isinstance(error, OutOfMemoryError) and "maxmemory" not in str(error):
                raise
            raise StateStoreOutOfMemory(
                f"Redis at {_describe(self.url)} is out of memory (maxmemory reached) and refused the write"
            ) from error

    async def ping(self) -> bool:
        with self.unavailable_as_error():
            return bool(await self.client.ping())

    async def check_writable(self) -> list[str]:
        """A short-lived write (out of memory raises :class:`StateStoreOutOfMemory`), then what to warn about.

        Sessions must never be evicted: any ``maxmemory-policy`` but ``noeviction`` can drop a session's
        keys one by one, leaving half a session. Warns (does not fail) when Redis is set so.
        On a cluster the write lands on one primary and the policy of every primary is read.
        """
        with self.unavailable_as_error():
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
