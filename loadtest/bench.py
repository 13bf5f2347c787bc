"""``rtserve bench``: the serving benchmark, one run on whatever machine it runs on.

Protocol
--------
1. Start an embedded Redis (the bench's own: ``RTSERVE_REDIS_URL`` of the caller is replaced), then the
   service as a subprocess (``python -m rtserve.cli serve``) on a free loopback port on that Redis, with
   ``RTSERVE_MODEL_REPOSITORY`` pointing at the repository; every other ``RTSERVE_*`` variable of the
   caller passes through, so ``RTSERVE_MAX_QUEUE_DELAY_MS=0 rtserve bench`` measures that setting. Wait
   for ``/readyz``. With ``floor``, the floor server (``benchmarks/floor_server.py``) starts beside it,
   on the same Redis.
2. Prepare every input before any timing (:mod:`loadtest.bench_inputs`): request bodies are bytes,
   sent by one ``aiohttp.ClientSession`` with keep-alive, so the client stays cheap on a CPU it shares
   with the server (its CPU time during served runs is reported as ``client_cpu_share``).
3. Scenarios (``--only`` picks some), each repeated ``--repeats`` times; served and offline runs
   alternate in order from one repeat to the next, and the medians are reported:

   - ``e2e``: one RMT classify session at a time, pieces of exactly one segment each (the answer's
     ``session.segments`` must grow by one per piece). Median client-measured piece latency over
     the median time of the RMT ``step`` graph alone at batch 1 on the very same segments, run in
     this process (``load_backends`` with the model's backend and ``RTSERVE_INTRA_OP_THREADS``)
     while the server is idle.
   - ``throughput``: N concurrent sessions (16 and 32), each sending its pieces one after another.
     Served segments/s (first piece sent to last answer) over offline segments/s (the same
     segments stepped at batch N, memory carried). Mean batch size from ``/metrics``.
   - ``latency``: N concurrent sessions, each create -> every piece -> finish, no barrier;
     p50/p90/p99 of the whole-session time.
   - ``articles``: 32 different BBC test articles, ``POST /summarize`` all at once vs one after
     another, ``decoding: "free"`` (the decoder, which continuous batching is for; sentence copy, the
     summarizers' default, runs no decoder); decode tokens/s = sum of ``summary_tokens`` / wall time.
   - ``decode``: 32 different documents read into summarization sessions (untimed), each one or two
     whole 510-token encoder windows of BBC test articles (an article, then the next ones, until the
     windows are full: most BBC articles are shorter than one window), sent in pieces that close the
     windows, so the finish has almost nothing left to encode; then every session's ``finish``
     (``decoding: "free"``) all at once vs one after another: decode tokens/s = sum of
     ``summary_tokens`` / wall time of the finishes. This is the decoder's throughput, which
     continuous batching across documents is for; ``articles`` also times the encoder (MiniLM over
     each 510-token window), which on a CPU is compute-bound and gains nothing from batching.
   - ``rsa``: 32 forecast sessions (ETTh1 rows, equal pieces) all at once vs one after another,
     create -> pieces -> finish; pieces/s.
   - ``floor``: RSA forecast pieces and RMT classify pieces sent to the service and to the floor server
     (the same Redis round trips and state sizes, the same ``step.onnx`` at batch 1 on one thread, a
     JSON answer, nothing else), the two taking turns block by block, at 1 session and at 32; the
     service's server CPU per piece over the floor's (:mod:`loadtest.bench_floor`).
   - ``gpu``: where NVML sees a GPU, per model: segments/s and J/segment at 1 and 32 sessions
     from NVML's energy counter (:mod:`loadtest.bench_gpu`); skipped, saying so, elsewhere.

   CPU: for ``articles``, ``decode`` and ``rsa``, each timed run also records the CPU time the service
   spent in it (its process tree and the bench's Redis, from each process's kernel CPU clock) and this
   client's, per unit (token, piece). Concurrent throughput cannot exceed ``cores`` / (CPU per unit),
   so a ratio cannot exceed ``ratio_ceiling`` = cores x (sequential seconds per unit) / (concurrent
   CPU seconds per unit): where the two meet, the machine was full, and only less CPU per unit raises
   the ratio.

   Redis share: over the pieces of the served runs of ``e2e`` and of the smallest ``throughput``
   count (``/metrics`` scraped just before the first piece and after the last answer, so session
   create and finish fall outside), the delta of ``rtserve_redis_operation_duration_seconds_sum``
   for the operations the segment route times (``begin``: meta, state, last result and the lock in
   one script; ``commit``: the compare-and-set write, the unlock and the live-index touch in one
   round trip; ``live_counts`` runs at each scrape and is left out) over the delta of
   ``rtserve_request_duration_seconds_sum`` for that route. Each timing spans the whole round trip
   (the client's encoding, the socket and the server); safetensors encoding of the state is outside.
   Every ratio is the median over the repeats of the ratio within a repeat, whose two runs were taken
   one right after the other (not the ratio of the two sides' medians, which pairs runs of different
   repeats: on a VM whose speed drifts by 20 % within minutes the two differ by as much).
4. Stop the service (SIGTERM, wait), write the JSON and the markdown table, print the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from loadtest import bench_inputs as inputs
from loadtest.bench_floor import Side, compare, floor_command, floor_sessions, tree_cpu_seconds
from loadtest.bench_gpu import EnergyMeter, energy_rates
from loadtest.bench_inputs import SessionInput
from loadtest.bench_report import check_targets, machine_info, machine_slug, write_reports
from models.cli_help import HelpFormatter

log = logging.getLogger("rtserve.bench")

SCENARIOS = ("e2e", "throughput", "latency", "articles", "decode", "rsa", "floor", "gpu")
SEGMENT_ROUTE = "/sessions/{session_id}/segments"
SEGMENT_ROUTE_REDIS_OPERATIONS = ("begin", "commit")
HOST = "127.0.0.1"


@dataclass(frozen=True)
class Counts:
    """How much each scenario sends."""

    e2e_sessions: int = 4  # one after another, `pieces` one-segment pieces each
    pieces: int = 8  # pieces per classify session (one segment each)
    sessions: tuple[int, ...] = (16, 32)  # concurrent classify sessions
    articles: int = 32
    article_chars: int | None = None  # None: whole articles
    rsa_sessions: int = 32
    rsa_piece_rows: int = 24
    rsa_extra_pieces: int = 4  # pieces after the look-back is filled, each answered with a forecast
    gpu_sessions: int = 32
    floor_sessions: int = 32  # the floor comparison: at 1 session (each in turn) and at this many at once
    floor_rsa_extra_pieces: int = 12  # more pieces per RSA session than `rsa`: CPU is read in 10 ms ticks
    settle_seconds: float = 0.2  # pause before each timed run: ONNX Runtime's idle threads stop spinning


# a smoke test of the instrument, not a measurement
QUICK = Counts(e2e_sessions=1, pieces=2, sessions=(2, 4), articles=2, article_chars=400, rsa_sessions=3,
               rsa_piece_rows=8, rsa_extra_pieces=1, gpu_sessions=4, floor_sessions=3, floor_rsa_extra_pieces=1,
               settle_seconds=0.01)


class BenchError(RuntimeError):
    """The run cannot measure what it claims to (a failed request, a piece that did not step once)."""


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

    def _server_cpu(self) -> float:
        return self.service_cpu() + self.redis_cpu()

    def start(self) -> tuple[float, float, float]:
        return time.perf_counter(), self._server_cpu(), time.process_time()

    def stop(self, started: tuple[float, float, float]) -> Span:
        wall, server, client = started
        return Span(time.perf_counter() - wall, self._server_cpu() - server, time.process_time() - client)


# ---- the service under test ----------------------------------------------------------------------
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
    """A server under test in a subprocess (``rtserve serve``, or the floor server), its output in a log file."""

    def __init__(self, command: list[str], env: dict[str, str], port: int, log_path: Path) -> None:
        self.url = f"http://{HOST}:{port}"
        self.log_path = log_path
        self._log = open(log_path, "w")  # closed in stop()
        self.process = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    @classmethod
    def rtserve(cls, repository: Path, port: int, log_path: Path, redis_url: str) -> Server:
        return cls([sys.executable, "-m", "rtserve.cli", "serve", "--host", HOST, "--port", str(port)],
                   server_environment(repository, port, redis_url), port, log_path)

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
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


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

    async def post(self, path: str, body: bytes = b"{}") -> dict[str, Any]:
        return json.loads(await self._ok("POST", path, body))

    async def delete(self, path: str) -> None:
        await self._ok("DELETE", path)

    async def models(self) -> list[dict[str, Any]]:
        return json.loads(await self._ok("GET", "/models"))

    async def metrics(self) -> Samples:
        from prometheus_client.parser import text_string_to_metric_families

        text = (await self._ok("GET", "/metrics")).decode()
        return {
            (sample.name, frozenset(sample.labels.items())): float(sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    async def close(self) -> None:
        await self.http.close()


def metric_delta(before: Samples, after: Samples) -> Samples:
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def add_delta(total: Samples, delta: Samples) -> None:
    for key, value in delta.items():
        total[key] = total.get(key, 0.0) + value


def metric_sum(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(value for (sample, tags), value in samples.items() if sample == name and wanted <= tags)


def redis_share(delta: Samples) -> dict[str, Any]:
    route_seconds = metric_sum(delta, "rtserve_request_duration_seconds_sum", route=SEGMENT_ROUTE)
    by_operation = {
        operation: metric_sum(delta, "rtserve_redis_operation_duration_seconds_sum", operation=operation)
        for operation in SEGMENT_ROUTE_REDIS_OPERATIONS
    }
    if route_seconds <= 0:
        raise BenchError(f"no time recorded on {SEGMENT_ROUTE} in /metrics")
    return {
        "share": sum(by_operation.values()) / route_seconds,
        "segment_route_seconds": route_seconds,
        "redis_seconds_by_operation": by_operation,
        "not_timed": "safetensors encoding/decoding of the state; lock waits of contended pieces (none here)",
    }


def histogram_mean(delta: Samples, name: str, **labels: str) -> float:
    count = metric_sum(delta, f"{name}_count", **labels)
    if count <= 0:
        raise BenchError(f"{name} recorded nothing for {labels}")
    return metric_sum(delta, f"{name}_sum", **labels) / count


# ---- driving sessions ----------------------------------------------------------------------------
@dataclass
class PiecesRun:
    """One served run: every session's pieces, timed from the first piece sent to the last answer."""

    wall_seconds: float
    piece_seconds: list[float]
    steps: int
    client_cpu_seconds: float


async def open_session(client: Client, model: str) -> str:
    created = await client.post("/sessions", json.dumps({"model": model}).encode())
    return str(created["id"])


async def close_session(client: Client, session_id: str) -> None:
    await client.post(f"/sessions/{session_id}/finish")
    await client.delete(f"/sessions/{session_id}")


async def send_pieces(client: Client, session_id: str, session: SessionInput, first: int = 1) -> list[float]:
    """Each piece after the previous answer; every piece must apply exactly one step. ``first``: the ``seq`` of
    the first piece (``session`` holding the rest of a session's pieces from there)."""
    path = f"/sessions/{session_id}/segments"
    latencies = []
    for seq, body in enumerate(session.pieces, start=first):
        started = time.perf_counter()
        answer = await client.post(path, body)
        latencies.append(time.perf_counter() - started)
        if answer["session"]["segments"] != seq:
            raise BenchError(f"piece {seq} left the session at {answer['session']['segments']} steps, not {seq}: "
                             "the pieces no longer match the model's segments")
    return latencies


async def served_pieces(
    client: Client, model: str, sessions: Sequence[SessionInput], metrics: Samples | None = None,
) -> PiecesRun:
    """Open every session, send all their pieces concurrently (timed), then finish and delete them.

    ``metrics``, when given, accumulates the ``/metrics`` delta of the pieces alone (scraped just
    before the first piece and just after the last answer, outside the timed span).
    """
    ids = await asyncio.gather(*(open_session(client, model) for _ in sessions))
    before = await client.metrics() if metrics is not None else {}
    cpu_before, started = time.process_time(), time.perf_counter()
    latencies = await asyncio.gather(*(send_pieces(client, i, s) for i, s in zip(ids, sessions, strict=True)))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_before
    if metrics is not None:
        add_delta(metrics, metric_delta(before, await client.metrics()))
    await asyncio.gather(*(close_session(client, session_id) for session_id in ids))
    flat = [seconds for per_session in latencies for seconds in per_session]
    return PiecesRun(wall, flat, len(flat), cpu)


async def whole_session(client: Client, model: str, session: SessionInput) -> float:
    """Create -> every piece -> finish, timed; the session is deleted afterwards, untimed."""
    started = time.perf_counter()
    session_id = await open_session(client, model)
    await send_pieces(client, session_id, session)
    await client.post(f"/sessions/{session_id}/finish")
    seconds = time.perf_counter() - started
    await client.delete(f"/sessions/{session_id}")
    return seconds


# ---- the step graph alone, in this process ---------------------------------------------------------
class OfflineSteps:
    """The RMT entry's ``step`` graph loaded here with the service's backend, device, precision and thread
    settings."""

    def __init__(self, entry: Path, manifest: Mapping[str, Any], model: Mapping[str, Any], threads: int,
                 spinning: bool) -> None:
        from service.runtime.backends import load_backends
        from service.runtime.pipeline import load_initial_state

        self.step = load_backends(entry, manifest, model["backend"], threads, model.get("device", "cpu"),
                                  model.get("precision", "fp32"), spinning=spinning)["step"]
        self.memory = load_initial_state(entry)["memory"]  # (1, m, d)

    def _run(self, memory: np.ndarray, segments: list[inputs.Segment]) -> np.ndarray:
        ids = np.stack([segment[0] for segment in segments])
        mask = np.stack([segment[1] for segment in segments])
        return self.step.run({"memory": memory, "input_ids": ids, "attention_mask": mask})["next_memory"]

    def batch_one_seconds(self, sessions: Sequence[SessionInput]) -> list[float]:
        """Each session's segments one step at a time, memory carried; the time of every step."""
        times = []
        for session in sessions:
            memory = self.memory
            for segment in session.segments:
                started = time.perf_counter()
                memory = self._run(memory, [segment])
                times.append(time.perf_counter() - started)
        return times

    def batched_seconds(self, sessions: Sequence[SessionInput]) -> float:
        """Step k of every session stacked into one batch, for every k; the total time."""
        memory = np.repeat(self.memory, len(sessions), axis=0)
        started = time.perf_counter()
        for k in range(len(sessions[0].segments)):
            memory = self._run(memory, [session.segments[k] for session in sessions])
        return time.perf_counter() - started


# ---- scenarios -----------------------------------------------------------------------------------
@dataclass
class Bench:
    client: Client
    repository: Path
    data: Path
    counts: Counts
    repeats: int
    intra_op_threads: int
    intra_op_spinning: bool
    models: dict[str, dict[str, Any]]  # task -> GET /models description of the model measured
    stopwatch: Stopwatch  # the service's and this client's CPU over each timed run
    floor: Side | None = None  # the floor server (scenario `floor`)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # scenario -> why it could not finish
    notes: list[str] = field(default_factory=list)

    def entry(self, task: str) -> tuple[Path, dict[str, Any]]:
        model = self.models[task]
        return self.repository / model["name"] / model["version"], model["manifest"]

    def ref(self, task: str) -> str:
        return f"{self.models[task]['name']}:{self.models[task]['version']}"

    async def settle(self) -> None:
        await asyncio.sleep(self.counts.settle_seconds)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def in_turn(repeat: int, first: Any, second: Any) -> tuple[Any, Any]:
    """``(first, second)`` on even repeats, ``(second, first)`` on odd ones: drift hits both sides alike."""
    return (first, second) if repeat % 2 == 0 else (second, first)


async def run_e2e(bench: Bench, sessions: list[SessionInput], offline: OfflineSteps) -> dict[str, Any]:
    model = bench.ref("classify")
    await served_pieces(bench.client, model, sessions[:1])  # warm-up, untimed
    offline.batch_one_seconds(sessions[:1])
    repeats: list[dict[str, Any]] = []
    metrics: Samples = {}
    for repeat in range(bench.repeats):
        order = in_turn(repeat, "served", "offline")
        row: dict[str, Any] = {"order": list(order), "piece_seconds": [], "step_seconds": []}
        for kind in order:
            await bench.settle()
            if kind == "offline":
                row["step_seconds"] = offline.batch_one_seconds(sessions)
                continue
            for session in sessions:  # one session at a time
                run = await served_pieces(bench.client, model, [session], metrics=metrics)
                row["piece_seconds"] += run.piece_seconds
        row["piece_ms_median"] = 1000 * median(row.pop("piece_seconds"))
        row["step_ms_median"] = 1000 * median(row.pop("step_seconds"))
        row["ratio"] = row["piece_ms_median"] / row["step_ms_median"]
        log.info("  repeat %d: piece %.1f ms, step %.1f ms", repeat + 1, row["piece_ms_median"], row["step_ms_median"])
        repeats.append(row)
    piece_ms, step_ms = median([r["piece_ms_median"] for r in repeats]), median([r["step_ms_median"] for r in repeats])
    return {
        "model": model,
        "pieces_per_repeat": sum(len(s.pieces) for s in sessions),
        "piece_ms_median": piece_ms,
        "step_ms_median": step_ms,
        "e2e_per_step": median([r["ratio"] for r in repeats]),
        "server_step_ms_mean": 1000 * histogram_mean(metrics, "rtserve_step_duration_seconds", model=model),
        "redis": redis_share(metrics),
        "repeats": repeats,
    }


async def run_throughput(bench: Bench, sessions: list[SessionInput], offline: OfflineSteps) -> dict[str, Any]:
    model = bench.ref("classify")
    results: dict[str, Any] = {}
    for count in bench.counts.sessions:
        chosen = sessions[:count]
        await served_pieces(bench.client, model, chosen)  # warm-up, untimed
        offline.batched_seconds(chosen)
        segments = sum(len(s.segments) for s in chosen)
        repeats: list[dict[str, Any]] = []
        metrics: Samples = {}
        for repeat in range(bench.repeats):
            row: dict[str, Any] = {}
            for kind in in_turn(repeat, "served", "offline"):
                await bench.settle()
                if kind == "offline":
                    row["offline_segments_per_second"] = segments / offline.batched_seconds(chosen)
                    continue
                run = await served_pieces(bench.client, model, chosen, metrics=metrics)
                row["served_segments_per_second"] = run.steps / run.wall_seconds
                row["client_cpu_share"] = run.client_cpu_seconds / run.wall_seconds
            row["ratio"] = row["served_segments_per_second"] / row["offline_segments_per_second"]
            log.info("  %d sessions, repeat %d: served %.1f, offline %.1f segments/s", count, repeat + 1,
                     row["served_segments_per_second"], row["offline_segments_per_second"])
            repeats.append(row)
        served = median([r["served_segments_per_second"] for r in repeats])
        offline_rate = median([r["offline_segments_per_second"] for r in repeats])
        results[str(count)] = {
            "sessions": count,
            "segments_per_repeat": segments,
            "served_segments_per_second": served,
            "offline_segments_per_second": offline_rate,
            "served_over_offline": median([r["ratio"] for r in repeats]),
            "mean_batch_size": histogram_mean(metrics, "rtserve_batch_size", model=model),
            "client_cpu_share": median([r["client_cpu_share"] for r in repeats]),
            "redis": redis_share(metrics),
            "repeats": repeats,
        }
    return results


def percentiles_ms(seconds: Sequence[float]) -> dict[str, float]:
    values = 1000 * np.asarray(seconds)
    return {
        "p50_ms": float(np.percentile(values, 50)),
        "p90_ms": float(np.percentile(values, 90)),
        "p99_ms": float(np.percentile(values, 99)),
        "max_ms": float(values.max()),
    }


async def run_latency(bench: Bench, sessions: list[SessionInput]) -> dict[str, Any]:
    model = bench.ref("classify")
    results: dict[str, Any] = {}
    for count in bench.counts.sessions:
        times: list[float] = []
        for _ in range(bench.repeats):
            times += await asyncio.gather(*(whole_session(bench.client, model, s) for s in sessions[:count]))
        results[str(count)] = {"sessions": count, "samples": len(times), **percentiles_ms(times)}
    return results


async def summarize_all(bench: Bench, bodies: list[bytes], concurrent: bool) -> tuple[Span, int]:
    """The span and summary tokens of every article, all at once or one after another."""
    client, started = bench.client, bench.stopwatch.start()
    if concurrent:
        answers = await asyncio.gather(*(client.post("/summarize", body) for body in bodies))
    else:
        answers = [await client.post("/summarize", body) for body in bodies]
    span = bench.stopwatch.stop(started)
    return span, sum(int(answer["summary_tokens"]) for answer in answers)


async def run_articles(bench: Bench) -> dict[str, Any]:
    model = bench.ref("summarize")
    texts = [text[: bench.counts.article_chars] for text in inputs.bbc_texts(bench.data, bench.counts.articles)]
    bodies = [json.dumps({"text": text, "model": model, "decoding": "free"}).encode() for text in texts]
    await summarize_all(bench, bodies[:1], concurrent=False)  # warm-up, untimed

    async def once(concurrent: bool) -> tuple[Span, int]:
        await bench.settle()
        return await summarize_all(bench, bodies, concurrent)

    rates = await concurrent_vs_sequential(bench, once)
    return {"model": model, "articles": len(bodies), **rates}


FREE_DECODING = json.dumps({"decoding": "free"}).encode()  # the decoder's work, not sentence copy's


async def finish_all(bench: Bench, ids: list[str], concurrent: bool) -> tuple[Span, int]:
    """The span and summary tokens of finishing every session, all at once or one after another."""
    client, started = bench.client, bench.stopwatch.start()
    if concurrent:
        answers = await asyncio.gather(*(client.post(f"/sessions/{i}/finish", FREE_DECODING) for i in ids))
    else:
        answers = [await client.post(f"/sessions/{i}/finish", FREE_DECODING) for i in ids]
    span = bench.stopwatch.stop(started)
    return span, sum(int(answer["summary_tokens"]) for answer in answers)


async def read_documents(client: Client, model: str, sessions: list[SessionInput]) -> list[str]:
    """Open a session per document and send its pieces (untimed); the session ids."""
    ids = await asyncio.gather(*(open_session(client, model) for _ in sessions))
    for session_id, session in zip(ids, sessions, strict=True):
        await send_pieces(client, session_id, session)
    return list(ids)


async def run_decode(bench: Bench) -> dict[str, Any]:
    model = bench.ref("summarize")
    entry, manifest = bench.entry("summarize")
    texts = inputs.bbc_texts(bench.data, bench.counts.articles * 4)
    sessions = inputs.decode_sessions(entry, manifest, texts, bench.counts.articles)
    await finish_all(bench, await read_documents(bench.client, model, sessions[:1]), False)  # warm-up

    async def once(concurrent: bool) -> tuple[Span, int]:
        ids = await read_documents(bench.client, model, sessions)  # untimed
        await bench.settle()
        timed = await finish_all(bench, ids, concurrent)
        await asyncio.gather(*(close_session(bench.client, session_id) for session_id in ids))
        return timed

    rates = await concurrent_vs_sequential(bench, once)
    return {"model": model, "articles": len(sessions), "windows": [len(s.pieces) for s in sessions], **rates}


async def concurrent_vs_sequential(
    bench: Bench, once: Callable[[bool], Awaitable[tuple[Span, int]]], unit: str = "tokens",
    count_key: str | None = "summary_tokens",
) -> dict[str, Any]:
    """``unit``/s of ``once(concurrent)`` -> (span, units) both ways, in alternating order, ``--repeats``
    times; medians. With each: the CPU per unit of the service and the client, the cores they kept busy,
    and the ceiling that CPU puts on the ratio. ``count_key`` also records each run's count of units."""
    cores = len(os.sched_getaffinity(0))
    repeats = []
    for repeat in range(bench.repeats):
        row: dict[str, Any] = {}
        for concurrent in in_turn(repeat, True, False):
            span, units = await once(concurrent)
            name = "concurrent" if concurrent else "sequential"
            row[f"{name}_{unit}_per_second"] = units / span.seconds
            row[f"{name}_server_cpu_ms_per_unit"] = 1000 * span.server_cpu_seconds / units
            row[f"{name}_client_cpu_ms_per_unit"] = 1000 * span.client_cpu_seconds / units
            row[f"{name}_cores_busy"] = (span.server_cpu_seconds + span.client_cpu_seconds) / span.seconds
            if count_key:
                row[f"{name}_{count_key}"] = units
        row["ratio"] = row[f"concurrent_{unit}_per_second"] / row[f"sequential_{unit}_per_second"]
        concurrent_cpu_ms = row["concurrent_server_cpu_ms_per_unit"] + row["concurrent_client_cpu_ms_per_unit"]
        row["ratio_ceiling"] = cores * (1000 / row[f"sequential_{unit}_per_second"]) / concurrent_cpu_ms
        log.info("  repeat %d: %.1f vs %.1f %s/s (ceiling of the ratio on %d cores: %.2f)", repeat + 1,
                 row[f"concurrent_{unit}_per_second"], row[f"sequential_{unit}_per_second"], unit, cores,
                 row["ratio_ceiling"])
        repeats.append(row)
    concurrent_rate = median([r[f"concurrent_{unit}_per_second"] for r in repeats])
    sequential_rate = median([r[f"sequential_{unit}_per_second"] for r in repeats])
    cpu = {key: median([r[key] for r in repeats]) for key in repeats[0]
           if key.endswith(("_cpu_ms_per_unit", "_cores_busy"))}
    return {
        f"concurrent_{unit}_per_second": concurrent_rate,
        f"sequential_{unit}_per_second": sequential_rate,
        "ratio": median([r["ratio"] for r in repeats]),
        "cores": cores,
        **cpu,
        "ratio_ceiling": median([r["ratio_ceiling"] for r in repeats]),
        "repeats": repeats,
    }


async def forecast_flows(bench: Bench, model: str, sessions: list[SessionInput], concurrent: bool) -> Span:
    """The span of create -> pieces -> finish for every session, all at once or one after another."""
    client = bench.client

    async def flow(session: SessionInput) -> str:
        session_id = await open_session(client, model)
        await send_pieces(client, session_id, session)
        await client.post(f"/sessions/{session_id}/finish")
        return session_id

    started = bench.stopwatch.start()
    if concurrent:
        ids = await asyncio.gather(*(flow(session) for session in sessions))
    else:
        ids = [await flow(session) for session in sessions]
    span = bench.stopwatch.stop(started)
    await asyncio.gather(*(client.delete(f"/sessions/{session_id}") for session_id in ids))
    return span


async def run_rsa(bench: Bench) -> dict[str, Any]:
    model = bench.ref("forecast")
    settings = bench.models["forecast"]["manifest"]["settings"]
    values = inputs.etth1_values(bench.data, list(settings["variables"]))
    sessions = inputs.forecast_sessions(values, int(settings["lookback"]), bench.counts.rsa_sessions,
                                        bench.counts.rsa_piece_rows, bench.counts.rsa_extra_pieces)
    pieces = sum(len(s.pieces) for s in sessions)
    await forecast_flows(bench, model, sessions[:1], concurrent=False)  # warm-up, untimed

    async def once(concurrent: bool) -> tuple[Span, int]:
        await bench.settle()
        return await forecast_flows(bench, model, sessions, concurrent), pieces

    rates = await concurrent_vs_sequential(bench, once, unit="pieces", count_key=None)
    return {
        "model": model,
        "sessions": len(sessions),
        "pieces": pieces,
        "rows_per_piece": bench.counts.rsa_piece_rows,
        **rates,
    }


def gpu_sessions(bench: Bench, model: Mapping[str, Any], count: int) -> list[SessionInput]:
    """One-step pieces for any loaded model: RMT segments, encoder windows, rows."""
    entry = bench.repository / model["name"] / model["version"]
    manifest, settings = model["manifest"], model["manifest"]["settings"]
    if model["task"] == "classify":
        texts = inputs.hyperpartisan_texts(bench.data)
        return inputs.classify_sessions(entry, manifest, texts, count, bench.counts.pieces)
    if model["task"] == "summarize":
        texts = inputs.bbc_texts(bench.data, count * 4)
        return inputs.summarize_sessions(entry, manifest, texts, count, bench.counts.pieces)
    values = inputs.etth1_values(bench.data, list(settings["variables"]))
    return inputs.forecast_sessions(values, int(settings["lookback"]), count, bench.counts.rsa_piece_rows,
                                    bench.counts.rsa_extra_pieces)


GPU_WINDOW_SECONDS = 2.0  # NVML's energy counter moves about every 100 ms: a window of 20 such steps or more


async def energy_window(bench: Bench, ref: str, sessions: Sequence[SessionInput],
                        meter: EnergyMeter) -> dict[str, float]:
    """Segments/s and J/segment of ``sessions`` served again and again for at least GPU_WINDOW_SECONDS.

    The energy is read once before and once after the whole window, so the sessions' opening and closing
    between the passes is in the joules (it is part of serving them); segments/s is over the pieces' time.
    """
    energy_before = meter.millijoules()
    steps, seconds = 0, 0.0
    while seconds < GPU_WINDOW_SECONDS:
        run = await served_pieces(bench.client, ref, sessions)
        steps, seconds = steps + run.steps, seconds + run.wall_seconds
    return energy_rates(meter.millijoules() - energy_before, steps, seconds)


async def run_gpu(bench: Bench, meter: EnergyMeter, described: list[dict[str, Any]]) -> dict[str, Any]:
    high = bench.counts.gpu_sessions
    on_gpu = [m for m in described if str(m.get("device", "cpu")).startswith("cuda")]
    results: dict[str, Any] = {"gpus": meter.names, "fraction_on_gpu": len(on_gpu) / len(described), "models": {}}
    for model in described:
        ref = f"{model['name']}:{model['version']}"
        sessions = gpu_sessions(bench, model, high)
        await served_pieces(bench.client, ref, sessions)  # warm-up, untimed
        row: dict[str, Any] = {"providers": model["providers"], "sessions_high": high}
        for count in (1, high):
            rates = [await energy_window(bench, ref, sessions[:count], meter) for _ in range(bench.repeats)]
            row[str(count)] = {key: median([rate[key] for rate in rates]) for key in rates[0]}
        row["joules_ratio"] = row[str(high)]["joules_per_segment"] / row["1"]["joules_per_segment"]
        results["models"][ref] = row
    return results


FLOOR_TASKS = ("forecast", "classify")
FLOOR_KEEP_ALIVE_SECONDS = 2.0  # below uvicorn's default keep-alive (5 s), which the floor server keeps


async def run_floor(bench: Bench) -> dict[str, Any]:
    """The service's server CPU per piece over the floor server's, per task, at 1 and N sessions."""
    assert bench.floor is not None, "the floor server starts with the scenario"
    service = Side("service", bench.client, bench.stopwatch.service_cpu)
    results: dict[str, Any] = {}
    for task in FLOOR_TASKS:
        reason = why_not(bench, task, {"forecast": "RSA forecaster", "classify": "RMT classifier"}[task])
        if reason:
            results[task] = {"skipped": reason}
            continue
        sessions = floor_sessions(bench, task, bench.counts.floor_sessions)
        log.info("floor: %s pieces, service vs floor server, at 1 and %d sessions", task, len(sessions))
        results[task] = {"model": bench.ref(task), **await compare(
            service, bench.floor, bench.ref(task), sessions, (1, len(sessions)), bench.repeats,
            bench.stopwatch.redis_cpu, bench.settle)}
    return results


# ---- the run -------------------------------------------------------------------------------------
def pick_models(described: list[dict[str, Any]], forecast_name: str) -> dict[str, dict[str, Any]]:
    """task -> the model measured: the first RMT classifier, the first summarizer, ``forecast_name`` (or an RSA)."""
    chosen: dict[str, dict[str, Any]] = {}
    rmt = [m for m in described if m["task"] == "classify" and m["family"] == "rmt"]
    summarizers = [m for m in described if m["task"] == "summarize"]
    forecasters = [m for m in described if m["name"] == forecast_name] or [
        m for m in described if m["task"] == "forecast" and m["family"] == "rsa"
    ]
    for task, candidates in (("classify", rmt), ("summarize", summarizers), ("forecast", forecasters)):
        if candidates:
            chosen[task] = candidates[0]
    return chosen


def service_settings(repository: Path) -> Any:
    """The service's settings as the subprocess will read them (same environment, embedded Redis)."""
    from service.settings import Settings

    return Settings(model_repository=repository, redis_url=None)


def settings_in_effect(settings: Any) -> dict[str, Any]:
    shown = ("backend", "model_backends", "device", "model_devices", "precision", "workers", "intra_op_threads",
             "intra_op_spinning", "max_batch_size", "max_batch_size_cuda", "max_queue_delay_ms", "log_level")
    in_effect: dict[str, Any] = {name: getattr(settings, name) for name in shown}
    in_effect["engine"] = "one engine process, every front end's rows" if settings.workers > 1 else "in process"
    in_effect["redis"] = "embedded"
    in_effect["api_keys"] = "set" if settings.api_keys else "none"
    return in_effect


CLASSIFY_SCENARIOS = ("e2e", "throughput", "latency")
DATASETS = {"classify": "hyperpartisan", "summarize": "bbc-news-summary", "forecast": "ETT-small"}


def why_not(bench: Bench, task: str, wanted: str) -> str | None:
    """Why the scenarios of ``task`` cannot run here, or None."""
    if task not in bench.models:
        return f"no {wanted} in the model repository"
    folder = bench.data / DATASETS[task]
    return None if folder.is_dir() else f"dataset not found at {folder} (--data)"


async def attempt(bench: Bench, scenarios: dict[str, Any], name: str, run: Coroutine[Any, Any, Any]) -> None:
    """Run one scenario; a failed request fails that scenario only, and the report says why."""
    try:
        scenarios[name] = await run
    except (BenchError, ValueError) as error:  # a failed request, or inputs the data cannot give
        log.error("%s failed: %s", name, error)
        bench.failed[name] = str(error)


async def run_classify_scenarios(bench: Bench, only: Sequence[str]) -> dict[str, Any]:
    """e2e, throughput and latency share the RMT sessions and the offline step graph."""
    entry, manifest = bench.entry("classify")
    texts = inputs.hyperpartisan_texts(bench.data)
    needed = max((*bench.counts.sessions, bench.counts.e2e_sessions))
    sessions = inputs.classify_sessions(entry, manifest, texts, needed, bench.counts.pieces)
    offline = OfflineSteps(entry, manifest, bench.models["classify"], bench.intra_op_threads, bench.intra_op_spinning)
    scenarios: dict[str, Any] = {}
    if "e2e" in only:
        log.info("e2e: 1 session, %d pieces x %d sessions", bench.counts.pieces, bench.counts.e2e_sessions)
        await attempt(bench, scenarios, "e2e", run_e2e(bench, sessions[: bench.counts.e2e_sessions], offline))
    if "throughput" in only:
        log.info("throughput: %s concurrent sessions", bench.counts.sessions)
        await attempt(bench, scenarios, "throughput", run_throughput(bench, sessions, offline))
    if "latency" in only:
        log.info("latency: whole sessions at %s concurrent", bench.counts.sessions)
        await attempt(bench, scenarios, "latency", run_latency(bench, sessions))
    return scenarios


# scenario -> (the task it needs a model of, that model in words, the scenario)
TASK_SCENARIOS: dict[str, tuple[str, str, Callable[[Bench], Coroutine[Any, Any, dict[str, Any]]]]] = {
    "articles": ("summarize", "summarization model", run_articles),
    "decode": ("summarize", "summarization model", run_decode),
    "rsa": ("forecast", "RSA forecaster", run_rsa),
}


async def run_scenarios(bench: Bench, only: Sequence[str], meter: EnergyMeter,
                        described: list[dict[str, Any]]) -> dict[str, Any]:
    scenarios: dict[str, Any] = {}
    classify = [name for name in CLASSIFY_SCENARIOS if name in only]
    if classify:
        reason = why_not(bench, "classify", "RMT classifier")
        if reason:
            bench.skipped |= dict.fromkeys(classify, reason)
        else:
            scenarios |= await run_classify_scenarios(bench, classify)
    for name, (task, wanted, run) in TASK_SCENARIOS.items():
        if name not in only:
            continue
        reason = why_not(bench, task, wanted)
        if reason:
            bench.skipped[name] = reason
            continue
        log.info("%s: %d %s", name, bench.counts.rsa_sessions if task == "forecast" else bench.counts.articles,
                 "forecast sessions" if task == "forecast" else "BBC articles")
        await attempt(bench, scenarios, name, run(bench))
    if "floor" in only:
        await attempt(bench, scenarios, "floor", run_floor(bench))
    if "gpu" in only:
        if meter.available:
            log.info("gpu: every model at 1 and %d sessions", bench.counts.gpu_sessions)
            await attempt(bench, scenarios, "gpu", run_gpu(bench, meter, described))
        else:
            bench.skipped["gpu"] = f"GPU rows skipped (no GPU): {meter.reason}"
    return scenarios


async def measure(options: argparse.Namespace, counts: Counts, meter: EnergyMeter) -> dict[str, Any]:
    from service.embedded_redis import EmbeddedRedis

    service = service_settings(options.model_repository)
    settings = settings_in_effect(service)
    port = options.port or free_port()
    log_path = options.server_log or Path(tempfile.mkdtemp(prefix="rtserve-bench-")) / "server.log"
    api_key = service.api_keys[0] if service.api_keys else None
    connections = max((*counts.sessions, counts.articles, counts.rsa_sessions, counts.gpu_sessions,
                       counts.floor_sessions)) + 4
    client = Client(f"http://{HOST}:{port}", api_key, connections, service.keep_alive_timeout_seconds / 2)
    floor_client: Client | None = None
    floor: Server | None = None
    with EmbeddedRedis() as redis:  # the bench's: the service and the floor server share it, its CPU apart
        server = Server.rtserve(options.model_repository, port, log_path, redis.url)
        log.info("service starting on port %d (log: %s)", port, log_path)
        try:
            await server.wait_ready(client, options.startup_timeout)
            described = await client.models()
            bench = Bench(client, options.model_repository, options.data, counts, options.repeats,
                          int(settings["intra_op_threads"]), bool(settings["intra_op_spinning"]),
                          pick_models(described, options.forecast_model), Stopwatch(server.process.pid, redis.pid))
            if "floor" in options.only:
                refs = [bench.ref(task) for task in FLOOR_TASKS if task in bench.models]
                floor_port = free_port()
                floor = Server(floor_command(options.model_repository, refs, redis.url, HOST, floor_port),
                               server_environment(options.model_repository, floor_port, redis.url), floor_port,
                               log_path.with_name("floor.log"))
                floor_client = Client(floor.url, None, connections, FLOOR_KEEP_ALIVE_SECONDS)
                await floor.wait_ready(floor_client, options.startup_timeout)
                bench.floor = Side("floor", floor_client, lambda: tree_cpu_seconds(psutil.Process(floor.process.pid)))
            scenarios = await run_scenarios(bench, options.only, meter, described)
        finally:
            await client.close()
            if floor_client is not None:
                await floor_client.close()
            if floor is not None:
                floor.stop()
            code = server.stop()
    if code not in (0, -signal.SIGTERM):
        bench.notes.append(f"the service exited with {code} on SIGTERM (log: {log_path})")
    if {"e2e", "throughput"} & set(scenarios):
        bench.notes.append(
            "Redis share = time in the Redis histogram for the segment route's operations "
            f"({', '.join(SEGMENT_ROUTE_REDIS_OPERATIONS)}: every round trip of an applied piece) / that "
            "route's request time; safetensors encoding of the state is not in it"
        )
    return {
        "settings": settings,
        "models": {task: f"{m['name']}:{m['version']}" for task, m in bench.models.items()},
        "backends": {f"{m['name']}:{m['version']}": m["providers"] for m in described},
        "scenarios": scenarios,
        "skipped": bench.skipped,
        "failed": bench.failed,
        "notes": bench.notes,
    }


def parse_options(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="rtserve bench", formatter_class=HelpFormatter,
        description="Start the service (embedded Redis) and measure it: e2e/step, served/offline throughput, "
        "concurrency gains, session latency, Redis share, GPU energy. Writes JSON and a markdown table.",
    )
    parser.add_argument("--model-repository", type=Path,
                        default=Path(os.environ.get("RTSERVE_MODEL_REPOSITORY", "model_repository")))
    parser.add_argument("--data", type=Path, default=Path("../shared/data"), help="the shared datasets folder")
    parser.add_argument("--out-json", type=Path, help="default: docs/bench-<machine>.json")
    parser.add_argument("--out-md", type=Path, help="default: docs/bench-<machine>.md")
    parser.add_argument("--quick", action="store_true", help="tiny counts, one repeat (a smoke test)")
    parser.add_argument("--repeats", type=int, help="served/offline alternations per scenario (default 3; quick 1)")
    parser.add_argument("--port", type=int, help="default: a free loopback port")
    parser.add_argument("--only", default=",".join(SCENARIOS), help=f"comma-separated subset of {','.join(SCENARIOS)}")
    parser.add_argument("--forecast-model", default="rsa-etth1-h24", help="the forecaster of the `rsa` scenario")
    parser.add_argument("--server-log", type=Path, help="where the service's output goes (default: a temp file)")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for /readyz")
    options = parser.parse_args(argv)
    options.only = [name.strip() for name in options.only.split(",") if name.strip()]
    unknown = sorted(set(options.only) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; choose from {','.join(SCENARIOS)}")
    if options.repeats is None:
        options.repeats = 1 if options.quick else 3
    if options.repeats < 1:
        parser.error("--repeats must be at least 1")
    if not (options.model_repository.is_dir() and any(options.model_repository.glob("*/*/manifest.json"))):
        parser.error(f"no model repository at {options.model_repository}: run `make model-repository` first")
    return options


def main(argv: Sequence[str] | None = None, meter: EnergyMeter | None = None) -> int:
    options = parse_options(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rtserve bench: %(message)s", stream=sys.stderr)
    meter = meter or EnergyMeter()
    counts = QUICK if options.quick else Counts()
    machine = machine_info(meter.names)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        measured = asyncio.run(measure(options, counts, meter))
    except BenchError as error:
        print(f"rtserve bench: {error}", file=sys.stderr)
        return 1
    results = {
        "machine": machine,
        "command": " ".join(["rtserve bench", *(argv if argv is not None else sys.argv[1:])]),
        "started_at": started_at,
        "repeats": options.repeats,
        "counts": {name: getattr(counts, name) for name in counts.__dataclass_fields__},
        **measured,
    }
    if options.quick:
        results["notes"].insert(0, "--quick: tiny counts, a smoke test of the instrument, not a measurement")
    results["targets"] = check_targets(results["scenarios"], on_gpu=meter.available)
    slug = machine_slug(machine)
    json_path = options.out_json or Path("docs") / f"bench-{slug}.json"
    markdown_path = options.out_md or Path("docs") / f"bench-{slug}.md"
    print(write_reports(results, json_path, markdown_path))
    print(f"wrote {json_path} and {markdown_path}")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
