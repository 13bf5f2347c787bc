"""Two versions of the service against the floor server, side by side: server CPU per RSA piece, many repeats.

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/floor_compare.py /tmp/before . [--repeats 20] [--sessions 1,32]

``rtserve bench --only floor`` measures one version; a cut of a tenth of the CPU per piece is lost in this VM's
drift between two such runs. Here both versions (each ``rtserve serve`` run from its own source tree, with this
checkout's environment and model repository) and the floor server (``benchmarks/floor_server.py``) run at once on
one embedded Redis, and each repeat sends the same pieces to the three in an order shuffled per repeat: at 1
session, 32 sessions of RSA pieces (24 rows each) one after another; at N, N sessions at once. Each side's CPU is
its process's, from the kernel (as the bench reads it). Printed per repeat and as medians: before / floor,
after / floor and after / before, each the median of the per-repeat ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PIECE_ROWS, EXTRA_PIECES, SESSIONS = 24, 12, 32


async def cpu_per_piece(client: Any, cpu: Any, model: str, sessions: list[Any], concurrent: bool) -> float:
    """Server CPU ms per piece over every piece of ``sessions``; sessions opened before and closed after."""
    from loadtest.sessions import close_session, open_session, send_pieces

    ids = [await open_session(client, model) for _ in sessions]
    await asyncio.sleep(0.05)
    before = cpu()
    if concurrent:
        await asyncio.gather(*(send_pieces(client, i, s) for i, s in zip(ids, sessions, strict=True)))
    else:
        for session_id, session in zip(ids, sessions, strict=True):
            await send_pieces(client, session_id, session)
    spent = cpu() - before
    await asyncio.gather(*(close_session(client, i) for i in ids))
    return 1000 * spent / sum(len(s.pieces) for s in sessions)


async def compare(options: argparse.Namespace) -> None:
    import psutil

    from loadtest import bench_inputs as inputs
    from loadtest.bench_floor import floor_command
    from loadtest.harness import HOST, Client, Server, free_port, server_environment, tree_cpu_seconds
    from service.embedded_redis import EmbeddedRedis

    repository = options.model_repository.resolve()
    manifest = json.loads((repository / options.model / "1" / "manifest.json").read_text())
    settings = manifest["settings"]
    values = inputs.etth1_values(options.data, list(settings["variables"]))
    sessions = inputs.forecast_sessions(values, int(settings["lookback"]), SESSIONS, PIECE_ROWS, EXTRA_PIECES)
    model = f"{options.model}:1"
    servers: list[Server] = []
    sides: dict[str, tuple[Client, Any]] = {}
    with EmbeddedRedis() as redis:
        try:
            for name, tree in (("before", options.before.resolve()), ("after", options.after.resolve())):
                port = free_port()
                environment = server_environment(repository, port, redis.url) | {"PYTHONPATH": str(tree)}
                here = Path.cwd()
                os.chdir(tree)  # `python -m` puts the working folder first on the path
                try:
                    server = Server([sys.executable, "-m", "rtserve.cli", "serve", "--host", HOST, "--port",
                                     str(port)], environment, port, Path(f"/tmp/floor-compare-{name}.log"))
                finally:
                    os.chdir(here)
                servers.append(server)
                client = Client(server.url, None, SESSIONS + 4, 2.0)
                await server.wait_ready(client, 300)
                sides[name] = (client, lambda pid=server.process.pid: tree_cpu_seconds(psutil.Process(pid)))
            port = free_port()
            floor = Server(floor_command(repository, [model], redis.url, HOST, port),
                           server_environment(repository, port, redis.url), port, Path("/tmp/floor-compare-floor.log"))
            servers.append(floor)
            client = Client(floor.url, None, SESSIONS + 4, 2.0)
            await floor.wait_ready(client, 300)
            sides["floor"] = (client, lambda pid=floor.process.pid: tree_cpu_seconds(psutil.Process(pid)))
            for client, cpu in sides.values():  # warm-up, untimed
                await cpu_per_piece(client, cpu, model, sessions[:2], False)
            for count in options.sessions:
                rows = []
                for repeat in range(options.repeats):
                    order = list(sides)
                    random.Random(repeat).shuffle(order)
                    row = {}
                    for name in order:
                        await asyncio.sleep(0.3)
                        client, cpu = sides[name]
                        chosen = sessions[:count] if count > 1 else sessions
                        row[name] = await cpu_per_piece(client, cpu, model, chosen, count > 1)
                    rows.append(row)
                    print(f"{count} session(s), repeat {repeat + 1}: before {row['before']:.3f}, after "
                          f"{row['after']:.3f}, floor {row['floor']:.3f} ms per piece; after / before "
                          f"{row['after'] / row['before']:.3f}", flush=True)

                def median(a: str, b: str, rows: list[dict[str, float]] = rows) -> float:
                    return statistics.median(r[a] / r[b] for r in rows)

                print(f"{count} session(s), medians of {options.repeats} repeats: before / floor "
                      f"{median('before', 'floor'):.2f}, after / floor {median('after', 'floor'):.2f}, "
                      f"after / before {median('after', 'before'):.3f}", flush=True)
        finally:
            for server in servers:
                server.stop()
            for client, _ in sides.values():
                await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="source tree of the version before (a git worktree)")
    parser.add_argument("after", type=Path, help="source tree of the version after")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--sessions", type=lambda text: [int(n) for n in text.split(",")], default=[1, 32])
    parser.add_argument("--model", default="rsa-etth1-h24")
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    options = parser.parse_args()
    started = time.monotonic()
    asyncio.run(compare(options))
    print(f"{time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
