"""Where the service's CPU per piece goes, layer by layer: py-spy samples of the serving process under load.

    .venv/bin/pip install py-spy
    .venv/bin/python benchmarks/piece_profile.py --task forecast --sessions 32 [--transport stream|binary-stream|http]
    .venv/bin/python benchmarks/piece_profile.py --profiler perf ...   # by thread and shared object, with Linux perf

The pieces go over HTTP (``POST /sessions/{id}/segments``) or over each session's stream (a WebSocket; rows as JSON
text or, with ``binary-stream``, as binary frames).

Method: the service starts as ``rtserve bench`` starts it (the bench's embedded Redis); after a warm-up, in each
of ``--rounds`` rounds the client opens the sessions (and their streams), then ``py-spy record --pid --gil``
samples the thread holding the GIL while the client sends the sessions' RSA or RMT pieces at the given
concurrency, then the sessions are finished and deleted: what is measured (samples and CPU) is the pieces' alone.
The event loop's thread's samples go to one layer each:
the first named layer found anywhere on the stack (the digest, the state codec, a piece's lock,
metrics, logging, the graph), else the layer of the innermost frame whose module is known (validation,
dependencies, routing, middleware, HTTP, Redis client, batcher hand-off, session flow, pipeline), else
the event loop (uvloop's C code and asyncio). A layer's CPU per piece is its share of those samples
times the event loop thread's CPU per piece over the same span (``/proc/<pid>/task/<pid>/schedstat``);
the other threads' CPU (the graph's thread with ONNX Runtime's pool) is one row, so the rows add up to
the process's CPU. A lone request's light step runs on the event loop's thread with the GIL released: its
CPU is in that thread's but in none of the samples, so it is spread over the layers in proportion. Shares
are of wall-clock samples: on a machine whose cores are oversubscribed a thread preempted while it holds
the GIL is still sampled, so the split is as good as preemption is even. py-spy runs in its own process; it
pauses the target briefly at each sample, which costs the target's wall time, not its CPU.
The lease keeper's samples are counted apart, outside the shares: it renews every lease the replica holds on a
clock, whatever the pieces, and most of its samples fall in the second each round's open streams wait, idle, for
py-spy to attach (on one Intel Xeon 2-core machine 10-17 % of the loop's samples for three or four renewals a round,
each 0.2 ms of CPU timed alone), which the pieces' CPU does not cover.

With ``--profiler perf``, ``perf record`` samples the service's threads and its Redis on the CPU clock instead (native
code too: the interpreter, ONNX Runtime, numpy, the kernel), and the table splits the CPU per piece by thread (the
event loop's, the service's other threads, Redis) and shared object: each row's samples over all of them, times the
service's and Redis's CPU per piece. It needs Linux ``perf`` and leave to read the processes' counters
(``kernel.perf_event_paranoid`` at most 2, or root).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# named layers: a sample belongs to the first of these found anywhere on its stack (outermost first)
NAMED = [
    ("graph (ONNX Runtime)", re.compile(r"^run \(.*onnxruntime|OnnxBackend\.run|_coerce \(")),
    ("leases (a piece's lock)", re.compile(r"Leases\.")),
    ("digest", re.compile(r"piece_digest \(")),
    ("state codec", re.compile(r"encode_tensors \(|decode_tensors \(|_state \(.*sessions/store\.py")),
    ("metrics", re.compile(r"prometheus_client|service/metrics\.py")),
    ("logging", re.compile(r"[(/]logging/|service/logs\.py")),
]
# module layers: the innermost frame whose file matches
MODULES = [
    ("validation and serialization (pydantic, FastAPI's body and answer)",
     re.compile(r"pydantic|fastapi/_compat|fastapi/encoders|service/schemas\.py|service/errors\.py|"
                r"_validate_|serialize_response|request_body_to_args|rows_to_array")),
    ("dependencies (FastAPI's solver, API key, owner)",
     re.compile(r"fastapi/dependencies|service/dependencies\.py|service/auth\.py|fastapi/security")),
    ("routing and handler", re.compile(r"fastapi/routing|starlette/routing|service/routers|service/fast_path|"
                                       r"starlette/requests|starlette/responses|starlette/_exception|"
                                       r"fastapi/applications|starlette/applications|starlette/datastructures")),
    ("middleware", re.compile(r"service/middleware\.py|service/shutdown\.py|starlette/middleware")),
    ("Redis client (redis-py, hiredis)", re.compile(r"[(/]redis/|hiredis")),
    ("batcher hand-off", re.compile(r"service/runtime/(batcher|graph_runner|batching)\.py|concurrent/futures|"
                                    r"threading\.py")),
    ("session flow and store (kept states, commits)", re.compile(r"service/session_flow\.py|service/sessions/")),
    ("pipeline (forecast / classify, numpy, tokenizer)",
     re.compile(r"service/runtime/(forecast|classify|pipeline)\.py|[(/]models/|numpy|tokenizers")),
    ("JSON", re.compile(r"[(/]json/|orjson")),
    ("HTTP and WebSocket server (uvicorn, httptools, websockets)", re.compile(r"uvicorn/|httptools|[(/]websockets/|"
                                                                             r"starlette/websockets")),
]
EVENT_LOOP = "event loop (uvloop, asyncio)"
# work on a clock, not per piece: its samples are counted apart, outside the shares
PERIODIC = re.compile(r"Leases\._keep \(")
KEEPER = "lease keeper"


def layer_of(stack: list[str]) -> str:
    for name, pattern in NAMED:
        if any(pattern.search(frame) for frame in stack):
            return name
    for frame in reversed(stack):  # innermost first
        for name, pattern in MODULES:
            if pattern.search(frame):
                return name
    return EVENT_LOOP


PERF_ROW = re.compile(r"^\s*(\d+)\s+(\d+):(\S+)\s+(\S.*?)\s*$")  # samples, thread id:command, shared object


def read_perf_report(text: str, loop_thread: int, redis_threads: set[int]) -> Counter[tuple[str, str]]:
    """Samples by (thread, shared object) from ``perf report --sort pid,dso -F sample,pid,dso`` (its ``pid`` is the
    thread's id): the event loop's thread (``loop_thread``, the process's main thread), Redis (``redis_threads``, its
    process's threads), the service's other threads."""
    shares: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        row = PERF_ROW.match(line)
        if row is None or line.lstrip().startswith("#"):
            continue
        samples, thread, library = int(row[1]), int(row[2]), row[4]
        if thread == loop_thread:
            who = "the event loop's thread"
        elif thread in redis_threads:
            who = "Redis"
        else:
            who = "the service's other threads (the graph's)"
        shares[who, library.split(".cpython")[0]] += samples
    return shares


def read_samples(path: Path) -> Counter[str]:
    """The event loop's thread's samples by layer (other threads' stacks start at ``Thread._bootstrap``)."""
    layers: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not stack or any(frame.startswith("Thread._bootstrap ") for frame in frames[:2]):
            continue
        layers[KEEPER if any(PERIODIC.search(frame) for frame in frames) else layer_of(frames)] += int(count)
    return layers


async def drive(url: str, task: str, sessions_count: int, repository: Path, data: Path, rounds: int,
                pid: int, redis_pid: int, spy_out: Path, rate: int,
                transport: str, profiler: str = "py-spy") -> tuple[Counter[Any], float, float, float, int]:
    import aiohttp

    from loadtest import bench_inputs as inputs
    from loadtest.closed_loop import RTSERVE_TRANSPORTS, SessionDriver, Target
    from loadtest.harness import Client, thread_cpu_seconds, tree_cpu_seconds

    client = Client(url, None, 4, 2.0)
    models = await client.models()
    await client.close()
    model = next(m for m in models if m["task"] == task and m["family"] in ("rsa", "rmt"))
    entry = repository / model["name"] / model["version"]
    if task == "forecast":
        settings = model["manifest"]["settings"]
        values = inputs.etth1_values(data, list(settings["variables"]))
        sessions = inputs.forecast_sessions(values, int(settings["lookback"]), max(sessions_count, 32), 24, 12)
    else:
        sessions = inputs.classify_sessions(entry, model["manifest"], inputs.hyperpartisan_texts(data),
                                            max(sessions_count, 32), 8)
    ref = f"{model['name']}:{model['version']}"
    target = Target(RTSERVE_TRANSPORTS[transport], url, ref)
    chosen = sessions[:sessions_count] if sessions_count > 1 else sessions[:8]
    http = aiohttp.ClientSession(url, headers={"content-type": "application/json"},
                                 connector=aiohttp.TCPConnector(limit=0))

    async def open_all() -> list[SessionDriver]:  # the session and its stream, before the clock: not the pieces' CPU
        drivers = [SessionDriver(http, target, s.pieces, 0) for s in chosen]
        for driver in drivers:
            await driver.open()
        return drivers

    async def send(drivers: list[SessionDriver]) -> int:
        if sessions_count > 1:
            await asyncio.gather(*(driver.pieces() for driver in drivers))
        else:
            for driver in drivers:
                await driver.pieces()
        return sum(len(s.pieces) for s in chosen)

    warm = await open_all()
    await send(warm)  # warm-up
    await asyncio.gather(*(driver.close() for driver in warm))
    server, redis = psutil.Process(pid), psutil.Process(redis_pid)
    cpu = main = redis_cpu = 0.0
    pieces = 0
    spy_out.write_text("")
    perf_rows: Counter[tuple[str, str]] = Counter()
    for round_number in range(rounds):  # each round's sessions and streams opened and closed outside what is measured
        drivers = await open_all()
        round_out = spy_out.with_suffix(".round")
        if profiler == "perf":
            command = ["perf", "record", "--freq", str(rate), "--pid", f"{pid},{redis_pid}", "--output",
                       str(spy_out.with_name(f"perf.{round_number}.data"))]
        else:
            command = [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid), "--gil",
                       "--format", "raw", "--rate", str(rate), "--output", str(round_out)]
        spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        await asyncio.sleep(1.0)  # the profiler attached (an idle event loop holds no GIL: no py-spy samples)
        cpu_before, main_before = tree_cpu_seconds(server), thread_cpu_seconds(pid, pid)
        redis_before = tree_cpu_seconds(redis)
        pieces += await send(drivers)
        cpu += tree_cpu_seconds(server) - cpu_before
        main += thread_cpu_seconds(pid, pid) - main_before
        redis_cpu += tree_cpu_seconds(redis) - redis_before
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
        if spy.returncode not in (0, -signal.SIGINT):  # it could not attach: say why, not a parser's traceback
            assert spy.stderr is not None
            raise SystemExit(f"{command[0]} record failed: {spy.stderr.read().decode(errors='replace')[-1000:]}")
        if profiler == "perf":
            report = subprocess.run(["perf", "report", "--input", str(spy_out.with_name(f"perf.{round_number}.data")),
                                     "--stdio", "--sort", "pid,dso", "--fields", "sample,pid,dso"],
                                    capture_output=True, text=True, check=True)
            redis_threads = {thread.id for thread in redis.threads()}
            perf_rows += read_perf_report(report.stdout, pid, redis_threads)
        else:
            with spy_out.open("a") as samples:
                samples.write(round_out.read_text())
        await asyncio.gather(*(driver.close() for driver in drivers))
    await http.close()
    if profiler == "perf":
        return perf_rows, cpu, main, redis_cpu, pieces
    return read_samples(spy_out), cpu, main, redis_cpu, pieces


def print_by_thread(rows: Counter[tuple[str, str]], cpu: float, redis_cpu: float, pieces: int, what: str,
                    folder: Path) -> None:
    """The CPU per piece of the service and its Redis by thread and shared object (rows under half a percent of the
    samples summed as "others" per thread)."""
    total = sum(rows.values())
    per_piece = 1000 * (cpu + redis_cpu) / pieces
    print(f"{what}: {pieces} pieces, {1000 * cpu / pieces:.3f} ms of service CPU and {1000 * redis_cpu / pieces:.3f} "
          f"of Redis's per piece; {total} perf samples ({folder})")
    print("| thread | shared object | share of the samples | ms per piece |\n|---|---|---|---|")
    others: Counter[str] = Counter()
    for (thread, library), count in rows.most_common():
        if count < total / 200:
            others[thread] += count
        else:
            print(f"| {thread} | {library} | {100 * count / total:.1f} % | {per_piece * count / total:.3f} |")
    for thread, count in others.most_common():
        print(f"| {thread} | others | {100 * count / total:.1f} % | {per_piece * count / total:.3f} |")


def main() -> None:
    from loadtest.closed_loop import RTSERVE_TRANSPORTS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--task", choices=("forecast", "classify"), default="forecast")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--transport", choices=tuple(RTSERVE_TRANSPORTS), default="http",
                        help="pieces as HTTP requests or over each session's stream (rows as JSON or binary frames)")
    parser.add_argument("--rounds", type=int, default=8, help="times every session's pieces are sent")
    parser.add_argument("--profiler", choices=("py-spy", "perf"), default="py-spy",
                        help="py-spy: the event loop's Python by layer; perf: every thread by shared object")
    parser.add_argument("--rate", type=int, default=None,
                        help="samples per second per thread (default: py-spy 200, perf 999)")
    options = parser.parse_args()
    if options.profiler == "perf" and shutil.which("perf") is None:
        parser.error("--profiler perf needs Linux perf on the PATH (Debian: apt install linux-perf)")
    rate = options.rate or (999 if options.profiler == "perf" else 200)

    from loadtest.harness import Server, free_port
    from service.embedded_redis import EmbeddedRedis

    folder = Path(tempfile.mkdtemp(prefix="rtserve-profile-"))
    port = free_port()
    with EmbeddedRedis() as redis:
        server = Server.rtserve(options.model_repository, port, folder / "server.log", redis.url)
        try:
            from loadtest.harness import Client

            async def ready() -> None:
                client = Client(server.url, None, 2, 2.0)
                await server.wait_ready(client, 600)
                await client.close()

            asyncio.run(ready())
            layers, cpu, main, redis_cpu, pieces = asyncio.run(drive(server.url, options.task, options.sessions,
                                                    options.model_repository, options.data, options.rounds,
                                                    server.process.pid, redis.pid, folder / "spy.txt",
                                                    rate, options.transport, options.profiler))
        finally:
            server.stop()
    if options.profiler == "perf":
        print_by_thread(layers, cpu, redis_cpu, pieces, f"{options.task}, {options.sessions} session(s), "
                        f"{options.transport}", folder)
        return
    keeper = layers.pop(KEEPER, 0)
    total = sum(layers.values())
    per_piece, loop = 1000 * cpu / pieces, 1000 * main / pieces
    print(f"{options.task}, {options.sessions} session(s), {options.transport}: {pieces} pieces, {per_piece:.3f} ms "
          "of service CPU per "
          f"piece, {loop:.3f} of it on the event loop's thread ({total} samples there, {folder / 'spy.txt'})")
    print(f"(the lease keeper's {keeper} samples are left out of the shares: it renews the held leases every third of "
          "a lease, whatever the pieces, mostly while each round's streams wait, idle, for py-spy to attach)")
    print("| layer | share of the loop's samples | ms per piece |\n|---|---|---|")
    for name, count in layers.most_common():
        print(f"| {name} | {100 * count / total:.1f} % | {loop * count / total:.3f} |")
    print(f"| the graph's thread and ONNX Runtime's pool (the step, its wrapper) | | {per_piece - loop:.3f} |")
    print(f"| Redis (redis-server: the commits' scripts) | | {1000 * redis_cpu / pieces:.3f} |")


if __name__ == "__main__":
    main()
