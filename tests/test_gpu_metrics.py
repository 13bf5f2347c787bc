"""GPU metrics: read from NVML where it sees a GPU, absent (not zero) where it does not.

No GPU is on the CI machines: the conversion from NVML's units is checked against a
stand-in NVML module with known readings; the no-GPU path runs for real.
"""

import sys
import types

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.gpu_metrics import GpuCollector
from service.metrics import ServiceMetrics


def test_without_a_gpu_the_gpu_families_are_absent(monkeypatch):
    nvml = types.ModuleType("pynvml")

    class NVMLError_DriverNotLoaded(Exception):  # noqa: N801 (NVML's own name)
        pass

    def no_driver():
        raise NVMLError_DriverNotLoaded("Driver Not Loaded")

    nvml.nvmlInit = no_driver
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    metrics = ServiceMetrics()
    assert metrics.gpu is not None and not metrics.gpu.available
    text = generate_latest(metrics.registry).decode()
    assert "rtserve_gpu_" not in text and "rtserve_energy_joules" not in text


def test_on_a_gpu_host_the_gpu_families_are_read_from_nvml():
    metrics = ServiceMetrics()
    if metrics.gpu is None or not metrics.gpu.available:
        pytest.skip("NVML sees no GPU on this machine")
    names = {f.name for f in text_string_to_metric_families(generate_latest(metrics.registry).decode())}
    assert {"rtserve_gpu_power_watts", "rtserve_gpu_memory_used_bytes"} <= names


def _fake_nvml(monkeypatch, devices):
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    nvml.NVMLError = NVMLError
    nvml.nvmlInit = lambda: None
    nvml.nvmlDeviceGetCount = lambda: len(devices)
    nvml.nvmlDeviceGetHandleByIndex = lambda index: devices[index]
    nvml.nvmlDeviceGetPowerUsage = lambda handle: handle["power_mw"]

    def enforced_power_limit(handle):
        if "limit_mw" not in handle:
            raise NVMLError("not supported")
        return handle["limit_mw"]

    nvml.nvmlDeviceGetEnforcedPowerLimit = enforced_power_limit
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda handle: handle["energy_mj"]
    nvml.nvmlDeviceGetUtilizationRates = lambda handle: types.SimpleNamespace(gpu=handle["util_percent"])
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(used=handle["memory_bytes"])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


def test_nvml_readings_become_watts_joules_ratio_and_bytes(monkeypatch):
    _fake_nvml(monkeypatch, [
        {"power_mw": 312_500, "limit_mw": 700_000, "energy_mj": 9_876_543, "util_percent": 87,
         "memory_bytes": 12 * 2**30},
        {"power_mw": 70_000, "energy_mj": 1_000, "util_percent": 0, "memory_bytes": 0},
    ])
    collector = GpuCollector()
    assert collector.available
    families = {family.name: family for family in collector.collect()}
    samples = {(s.name, s.labels["gpu"]): s.value for f in families.values() for s in f.samples}
    assert samples[("rtserve_gpu_power_watts", "0")] == 312.5
    assert samples[("rtserve_gpu_energy_joules_total", "0")] == 9876.543
    assert samples[("rtserve_gpu_utilization_ratio", "0")] == 0.87
    assert samples[("rtserve_gpu_memory_used_bytes", "0")] == 12 * 2**30
    assert samples[("rtserve_gpu_power_watts", "1")] == 70.0
    # the limit the power alert compares with; a board that reports none has no sample (not a zero)
    assert samples[("rtserve_gpu_power_limit_watts", "0")] == 700.0
    assert ("rtserve_gpu_power_limit_watts", "1") not in samples


def test_nvml_without_devices_disables_gpu_metrics(monkeypatch):
    _fake_nvml(monkeypatch, [])
    assert not GpuCollector().available
