"""The capacity sweep's rules: when it stops, and how busy the device was (NVML on a GPU, the engine's CPU else)."""

import os
import subprocess
import sys
import time

import psutil

from loadtest.device_busy import DeviceBusy, engine_process
from loadtest.scenarios.sweep import StopRule, summarize
from tests.fake_nvml import FakeNvml, NoNvml


def test_the_sweep_stops_after_two_counts_without_gain_not_at_one_noisy_count():
    rule = StopRule()
    assert rule.after(100) is None and rule.after(300) is None
    assert rule.after(290) is None  # one count not 5 % above the best: noise, go on
    assert rule.after(600) is None  # it rose again: the count resets
    assert rule.after(610) is None
    reason = rule.after(500)
    assert reason and "stopped rising" in reason


def test_a_count_is_the_median_of_its_repeats_and_names_a_client_limit_seen_in_any():
    base = {"pieces": 8, "client_processes": 2, "errors": 0, "first_errors": [], "p50_ms": 1.0, "p99_ms": 2.0,
            "mean_batch_size": 4.0, "device_busy": 0.5, "client_cpu_share": 0.1, "client_limited": None}
    runs = [base | {"pieces_per_second": rate} for rate in (100.0, 300.0, 200.0)]
    runs[2]["client_limited"] = "a client process was busy 95% of the run"
    row = summarize(runs)
    assert row["pieces_per_second"] == 200.0 and row["client_limited"].startswith("a client process")
    assert len(row["repeats"]) == 3


def test_on_a_gpu_the_busy_share_is_nvmls_utilization():
    busy = DeviceBusy(os.getpid(), nvml=FakeNvml())
    assert busy.on_gpu
    busy.start()
    time.sleep(0.2)
    figures = busy.stop()
    assert abs(figures["device_busy"] - 0.4) < 1e-9 and "NVML" in figures["device_busy_source"]


def test_on_a_cpu_the_busy_share_is_the_engine_processes_cpu_over_the_cores():
    busy_loop = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"
    engine = subprocess.Popen([sys.executable, "-c", busy_loop, "service.runtime.engine_process"])
    try:
        time.sleep(0.2)
        found, kind = engine_process(psutil.Process())
        assert found.pid == engine.pid and kind == "the engine process"
        busy = DeviceBusy(os.getpid(), nvml=NoNvml())
        assert not busy.on_gpu
        busy.start()
        time.sleep(0.5)
        figures = busy.stop()
        cores = len(os.sched_getaffinity(0))
        assert 0.3 / cores < figures["device_busy"] <= 1.2 / cores + 0.05, figures
        assert figures["engine"] == "the engine process"
    finally:
        engine.wait()
