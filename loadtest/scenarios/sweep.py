"""The ``sweep`` scenario: rtserve's capacity, per model (the RSA forecaster, the RMT classifier), over rising
counts of concurrent sessions until pieces/s stops rising.

At each count (1, 8, 32, 128, 512 up to ``--sweep-max``) N sessions each send their pieces in order over HTTP,
waiting for each answer (:mod:`loadtest.closed_loop`, several client processes), once; past 32 sessions
they reuse the first 32 sessions' pieces (each in a session of its own). Reported per count:
pieces/s, p50 and p99 piece latency, the engine's mean batch (the delta of the service's ``rtserve_batch_size``
histogram over the run), the client's share of the machine and whether the client was the limit. The sweep stops
after the first count whose pieces/s is not :data:`RISE` above the best before it. A model's **capacity** is the
most pieces/s of a count whose p99 stayed under :data:`P99_BOUND_MS`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from loadtest.closed_loop import ClientPool, Target, default_processes, figures
from loadtest.metrics import histogram_mean, metric_delta
from loadtest.scenarios.common import Bench, log, why_not
from loadtest.scenarios.triton import TASKS, sessions_for

RISE = 1.05  # a count whose pieces/s is not 5 % above the best before it: the rate stopped rising
P99_BOUND_MS = 250.0
DISTINCT_SESSIONS = 32  # different documents / stretches of rows; more sessions reuse them (ETTh1 holds ~60)


def capacity(levels: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The most pieces/s among the counts whose p99 stayed under the bound, and at which count."""
    within = [(row["pieces_per_second"], int(count)) for count, row in levels.items()
              if row.get("p99_ms", float("inf")) < P99_BOUND_MS]
    if not within:
        return None
    rate, count = max(within)
    return {"pieces_per_second": rate, "sessions": count, "p99_bound_ms": P99_BOUND_MS}


async def sweep_model(bench: Bench, pool: ClientPool, task: str, counts: list[int]) -> dict[str, Any]:
    ref = bench.ref(task)
    distinct = sessions_for(bench, task, min(max(counts), DISTINCT_SESSIONS), pieces=bench.counts.sweep_pieces)
    bodies = [distinct[index % len(distinct)].pieces for index in range(max(counts))]
    target = Target("rtserve-http", bench.url, ref, bench.api_key)
    cores = len(os.sched_getaffinity(0))
    await asyncio.to_thread(pool.run, target, bodies[:1], bench.stopwatch.server_cpu)  # warm-up, untimed
    levels: dict[str, dict[str, Any]] = {}
    best = 0.0
    for count in counts:
        await bench.settle()
        before = await bench.client.metrics()
        run = await asyncio.to_thread(pool.run, target, bodies[:count], bench.stopwatch.server_cpu)
        delta = metric_delta(before, await bench.client.metrics())
        row = figures(run, cores)
        row["mean_batch_size"] = histogram_mean(delta, "rtserve_batch_size", model=ref)
        row["client_cpu_share"] = run.client_cpu_seconds / run.wall_seconds / cores
        levels[str(count)] = row
        log.info("  %s, %d sessions: %.1f pieces/s, p99 %.0f ms, mean batch %.1f%s", task, count,
                 row["pieces_per_second"], row["p99_ms"], row["mean_batch_size"],
                 f" (client-limited: {row['client_limited']})" if row["client_limited"] else "")
        if run.errors:
            row["stopped"] = f"{len(run.errors)} pieces failed: {run.errors[:2]}"
            break
        if best and row["pieces_per_second"] < RISE * best:
            row["stopped"] = "pieces/s stopped rising"
            break
        best = max(best, row["pieces_per_second"])
    return {"model": ref, "pieces_per_session": len(bodies[0]), "levels": levels, "capacity": capacity(levels)}


async def run_sweep(bench: Bench) -> dict[str, Any]:
    top = bench.options.sweep_max
    counts = [count for count in bench.counts.sweep_sessions if top is None or count <= top]
    processes = bench.options.client_processes or default_processes()
    results: dict[str, Any] = {"client_processes": processes, "counts": counts, "models": {}}
    pool = ClientPool(processes)
    try:
        for task, wanted in TASKS.items():
            reason = why_not(bench, task, wanted)
            if reason:
                results["models"][task] = {"skipped": reason}
                continue
            log.info("sweep: %s at up to %s sessions", bench.ref(task), counts)
            results["models"][task] = await sweep_model(bench, pool, task, counts)
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
