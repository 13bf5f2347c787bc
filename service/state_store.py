"""Named tensors in Redis, through the asyncio client of redis-py.

Keys are namespaced and cluster-safe: ``<prefix>:{<session-id>}:<part>``, so
all keys of one session fall in one hash slot and can be touched by one Lua
script. Values are safetensors bytes (see :mod:`service.tensor_codec`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.tensor_codec import decode_tensors, encode_tensors


class StateStoreUnavailable(RuntimeError):
    """Redis could not be reached; the caller should retry later (HTTP 503)."""


def _describe(url: str) -> str:
    """The URL without credentials, for error messages."""
    if "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


REDIS_DOWN_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


class StateStore:
    def __init__(self, client: aioredis.Redis, url: str, prefix: str = "rtserve") -> None:
        self.client = client
        self.url = url
        self.prefix = prefix

    @classmethod
    def from_url(cls, url: str, prefix: str = "rtserve", timeout_seconds: float = 2.0) -> StateStore:
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_seconds,
            socket_connect_timeout=timeout_seconds,
            decode_responses=False,
        )
        return cls(client, url, prefix)

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

    async def ping(self) -> bool:
        with self.unavailable_as_error():
            return bool(await self.client.ping())

    async def put_tensors(
        self,
        key: str,
        tensors: Mapping[str, np.ndarray],
        ttl_seconds: int,
        metadata: Mapping[str, str] | None = None,
    ) -> int:
        """Store named tensors under ``key`` for ``ttl_seconds``. Returns the bytes written."""
        payload = encode_tensors(tensors, metadata)
        with self.unavailable_as_error():
            await self.client.set(key, payload, ex=ttl_seconds)
        return len(payload)

    async def get_tensors(self, key: str) -> dict[str, np.ndarray] | None:
        """The tensors stored under ``key``, or None when absent or expired."""
        with self.unavailable_as_error():
            payload = await self.client.get(key)
        return None if payload is None else decode_tensors(payload)

    async def delete(self, *keys: str) -> int:
        with self.unavailable_as_error():
            return int(await self.client.delete(*keys)) if keys else 0

    async def close(self) -> None:
        await self.client.aclose()
