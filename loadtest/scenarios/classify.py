"""The RMT classify scenarios: ``e2e`` (one session's piece latency over the step graph's time alone),
``throughput`` (N sessions' served segments/s over the offline rate at batch N) and ``latency`` (whole
sessions at N concurrent: p50/p90/p99). They share the RMT sessions (pieces of exactly one segment each)
and the offline step graph (:class:`loadtest.offline.OfflineSteps`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadtest import bench_inputs as inputs
from loadtest.bench_inputs import SessionInput
from loadtest.harness import Samples, in_turn, median
from loadtest.metrics import histogram_mean, redis_share
from loadtest.offline import OfflineSteps
from loadtest.scenarios.common import Bench, attempt, log
from loadtest.sessions import served_pieces, whole_session

CLASSIFY_SCENARIOS = ("e2e", "throughput", "latency")


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
