"""Front ends over one engine, on a fake device: batches shared across processes, pieces/s against front ends.

    .venv/bin/python benchmarks/engine_scaling.py --front-ends 1,2,4,8 --piece-ms 2 --device-ms 10
    .venv/bin/python benchmarks/engine_scaling.py --front-ends 1,2 --piece-ms 2 --piece-cost cpu

The engine process is the service's (:class:`service.runtime.engine.Engine`, its batcher
:class:`~service.runtime.batcher.DynamicBatcher` and the continuous-batching policy) over one graph whose
backend is a fake device: every batch, of any size up to ``--max-batch``, takes ``--device-ms`` of wall time
and no CPU (it sleeps), as an accelerator's step does for the host. Each front end is a process with the
service's engine client (:class:`~service.runtime.engine.RemoteGraph`) and ``--sessions`` sessions, each
sending one row after another; before each row a session spends ``--piece-cpu-ms`` of CPU (the CPU clock of
its thread, whatever the machine's load), which stands for the Python around a piece (HTTP, validation,
Redis, the pipeline). The rows carry their front end's number, so the device sees which processes every batch
mixes. Reported per front-end count: pieces/s, the engine's mean batch size and the share of batches holding
rows of more than one front end.

What a machine can show: with ``held`` pieces/s rises with front ends until the fake device is busy all the
time (``--max-batch`` rows per ``--device-ms``), on any machine; with ``cpu`` it rises only as far as idle
cores let it: on 2 cores the engine, the front ends and anything else running share them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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

MODEL, GRAPH = "fake:1", "step"


class FakeDevice:
    """A backend whose every batch takes ``seconds`` (asleep); it logs each batch's rows by front end."""

    name, device, precision, providers = "fake", "cpu", "fp32", ["FakeDevice"]

    def __init__(self, seconds: float, log: Path) -> None:
        self.seconds = seconds
        self.log = open(log, "a", buffering=1)  # a line per batch, flushed: the engine is stopped by a signal

    def run(self, inputs: dict[str, np.ndarray], keep: Any = ()) -> dict[str, np.ndarray]:
        time.sleep(self.seconds)
        front_ends = inputs["front_end"].reshape(-1)
        self.log.write(json.dumps({"rows": int(front_ends.size), "front_ends": sorted(set(front_ends.tolist()))})
                       + "\n")
        return {"echo": inputs["front_end"].copy()}

    def drop_kept(self) -> None:
        pass


async def engine_main(socket_path: Path, device_ms: float, max_batch: int, log: Path) -> None:
    import signal

    from loadtest.fake_engine import FakeRegistry
    from service.runtime.batcher import DynamicBatcher
    from service.runtime.engine import Engine

    # an accelerator's step: about the same time at any batch size (the batcher's flat-step rule, as on CUDA)
    batcher = DynamicBatcher(FakeDevice(device_ms / 1000, log), MODEL, GRAPH, max_batch, 0.005, flat_step=True)
    registry = FakeRegistry.over(batcher)
    server = await Engine(registry).serve(socket_path)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.close()
    await registry.close()


def spend_cpu(seconds: float) -> None:
    """Busy for ``seconds`` of this thread's CPU time (not wall time: a loaded machine stretches it, not shrinks)."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def hold_loop(seconds: float) -> None:
    """The event loop held for ``seconds`` without using the CPU: a front end as if it had a core of its own."""
    time.sleep(seconds)


PIECE_COSTS = {"cpu": spend_cpu, "held": hold_loop}


async def front_end_main(socket_path: Path, index: int, sessions: int, piece_ms: float, cost: str, seconds: float,
                         out: Path) -> None:
    from service.runtime.engine_client import EngineClient, RemoteGraph

    client = EngineClient(socket_path)
    await client.connect(timeout=60)
    graph = RemoteGraph(client, MODEL, GRAPH, int(client.models[MODEL]["max_batch_size"]))
    row = {"front_end": np.full((1, 1), index, dtype=np.int64)}
    await graph.submit(row)  # connected and warm
    deadline = time.monotonic() + seconds
    pieces = 0

    async def session() -> None:
        nonlocal pieces
        while time.monotonic() < deadline:
            PIECE_COSTS[cost](piece_ms / 1000)
            answer = await graph.submit(row)
            assert int(answer["echo"][0, 0]) == index, "a row came back to another front end"
            pieces += 1

    started = time.monotonic()
    await asyncio.gather(*(session() for _ in range(sessions)))
    out.write_text(json.dumps({"pieces": pieces, "seconds": time.monotonic() - started}))
    await client.close()


def measure(front_ends: int, sessions: int, piece_ms: float, cost: str, device_ms: float, max_batch: int,
            seconds: float) -> dict[str, Any]:
    """One run: the engine and ``front_ends`` front-end processes; pieces/s and the engine's batches."""
    folder = Path(tempfile.mkdtemp(prefix="rtserve-engine-scaling-"))
    socket_path, log = folder / "engine.sock", folder / "batches.jsonl"
    engine = subprocess.Popen([sys.executable, __file__, "engine", str(socket_path), str(device_ms), str(max_batch),
                               str(log)])
    try:
        while not socket_path.exists():
            if engine.poll() is not None:
                raise RuntimeError(f"the engine exited with {engine.returncode}")
            time.sleep(0.05)
        outs = [folder / f"front-end-{i}.json" for i in range(front_ends)]
        processes = [subprocess.Popen([sys.executable, __file__, "front-end", str(socket_path), str(i), str(sessions),
                                       str(piece_ms), cost, str(seconds), str(out)]) for i, out in enumerate(outs)]
        for process in processes:
            if process.wait(timeout=seconds + 120) != 0:
                raise RuntimeError(f"a front end exited with {process.returncode}")
    finally:
        engine.terminate()
        engine.wait(timeout=30)
    results = [json.loads(out.read_text()) for out in outs]
    batches = [json.loads(line) for line in log.read_text().splitlines()]
    counted = batches[front_ends:]  # each front end's warm-up row first
    return {
        "front_ends": front_ends,
        "pieces_per_second": sum(r["pieces"] / r["seconds"] for r in results),
        "mean_batch_size": statistics.fmean(b["rows"] for b in counted) if counted else 0.0,
        "mixed_batches": sum(len(b["front_ends"]) > 1 for b in counted) / max(len(counted), 1),
        "batches": len(counted),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "engine":
        _, _, path, device_ms, max_batch, log = sys.argv
        asyncio.run(engine_main(Path(path), float(device_ms), int(max_batch), Path(log)))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "front-end":
        _, _, path, index, sessions, piece_ms, cost, seconds, out = sys.argv
        asyncio.run(front_end_main(Path(path), int(index), int(sessions), float(piece_ms), cost, float(seconds),
                                   Path(out)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--front-ends", default="1,2", help="comma-separated front-end counts, measured in turn")
    parser.add_argument("--sessions", type=int, default=16, help="sessions per front end")
    parser.add_argument("--piece-ms", type=float, default=4.0, help="a front end's time per piece")
    parser.add_argument("--piece-cost", choices=sorted(PIECE_COSTS), default="held",
                        help="held: the front end's event loop is held (asleep), as if each front end had a core of "
                        "its own; cpu: spent on this machine's cores")
    parser.add_argument("--device-ms", type=float, default=2.0, help="the fake device's time per batch, any size")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    options = parser.parse_args()
    print("| front ends | pieces/s | engine's mean batch | batches mixing front ends |\n|---|---|---|---|")
    for count in (int(n) for n in options.front_ends.split(",")):
        row = measure(count, options.sessions, options.piece_ms, options.piece_cost, options.device_ms,
                      options.max_batch, options.seconds)
        print(f"| {count} | {row['pieces_per_second']:.0f} | {row['mean_batch_size']:.1f} | "
              f"{100 * row['mixed_batches']:.0f} % |", flush=True)


if __name__ == "__main__":
    main()
