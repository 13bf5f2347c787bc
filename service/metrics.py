"""Prometheus metrics, one registry per app instance.

Names follow Prometheus conventions: ``rtserve_`` prefix, base units in the
name, counters end in ``_total``. GPU metrics come from NVML and are absent —
not zero — where NVML sees no GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
BYTES_BUCKETS = tuple(float(4**k) for k in range(4, 14))  # 256 B .. 64 MiB


class GpuCollector(Collector):
    """Per-GPU power, energy, utilisation and memory from NVML (``nvidia-ml-py``).

    ``collect`` yields nothing when NVML cannot be initialised (no driver, no
    GPU), so the families are absent rather than faked.
    """

    def __init__(self) -> None:
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() > 0:
                self._nvml = pynvml
        except Exception as error:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError ...
            log.info("NVML unavailable, GPU metrics disabled: %s", error)

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if self._nvml is None:
            return
        nvml = self._nvml
        power = GaugeMetricFamily("rtserve_gpu_power_watts", "GPU power draw (NVML).", labels=["gpu"])
        energy = CounterMetricFamily(
            "rtserve_gpu_energy_joules", "GPU energy since driver load (NVML).", labels=["gpu"]
        )
        utilisation = GaugeMetricFamily(
            "rtserve_gpu_utilization_ratio", "GPU busy fraction over the last sample period.", labels=["gpu"]
        )
        memory = GaugeMetricFamily("rtserve_gpu_memory_used_bytes", "GPU memory in use.", labels=["gpu"])
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            label = [str(index)]
            power.add_metric(label, nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)  # mW -> W
            try:
                energy.add_metric(label, nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0)  # mJ -> J
            except nvml.NVMLError:  # pre-Volta GPUs have no energy counter
                pass
            utilisation.add_metric(label, nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
            memory.add_metric(label, float(nvml.nvmlDeviceGetMemoryInfo(handle).used))
        yield from (power, energy, utilisation, memory)


class ServiceMetrics:
    """Every metric the service exports, registered on one private registry."""

    def __init__(self, registry: CollectorRegistry | None = None, collect_gpu: bool = True) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
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
            "rtserve_batch_size", "Steps stacked into one batched model call.", ["model"],
            buckets=BATCH_BUCKETS, registry=r,
        )
        self.step_seconds = Histogram(
            "rtserve_step_duration_seconds", "Latency of one batched model step.", ["model", "backend", "graph"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.segments = Counter(
            "rtserve_segments_processed", "Segments (steps) applied, by model.", ["model"], registry=r
        )
        self.active_sessions = Gauge(
            "rtserve_active_sessions",
            "Open sessions (not finished, deleted or idle-expired) per model, counted in the shared Redis at "
            "scrape time: every replica reports the same figure, so aggregate with max, not sum.",
            ["model"], registry=r,
        )
        self.session_state_bytes = Histogram(
            "rtserve_session_state_bytes", "Size of a session's stored state after a step.", ["model"],
            buckets=BYTES_BUCKETS, registry=r,
        )
        self.redis_seconds = Histogram(
            "rtserve_redis_operation_duration_seconds", "Latency of Redis operations.", ["operation"],
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.gpu = GpuCollector() if collect_gpu else None
        if self.gpu is not None and self.gpu.available:
            r.register(self.gpu)

    def observe_batch(
        self, model: str, backend: str, graph: str, rows: int, seconds: float, queued: list[float]
    ) -> None:
        """One batched model call: its size, its duration, and how long each of its callers queued."""
        self.batch_size.labels(model=model).observe(rows)
        self.step_seconds.labels(model=model, backend=backend, graph=graph).observe(seconds)
        for wait in queued:
            self.queue_seconds.labels(model=model).observe(wait)

    def time_redis(self, operation: str) -> object:
        """Context manager timing one Redis operation."""
        return self.redis_seconds.labels(operation=operation).time()
