"""The bench's harness: a server under test in a subprocess, the HTTP client that drives it, and CPU clocks.

- :class:`Server`: ``rtserve serve`` (or another server: the floor server) started as a subprocess on a
  loopback port, its output in a log file; :meth:`Server.wait_ready` polls ``/readyz``; :meth:`Server.stop`
  sends SIGTERM and waits.
- :class:`Client`: one keep-alive ``aiohttp`` session whose bodies are bytes prepared beforehand; an answer
  of 400 or more is a :class:`BenchError`. ``/metrics`` comes back as :data:`Samples` (see
  :mod:`loadtest.metrics` for deltas and shares).
- CPU: :func:`process_cpu_seconds` (the kernel's per-process CPU clock, in nanoseconds),
  :func:`tree_cpu_seconds` (a process and its descendants) and :class:`Stopwatch` (wall time plus the
  service's and this client's CPU over a timed run).
- :func:`median` and :func:`in_turn` (which side goes first in a repeat), which every comparison uses.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from service.embedded_redis import die_with_parent

HOST = "127.0.0.1"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]  # (sample name, labels) -> value, from /metrics


class BenchError(RuntimeError):
    """The run cannot measure what it claims to (a failed request, a piece that did not step once)."""


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def in_turn(repeat: int, first: Any, second: Any) -> tuple[Any, Any]:
    """``(first, second)`` on even repeats, ``(second, first)`` on odd ones: drift hits both sides alike."""
    return (first, second) if repeat % 2 == 0 else (second, first)


# ---- CPU clocks ----------------------------------------------------------------------------------
def process_cpu_seconds(process: psutil.Process) -> float:
    """CPU seconds (user + system, every thread, living or ended) of one process.

    The kernel's CPU clock of the process (what ``clock_getcpuclockid(pid)`` names: the same accounting that
    ``/proc/<pid>/stat`` shows, read in nanoseconds instead of 10 ms ticks, which would be 1-10 % of a short run);
    ``/proc/<pid>/stat`` by psutil where that clock cannot be read.
    """
    try:
        return time.clock_gettime_ns(((~process.pid) << 3) | 2) / 1e9  # CPUCLOCK_SCHED of the whole process
    except (OSError, OverflowError, AttributeError):
        times = process.cpu_times()
        return times.user + times.system


def thread_cpu_seconds(pid: int, thread: int) -> float:
    """CPU seconds (user + system) of one thread of process ``pid`` (its first, ``pid`` itself, is the event loop's),
    in nanoseconds from ``/proc/<pid>/task/<thread>/schedstat``."""
    return int(Path(f"/proc/{pid}/task/{thread}/schedstat").read_text().split()[0]) / 1e9


def tree_cpu_seconds(root: psutil.Process) -> float:
    """CPU seconds of ``root`` and its living descendants."""
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process_cpu_seconds(process)
        except psutil.NoSuchProcess:
            continue
    return total


@dataclass(frozen=True)
class Span:
    """A timed run: its wall time and the CPU time spent in it by the service and by this client."""

    seconds: float
    server_cpu_seconds: float  # the service's process and its children (the embedded Redis)
    client_cpu_seconds: float


class Stopwatch:
    """Wall time plus the CPU time of the service (its process tree and the bench's Redis) and of this process
    (the client)."""

    def __init__(self, server_pid: int, redis_pid: int | None) -> None:
        self.server = psutil.Process(server_pid)
        self.redis = psutil.Process(redis_pid) if redis_pid is not None else None

    def service_cpu(self) -> float:
        """The service's own processes: every front end and engine, not Redis."""
        return tree_cpu_seconds(self.server)

    def redis_cpu(self) -> float:
        return tree_cpu_seconds(self.redis) if self.redis is not None else 0.0

    def server_cpu(self) -> float:
        """The service and the bench's Redis."""
        return self.service_cpu() + self.redis_cpu()

    def start(self) -> tuple[float, float, float]:
        return time.perf_counter(), self.server_cpu(), time.process_time()

    def stop(self, started: tuple[float, float, float]) -> Span:
        wall, server, client = started
        return Span(time.perf_counter() - wall, self.server_cpu() - server, time.process_time() - client)


# ---- the service under test ----------------------------------------------------------------------
def samples_of(text: str) -> Samples:
    """A ``/metrics`` page (Prometheus' text format) as :data:`Samples`."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, frozenset(sample.labels.items())): float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def server_environment(repository: Path, port: int, redis_url: str) -> dict[str, str]:
    """The caller's environment, the bench's embedded Redis, this repository and port; the code beside this file
    first."""
    env = dict(os.environ)
    env.update(RTSERVE_MODEL_REPOSITORY=str(repository), RTSERVE_HOST=HOST, RTSERVE_PORT=str(port),
               RTSERVE_REDIS_URL=redis_url)
    source_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, env.get("PYTHONPATH")) if p)
    return env


class Server:
    """A server under test in a subprocess (``rtserve serve``, or the floor server), its output in a log file. It
    gets SIGTERM if the process that started it dies first (a bench that crashes leaves no server behind to load the
    machine under the next measurement); start it from the main thread, whose end the kernel watches."""

    def __init__(self, command: list[str], env: dict[str, str], port: int, log_path: Path) -> None:
        self.url = f"http://{HOST}:{port}"
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "w")  # closed in stop()
        self.process = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        preexec_fn=die_with_parent)  # runs in the child, between fork and exec

    @classmethod
    def rtserve(cls, repository: Path, port: int, log_path: Path, redis_url: str,
                settings: Mapping[str, str] | None = None) -> Server:
        """``rtserve serve`` on ``port``; ``settings``: environment variables beside the bench's."""
        return cls([sys.executable, "-m", "rtserve.cli", "serve", "--host", HOST, "--port", str(port)],
                   {**server_environment(repository, port, redis_url), **(settings or {})}, port, log_path)

    def log_tail(self, characters: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-characters:]

    async def wait_ready(self, client: Client, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        reason = "no answer"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BenchError(f"the service exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                status, content = await client.get("/readyz")
                if status == 200:
                    return
                reason = content.decode(errors="replace")
            except Exception as error:  # not listening yet
                reason = f"{type(error).__name__}: {error}"
            await asyncio.sleep(0.2)
        raise BenchError(f"the service was not ready within {timeout:.0f} s ({reason}):\n{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


# ---- the client ----------------------------------------------------------------------------------
class Client:
    """Keep-alive HTTP client (aiohttp); bodies are bytes prepared beforehand, answers are checked.

    aiohttp rather than httpx (the project's own client): the bench shares the CPU with the service it
    measures, and httpx spent 1.5-1.9 ms of CPU per request here against aiohttp's 0.3 (docs/serving.md).
    """

    def __init__(self, base_url: str, api_key: str | None, connections: int, keep_alive_seconds: float) -> None:
        """``keep_alive_seconds``: how long an idle connection is kept; below the service's own keep-alive
        timeout, so that a connection is never reused just as the service closes it."""
        import aiohttp

        headers = {"content-type": "application/json"} | ({"x-api-key": api_key} if api_key else {})
        self.http = aiohttp.ClientSession(
            base_url, headers=headers, timeout=aiohttp.ClientTimeout(total=600.0),
            connector=aiohttp.TCPConnector(limit=connections, keepalive_timeout=keep_alive_seconds),
        )

    async def get(self, path: str) -> tuple[int, bytes]:
        """Status and body, whatever the status."""
        async with self.http.get(path) as answer:
            return answer.status, await answer.read()

    async def _ok(self, method: str, path: str, body: bytes | None = None) -> bytes:
        """The body of an answer below 400; any other is a failed request (:class:`BenchError`)."""
        async with self.http.request(method, path, data=body) as answer:
            content = await answer.read()
            if answer.status >= 400:
                raise BenchError(f"{method} {path} answered {answer.status}: {content[:500].decode(errors='replace')}")
            return content

    async def get_json(self, path: str) -> Any:
        return json.loads(await self._ok("GET", path))

    async def post(self, path: str, body: bytes = b"{}") -> dict[str, Any]:
        return json.loads(await self._ok("POST", path, body))

    async def delete(self, path: str) -> None:
        await self._ok("DELETE", path)

    async def models(self) -> list[dict[str, Any]]:
        return json.loads(await self._ok("GET", "/models"))

    async def metrics(self) -> Samples:
        return samples_of((await self._ok("GET", "/metrics")).decode())

    async def close(self) -> None:
        await self.http.close()
