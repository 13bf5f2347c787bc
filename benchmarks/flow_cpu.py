"""The service's CPU per request of an RSA session's flow: create, each piece, finish, delete, one at a time.

    .venv/bin/python benchmarks/flow_cpu.py [--sessions 32] [--rounds 4] [--model-repository ...]

Method: the service runs as ``rtserve bench`` starts it, on its own embedded Redis. Each session is opened, sent
the bench's RSA pieces (24 ETTh1 rows each: the look-back's 4, then 4 more, each answered with a forecast),
finished and deleted, one request after another; the service's CPU (its process, from the kernel's
per-process clock, as the bench reads it) is read around every request. Redis's CPU is in none of them. The
first round warms up and is not counted; printed: the mean CPU per request kind.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import defaultdict
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PIECE_ROWS, EXTRA_PIECES = 24, 4


async def measure(options: argparse.Namespace) -> dict[str, float]:
    import psutil

    from loadtest import bench_inputs as inputs
    from loadtest.harness import Client, Server, free_port, process_cpu_seconds
    from service.embedded_redis import EmbeddedRedis

    repository = options.model_repository.resolve()
    settings = json.loads((repository / options.model / "1" / "manifest.json").read_text())["settings"]
    values = inputs.etth1_values(options.data, list(settings["variables"]))
    sessions = inputs.forecast_sessions(values, int(settings["lookback"]), options.sessions, PIECE_ROWS,
                                        EXTRA_PIECES)
    model = f"{options.model}:1"
    spent: dict[str, list[float]] = defaultdict(list)
    with EmbeddedRedis() as redis:
        port = free_port()
        server = Server.rtserve(repository, port, Path("/tmp/rtserve-flow-cpu.log"), redis.url)
        client = Client(server.url, None, 4, 2.0)
        process = psutil.Process(server.process.pid)

        async def timed(kind: str, request: Awaitable[Any], counted: bool) -> Any:
            before = process_cpu_seconds(process)
            answer = await request
            if counted:
                spent[kind].append(process_cpu_seconds(process) - before)
            return answer

        try:
            await server.wait_ready(client, 300)
            for round_ in range(options.rounds + 1):
                counted = round_ > 0  # the first round warms up
                for session in sessions:
                    created = await timed("create", client.post("/sessions", json.dumps({"model": model}).encode()),
                                          counted)
                    path = f"/sessions/{created['id']}"
                    for seq, body in enumerate(session.pieces, start=1):
                        await timed("first piece" if seq == 1 else "piece", client.post(f"{path}/segments", body),
                                    counted)
                    await timed("finish", client.post(f"{path}/finish"), counted)
                    await timed("delete", client.delete(path), counted)
        finally:
            await client.close()
            server.stop()
    return {kind: 1000 * sum(values) / len(values) for kind, values in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds over every session")
    parser.add_argument("--model", default="rsa-etth1-h24")
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    options = parser.parse_args()
    for kind, milliseconds in asyncio.run(measure(options)).items():
        print(f"{kind}: {milliseconds:.2f} ms of service CPU per request")


if __name__ == "__main__":
    main()
