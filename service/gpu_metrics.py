"""What NVML tells of the GPUs: power, energy, utilisation and memory per device (:class:`GpuCollector`), and the
energy each model's batches drew (:class:`EnergyMeter`). Both are absent, not zero, where NVML sees no GPU."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from service.devices import device_index

log = logging.getLogger(__name__)


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
