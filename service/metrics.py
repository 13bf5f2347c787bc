"""Prometheus metrics, one registry per app instance.

Names follow Prometheus conventions: ``rtserve_`` prefix, base units in the
name, counters end in ``_total``. GPU metrics (and the energy per model,
:class:`EnergyMeter`) come from NVML and are absent — not zero — where NVML
sees no GPU.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from service.runtime.devices import device_index

log = logging.getLogger(__name__)

# from 100 µs: a forecast step or a Redis round trip takes well under a millisecond
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                   30, 60)
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

    @property
    def nvml(self) -> Any:
        """The initialised NVML module, or None."""
        return self._nvml

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        if self._nvml is None:
            return
        nvml = self._nvml
        power = GaugeMetricFamily("rtserve_gpu_power_watts", "GPU power draw (NVML).", labels=["gpu"])
        power_limit = GaugeMetricFamily(
            "rtserve_gpu_power_limit_watts", "The power limit the driver enforces (NVML); clocks throttle there.",
            labels=["gpu"],
        )
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
                power_limit.add_metric(label, nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)  # mW -> W
            except nvml.NVMLError:  # boards without power management report none
                pass
            try:
                energy.add_metric(label, nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0)  # mJ -> J
            except nvml.NVMLError:  # pre-Volta GPUs have no energy counter
                pass
            utilisation.add_metric(label, nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
            memory.add_metric(label, float(nvml.nvmlDeviceGetMemoryInfo(handle).used))
        yield from (power, power_limit, energy, utilisation, memory)


@dataclass(eq=False)  # identity: a batch is removed by itself, never by equal fields
class _RunningBatch:
    device: str
    model: str
    rows: int
    started: float
    ended: float | None = None


class EnergyMeter:
    """Joules per model from NVML's energy counter, charged to the batches that ran while it counted.

    Reading the counter costs about 2.4 ms (measured on an H200) and the counter moves only about every
    100 ms, so a batch never reads it: :meth:`begin` and :meth:`end` (or :meth:`batch`) note the batch's
    rows and time span, nothing more. A daemon thread reads each GPU's counter every ``period`` seconds
    (:meth:`sample`, from the first batch on that GPU) and splits the energy since the reading before
    among the batches that ran in that interval. The share of the interval during which some batch ran
    (the union of their spans) is charged; each batch gets a part in proportion to its rows times its
    time in the interval. Models sharing a GPU thus each get their share, nothing is counted twice, and
    energy drawn while none of the service's batches ran (idle, other processes) is charged to no
    model. Within one interval the draw is taken as even, so a figure is as fine as ``period`` and the
    counter's own refresh: the totals over many batches are what to read.

    Without NVML, on the CPU, or on a GPU without an energy counter (pre-Volta, MIG), nothing is
    charged and ``rtserve_energy_joules_total`` is absent, not zero.
    """

    def __init__(self, nvml: Any = None, registry: CollectorRegistry | None = None, period: float | None = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``period``: seconds between the sampling thread's readings (None: no thread; call :meth:`sample`);
        ``clock``: where batch spans and readings take their time (tests pass their own)."""
        self._nvml = nvml
        self._joules = None
        if nvml is not None:
            self._joules = Counter(
                "rtserve_energy_joules",
                "GPU energy drawn while the model's batches ran (NVML), split among concurrent batches by rows "
                "and time.",
                ["model"], registry=registry,
            )
        self.period, self._clock = period, clock
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}  # "cuda:N" -> NVML handle, or None where there is no counter
        self._last: dict[str, tuple[float, float]] = {}  # "cuda:N" -> the last reading: (time, mJ)
        self._batches: dict[str, list[_RunningBatch]] = {}  # running, or ended and not yet wholly charged
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._joules is not None

    def begin(self, device: str, model: str, rows: int) -> _RunningBatch | None:
        """Before a batch of ``rows`` rows of ``model`` runs on ``device``; pass the answer to :meth:`end`."""
        if self._joules is None or not device.startswith("cuda"):
            return None
        with self._lock:
            if device not in self._handles and not self._start_counting(device):
                return None
            if self._handles[device] is None:
                return None
            batch = _RunningBatch(device, model, rows, self._clock())
            self._batches[device].append(batch)
            return batch

    def end(self, batch: _RunningBatch | None) -> None:
        """After the batch ran (or failed): its span closes; the next reading charges it."""
        if batch is not None:
            batch.ended = self._clock()

    @contextmanager
    def batch(self, device: str, model: str, rows: int) -> Iterator[None]:
        """``with meter.batch(backend.device, model, rows): <run the batch>`` — begin and end around it."""
        running = self.begin(device, model, rows)
        try:
            yield
        finally:
            self.end(running)

    def joules(self, model: str) -> float:
        """What ``model`` has been charged so far (0 where nothing was)."""
        if self._joules is None:
            return 0.0
        return float(self._joules.labels(model=model)._value.get())

    def sample(self) -> None:
        """Read every counted GPU's counter once and charge the energy since the last reading."""
        with self._lock:
            devices = [device for device, handle in self._handles.items() if handle is not None]
        for device in devices:
            reading = self._read(device)  # outside the lock: batches begin and end meanwhile
            with self._lock:
                self._charge(device, self._clock(), reading)

    def close(self) -> None:
        """Stop the sampling thread (a daemon: it also ends with the process), then charge what ran since its
        last reading."""
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=2 * (self.period or 0) + 1)
        try:
            self.sample()
        except Exception as error:  # a last reading is worth trying, not worth failing a shutdown
            log.info("the last GPU energy reading failed: %s", error)

    def _start_counting(self, device: str) -> bool:
        """At the first batch on ``device``: its handle and first reading, and the sampling thread."""
        try:
            handle = self._handle(device)
            reading = float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
        except Exception as error:  # no such GPU, or no energy counter on it
            log.info("no NVML energy counter for %s, energy per model not counted there: %s", device, error)
            self._handles[device] = None
            return False
        self._handles[device], self._last[device], self._batches[device] = handle, (self._clock(), reading), []
        if self.period is not None and self._sampler is None:
            self._sampler = threading.Thread(target=self._sample_forever, name="rtserve-energy", daemon=True)
            self._sampler.start()
        return True

    def _sample_forever(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.sample()
            except Exception:  # a failed read loses one interval, never the thread
                log.exception("reading the GPU energy counter failed")

    def _charge(self, device: str, now: float, reading: float) -> None:
        """Charge the energy between the last reading of ``device`` and this one (``now``, ``reading`` mJ)."""
        (since, last), self._last[device] = self._last[device], (now, reading)
        batches = self._batches[device]
        spans = [(b, max(b.started, since), min(b.ended if b.ended is not None else now, now)) for b in batches]
        spans = [(b, start, stop) for b, start, stop in spans if stop > start]
        self._batches[device] = [b for b in batches if b.ended is None or b.ended > now]
        if not spans or now <= since:
            return
        busy, covered_until = 0.0, since  # the union of the spans, swept in order of start
        for _, start, stop in sorted(spans, key=lambda span: span[1]):
            busy += max(stop - max(start, covered_until), 0.0)
            covered_until = max(covered_until, stop)
        joules = max(reading - last, 0.0) / 1000.0 * busy / (now - since)  # mJ -> J; a driver reload restarts
        weights = [(b, max(b.rows, 1) * (stop - start)) for b, start, stop in spans]
        total = sum(weight for _, weight in weights)
        for b, weight in weights:
            self._joules.labels(model=b.model).inc(joules * weight / total)  # type: ignore[union-attr]

    def _read(self, device: str) -> float:
        """The energy counter of ``device`` in mJ."""
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handles[device]))

    def _handle(self, device: str) -> Any:
        """NVML's handle of CUDA device ``cuda:N``, through ``CUDA_VISIBLE_DEVICES`` where it is set
        (indices are NVML's, i.e. PCI bus order: set ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; or GPU UUIDs)."""
        index = device_index(device)
        visible = [entry.strip() for entry in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
        if index < len(visible):
            entry = visible[index]
            if not entry.isdigit():
                return self._nvml.nvmlDeviceGetHandleByUUID(entry)
            index = int(entry)
        return self._nvml.nvmlDeviceGetHandleByIndex(index)


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
