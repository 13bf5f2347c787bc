"""Figures from the service's ``/metrics``: deltas between two scrapes, sums over labels, histogram means, and
the Redis share of the segment route.

A scrape is :data:`loadtest.harness.Samples` (``(name, labels) -> value``); a run's figures are the delta of
the scrapes taken just before its first piece and just after its last answer (:func:`metric_delta`), summed
over runs with :func:`add_delta`.

Redis share (:func:`redis_share`): the delta of ``rtserve_redis_operation_duration_seconds_sum`` for the
operations the segment route times (``begin``: meta, state, last result and the lock in one script;
``commit``: the compare-and-set write, the unlock and the live-index touch in one round trip;
``live_counts`` runs at each scrape and is left out) over the delta of ``rtserve_request_duration_seconds_sum``
for that route.
"""

from __future__ import annotations

from typing import Any

from loadtest.harness import BenchError, Samples

SEGMENT_ROUTE = "/sessions/{session_id}/segments"
SEGMENT_ROUTE_REDIS_OPERATIONS = ("begin", "commit")


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
