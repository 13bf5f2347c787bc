"""The ``sweep`` scenario: rtserve's capacity, per model (the RSA forecaster, the RMT classifier), over rising
counts of concurrent sessions until pieces/s stops rising.

At each count (1, 8, 32, 128, 512 up to ``--sweep-max``) N sessions each send their pieces in order over HTTP,
waiting for each answer (:mod:`loadtest.closed_loop`: several client processes, so that the load is not one
process's event loop), ``--repeats`` times; past 32 sessions they reuse the first 32 sessions' pieces (each in a
session of its own). Reported per count, the medians over the repeats of: pieces/s, p50 and p99 piece latency, the
engine's mean batch (the delta of the service's ``rtserve_batch_size`` histogram over the run), the device's busy
share (:mod:`loadtest.device_busy`: NVML's utilization on a GPU, the engine's CPU share on a CPU), the client's share
of the machine, and whether the client was the limit (in any repeat). Where NVML reads the GPU's energy counter,
each count also gets J/piece: its sessions served again and again for at least ``GPU_WINDOW_SECONDS``, the whole
GPU's energy over that window divided by its pieces (:mod:`loadtest.bench_gpu`), so J/segment at one session and at
capacity are two rows of the same table.

The sweep stops after :data:`PATIENCE` counts in a row whose pieces/s is not :data:`RISE` above the best before
them (one noisy count does not end it), or at the first count with failed pieces. A model's **capacity** is the
most pieces/s of a count whose p99 stayed under :data:`P99_BOUND_MS`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from loadtest.bench_gpu import EnergyMeter, energy_rates
from loadtest.closed_loop import ClientPool, Target, default_processes, figures
from loadtest.device_busy import DeviceBusy
from loadtest.harness import median
from loadtest.metrics import histogram_mean, metric_delta
from loadtest.scenarios.common import Bench, log, why_not
from loadtest.scenarios.gpu import GPU_WINDOW_SECONDS
from loadtest.scenarios.triton import TASKS, sessions_for

RISE = 1.05  # a count whose pieces/s is not 5 % above the best before it did not raise the rate
PATIENCE = 2  # counts in a row without that rise end the sweep
P99_BOUND_MS = 250.0
DISTINCT_SESSIONS = 32  # different documents / stretches of rows; more sessions reuse them (ETTh1 holds ~60)
MEDIAN_KEYS = ("pieces_per_second", "p50_ms", "p99_ms", "mean_batch_size", "device_busy", "engine_cores_busy",
               "client_cpu_share", "client_cpu_ms_per_piece", "server_cpu_ms_per_piece", "cores_busy")


def capacity(levels: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The most pieces/s among the counts whose p99 stayed under the bound, and at which count."""
    within = [(row["pieces_per_second"], int(count)) for count, row in levels.items()
              if row.get("p99_ms", float("inf")) < P99_BOUND_MS]
    if not within:
        return None
    rate, count = max(within)
    return {"pieces_per_second": rate, "sessions": count, "p99_bound_ms": P99_BOUND_MS}


class StopRule:
    """Whether the sweep goes on: :data:`PATIENCE` counts in a row without a :data:`RISE` over the best end it."""

    def __init__(self, rise: float = RISE, patience: int = PATIENCE) -> None:
        self.rise, self.patience = rise, patience
        self.best, self.without_gain = 0.0, 0

    def after(self, rate: float) -> str | None:
        """The reason to stop after a count that served ``rate`` pieces/s, or None to go on."""
        if self.best and rate < self.rise * self.best:
            self.without_gain += 1
        else:
            self.without_gain = 0
        self.best = max(self.best, rate)
        if self.without_gain >= self.patience:
            return f"pieces/s stopped rising ({self.patience} counts in a row not {self.rise - 1:.0%} above the best)"
        return None


class MeteredClock:
    """The server's CPU clock as the client pool reads it (right before 'go', right after the last answer), which
    also starts and stops the device's busy meter: the two cover the same window."""

    def __init__(self, server_cpu: Callable[[], float], busy: DeviceBusy) -> None:
        self.server_cpu, self.busy, self.reads = server_cpu, busy, 0

    def __call__(self) -> float:
        value = self.server_cpu()
        if self.reads % 2 == 0:
            self.busy.start()
        else:
            self.busy.stop()
        self.reads += 1
        return value


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One count's row: the medians of its repeats, every repeat kept, the client named if it limited any."""
    row: dict[str, Any] = {key: median([run[key] for run in runs]) for key in MEDIAN_KEYS if key in runs[0]}
    limited = [run["client_limited"] for run in runs if run.get("client_limited")]
    row |= {"pieces": runs[0]["pieces"], "client_processes": runs[0]["client_processes"],
            "client_limited": limited[0] if limited else None, "engine": runs[0].get("engine"),
            "device_busy_source": runs[0].get("device_busy_source"), "errors": sum(r["errors"] for r in runs),
            "first_errors": [e for r in runs for e in r["first_errors"]][:3], "repeats": runs}
    return row


async def measure_count(bench: Bench, pool: ClientPool, target: Target, bodies: list[list[bytes]],
                        busy: DeviceBusy, ref: str) -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0))
    await bench.settle()
    before = await bench.client.metrics()
    clock = MeteredClock(bench.stopwatch.server_cpu, busy)
    run = await asyncio.to_thread(pool.run, target, bodies, clock)
    delta = metric_delta(before, await bench.client.metrics())
    row = figures(run, cores)
    if not run.pieces:
        return row | {"errors": len(run.errors) or 1}
    row["mean_batch_size"] = histogram_mean(delta, "rtserve_batch_size", model=ref)
    row["client_cpu_share"] = run.client_cpu_seconds / run.wall_seconds / cores
    return row | busy.figures


async def energy_window(pool: ClientPool, target: Target, bodies: list[list[bytes]], meter: EnergyMeter,
                        server_cpu: Callable[[], float]) -> dict[str, float]:
    """J/piece of ``bodies`` served closed loop, again and again for at least GPU_WINDOW_SECONDS (the counter moves
    about every 100 ms); the sessions' opening and closing between passes is in the joules, as in serving."""
    before, pieces, seconds = meter.millijoules(), 0, 0.0
    while seconds < GPU_WINDOW_SECONDS:
        run = await asyncio.to_thread(pool.run, target, bodies, server_cpu)
        pieces, seconds = pieces + run.pieces, seconds + run.wall_seconds
    rates = energy_rates(meter.millijoules() - before, pieces, seconds)
    return {"joules_per_piece": rates["joules_per_segment"], "watts": rates["watts"]}


async def sweep_model(bench: Bench, pool: ClientPool, task: str, counts: list[int],
                      meter: EnergyMeter | None = None) -> dict[str, Any]:
    ref = bench.ref(task)
    distinct = sessions_for(bench, task, min(max(counts), DISTINCT_SESSIONS), pieces=bench.counts.sweep_pieces)
    bodies = [distinct[index % len(distinct)].pieces for index in range(max(counts))]
    target = Target("rtserve-http", bench.url, ref, bench.api_key)
    busy = DeviceBusy(bench.stopwatch.server.pid)
    await asyncio.to_thread(pool.run, target, bodies[:1], bench.stopwatch.server_cpu)  # warm-up, untimed
    levels: dict[str, dict[str, Any]] = {}
    rule = StopRule()
    for count in counts:
        runs = [await measure_count(bench, pool, target, bodies[:count], busy, ref) for _ in range(bench.repeats)]
        failed = [run for run in runs if run.get("errors")]
        row = summarize(runs) if all("pieces_per_second" in run for run in runs) else {**runs[-1], "repeats": runs}
        levels[str(count)] = row
        if not failed and meter is not None and meter.available:
            row |= await energy_window(pool, target, bodies[:count], meter, bench.stopwatch.server_cpu)
        if failed:
            row["stopped"] = f"{sum(r['errors'] for r in failed)} pieces failed: {failed[0].get('first_errors')}"
            break
        log.info("  %s, %d sessions: %.1f pieces/s, p99 %.0f ms, mean batch %.1f, device busy %.0f %%%s", task, count,
                 row["pieces_per_second"], row["p99_ms"], row["mean_batch_size"], 100 * row.get("device_busy", 0),
                 f" (client-limited: {row['client_limited']})" if row["client_limited"] else "")
        reason = rule.after(row["pieces_per_second"])
        if reason:
            row["stopped"] = reason
            break
    return {"model": ref, "pieces_per_session": len(bodies[0]), "levels": levels, "capacity": capacity(levels),
            "device_busy_source": busy.figures.get("device_busy_source")}


async def run_sweep(bench: Bench) -> dict[str, Any]:
    top = bench.options.sweep_max
    counts = [count for count in bench.counts.sweep_sessions if top is None or count <= top]
    processes = bench.options.client_processes or default_processes()
    results: dict[str, Any] = {"client_processes": processes, "counts": counts, "repeats": bench.repeats,
                               "models": {}}
    pool = ClientPool(processes)
    meter = EnergyMeter()
    try:
        for task, wanted in TASKS.items():
            reason = why_not(bench, task, wanted)
            if reason:
                results["models"][task] = {"skipped": reason}
                continue
            log.info("sweep: %s at up to %s sessions", bench.ref(task), counts)
            results["models"][task] = await sweep_model(bench, pool, task, counts, meter)
            levels, best = results["models"][task]["levels"], results["models"][task]["capacity"]
            at_best = levels[str(best["sessions"])] if best else {}
            if "joules_per_piece" in levels.get("1", {}) and "joules_per_piece" in at_best:
                results["models"][task]["joules_at_capacity_over_one"] = (
                    at_best["joules_per_piece"] / levels["1"]["joules_per_piece"])
    finally:
        pool.close()
    return results


def sweep_notes(results: dict[str, Any]) -> list[str]:
    """Where the client was the limit, and how the sweep ended, one sentence each."""
    notes = []
    for task, model in (results.get("models") or {}).items():
        for count, row in (model.get("levels") or {}).items():
            if row.get("client_limited"):
                notes.append(f"sweep, {task} at {count} sessions: the client was the limit ({row['client_limited']})")
            if row.get("stopped"):
                notes.append(f"sweep, {task}: stopped at {count} sessions ({row['stopped']})")
    return notes
