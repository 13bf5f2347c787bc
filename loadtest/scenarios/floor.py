"""The ``floor`` scenario: the service's server CPU per piece over the floor server's, per task, at 1 and N
sessions (the comparison itself is :mod:`loadtest.bench_floor`).
"""

from __future__ import annotations

from typing import Any

from loadtest.bench_floor import Side, compare, floor_sessions
from loadtest.scenarios.common import Bench, log, why_not

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
