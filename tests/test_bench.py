"""`rtserve bench` as a user runs it (quick mode, tiny models), and its arithmetic on made-up figures."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.bench_gpu import EnergyMeter, energy_rates
from loadtest.bench_report import check_targets, machine_slug
from loadtest.metrics import SEGMENT_ROUTE, histogram_mean, metric_delta, redis_share
from tests.fake_nvml import FakeNvml, NoNvml
from tests.service_helpers import gone_within

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
NEEDED = ("hyperpartisan", "bbc-news-summary", "ETT-small")
SERVED_SCENARIOS = ("e2e", "throughput", "latency", "articles", "decode", "rsa", "floor")


def _finite_positive(value):
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


@pytest.mark.slow
@pytest.mark.skipif(not all((DATA / name).exists() for name in NEEDED), reason=f"datasets not found under {DATA}")
def test_quick_bench_reports_every_scenario_with_positive_figures_and_writes_the_table(every_task_repository,
                                                                                      tmp_path):
    """Tiny RMT, SRformer and RSA (the run's shared exports) served by the eager backend (``RTSERVE_BACKEND=torch``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")}
    env |= {"RTSERVE_BACKEND": "torch", "RTSERVE_INTRA_OP_THREADS": "1", "RTSERVE_LOG_LEVEL": "warning",
            "RTSERVE_REDIS_URL": "redis://127.0.0.1:1/0",  # must be ignored: the bench uses the embedded Redis
            "PYTHONPATH": str(ROOT)}
    out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
    result = subprocess.run(
        [sys.executable, "-m", "rtserve.cli", "bench", "--quick", "--model-repository", str(every_task_repository),
         "--data", str(DATA), "--out-json", str(out_json), "--out-md", str(out_md)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out_json.read_text())
    assert report["failed"] == {}

    scenarios = report["scenarios"]
    assert set(SERVED_SCENARIOS) <= set(scenarios), report["skipped"]
    assert ("gpu" in scenarios) != ("gpu" in report["skipped"])  # measured or said to be skipped
    e2e = scenarios["e2e"]
    for key in ("piece_ms_median", "step_ms_median", "e2e_per_step", "server_step_ms_mean"):
        assert _finite_positive(e2e[key]), (key, e2e)
    assert 0 < e2e["redis"]["share"] < 1
    for count in ("2", "4"):
        run = scenarios["throughput"][count]
        for key in ("served_segments_per_second", "offline_segments_per_second", "served_over_offline",
                    "mean_batch_size"):
            assert _finite_positive(run[key]), (count, key, run)
        assert 1 <= run["mean_batch_size"] <= int(count)
        assert 0 < run["redis"]["share"] < 1
        latency = scenarios["latency"][count]
        assert 0 < latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"] <= latency["max_ms"]
    for name, keys in (("articles", ("concurrent_tokens_per_second", "sequential_tokens_per_second", "ratio")),
                       ("decode", ("concurrent_tokens_per_second", "sequential_tokens_per_second", "ratio")),
                       ("rsa", ("concurrent_pieces_per_second", "sequential_pieces_per_second", "ratio"))):
        for key in keys:
            assert _finite_positive(scenarios[name][key]), (name, key, scenarios[name])
        run = scenarios[name]  # the service's CPU is measured (its process tree), and the client's
        for key in ("concurrent_server_cpu_ms_per_unit", "sequential_server_cpu_ms_per_unit",
                    "concurrent_client_cpu_ms_per_unit", "concurrent_cores_busy", "ratio_ceiling"):
            assert _finite_positive(run[key]), (name, key, run)
        assert run["cores"] >= 1 and f"{name}: ceiling of the ratio" in out_md.read_text()

    for task in ("forecast", "classify"):  # the service beside the floor server, on the same pieces
        for count in ("1", "3"):
            run = scenarios["floor"][task][count]
            for key in ("ratio", "service_server_cpu_ms_per_piece", "floor_server_cpu_ms_per_piece",
                        "service_redis_cpu_ms_per_piece", "floor_redis_cpu_ms_per_piece", "floor_pieces_per_second"):
                assert _finite_positive(run[key]), (task, count, key, run)
    assert "service / floor server CPU per piece" in out_md.read_text()

    assert report["machine"]["cores"] >= 1 and report["machine"]["cpu"]
    for moment in ("before", "after"):  # the machine's pace: the interpreter, and the tiny RSA's step alone
        assert all(_finite_positive(value) for value in report["machine"]["pace"][moment].values()), moment
    assert report["settings"]["intra_op_threads"] == 1 and report["settings"]["redis"] == "embedded"
    checked = [row for row in report["targets"] if row["checked_here"]]
    assert checked and all(_finite_positive(row["value"]) for row in checked), checked
    table = out_md.read_text()
    assert "| metric | value | target | holds |" in table and report["machine"]["cpu"] in table
    assert "Pace, before / after the run: ten million Python additions" in table
    assert "e2e / step, 1 session" in table and "| metric | value | target | holds |" in result.stdout


def test_energy_per_segment_sums_every_gpu_counter_between_two_readings():
    meter = EnergyMeter(FakeNvml())
    assert meter.available and meter.names == ["Fake GPU", "Fake GPU"]
    before = meter.millijoules()
    after = meter.millijoules()
    assert after - before == 2000  # 1500 + 500 mJ
    rates = energy_rates(after - before, segments=40, seconds=0.5)
    assert rates["joules"] == pytest.approx(2.0)
    assert rates["joules_per_segment"] == pytest.approx(0.05)
    assert rates["segments_per_second"] == pytest.approx(80.0)
    assert rates["watts"] == pytest.approx(4.0)
    unavailable = EnergyMeter(NoNvml())
    assert not unavailable.available and "NVML Shared Library Not Found" in unavailable.reason


def test_gpu_targets_compare_joules_per_segment_at_many_sessions_with_one():
    scenarios = {"gpu": {"fraction_on_gpu": 1.0, "models": {
        "rmt:1": {"sessions_high": 32, "joules_ratio": 0.08},
        "rsa:1": {"sessions_high": 32, "joules_ratio": 0.2},
    }}}
    rows = {row["metric"]: row for row in check_targets(scenarios, on_gpu=True)}
    assert rows["rmt:1: J/segment at 32 sessions / at 1"]["holds"] is True
    assert rows["rsa:1: J/segment at 32 sessions / at 1"]["holds"] is False
    assert rows["models served from the GPU (fraction)"]["holds"] is True
    assert rows["e2e / step, 1 session"]["checked_here"] is False  # a CPU target, on a GPU machine
    assert rows["e2e / step, 1 session"]["holds"] is None  # not measured


def test_redis_share_counts_the_segment_routes_operations_only():
    def sample(name, **labels):
        return (name, frozenset(labels.items()))

    before = {sample("rtserve_request_duration_seconds_sum", route=SEGMENT_ROUTE, model="m:1", status="200"): 1.0}
    after = {
        sample("rtserve_request_duration_seconds_sum", route=SEGMENT_ROUTE, model="m:1", status="200"): 3.0,
        sample("rtserve_request_duration_seconds_sum", route="/sessions", model="m:1", status="201"): 9.0,
        sample("rtserve_redis_operation_duration_seconds_sum", operation="begin"): 0.03,
        sample("rtserve_redis_operation_duration_seconds_sum", operation="commit"): 0.05,
        sample("rtserve_redis_operation_duration_seconds_sum", operation="live_counts"): 7.0,  # /metrics scrapes
        sample("rtserve_batch_size_sum", model="m:1"): 12.0,
        sample("rtserve_batch_size_count", model="m:1"): 4.0,
    }
    delta = metric_delta(before, after)
    share = redis_share(delta)
    assert share["segment_route_seconds"] == pytest.approx(2.0)
    assert share["share"] == pytest.approx(0.04)  # (0.03 + 0.05) / 2
    assert histogram_mean(delta, "rtserve_batch_size", model="m:1") == pytest.approx(3.0)


def test_report_file_names_say_the_machine_without_trademark_signs():
    assert machine_slug({"cpu": "Intel(R) Xeon(R) Processor", "cores": 2, "gpus": []}) == "intel-xeon-processor-2c"
    assert machine_slug({"cpu": "AMD EPYC", "cores": 2, "gpus": []}) == "amd-epyc-2c"
    assert machine_slug({"cpu": "Intel(R) Xeon(R)", "cores": 16, "gpus": ["NVIDIA H200"]}) == "nvidia-h200"


def test_a_server_under_test_dies_with_the_bench_that_started_it(tmp_path):
    """A bench killed mid-run (SIGKILL: no finally, no stop()) leaves no server behind to load the next measurement."""
    script = ("import os, signal, sys; from pathlib import Path; from loadtest.harness import Server;"
              "server = Server([sys.executable, '-c', 'import time; time.sleep(60)'], dict(os.environ), 1,"
              " Path(sys.argv[1])); print(server.process.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    child = subprocess.run([sys.executable, "-c", script, str(tmp_path / "server.log")], capture_output=True,
                           text=True, env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1])),
                           timeout=60)
    assert child.returncode == -9, child.stderr
    server_pid = int(child.stdout.split()[0])
    assert gone_within(server_pid, 5), "the server under test outlived the bench that started it"
