"""The service's and the floor server's instructions per RSA session piece, counted by valgrind (callgrind).

    .venv/bin/python benchmarks/piece_instructions.py [--pieces 200] [--model-repository ...]

Why: CPU time per piece on a shared VM drifts by a third within minutes, so a cut of a tenth needs dozens of
alternated runs to show (docs/serving.md). Callgrind counts the instructions a process executes in user space,
which do not depend on what else the machine does: the same code, inputs and environment give the same count
within a percent, run after run. It cannot see the kernel's part (system calls, thread wake-ups, context
switches), so a cut of those shows in ``rtserve bench --only floor`` and not here.

Method: the service (``rtserve serve``, as the bench starts it) and the floor server
(``benchmarks/floor_server.py``) each run under ``valgrind --tool=callgrind --instr-atstart=no`` on the same
embedded Redis, ``PYTHONHASHSEED=0``. For each in turn, one session is opened and sent 20 pieces untimed; then
``callgrind_control -i on`` starts the count, the next ``--pieces`` pieces are sent one after another (the bench's
own RSA pieces of 24 ETTh1 rows, each applying one step), ``callgrind_control -i off`` stops it. The count is read from
callgrind's output when the server exits. Under valgrind a server runs some 50 times slower; the client does not
run under it. RSA only: an RMT piece is its graph (40 ms of CPU), which would take minutes a piece under valgrind
and which both servers run alike.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARM_PIECES = 20


def callgrind(command: list[str], out_file: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_file}", *command]


def instrument(pid: int, on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(pid)], check=True, capture_output=True)


def counted_instructions(out_file: Path) -> int:
    """The ``totals:`` line of a callgrind output file: the instructions counted while instrumented (its
    ``summary:`` line, written when the process started, says 0)."""
    for line in reversed(out_file.read_text().splitlines()):
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise ValueError(f"{out_file} has no totals line")


async def count_side(url: str, pid: int, model: str, pieces: list[bytes], counted: int) -> None:
    """One session: WARM_PIECES pieces, then ``counted`` more while callgrind counts; each after the last answer."""
    from loadtest.harness import Client
    from loadtest.sessions import close_session, open_session

    client = Client(url, None, 2, 2.0)
    session_id = await open_session(client, model)
    path = f"/sessions/{session_id}/segments"
    for body in pieces[:WARM_PIECES]:
        await client.post(path, body)
    instrument(pid, True)
    for body in pieces[WARM_PIECES:WARM_PIECES + counted]:
        await client.post(path, body)  # an answer of 400 or more raises
    instrument(pid, False)
    await close_session(client, session_id)
    await client.close()


def one_session(repository: Path, data: Path, pieces: int) -> tuple[str, list[bytes]]:
    """The RSA forecaster measured (as the bench picks it) and the pieces of one session: WARM_PIECES + ``pieces``."""
    import json

    from loadtest import bench_inputs as inputs

    for manifest_path in sorted(repository.glob("*/*/manifest.json")):
        manifest = json.loads(manifest_path.read_text())
        if manifest["task"] == "forecast" and manifest["family"] == "rsa":
            break
    else:
        raise SystemExit(f"no RSA forecaster in {repository}")
    settings = manifest["settings"]
    values = inputs.etth1_values(data, list(settings["variables"]))
    session = inputs.forecast_sessions(values, int(settings["lookback"]), 1, 24, WARM_PIECES + pieces)[0]
    return f"{manifest['name']}:{manifest['version']}", session.pieces


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--pieces", type=int, default=200)
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    options = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (callgrind) is not installed")

    from loadtest.bench_floor import floor_command
    from loadtest.harness import Client, Server, free_port, server_environment
    from service.embedded_redis import EmbeddedRedis

    model, pieces = one_session(options.model_repository, options.data, options.pieces)
    folder = Path(tempfile.mkdtemp(prefix="rtserve-instructions-"))
    counts: dict[str, int] = {}
    with EmbeddedRedis() as redis:
        for side in ("service", "floor"):
            port = free_port()
            environment = server_environment(options.model_repository, port, redis.url) | {"PYTHONHASHSEED": "0"}
            if side == "service":
                command = [sys.executable, "-m", "rtserve.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
            else:
                command = floor_command(options.model_repository, [model], redis.url, "127.0.0.1", port)
            out_file = folder / f"{side}.callgrind"
            server = Server(callgrind(command, out_file), environment, port, folder / f"{side}.log")
            try:
                async def run(server: Server = server) -> None:
                    client = Client(server.url, None, 2, 2.0)
                    await server.wait_ready(client, options.startup_timeout)
                    await client.close()
                    await count_side(server.url, server.process.pid, model, pieces, options.pieces)

                asyncio.run(run())
            finally:
                server.stop(timeout=300)
            counts[side] = counted_instructions(out_file)
            print(f"{side}: {counts[side] / options.pieces:,.0f} instructions per piece ({options.pieces} pieces)",
                  flush=True)
    print(f"RSA pieces of {model}, one session: service / floor instructions per piece "
          f"{counts['service'] / counts['floor']:.2f} (callgrind outputs in {folder})")


if __name__ == "__main__":
    main()
