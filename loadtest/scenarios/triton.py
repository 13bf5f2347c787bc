"""The ``triton`` scenario: rtserve beside NVIDIA Triton 2.51's sequence batcher, serving the same exported step
graph, under one closed-loop client in the same run (what a user choosing between the two servers would measure).

Triton side (:mod:`loadtest.triton`): ``tritonserver`` from the peer venv (``make peers``), the python backend
running :mod:`loadtest.triton.model` over the rtserve entry's own ``step.onnx`` and ``initial_state.safetensors``,
each sequence's state kept per correlation id; sequence batcher ``oldest``, up to 32 requests a batch, one CPU
instance, ``max_queue_delay`` 0 (and with ``--triton-queue-delays-ms 0,5`` also rtserve's own 5 ms). ONNX
Runtime gets rtserve's intra-op threads (the setting, else the manifest's: one for RSA).

Per model (the RSA forecaster: rows; the RMT classifier: text, every piece exactly one segment, cut by the same
cutter on both servers) and per session count (1, 16, 32): N sessions at a time each send K pieces in order,
waiting for each answer (:mod:`loadtest.closed_loop`, several client processes), more sessions following in the N
slots until a run holds at least ``triton_rsa_min_pieces`` pieces (RMT: ``triton_rmt_min_pieces``), over rtserve's
HTTP route, rtserve's session stream (where this rtserve serves it; for RSA also with binary row frames) and
Triton's KServe v2 HTTP/JSON ``infer``. The
sides take turns run by run, in an order that reverses from one repeat to the next; medians over ``--repeats``,
every run kept in the JSON.
Per side: pieces/s, p50 and p99 piece latency, server CPU per piece (the server's whole process tree: rtserve's
with the bench's Redis, Triton's with its backend stubs), the client's CPU per piece, whether the client was the
limit, and the mean batch: the pieces a step of the graph held, by each server's own count (rtserve's
``rtserve_batch_size``, Triton's statistics extension), read just before and after the run. Ratios rtserve /
Triton are the medians of the ratios within a repeat. The first repeat's last answer of every session is compared
across the servers (the same forecast / probabilities for the same pieces).
"""

from __future__ import annotations

import asyncio
import math
import os
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from loadtest import bench_inputs as inputs
from loadtest.bench_inputs import SessionInput
from loadtest.closed_loop import ClientPool, Run, Target, default_processes, figures
from loadtest.harness import BenchError, Client, median, tree_cpu_seconds
from loadtest.metrics import metric_sum
from loadtest.scenarios.common import Bench, log, why_not
from loadtest.triton.repository import TritonModel, write_model
from loadtest.triton.server import HOW_TO_GET_IT, TritonInstall, TritonServer, find_triton, triton_venv

TASKS = {"forecast": "RSA forecaster", "classify": "RMT classifier"}
RATIO_KEYS = ("pieces_per_second", "p50_ms", "p99_ms", "server_cpu_ms_per_piece")

# what each server does per piece that the other does not: in the report beside the figures
PER_PIECE = [
    "per piece, rtserve does what Triton does not: checks the piece number (seq) and replays the stored answer of "
    "a retried piece, reads and writes the session's state in Redis (durable across a restart of a replica, "
    "shared by replicas), locks the session, counts it in /metrics",
    "per piece, Triton does what rtserve does not: hands each batch from the server process to its python "
    "backend's stub process and back (shared-memory IPC). Its state lives in that stub process only: no piece "
    "numbers, no replay of a retry, no durability (a restart loses every sequence)",
    "both run the same step.onnx with ONNX Runtime from the same initial state; for RMT both cut the piece's text "
    "with the same cutter and the entry's tokenizer, one segment step per piece",
]


def unavailable_reason(venv: Path | None) -> TritonInstall | str:
    """The Triton install, or why the side is skipped and how to get it."""
    found = find_triton(triton_venv(venv))
    return found if isinstance(found, TritonInstall) else f"Triton side skipped: {found}; {HOW_TO_GET_IT}"


@dataclass(frozen=True)
class Side:
    """One server and transport of the comparison."""

    name: str  # rtserve-http, rtserve-ws, triton-0ms, ...
    target: Target
    server_cpu: Callable[[], float]
    batches: Callable[[], Awaitable[tuple[float, float]]]  # the server's requests and batch steps so far

    @property
    def rtserve(self) -> bool:
        return self.name.startswith("rtserve")

    @property
    def binary(self) -> bool:
        """Its rows go as binary data (rtserve's binary stream frames, Triton's binary tensor extension)."""
        return self.name.endswith("-binary")


def rtserve_batches(client: Client, ref: str) -> Callable[[], Awaitable[tuple[float, float]]]:
    """The rows and the steps of model ``ref``'s batches so far, from the service's ``/metrics`` (none read: 0, 0,
    and the run's mean batch is not reported)."""
    async def read() -> tuple[float, float]:
        try:
            samples = await client.metrics()
        except BenchError:
            return 0.0, 0.0
        return (metric_sum(samples, "rtserve_batch_size_sum", model=ref),
                metric_sum(samples, "rtserve_batch_size_count", model=ref))
    return read


def triton_batches(client: Client, model: str) -> Callable[[], Awaitable[tuple[float, float]]]:
    """The requests and the executions of Triton's ``model`` so far, from its statistics extension (none read: 0, 0,
    and the run's mean batch is not reported)."""
    async def read() -> tuple[float, float]:
        try:
            stats = (await client.get_json(f"/v2/models/{model}/stats"))["model_stats"][0]
            return float(stats["inference_count"]), float(stats["execution_count"])
        except (BenchError, KeyError, IndexError, TypeError, ValueError):
            return 0.0, 0.0
    return read


def sessions_for(bench: Bench, task: str, count: int, pieces: int | None = None) -> list[SessionInput]:
    """RMT: documents cut into ``pieces`` one-segment pieces (default ``counts.pieces``); RSA: ETTh1 rows, the
    look-back then ``pieces`` more (default ``counts.triton_rsa_extra_pieces``)."""
    entry, manifest = bench.entry(task)
    if task == "classify":
        return inputs.classify_sessions(entry, manifest, inputs.hyperpartisan_texts(bench.data), count,
                                        pieces or bench.counts.pieces)
    settings = manifest["settings"]
    values = inputs.etth1_values(bench.data, list(settings["variables"]))
    return inputs.forecast_sessions(values, int(settings["lookback"]), count, bench.counts.rsa_piece_rows,
                                    pieces or bench.counts.triton_rsa_extra_pieces)


def answer_vector(task: str, side: Side, answer: Any) -> np.ndarray | None:
    """The part of an answer both servers compute from the step graph: the forecast, or the class probabilities."""
    if answer is None:
        return None
    if side.rtserve:
        result = answer["result"]
        if task == "forecast":
            return None if result["forecast"] is None else np.asarray(result["forecast"], dtype=np.float64).ravel()
        return np.asarray(list(result["probabilities"].values()), dtype=np.float64)
    outputs = {o["name"]: o["data"] for o in answer["outputs"]}
    if task == "forecast":
        return np.asarray(outputs["forecast"], dtype=np.float64) if outputs["ready"][0] else None
    logits = np.asarray(outputs["logits"], dtype=np.float64)
    exp = np.exp(logits - logits.max())
    return exp / exp.sum()


def answers_max_difference(task: str, first: Side, first_run: Run, second: Side, second_run: Run) -> float | None:
    """Max |difference| between the two servers' last answers of the same sessions (None: nothing comparable)."""
    worst = None
    for a, b in zip(first_run.answers, second_run.answers, strict=True):
        left, right = answer_vector(task, first, a), answer_vector(task, second, b)
        if (left is None) != (right is None):
            return math.inf  # one answered a forecast, the other not
        if left is not None and right is not None:
            worst = max(worst or 0.0, float(np.abs(left - right).max()) if left.shape == right.shape else math.inf)
    return worst


def summarize(rows: list[dict[str, Any]], sides: Sequence[Side]) -> dict[str, Any]:
    """Per side the medians over the repeats; per rtserve side and Triton side the medians of per-repeat ratios."""
    summary: dict[str, Any] = {"sides": {}, "ratios": {}}
    for side in sides:
        runs = [row[side.name] for row in rows if "pieces_per_second" in row.get(side.name, {})]
        if not runs:
            summary["sides"][side.name] = rows[0].get(side.name, {})
            continue
        numbers = {key: median([run[key] for run in runs]) for key in runs[0] if isinstance(runs[0][key], float)}
        numbers |= {key: runs[0][key] for key in ("pieces", "client_processes")}
        limited = [run["client_limited"] for run in runs if run["client_limited"]]
        summary["sides"][side.name] = {**numbers, "client_limited": limited[0] if limited else None,
                                       "client_limited_runs": len(limited)}
    for ours in (side for side in sides if side.rtserve):
        # like with like: rows sent as JSON against Triton's JSON tensors, binary rows against its binary data
        for theirs in (side for side in sides if not side.rtserve and side.binary == ours.binary):
            pairs = [(row[ours.name], row[theirs.name]) for row in rows
                     if "pieces_per_second" in row.get(ours.name, {}) and "pieces_per_second" in row[theirs.name]]
            if pairs:
                summary["ratios"][f"{ours.name}/{theirs.name}"] = {
                    key: median([a[key] / b[key] for a, b in pairs]) for key in RATIO_KEYS}
    return summary


async def compare_task(bench: Bench, pool: ClientPool, task: str, sides: list[Side]) -> dict[str, Any]:
    """Every session count of one model: the sides in turn, ``--repeats`` times."""
    counts = bench.counts.triton_sessions
    sessions = sessions_for(bench, task, max(counts))
    bodies = [session.pieces for session in sessions]
    cores = len(os.sched_getaffinity(0))
    result: dict[str, Any] = {"model": bench.ref(task), "pieces_per_session": len(bodies[0]),
                              "client_processes": pool.processes, "sessions": {}}
    if task == "forecast":
        result["rows_per_piece"] = bench.counts.rsa_piece_rows
    served = []
    for side in sides:  # warm-up, untimed; finds out whether this rtserve serves the session stream
        run = await asyncio.to_thread(pool.run, side.target, bodies[:1], side.server_cpu)
        if run.unavailable:
            result.setdefault("unavailable", {})[side.name] = run.unavailable
            log.info("  %s: %s", side.name, run.unavailable)
            continue
        served.append(side)
    least = bench.counts.triton_rsa_min_pieces if task == "forecast" else bench.counts.triton_rmt_min_pieces
    for count in counts:
        waves = max(1, math.ceil(least / (count * len(bodies[0]))))  # count sessions at a time, waves after waves
        chosen = [bodies[index % count] for index in range(count * waves)]
        rows: list[dict[str, Any]] = []
        differences: dict[str, float | None] = {}
        for repeat in range(bench.repeats):
            row: dict[str, Any] = {}
            runs: dict[str, Run] = {}
            for side in served if repeat % 2 == 0 else served[::-1]:
                await bench.settle()
                rows_before, steps_before = await side.batches()
                run = await asyncio.to_thread(pool.run, side.target, chosen, side.server_cpu, repeat == 0, count)
                if run.errors:
                    raise BenchError(f"triton scenario, {side.name}, {count} sessions: {run.errors[:3]}")
                rows_after, steps_after = await side.batches()
                runs[side.name], row[side.name] = run, figures(run, cores)
                if steps_after > steps_before:  # how many of the side's pieces each step of the graph held
                    row[side.name]["mean_batch_size"] = (rows_after - rows_before) / (steps_after - steps_before)
            if repeat == 0:
                reference = next(side for side in served if side.rtserve)
                differences = {other.name: answers_max_difference(task, reference, runs[reference.name], other,
                                                                  runs[other.name])
                               for other in served if other is not reference}
            log.info("  %s, %d sessions, repeat %d: %s", task, count, repeat + 1, ", ".join(
                f"{name} {figure['pieces_per_second']:.1f}/s" for name, figure in row.items()))
            rows.append(row)
        result["sessions"][str(count)] = {"sessions": count, "sessions_in_all": len(chosen), **summarize(rows, served),
                                          "answers_max_abs_difference": differences, "repeats": rows}
    return result


async def run_triton(bench: Bench, install: TritonInstall) -> dict[str, Any]:
    """Start Triton on the models measured, then compare it with rtserve model by model."""
    options = bench.options
    delays = tuple(options.triton_queue_delays_ms)
    tasks = [task for task, wanted in TASKS.items() if not why_not(bench, task, wanted)]
    if not tasks:
        raise BenchError("neither an RSA forecaster nor an RMT classifier (with its dataset) to compare")
    repository = Path(tempfile.mkdtemp(prefix="rtserve-bench-triton-"))
    models: dict[str, list[TritonModel]] = {
        task: [write_model(repository, *bench.entry(task), delay, bench.intra_op_threads) for delay in delays]
        for task in tasks}
    log_path = (bench.log_folder or repository) / "tritonserver.log"
    server = TritonServer(install, repository, [m.name for ms in models.values() for m in ms], log_path)
    log.info("triton: tritonserver starting (log: %s)", log_path)
    client = Client(server.url, None, 4, 2.0)
    processes = options.client_processes or default_processes()
    results: dict[str, Any] = {"client_processes": processes, "cores": len(os.sched_getaffinity(0)),
                               "queue_delays_ms": list(delays), "venv": str(install.venv), "models": {},
                               "min_pieces": {"forecast": bench.counts.triton_rsa_min_pieces,
                                              "classify": bench.counts.triton_rmt_min_pieces},
                               "per_piece": PER_PIECE}
    try:
        results["triton_version"] = await server.wait_models(client, options.startup_timeout)
        triton_process = psutil.Process(server.process.pid)
        pool = ClientPool(processes)
        try:
            for task in tasks:
                ref = bench.ref(task)
                ours = rtserve_batches(bench.client, ref)
                sides = [Side(name, Target(name, bench.url, ref, bench.api_key), bench.stopwatch.server_cpu, ours)
                         for name in ("rtserve-http", "rtserve-ws")]
                if task == "forecast":  # rows: also as the stream's binary frames
                    sides.append(Side("rtserve-ws-binary", Target("rtserve-ws-binary", bench.url, ref, bench.api_key),
                                      bench.stopwatch.server_cpu, ours))
                for model in models[task]:
                    for binary in (False, True) if task == "forecast" else (False,):  # rows: also as binary data
                        sides.append(Side(f"triton-{model.delay_ms:g}ms{'-binary' if binary else ''}", Target(
                            "triton-http-binary" if binary else "triton-http", server.url, model.name,
                            text=model.text, piece_input=model.piece_inputs[0] if model.piece_inputs else ("", ""),
                            outputs=model.answers), lambda: tree_cpu_seconds(triton_process),
                            triton_batches(client, model.name)))
                log.info("triton: %s at %s sessions, sides %s", ref, bench.counts.triton_sessions,
                         ", ".join(side.name for side in sides))
                results["models"][task] = await compare_task(bench, pool, task, sides)
        finally:
            pool.close()
    finally:
        await client.close()
        server.stop()
    return results


def client_limited_notes(results: Mapping[str, Any]) -> list[str]:
    """A sentence for each side whose client was the limit in some run."""
    notes = []
    for task, model in (results.get("models") or {}).items():
        for count, row in model["sessions"].items():
            for side, figures_ in row["sides"].items():
                if figures_.get("client_limited"):
                    notes.append(f"triton scenario, {task} at {count} sessions, {side}: the client was the limit in "
                                 f"{figures_['client_limited_runs']} run(s) ({figures_['client_limited']})")
    return notes
