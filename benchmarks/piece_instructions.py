"""The service's and the floor server's instructions per RSA session piece, counted by valgrind (callgrind).

    .venv/bin/python benchmarks/piece_instructions.py [--pieces 200] [--model-repository ...]
    .venv/bin/python benchmarks/piece_instructions.py --sessions 32 --transport http|stream|binary-stream|grpc-stream

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

With ``--sessions N`` (above 1) or another ``--transport``, the service alone: N sessions of 16 pieces at once (the
bench's closed-loop client, :mod:`loadtest.closed_loop`) over HTTP, over their streams with rows as JSON, or with
rows as binary frames; the sessions and their streams are opened once untimed and warmed by a first round, and the
second round's pieces are counted. ``grpc-stream``: KServe v2 over gRPC as ``perf_analyzer --streaming`` sends it,
each session a sequence on its own ``ModelStreamInfer`` stream (``sequence_start`` on its first piece,
``sequence_end`` on its last, the rows as raw FP32), so the count takes in each sequence's create and finish. Under
valgrind every batch fills (the server runs 50 times slower than its
client), so the count is that of full batches; the graph's instructions (ONNX Runtime) are in it, the same for
every transport.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARM_PIECES = 20
SESSION_PIECES = 16  # each of --sessions sessions' pieces (their look-back included)


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


async def count_sessions(url: str, pid: int, model: str, sessions: list[list[bytes]], transport: str) -> int:
    """``sessions`` at once over ``transport``: a warm round, then a counted one; the pieces counted."""
    import aiohttp

    from loadtest.closed_loop import RTSERVE_TRANSPORTS, SessionDriver, Target

    target = Target(RTSERVE_TRANSPORTS[transport], url, model)
    http = aiohttp.ClientSession(url, headers={"content-type": "application/json"},
                                 connector=aiohttp.TCPConnector(limit=0))
    try:
        for counted in (False, True):
            drivers = [SessionDriver(http, target, pieces, 0) for pieces in sessions]
            for driver in drivers:
                await driver.open()
            if counted:
                instrument(pid, True)
            await asyncio.gather(*(driver.pieces() for driver in drivers))
            if counted:
                instrument(pid, False)
            await asyncio.gather(*(driver.close() for driver in drivers))
    finally:
        await http.close()
    return sum(len(pieces) for pieces in sessions)


async def count_grpc_sequences(target: str, pid: int, model: str, sessions: list[list[bytes]]) -> int:
    """``sessions`` as KServe v2 sequences, each on its own gRPC stream (``perf_analyzer --streaming``'s way): a
    warm round, then a counted one; the pieces counted."""
    import grpc
    import orjson
    from tritonclient.grpc import service_pb2_grpc

    from loadtest.perf_analyzer import sequence_request

    name = model.split(":", 1)[0]

    def requests(pieces: list[bytes], sequence_id: int) -> list[Any]:
        return [sequence_request(name, "ROWS", np.asarray(orjson.loads(body)["rows"]), sequence_id, index, len(pieces))
                for index, body in enumerate(pieces)]

    async def sequence(stub: Any, messages: list[Any]) -> None:
        call = stub.ModelStreamInfer()
        for message in messages:  # the next piece once the last is answered, as perf_analyzer's sequences go
            await call.write(message)
            answer = await call.read()
            if answer.error_message:
                raise RuntimeError(answer.error_message)
        await call.done_writing()

    async with grpc.aio.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for counted in (False, True):
            rounds = [requests(pieces, 1 + index + (len(sessions) if counted else 0))
                      for index, pieces in enumerate(sessions)]
            if counted:
                instrument(pid, True)
            await asyncio.gather(*(sequence(stub, messages) for messages in rounds))
            if counted:
                instrument(pid, False)
    return sum(len(pieces) for pieces in sessions)


def rsa_sessions(repository: Path, data: Path, sessions: int, pieces: int) -> tuple[str, list[list[bytes]]]:
    """The RSA forecaster measured (as the bench picks it) and the pieces of ``sessions`` sessions of ``pieces``
    pieces each."""
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
    lookback = int(settings["lookback"])
    chosen = inputs.forecast_sessions(values, lookback, sessions, 24, pieces - math.ceil(lookback / 24))
    return f"{manifest['name']}:{manifest['version']}", [session.pieces for session in chosen]


def main() -> None:
    from loadtest.closed_loop import RTSERVE_TRANSPORTS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--pieces", type=int, default=200)
    parser.add_argument("--startup-timeout", type=float, default=900.0)
    parser.add_argument("--sessions", type=int, default=1, help="sessions at once (above 1: the service alone)")
    parser.add_argument("--transport", choices=(*RTSERVE_TRANSPORTS, "grpc-stream"), default="http")
    options = parser.parse_args()
    concurrent = options.sessions > 1 or options.transport != "http"
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (callgrind) is not installed")

    from loadtest.bench_floor import floor_command
    from loadtest.harness import Client, Server, free_port, server_environment
    from service.embedded_redis import EmbeddedRedis

    if concurrent:
        model, sessions = rsa_sessions(options.model_repository, options.data, options.sessions, SESSION_PIECES)
    else:
        model, sessions = rsa_sessions(options.model_repository, options.data, 1, WARM_PIECES + options.pieces)
    pieces = sessions[0]
    folder = Path(tempfile.mkdtemp(prefix="rtserve-instructions-"))
    counts: dict[str, int] = {}
    counted = options.pieces
    with EmbeddedRedis() as redis:
        for side in ("service",) if concurrent else ("service", "floor"):
            port = free_port()
            environment = server_environment(options.model_repository, port, redis.url) | {"PYTHONHASHSEED": "0"}
            grpc_port = free_port()
            if options.transport == "grpc-stream":
                environment["RTSERVE_GRPC_PORT"] = str(grpc_port)
            if side == "service":
                command = [sys.executable, "-m", "rtserve.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
            else:
                command = floor_command(options.model_repository, [model], redis.url, "127.0.0.1", port)
            out_file = folder / f"{side}.callgrind"
            server = Server(callgrind(command, out_file), environment, port, folder / f"{side}.log")
            try:
                async def run(server: Server = server, grpc_port: int = grpc_port) -> int:
                    client = Client(server.url, None, 2, 2.0)
                    await server.wait_ready(client, options.startup_timeout)
                    await client.close()
                    if options.transport == "grpc-stream":
                        return await count_grpc_sequences(f"127.0.0.1:{grpc_port}", server.process.pid, model,
                                                          sessions)
                    if concurrent:
                        return await count_sessions(server.url, server.process.pid, model, sessions, options.transport)
                    await count_side(server.url, server.process.pid, model, pieces, options.pieces)
                    return options.pieces

                counted = asyncio.run(run())
            finally:
                server.stop(timeout=300)
            counts[side] = counted_instructions(out_file)
            print(f"{side}: {counts[side] / counted:,.0f} instructions per piece ({counted} pieces)", flush=True)
    if concurrent:
        print(f"RSA pieces of {model}, {options.sessions} sessions over {options.transport}: "
              f"{counts['service'] / counted:,.0f} instructions per piece (callgrind output in {folder})")
        return
    print(f"RSA pieces of {model}, one session: service / floor instructions per piece "
          f"{counts['service'] / counts['floor']:.2f} (callgrind outputs in {folder})")


if __name__ == "__main__":
    main()
