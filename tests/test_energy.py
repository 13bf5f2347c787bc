"""Energy per model: NVML's energy counter, split among the batches that ran while it counted.

No GPU is on the CI machines: the accounting is checked against a stand-in NVML whose energy
counter the test advances; the no-GPU path (the family absent, not zero) runs for real.
"""

import sys
import types

from prometheus_client import CollectorRegistry, generate_latest

from service.metrics import EnergyMeter, ServiceMetrics


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


def test_overlapping_batches_share_the_energy_by_rows_and_idle_energy_is_nobodys(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = FakeGpu(millijoules=1_000)
    registry = CollectorRegistry()
    meter = EnergyMeter(fake_nvml([gpu]), registry)
    a = meter.begin("cuda:0", "a:1", rows=3)
    gpu.millijoules = 3_000  # 2 J with only a running: all a's
    b = meter.begin("cuda:0", "b:1", rows=1)
    gpu.millijoules = 7_000  # 4 J with a (3 rows) and b (1 row): 3 J and 1 J
    meter.end(a)
    gpu.millijoules = 8_000  # 1 J with b alone
    meter.end(b)
    gpu.millijoules = 20_000  # idle: charged to no one
    with meter.batch("cuda:0", "a:1", rows=2):
        gpu.millijoules = 20_500
    assert joules(registry, "a:1") == 2.0 + 3.0 + 0.5
    assert joules(registry, "b:1") == 1.0 + 1.0


def test_cpu_batches_and_gpus_without_an_energy_counter_charge_nothing(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = [FakeGpu(0), FakeGpu(0, counter=False)]
    registry = CollectorRegistry()
    meter = EnergyMeter(fake_nvml(gpus), registry)
    assert meter.begin("cpu", "a:1", rows=4) is None
    assert meter.begin("cuda:1", "a:1", rows=4) is None  # pre-Volta or MIG: no counter
    meter.end(None)
    assert joules(registry, "a:1") is None


def test_cuda_visible_devices_maps_cuda_indices_to_nvml_indices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpus = [FakeGpu(0), FakeGpu(0)]
    registry = CollectorRegistry()
    meter = EnergyMeter(fake_nvml(gpus), registry)
    with meter.batch("cuda:0", "a:1", rows=1):
        gpus[0].millijoules += 9_000  # another process's GPU
        gpus[1].millijoules += 2_000
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
    with metrics.energy.batch("cuda:0", "srformer-news:1", rows=8):
        gpu.millijoules = 4_500
    assert joules(metrics.registry, "srformer-news:1") == 4.0
    assert b'rtserve_energy_joules_total{model="srformer-news:1"} 4.0' in generate_latest(metrics.registry)


async def test_the_batcher_charges_each_batch_to_its_model(monkeypatch):
    import numpy as np

    from service.runtime.batcher import DynamicBatcher

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = FakeGpu(0)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([gpu]))
    metrics = ServiceMetrics()

    class GpuBackend:  # draws 2 J per row it runs
        name, providers, device = "numpy", ["CUDAExecutionProvider"], "cuda:0"

        def run(self, inputs, keep=()):
            gpu.millijoules += 2_000 * len(inputs["x"])
            return {"y": inputs["x"] * 2}

    batcher = DynamicBatcher(GpuBackend(), "rsa:1", "step", 8, max_queue_delay_seconds=0, metrics=metrics)
    for rows in (1, 3):
        await batcher.submit({"x": np.ones((rows, 2), dtype=np.float32)})
    assert joules(metrics.registry, "rsa:1") == 8.0
    await batcher.close()
