"""How busy the serving device was over a run: NVML's utilization where there is a GPU, else the engine's CPU.

On a GPU host a thread samples ``nvmlDeviceGetUtilizationRates`` (the share of the last sample period in which a
kernel ran, every visible GPU averaged) every :data:`SAMPLE_SECONDS` between :meth:`DeviceBusy.start` and
:meth:`DeviceBusy.stop`. Without one the device is the CPU: the share is the engine's CPU seconds per wall second
(the engine process with ``RTSERVE_WORKERS`` above 1, else the one serving process, whose front end shares it) over
the usable cores. Both are read from outside the service, so measuring moves nothing on its path.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import psutil

SAMPLE_SECONDS = 0.05
ENGINE_MODULE = "service.runtime.engine_process"


def engine_process(server: psutil.Process) -> tuple[psutil.Process, str]:
    """The engine among ``server``'s descendants, or the server itself (the engine in process), and which."""
    for child in server.children(recursive=True):
        try:
            if ENGINE_MODULE in " ".join(child.cmdline()):
                return child, "the engine process"
        except psutil.Error:
            continue
    return server, "the serving process (engine in process)"


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


class DeviceBusy:
    """One run's device busy share: :meth:`start`, :meth:`stop`, then :attr:`figures`."""

    def __init__(self, server_pid: int, nvml: Any | None = None) -> None:
        """``nvml``: the ``pynvml`` module or a stand-in (tests); None: import it, the CPU where that fails."""
        self.engine, self.engine_kind = engine_process(psutil.Process(server_pid))
        self.cores = len(os.sched_getaffinity(0))
        self._nvml, self._handles = None, []
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            for handle in self._handles:
                nvml.nvmlDeviceGetUtilizationRates(handle)
            self._nvml = nvml if self._handles else None
        except Exception:  # no driver, no library: the device is the CPU
            self._nvml, self._handles = None, []
        self._samples: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = (0.0, 0.0)
        self.figures: dict[str, Any] = {}

    @property
    def on_gpu(self) -> bool:
        return self._nvml is not None

    def start(self) -> None:
        self._samples.clear()
        self._stop.clear()
        self._started = (time.perf_counter(), cpu_seconds(self.engine))
        if self.on_gpu:
            self._thread = threading.Thread(target=self._sample, name="device-busy", daemon=True)
            self._thread.start()

    def _sample(self) -> None:
        assert self._nvml is not None
        while not self._stop.wait(SAMPLE_SECONDS):
            rates = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0 for h in self._handles]
            self._samples.append(sum(rates) / len(rates))

    def stop(self) -> dict[str, Any]:
        wall = time.perf_counter() - self._started[0]
        engine_cores = (cpu_seconds(self.engine) - self._started[1]) / max(wall, 1e-9)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.figures = {"engine_cores_busy": engine_cores, "engine": self.engine_kind}
        if self.on_gpu:
            self.figures |= {"device_busy": sum(self._samples) / len(self._samples) if self._samples else 0.0,
                             "device_busy_source": "NVML utilization, GPUs averaged"}
        else:
            self.figures |= {"device_busy": engine_cores / self.cores,
                             "device_busy_source": f"{self.engine_kind}'s CPU share of {self.cores} cores"}
        return self.figures
