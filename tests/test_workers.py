"""`rtserve serve` with RTSERVE_WORKERS=2: two front ends and one engine on one port, one Redis, one set of
metrics, no process left behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from loadtest.chaos import free_port
from service.workers import MetricsDirError, clear_metrics_dir
from tests.service_helpers import start_rtserve

MODEL = "rsa-tiny"
LOOKBACK, WIDTH = 32, 7


def _rows(n: int, seed: int) -> list[list[float]]:
    return np.random.default_rng(seed).normal(size=(n, WIDTH)).round(4).tolist()


def _sample(text: str, name: str, **labels: str) -> float | None:
    """Sum of the samples of ``name`` whose labels include ``labels``; None when there is none."""
    values = [sample.value for family in text_string_to_metric_families(text) for sample in family.samples
              if sample.name == name and labels.items() <= sample.labels.items()]
    return sum(values) if values else None


def _per_worker(metrics_dir: Path, name: str, **labels: str) -> dict[int, float]:
    """``name`` summed per worker, from each worker's own files in the shared metrics folder."""
    totals: dict[int, float] = {}
    for pid in {int(path.stem.rpartition("_")[2]) for path in metrics_dir.glob("counter_*.db")}:
        alone = metrics_dir.parent / f"worker-{pid}"
        shutil.rmtree(alone, ignore_errors=True)
        alone.mkdir()
        for path in metrics_dir.glob(f"*_{pid}.db"):
            shutil.copy(path, alone / path.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        totals[pid] = sum(sample.value for family in registry.collect() for sample in family.samples
                          if sample.name == name and labels.items() <= sample.labels.items())
    return totals


def _per_worker_histogram(path: Path, name: str) -> float:
    """``name`` in one process's histogram file alone."""
    alone = path.parent.parent / f"alone-{path.stem}"
    shutil.rmtree(alone, ignore_errors=True)
    alone.mkdir()
    shutil.copy(path, alone / path.name)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(alone))
    return sum(sample.value for family in registry.collect() for sample in family.samples if sample.name == name)


def _start(tmp_path: Path, repository: Path) -> tuple[subprocess.Popen, str, Path, Path]:
    metrics_dir, redis_dir = tmp_path / "metrics", tmp_path / "redis"
    metrics_dir.mkdir()
    (metrics_dir / "counter_1.db").write_bytes(b"left by an earlier run")  # must be cleared, not summed
    env = {"RTSERVE_MODEL_REPOSITORY": str(repository), "RTSERVE_WORKERS": "2",
           "RTSERVE_METRICS_DIR": str(metrics_dir), "RTSERVE_EMBEDDED_REDIS_DIR": str(redis_dir)}
    port = free_port()
    process = start_rtserve(env, port, output=subprocess.PIPE, timeout=90)
    return process, f"http://127.0.0.1:{port}", metrics_dir, redis_dir / "redis.sock"


def _engines(process: subprocess.Popen) -> list[psutil.Process]:
    return [child for child in psutil.Process(process.pid).children()
            if "service.runtime.engine_process" in " ".join(child.cmdline())]


def _wait_for_workers(process: subprocess.Popen, count: int, timeout: float = 60) -> list[psutil.Process]:
    """The worker processes (the supervisor's Python children), once ``count`` are there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = [child for child in psutil.Process(process.pid).children()
                   if "spawn_main" in " ".join(child.cmdline())]
        if len(workers) >= count:
            return workers
        time.sleep(0.1)
    pytest.fail(f"{count} workers did not start")


def test_the_metrics_folder_loses_only_prometheus_files_and_refuses_foreign_databases(tmp_path):
    folder = tmp_path / "metrics"
    clear_metrics_dir(folder)  # made when missing
    earlier = ["counter_17.db", "histogram_17.db", "gauge_livesum_17.db", "gauge_all_18.db", "summary_18.db"]
    for name in [*earlier, "README.txt"]:
        (folder / name).write_bytes(b"x")
    clear_metrics_dir(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["README.txt"]  # an earlier run's metrics, and only those
    for name in earlier:
        (folder / name).write_bytes(b"x")
    (folder / "users.db").write_bytes(b"someone's data")
    with pytest.raises(MetricsDirError, match="users.db"):
        clear_metrics_dir(folder)
    assert (folder / "users.db").read_bytes() == b"someone's data"  # refused, and nothing deleted
    assert all((folder / name).exists() for name in earlier)


def test_a_metrics_folder_with_foreign_databases_stops_startup_with_its_name(tmp_path):
    folder = tmp_path / "metrics"
    folder.mkdir()
    (folder / "users.db").write_bytes(b"someone's data")
    env = {"RTSERVE_WORKERS": "2", "RTSERVE_METRICS_DIR": str(folder), "RTSERVE_MODEL_REPOSITORY": str(tmp_path)}
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")}
    result = subprocess.run([sys.executable, "-m", "rtserve.cli", "serve", "--port", str(free_port())],
                            env=inherited | env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "users.db" in result.stderr and "Traceback" not in result.stderr
    assert (folder / "users.db").exists()


def test_two_workers_share_sessions_and_metrics_and_stop_together(forecast_repository, tmp_path):
    repository, _ = forecast_repository
    process, base, metrics_dir, redis_socket = _start(tmp_path, repository)
    try:
        workers = _wait_for_workers(process, 2)
        # one-shot requests on fresh connections until both workers have answered some (32 at once: a front end
        # that sends the step to the engine is free again at once, and an idle one may then not be woken)
        sent = 0
        with ThreadPoolExecutor(32) as pool:
            while sent < 640:
                answers = list(pool.map(lambda i: httpx.post(f"{base}/forecast", timeout=30, json={
                    "model": MODEL, "rows": _rows(LOOKBACK, i)}).status_code, range(sent, sent + 64)))
                assert answers == [200] * 64
                sent += 64
                per_worker = _per_worker(metrics_dir, "rtserve_requests_total", route="/forecast")
                if len([n for n in per_worker.values() if n > 0]) >= 2:
                    break
        assert {pid for pid, n in per_worker.items() if n > 0} <= {w.pid for w in workers}
        assert len([n for n in per_worker.values() if n > 0]) == 2, per_worker
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert _sample(metrics, "rtserve_requests_total", route="/forecast", status="200") == sent  # summed
        assert "process_cpu_seconds_total" not in metrics  # per-process families: not in multiprocess mode

        # sessions whose pieces land on either worker: the same answers as one-shot, pieces on both workers
        series = {seed: _rows(LOOKBACK + 12, 100 + seed) for seed in range(6)}

        def stream(seed: int) -> dict:
            created = httpx.post(f"{base}/sessions", json={"model": MODEL}, timeout=30)
            assert created.status_code == 201, created.text
            session = created.json()["id"]
            rows = series[seed]
            for seq, start in enumerate(range(0, len(rows), 4), start=1):
                piece = httpx.post(f"{base}/sessions/{session}/segments", timeout=30,
                                   json={"seq": seq, "rows": rows[start : start + 4]})
                assert piece.status_code == 200, piece.text
            return httpx.post(f"{base}/sessions/{session}/finish", timeout=30).json()

        with ThreadPoolExecutor(6) as pool:
            finished = dict(zip(series, pool.map(stream, series), strict=True))
        for seed, rows in series.items():
            whole = httpx.post(f"{base}/forecast", json={"model": MODEL, "rows": rows}, timeout=30).json()
            assert finished[seed]["forecast"] == whole["forecast"]
        pieces = _per_worker(metrics_dir, "rtserve_requests_total", route="/sessions/{session_id}/segments")
        assert sum(pieces.values()) == 6 * 11 and len([n for n in pieces.values() if n > 0]) == 2, pieces
        open_one = httpx.post(f"{base}/sessions", json={"model": MODEL}, timeout=30)
        assert open_one.status_code == 201
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert _sample(metrics, "rtserve_active_sessions") == 1  # six finished, one open: read once, not summed
        # one engine ran every step of both front ends: its batches are in the summed metrics, theirs are none
        engines = _engines(process)
        assert len(engines) == 1 and engines[0].pid not in {w.pid for w in workers}
        steps = _sample(metrics, "rtserve_batch_size_sum", model=f"{MODEL}:1")
        assert steps == sent + 6 * 11 + 6, steps  # a row per one-shot request, per piece, per final check
        batch_files = {int(path.stem.rpartition("_")[2]) for path in metrics_dir.glob("histogram_*.db")
                       if _per_worker_histogram(path, "rtserve_batch_size_count")}
        assert batch_files == {engines[0].pid}, batch_files
        # the event loops' lag: every front end's and the engine's, each loop's timer ticking (40 a second)
        lag_files = {int(path.stem.rpartition("_")[2]) for path in metrics_dir.glob("histogram_*.db")
                     if _per_worker_histogram(path, "rtserve_event_loop_lag_seconds_count")}
        assert lag_files == {engines[0].pid, *(w.pid for w in workers)}, lag_files
        assert _sample(metrics, "rtserve_event_loop_lag_seconds_count", loop="engine") > 10
        assert _sample(metrics, "rtserve_event_loop_lag_seconds_count", loop="http") > 20
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode in (0, -signal.SIGTERM), output
    assert "stopped embedded Redis" in output
    assert not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in [*workers, *engines])
    assert not redis_socket.exists()  # the parent's embedded Redis stopped with it


def test_workers_and_redis_die_with_a_killed_parent(forecast_repository, tmp_path):
    repository, _ = forecast_repository
    process, _, _, _ = _start(tmp_path, repository)
    workers = _wait_for_workers(process, 2)
    redis = [child for child in psutil.Process(process.pid).children() if "redis" in child.name()]
    engines = _engines(process)
    assert len(redis) == 1 and len(engines) == 1
    process.kill()
    process.wait(timeout=10)
    # a worker still importing when the parent died has not yet asked to die with it: it leaves as soon as its
    # app factory runs and finds the parent gone (a loaded machine can take tens of seconds to get there)
    _, alive = psutil.wait_procs([*workers, *redis, *engines], timeout=60)
    for survivor in alive:  # not to leak them into the rest of the run
        survivor.kill()
    assert not alive, f"left running after the parent was killed: {alive}"
