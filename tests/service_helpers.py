"""Building apps over a tiny model repository, for service tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings


def make_client(repository: Path, redis_url: str, key_prefix: str, **overrides: Any) -> TestClient:
    settings = Settings(
        model_repository=repository, redis_url=redis_url, redis_key_prefix=key_prefix, **overrides
    )
    return TestClient(create_app(settings))


def random_pieces(items: list, rng: Any, max_piece: int) -> list[list]:
    """Cut ``items`` (rows or characters) into consecutive pieces of random sizes 1..max_piece."""
    pieces, start = [], 0
    while start < len(items):
        size = int(rng.integers(1, max_piece + 1))
        pieces.append(items[start : start + size])
        start += size
    return pieces
