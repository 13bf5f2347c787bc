"""``rtserve bench``: the serving benchmark, one run on whatever machine it runs on.

This module is the command: its options, starting the servers, running the chosen scenarios and writing the
report. The parts: :mod:`loadtest.harness` (a server in a subprocess, the HTTP client, CPU clocks),
:mod:`loadtest.metrics` (``/metrics`` deltas), :mod:`loadtest.sessions` (driving sessions),
:mod:`loadtest.offline` (the step graph alone), :mod:`loadtest.bench_inputs` (the prepared pieces),
:mod:`loadtest.scenarios` (one module per group of scenarios) and :mod:`loadtest.bench_report` (JSON, markdown).

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
   - ``triton``: rtserve beside Triton 2.51's sequence batcher serving the same ``step.onnx`` (RSA rows, RMT
     text), one multi-process closed-loop client for both, at 1, 16 and 32 sessions: pieces/s, p50/p99, each
     server's CPU per piece and the client's, ratios (:mod:`loadtest.scenarios.triton`); skipped, saying why and
     how to get it (``make peers``), without the peer venv (``--triton-venv``).
   - ``sweep`` (only when asked for): rtserve's capacity per model over rising session counts
     (:mod:`loadtest.scenarios.sweep`).

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
4. Stop the service (SIGTERM, wait), write the JSON and the markdown table, print the table. Before the service
   starts and after it stops, the machine's pace is taken (:mod:`loadtest.machine_pace`: ten million Python
   additions and the forecaster's step alone, CPU time each); the report gives both and says when they differ.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from loadtest.bench_floor import Side, floor_command
from loadtest.bench_gpu import EnergyMeter
from loadtest.bench_report import check_targets, machine_info, machine_slug, write_reports
from loadtest.harness import (
    HOST,
    BenchError,
    Client,
    Server,
    Stopwatch,
    free_port,
    server_environment,
    tree_cpu_seconds,
)
from loadtest.machine_pace import drift_note, pace
from loadtest.metrics import SEGMENT_ROUTE_REDIS_OPERATIONS
from loadtest.scenarios.classify import CLASSIFY_SCENARIOS, run_classify_scenarios
from loadtest.scenarios.common import QUICK, Bench, Counts, attempt, why_not
from loadtest.scenarios.floor import FLOOR_KEEP_ALIVE_SECONDS, FLOOR_TASKS, run_floor
from loadtest.scenarios.forecast import run_rsa
from loadtest.scenarios.gpu import run_gpu
from loadtest.scenarios.summarize import run_articles, run_decode
from loadtest.scenarios.sweep import run_sweep, sweep_notes
from loadtest.scenarios.triton import PER_PIECE, client_limited_notes, run_triton, unavailable_reason
from loadtest.triton.server import VENV_VARIABLE
from models.cli_help import HelpFormatter

log = logging.getLogger("rtserve.bench")

SCENARIOS = ("e2e", "throughput", "latency", "articles", "decode", "rsa", "floor", "gpu", "triton", "sweep")
DEFAULT_SCENARIOS = SCENARIOS[:-1]  # the sweep runs when asked for (--only sweep): it takes minutes per model
RESULTS = Path("bench-results")  # where a run's reports go unless told (the reports in docs/ were copied from there)


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


def forecaster_step(repository: Path, name: str) -> Path | None:
    """The ONNX step graph of the forecaster the bench measures (:func:`pick_models`' choice among the repository's
    manifests), found before the service starts; None where it has none, or its file is missing (a carried copy)."""
    from service.runtime.registry import discover  # the entries as the service finds them

    manifests = [json.loads((entry / "manifest.json").read_text()) | {"entry": entry}
                 for versions in discover(repository).values() for entry in versions.values()]
    chosen = pick_models(manifests, name).get("forecast")
    step = next((graph for graph in chosen.get("graphs", []) if graph.get("name") == "step"), None) if chosen else None
    if step is None or "onnx" not in step.get("files", {}):
        return None
    path = chosen["entry"] / step["files"]["onnx"]
    return path if path.is_file() else None


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
    if "triton" in only:
        await run_triton_side(bench, scenarios)
    if "sweep" in only:
        await attempt(bench, scenarios, "sweep", run_sweep(bench))
        bench.notes += sweep_notes(scenarios.get("sweep") or {})
    return scenarios


async def run_triton_side(bench: Bench, scenarios: dict[str, Any]) -> None:
    """rtserve beside Triton, or why not (no peer venv: skipped, saying how to get it; the bench goes on)."""
    install = unavailable_reason(bench.options.triton_venv)
    if isinstance(install, str):
        log.warning("%s", install)
        bench.skipped["triton"] = install
        return
    await attempt(bench, scenarios, "triton", run_triton(bench, install))
    if "triton" in scenarios:
        bench.notes += [f"triton: {line}" for line in PER_PIECE]
        bench.notes += client_limited_notes(scenarios["triton"])


async def measure(options: argparse.Namespace, counts: Counts, meter: EnergyMeter) -> dict[str, Any]:
    from service.embedded_redis import EmbeddedRedis

    service = service_settings(options.model_repository)
    settings = settings_in_effect(service)
    port = options.port or free_port()
    log_path = options.server_log or Path(tempfile.mkdtemp(prefix="rtserve-bench-")) / "server.log"
    api_key = service.api_keys[0] if service.api_keys else None
    connections = max((*counts.sessions, counts.articles, counts.rsa_sessions, counts.gpu_sessions,
                       counts.floor_sessions)) + 4
    client_url = f"http://{HOST}:{port}"
    client = Client(client_url, api_key, connections, service.keep_alive_timeout_seconds / 2)
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
                          pick_models(described, options.forecast_model), Stopwatch(server.process.pid, redis.pid),
                          url=client_url, api_key=api_key, options=options, log_folder=log_path.parent)
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
    parser.add_argument("--out-json", type=Path, help=f"default: {RESULTS}/bench-<machine>.json")
    parser.add_argument("--out-md", type=Path, help=f"default: {RESULTS}/bench-<machine>.md")
    parser.add_argument("--quick", action="store_true", help="tiny counts, one repeat (a smoke test)")
    parser.add_argument("--repeats", type=int, help="served/offline alternations per scenario (default 3; quick 1)")
    parser.add_argument("--port", type=int, help="default: a free loopback port")
    parser.add_argument("--only", default=",".join(DEFAULT_SCENARIOS),
                        help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all but sweep)")
    parser.add_argument("--forecast-model", default="rsa-etth1-h24", help="the forecaster of the `rsa` scenario")
    parser.add_argument("--server-log", type=Path, help="where the service's output goes (default: a temp file)")
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for /readyz")
    parser.add_argument("--triton-venv", type=Path, default=None,
                        help=f"the Triton peer's venv (`make peers`; default: ${VENV_VARIABLE}, else .venv-peers)")
    parser.add_argument("--triton-queue-delays-ms", default="0",
                        help="Triton's sequence batcher max_queue_delay, one configuration each (e.g. 0,5: rtserve's)")
    parser.add_argument("--client-processes", type=int, default=None,
                        help="processes of the closed-loop client of `triton` and `sweep` (default: the usable cores)")
    parser.add_argument("--sweep-max", type=int, default=None,
                        help="the most concurrent sessions the sweep tries (of 1, 8, 32, 128, 512; default 512)")
    options = parser.parse_args(argv)
    options.only = [name.strip() for name in options.only.split(",") if name.strip()]
    unknown = sorted(set(options.only) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; choose from {','.join(SCENARIOS)}")
    if options.repeats is None:
        options.repeats = 1 if options.quick else 3
    if options.repeats < 1:
        parser.error("--repeats must be at least 1")
    try:
        options.triton_queue_delays_ms = [float(x) for x in options.triton_queue_delays_ms.split(",") if x.strip()]
    except ValueError:
        parser.error("--triton-queue-delays-ms takes milliseconds separated by commas, e.g. 0,5")
    if options.client_processes is not None and options.client_processes < 1:
        parser.error("--client-processes must be at least 1")
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
    step = forecaster_step(options.model_repository, options.forecast_model)
    before = pace(step)  # how fast the machine runs, before and after (loadtest.machine_pace)
    try:
        measured = asyncio.run(measure(options, counts, meter))
    except BenchError as error:
        print(f"rtserve bench: {error}", file=sys.stderr)
        return 1
    after = pace(step)
    machine["pace"] = {"before": before, "after": after}
    drifted = drift_note(before, after)
    if drifted:
        measured["notes"].append(drifted)
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
    json_path = options.out_json or RESULTS / f"bench-{slug}.json"
    markdown_path = options.out_md or RESULTS / f"bench-{slug}.md"
    print(write_reports(results, json_path, markdown_path))
    print(f"wrote {json_path} and {markdown_path}")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
