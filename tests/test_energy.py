"""Energy per model: NVML's energy counter, read off the batch path and split among the batches that ran while it
counted.

No GPU is on the CI machines: the accounting is checked against a stand-in NVML whose energy counter the test
advances, on a clock the test moves; the no-GPU path (the family absent, not zero) runs for real.
"""

import sys
import time
import types

from prometheus_client import CollectorRegistry, generate_latest

from service.gpu_metrics import EnergyMeter
from service.metrics import ServiceMetrics


class FakeGpu:
    def __init__(self, millijoules: float = 0.0, counter: bool = True) -> None:
        self.millijoules = millijoules
        self.counter = counter


def fake_nvml(gpus: list[FakeGpu]) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def energy(handle: FakeGpu) -> float:
        if not handle.counter:
            raise NVMLError("Not Supported")
        return handle.millijoules

    nvml.NVMLError = NVMLError
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetCount = lambda: len(gpus)
    nvml.nvmlDeviceGetHandleByIndex = lambda index: gpus[index]
    nvml.nvmlDeviceGetTotalEnergyConsumption = energy
    nvml.nvmlDeviceGetPowerUsage = lambda handle: 100_000
    nvml.nvmlDeviceGetEnforcedPowerLimit = lambda handle: 700_000
    nvml.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=50)
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(used=0)
    return nvml


def joules(registry: CollectorRegistry, model: str) -> float | None:
    return registry.get_sample_value("rtserve_energy_joules_total", {"model": model})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_overlapping_batches_share_the_energy_by_rows_and_time_and_idle_energy_is_nobodys(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu, clock = FakeGpu(millijoules=1_000), Clock()
    registry = CollectorRegistry()
    meter = EnergyMeter(fake_nvml([gpu]), registry, period=None, clock=clock)
    a = meter.begin("cuda:0", "a:1", rows=3)  # the first batch takes the first reading
    clock.now, gpu.millijoules = 1.0, 3_000  # 2 J with only a running: all a's
    meter.sample()
    b = meter.begin("cuda:0", "b:1", rows=1)
    clock.now, gpu.millijoules = 2.0, 7_000  # 4 J with a (3 rows) and b (1 row) all along: 3 J and 1 J
    meter.end(a)
    meter.sample()
    clock.now, gpu.millijoules = 3.0, 8_000  # 1 J with b alone
    meter.end(b)
    meter.sample()
    clock.now, gpu.millijoules = 4.0, 20_000  # idle: charged to no one
    meter.sample()
    with meter.batch("cuda:0", "a:1", rows=2):  # runs half of the next interval: half its energy
        clock.now = 4.5
    clock.now, gpu.millijoules = 5.0, 21_000
    meter.sample()
    assert joules(registry, "a:1") == 2.0 + 3.0 + 0.5
    assert joules(registry, "b:1") == 1.0 + 1.0


def test_batches_in_one_interval_share_it_by_rows_times_their_time(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu, clock = FakeGpu(millijoules=0), Clock()
    registry = CollectorRegistry()
    meter = EnergyMeter(fake_nvml([gpu]), registry, period=None, clock=clock)
    with meter.batch("cuda:0", "a:1", rows=1):  # [0, 1]
        clock.now = 1.0
    with meter.batch("cuda:0", "b:1", rows=2):  # [1, 3] with twice the rows: four times a's share
        clock.now = 3.0
    clock.now, gpu.millijoules = 4.0, 10_000  # 10 J over 4 s of which 3 busy: 7.5 J charged
    meter.sample()
    assert joules(registry, "a:1") == 1.5
    assert joules(registry, "b:1") == 6.0


def test_no_batch_reads_the_counter_after_the_first(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = FakeGpu(0)
    nvml = fake_nvml([gpu])
    reads = []
    counter = nvml.nvmlDeviceGetTotalEnergyConsumption
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda handle: reads.append(handle) or counter(handle)
    meter = EnergyMeter(nvml, CollectorRegistry(), period=None)
    for _ in range(10):
        with meter.batch("cuda:0", "a:1", rows=4):
            pass
    assert len(reads) == 1  # the first batch's baseline; the sampler reads the rest


def test_the_sampling_thread_charges_batches_without_being_asked(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = FakeGpu(0)
    registry = CollectorRegistry()
    meter = EnergyMeter(fake_nvml([gpu]), registry, period=0.01)
    try:
        with meter.batch("cuda:0", "a:1", rows=1):
            gpu.millijoules = 5_000
            deadline = time.monotonic() + 5
            while not joules(registry, "a:1") and time.monotonic() < deadline:
                time.sleep(0.01)
        assert 0 < joules(registry, "a:1") <= 5.0
    finally:
        meter.close()


def test_cpu_batches_and_gpus_without_an_energy_counter_charge_nothing(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [FakeGpu(0), FakeGpu(0, counter=False)]
    registry = CollectorRegistry()
    meter = EnergyMeter(fake_nvml(gpus), registry, period=None)
    assert meter.begin("cpu", "a:1", rows=4) is None
    assert meter.begin("cuda:1", "a:1", rows=4) is None  # pre-Volta or MIG: no counter
    meter.end(None)
    assert joules(registry, "a:1") is None


def test_cuda_visible_devices_maps_cuda_indices_to_nvml_indices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpus, clock = [FakeGpu(0), FakeGpu(0)], Clock()
    registry = CollectorRegistry()
    meter = EnergyMeter(fake_nvml(gpus), registry, period=None, clock=clock)
    with meter.batch("cuda:0", "a:1", rows=1):
        gpus[0].millijoules += 9_000  # another process's GPU
        gpus[1].millijoules += 2_000
        clock.now = 1.0
    meter.sample()
    assert joules(registry, "a:1") == 2.0


def test_service_metrics_export_energy_per_model_only_with_a_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    metrics = ServiceMetrics()
    if not (metrics.gpu is not None and metrics.gpu.available):  # no GPU here: absent, not zero
        with metrics.energy.batch("cuda:0", "a:1", rows=1):
            pass
        assert b"rtserve_energy_joules" not in generate_latest(metrics.registry)
    gpu = FakeGpu(500)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([gpu]))
    metrics = ServiceMetrics()
    try:
        with metrics.energy.batch("cuda:0", "srformer-news:1", rows=8):
            gpu.millijoules = 4_500
        metrics.energy.sample()
        charged = joules(metrics.registry, "srformer-news:1")
        assert charged is not None and 0 < charged <= 4.0  # the batch's share of the time since the first reading
        assert b'rtserve_energy_joules_total{model="srformer-news:1"}' in generate_latest(metrics.registry)
    finally:
        metrics.energy.close()


async def test_the_batcher_charges_each_batch_to_its_model(monkeypatch):
    import numpy as np

    from service.runtime.batcher import DynamicBatcher

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu, clock = FakeGpu(0), Clock()
    nvml = fake_nvml([gpu])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    metrics = ServiceMetrics()
    metrics.energy.close()
    registry = CollectorRegistry()
    metrics.energy = EnergyMeter(nvml, registry, period=None, clock=clock)

    class GpuBackend:  # draws 2 J per row it runs, for a second per row
        name, providers, device = "numpy", ["CUDAExecutionProvider"], "cuda:0"

        def run(self, inputs, keep=()):
            gpu.millijoules += 2_000 * len(inputs["x"])
            clock.now += len(inputs["x"])
            return {"y": inputs["x"] * 2}

    batcher = DynamicBatcher(GpuBackend(), "rsa:1", "step", 8, max_queue_delay_seconds=0, metrics=metrics)
    for rows in (1, 3):
        await batcher.submit({"x": np.ones((rows, 2), dtype=np.float32)})
    metrics.energy.sample()
    assert joules(registry, "rsa:1") == 8.0
    await batcher.close()


def test_closing_charges_what_ran_since_the_last_reading(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu, clock = FakeGpu(0), Clock()
    registry = CollectorRegistry()
    meter = EnergyMeter(fake_nvml([gpu]), registry, period=None, clock=clock)
    with meter.batch("cuda:0", "a:1", rows=1):
        clock.now, gpu.millijoules = 1.0, 3_000
    meter.close()
    assert joules(registry, "a:1") == 3.0
