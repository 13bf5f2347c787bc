"""Forecast pieces through the engine process: the engine's CPU, the front end's CPU and the wall time per piece.

    .venv/bin/python benchmarks/engine_hop.py [--model rsa-etth1-h24] [--pieces 1000] [--repeats 5] [--sessions 1]

Method: the engine process is the service's (``python -m service.runtime.engine_process``, as ``RTSERVE_WORKERS``
above 1 starts it) over a repository holding only ``--model`` (a folder of links to the model repository's entry). This
process is the front end: the service's registry with its engine client, whose forecast pipeline sends each step to
the engine. Pieces of 24 ETTh1-like rows are consumed one after another on each of ``--sessions`` states: with one,
every step is the engine's only call in flight; with more, that many are in flight at once and share the engine's
batches. Per repeat, the engine process's and this process's CPU (the kernel's
per-process clocks) and the wall time are read around ``--pieces`` pieces; printed: the medians per piece.

The engine's CPU is also split by thread (the kernel's per-thread clocks): its event loop (the main thread: reading
frames, the batcher, writing answers: the hop) and the rest (the graph's thread, where the step itself runs on a
CPU; on a GPU host that thread only launches the step). Also printed: steps per frame the front end sent
(:class:`~service.runtime.engine_client.StepFrames`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


async def leave(client: Any) -> None:
    """Leave the engine as a front end of the service does: the engine sees the connection end and closes its side
    before it is stopped. Stopped while it still waited on the connection, its handler would be cancelled mid-read,
    which Python 3.11's asyncio streams log as an error with a CancelledError traceback."""
    if client._writer is not None and client._reader_task is not None and not client._reader_task.done():
        client._writer.write_eof()  # no more calls: the engine's handler reads the end and closes the connection
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(client._reader_task), timeout=10)
    await client.close()


async def measure(options: argparse.Namespace) -> dict[str, float]:
    import psutil

    from service.metrics import ServiceMetrics
    from service.runtime.engine_client import EngineClient
    from service.runtime.registry import ModelRegistry
    from service.settings import Settings

    folder = Path(tempfile.mkdtemp(prefix="rtserve-engine-hop-"))
    repository, metrics, socket_path = folder / "repository", folder / "metrics", folder / "engine.sock"
    repository.mkdir(), metrics.mkdir()
    (repository / options.model).symlink_to(options.model_repository.resolve() / options.model)
    env = dict(os.environ, RTSERVE_MODEL_REPOSITORY=str(repository), RTSERVE_METRICS_DIR=str(metrics),
               PROMETHEUS_MULTIPROC_DIR=str(metrics))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    engine = subprocess.Popen([sys.executable, "-m", "service.runtime.engine_process", str(socket_path)], env=env,
                              cwd=ROOT)
    client = EngineClient(socket_path)
    try:
        await client.connect(timeout=300)
        settings = Settings(model_repository=repository, redis_url="redis://unused")
        front = ModelRegistry(settings, ServiceMetrics(collect_gpu=False), client)
        await front.load_all()
        model = front.resolve(None, "forecast")
        rows = (np.random.default_rng(0).standard_normal((24, model.pipeline.row_width)) * 3 + 10).tolist()
        states = [model.new_state() for _ in range(options.sessions)]
        per_session = max(1, options.pieces // options.sessions)

        async def session(state: dict[str, np.ndarray], pieces: int) -> None:
            for _ in range(pieces):
                await model.consume(state, rows)

        await asyncio.gather(*(session(state, 200 // options.sessions + 1) for state in states))  # warm-up
        engine_process, front_end = psutil.Process(engine.pid), psutil.Process()
        runs: list[tuple[float, float, float, float]] = []
        counted = getattr(client, "steps", None)  # (an engine client from before step frames: one step a frame)
        frames, steps = (counted.frames_sent, counted.steps_sent) if counted else (0, 0)
        for _ in range(options.repeats):
            engine_cpu, front_cpu = sum(engine_process.cpu_times()[:2]), sum(front_end.cpu_times()[:2])
            loop_cpu = loop_thread_cpu(engine_process)
            started = time.perf_counter()
            await asyncio.gather(*(session(state, per_session) for state in states))
            runs.append((sum(engine_process.cpu_times()[:2]) - engine_cpu, sum(front_end.cpu_times()[:2]) - front_cpu,
                         time.perf_counter() - started, loop_thread_cpu(engine_process) - loop_cpu))
        steps_per_frame = ((counted.steps_sent - steps) / max(counted.frames_sent - frames, 1)) if counted else 1.0
    finally:
        await leave(client)
        engine.terminate()
        engine.wait(timeout=30)
    per_piece = [[1e6 * value / (per_session * options.sessions) for value in run] for run in runs]
    result = {name: statistics.median(run[i] for run in per_piece)
              for i, name in enumerate(("engine_cpu_us", "front_end_cpu_us", "wall_us", "engine_loop_cpu_us"))}
    return result | {"steps_per_frame": steps_per_frame}


def loop_thread_cpu(process: Any) -> float:
    """CPU seconds of the process's main thread (the engine's event loop), from the kernel's per-thread clock."""
    return next((t.user_time + t.system_time for t in process.threads() if t.id == process.pid), 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="rsa-etth1-h24")
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--pieces", type=int, default=1000, help="pieces per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=1, help="states consumed at once (calls in flight)")
    options = parser.parse_args()
    result = asyncio.run(measure(options))
    print(f"{options.sessions} session(s), per piece (medians of {options.repeats} x {options.pieces}): "
          f"engine {result['engine_cpu_us']:.0f} µs of CPU (its event loop {result['engine_loop_cpu_us']:.0f}, "
          f"the graph's thread {result['engine_cpu_us'] - result['engine_loop_cpu_us']:.0f}), "
          f"front end {result['front_end_cpu_us']:.0f} µs of CPU, wall {result['wall_us']:.0f} µs; "
          f"{result['steps_per_frame']:.1f} steps per frame")


if __name__ == "__main__":
    main()
