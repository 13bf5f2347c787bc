"""Building apps over a tiny model repository, for service tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings


def make_client(repository: Path, redis_url: str, key_prefix: str, **overrides: Any) -> TestClient:
    settings = Settings(
        model_repository=repository, redis_url=redis_url, redis_key_prefix=key_prefix, **overrides
    )
    return TestClient(create_app(settings))


def process_gone(pid: int) -> bool:
    """Exited (or a zombie its dead parent left for init to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def gone_within(pid: int, seconds: float) -> bool:
    """Whether the process is gone (:func:`process_gone`) within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not process_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return process_gone(pid)


def random_pieces(items: list, rng: Any, max_piece: int) -> list[list]:
    """Cut ``items`` (rows or characters) into consecutive pieces of random sizes 1..max_piece."""
    pieces, start = [], 0
    while start < len(items):
        size = int(rng.integers(1, max_piece + 1))
        pieces.append(items[start : start + size])
        start += size
    return pieces


def start_rtserve(settings: dict[str, str], port: int, output: int | IO[str] | None = subprocess.DEVNULL,
                  ready_path: str = "/readyz", timeout: float = 60,
                  command: tuple[str, ...] = ("rtserve.cli", "serve")) -> subprocess.Popen:
    """``rtserve serve`` as a user runs it, in its own process, with the ``RTSERVE_*`` variables of ``settings``
    only (none inherited); returns once ``ready_path`` answers 200. Fails the test if the process exits first.
    ``command``: the module to run and its arguments (``--port`` is added)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")} | settings
    process = subprocess.Popen([sys.executable, "-m", *command, "--port", str(port)], env=env,
                               stdout=output, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            text = process.stdout.read() if process.stdout else ""
            pytest.fail(f"rtserve serve exited early ({process.returncode}):\n{text}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{ready_path}", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    process.kill()
    pytest.fail(f"rtserve serve did not answer {ready_path} within {timeout:.0f} s")

