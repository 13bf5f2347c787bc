"""GPU energy for ``rtserve bench``: NVML's energy counter read before and after a served run.

``nvmlDeviceGetTotalEnergyConsumption`` counts millijoules since the driver loaded (Volta and
newer). Every visible GPU is summed: the service places its models on the GPU ONNX Runtime
picks, and idle GPUs add their idle draw to every run alike. Where NVML sees no GPU, or the
GPU has no energy counter, :class:`EnergyMeter` is unavailable and the bench says the GPU rows
were skipped.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class EnergyMeter:
    def __init__(self, nvml: Any | None = None) -> None:
        """``nvml``: the ``pynvml`` module, or a stand-in with the same four functions (tests)."""
        self._nvml: Any | None = None
        self.names: list[str] = []
        self.reason = ""
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            if count == 0:
                self.reason = "NVML sees no GPU"
                return
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
            self.names = [_text(nvml.nvmlDeviceGetName(handle)) for handle in self._handles]
            for handle in self._handles:
                nvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # raises on GPUs without the counter
            self._nvml = nvml
        except Exception as error:  # no driver, no library, pre-Volta GPU ...
            self.reason = f"NVML unavailable: {type(error).__name__}: {error}"
            log.info("GPU rows skipped: %s", self.reason)

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def millijoules(self) -> int:
        """Energy of every visible GPU since the driver loaded, summed."""
        assert self._nvml is not None, "no GPU: check `available` first"
        return sum(int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle)) for handle in self._handles)


def _text(name: str | bytes) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


def gpu_names() -> list[str]:
    return EnergyMeter().names


def energy_rates(millijoules: int, segments: int, seconds: float) -> dict[str, float]:
    """Segments/s and J/segment of one run, from its energy delta (mJ), segments and wall time."""
    if segments <= 0 or seconds <= 0:
        raise ValueError(f"a run needs segments and time; got {segments} segments in {seconds} s")
    joules = millijoules / 1000.0
    return {
        "segments": segments,
        "seconds": seconds,
        "joules": joules,
        "segments_per_second": segments / seconds,
        "joules_per_segment": joules / segments,
        "watts": joules / seconds,
    }
