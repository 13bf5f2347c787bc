"""Prometheus metrics, one registry per app instance.

Names follow Prometheus conventions: ``rtserve_`` prefix, base units in the
name, counters end in ``_total``. GPU metrics and the energy per model come
from NVML (:mod:`service.gpu_metrics`) and are absent — not zero — where NVML
sees no GPU.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from service.gpu_metrics import EnergyMeter, GpuCollector

log = logging.getLogger(__name__)

# from 100 µs: a forecast step or a Redis round trip takes well under a millisecond
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                   30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
BYTES_BUCKETS = tuple(float(4**k) for k in range(4, 14))  # 256 B .. 64 MiB


TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)

# No `<name>_created` series: they double every counter and histogram for a timestamp nobody graphs.
# (A process-wide switch of prometheus_client; it only affects exposition.)
disable_created_metrics()


class ServiceMetrics:
    """Every metric the service exports, registered on one private registry.

    With ``multiprocess_dir`` (a worker among several, :mod:`service.workers`) the values live in
    prometheus_client's files in that folder, and :meth:`exposition` sums every worker's; the per-process
    collectors are left out (they would describe only the worker that answers the scrape).

    The ``model`` label of the request metrics is the ``name:version`` that served the request, also on errors
    after the model was known (a session's GET, DELETE, 409, ...); it is empty (in PromQL: absent) for requests
    that involve no model (health, metrics, docs, ``/models``) or were refused before one was named.
    """

    def __init__(self, registry: CollectorRegistry | None = None, collect_gpu: bool = True,
                 collect_process: bool = True, multiprocess_dir: Path | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.multiprocess_dir = multiprocess_dir
        r = self.registry
        if collect_process and multiprocess_dir is None:
            # process_cpu_seconds_total, process_resident_memory_bytes, ... and python_info
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
        self.requests = Counter(
            "rtserve_requests", "HTTP requests by route, model and status.", ["route", "model", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "rtserve_request_duration_seconds", "HTTP request latency.", ["route", "model", "status"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.queue_seconds = Histogram(
            "rtserve_batch_queue_seconds", "Time a step waited in the batcher queue.", ["model"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.batch_size = Histogram(
            "rtserve_batch_size", "Steps stacked into one batched model call, per graph.", ["model", "graph"],
            buckets=BATCH_BUCKETS, registry=r,
        )
        self.step_seconds = Histogram(
            "rtserve_step_duration_seconds", "Latency of one batched model step.", ["model", "backend", "graph"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.segments = Counter(
            "rtserve_segments_processed",
            "Segments (model steps over the input) read, by model: one-shot requests, session pieces and the "
            "tail a finish reads, counted as they are computed.", ["model"], registry=r,
        )
        self.time_to_first_token = Histogram(
            "rtserve_time_to_first_token_seconds",
            "Summaries: from the handler's start to the first summary text sent (streamed: the first `token` "
            "event; JSON: the answer).", ["model", "stream"], buckets=TTFT_BUCKETS, registry=r,
        )
        self.generated_tokens = Counter(
            "rtserve_generated_tokens", "Summary tokens generated, by model.", ["model"], registry=r
        )
        self.active_sessions = Gauge(
            "rtserve_active_sessions",
            "Open sessions (not finished, deleted or idle-expired) per model, counted in the shared Redis at "
            "scrape time: every replica reports the same figure, so aggregate with max, not sum.",
            ["model"], registry=r, multiprocess_mode="mostrecent",  # with workers: the last count read
        )
        self.session_state_bytes = Histogram(
            "rtserve_session_state_bytes", "Size of a session's stored state after a step.", ["model"],
            buckets=BYTES_BUCKETS, registry=r,
        )
        self.redis_seconds = Histogram(
            "rtserve_redis_operation_duration_seconds", "Latency of Redis operations.", ["operation"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.loop_lag = Histogram(
            "rtserve_event_loop_lag_seconds",
            "How late an event loop ran a timer due every 25 ms: the time a ready callback (a request's next step, a "
            "Redis reply, a step sent to the engine) waits behind the others. `loop`: http (the process answering "
            "HTTP; with several workers, every front end's, summed) or engine (the engine process's).",
            ["loop"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.gpu = GpuCollector() if collect_gpu else None
        if self.gpu is not None and self.gpu.available:
            r.register(self.gpu)
        self.energy = EnergyMeter(self.gpu.nvml if self.gpu is not None else None, r)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def labelled(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)`` (values in the metric's label order), looked up once: prometheus_client's
        ``labels`` checks its arguments and takes a lock at every call, several times per request."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def exposition(self) -> bytes:
        """The Prometheus text of every family: this registry's, or every worker's summed."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.multiprocess_dir))
        if self.gpu is not None and self.gpu.available:
            registry.register(self.gpu)  # read live from NVML by whichever worker answers
        return generate_latest(registry)

    def observe_batch(
        self, model: str, backend: str, graph: str, rows: int, seconds: float, queued: list[float]
    ) -> None:
        """One batched model call: its size, its duration, and how long each of its callers queued."""
        self.labelled(self.batch_size, model, graph).observe(rows)
        self.labelled(self.step_seconds, model, backend, graph).observe(seconds)
        queue = self.labelled(self.queue_seconds, model)
        for wait in queued:
            queue.observe(wait)

    def time_redis(self, operation: str) -> object:
        """Context manager timing one Redis operation."""
        return self.labelled(self.redis_seconds, operation).time()


def metered(metrics: ServiceMetrics | None, backend: Any, model: str, rows: int) -> AbstractContextManager[None]:
    """``with metered(...): <run one batch of rows>`` — charges its GPU energy to ``model`` (nothing on a CPU)."""
    if metrics is None:
        return nullcontext()
    return metrics.energy.batch(getattr(backend, "device", "cpu"), model, rows)
