"""Triton's ``perf_analyzer`` against rtserve and against Triton, the same way: sequences of RSA pieces over KServe v2.

    python -m loadtest.perf_analyzer [--model rsa-etth1-h24] [--concurrency 16,32] [--protocol grpc] ...

Both servers serve the same exported step graph (rtserve: the model-repository entry; Triton 2.51: the bench's Triton
side, :mod:`loadtest.triton`: its python backend over the entry's own ``step.onnx``, sequence batcher ``oldest``, no
queue delay, from the peer venv ``--triton-venv`` / ``RTSERVE_BENCH_TRITON_VENV`` / ``.venv-peers``). One
``perf_analyzer`` (the tritonclient 2.50.0 wheel's, in that venv) drives each in turn with the same arguments:
sequences of ``--sequence-length`` pieces of ``--rows`` x C rows (the same normal-distributed values, from a data file),
``--streaming`` over gRPC, at each concurrency (one sequence per concurrent slot), ``--measurement-ms`` windows until
stable. Only the input's name differs (rtserve ``ROWS``; Triton the graph's ``values``), and the shape: Triton's model
has a batch axis (``max_batch_size`` 32) that perf_analyzer adds itself.

Per server and concurrency: pieces/s (perf_analyzer's stable windows), p50 and p99 latency, and the CPU per piece of
the server (its whole process tree, with rtserve's Redis; Triton with its backend stub) and of the client
(perf_analyzer), over the whole run, divided by the pieces the server counted (its statistics extension). What each
server does per piece that the other does not: :data:`loadtest.scenarios.triton.PER_PIECE`.

:func:`find_perf_analyzer` and :func:`run` are what tests/test_kserve_perf_analyzer.py uses too.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from loadtest.harness import HOST, Server, free_port, tree_cpu_seconds
from loadtest.triton.server import TritonServer, find_triton, triton_venv

HOW_TO_GET_IT = ("perf_analyzer comes with tritonclient 2.50.0 in the Triton peer's venv: `make peers` (.venv-peers), "
                 "or ../shared/peers/triton/setup.sh (/tmp/trv); pass --triton-venv")


@dataclass(frozen=True)
class PerfAnalyzer:
    binary: Path
    env: dict[str, str]  # LD_LIBRARY_PATH with the libb64 and libcudart it links (nvidia-pytriton bundles both)


def find_perf_analyzer(venv: Path) -> PerfAnalyzer | str:
    """The perf_analyzer of ``venv`` and the environment it runs in, or why there is none."""
    binary = venv / "bin" / "perf_analyzer"
    if not binary.exists():
        return f"no perf_analyzer in {venv}"
    links = Path(tempfile.mkdtemp(prefix="rtserve-perf-analyzer-lib-"))
    for bundled in sorted(venv.glob("lib/python3*/site-packages/nvidia_pytriton.libs/*")):
        for prefix, name in (("libb64-", "libb64.so.0d"), ("libcudart-", "libcudart.so.12")):
            if bundled.name.startswith(prefix) and not (links / name).exists():
                (links / name).symlink_to(bundled.resolve())  # the venv may be named relative to here
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(links),
                                                                        os.environ.get("LD_LIBRARY_PATH")])))
    try:
        probe = subprocess.run([str(binary), "--help"], env=env, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return f"{binary} does not run: {error}"
    if "concurrency-range" not in probe.stdout + probe.stderr:
        return f"{binary} does not run here: {(probe.stderr or probe.stdout).strip()[-300:]}"
    return PerfAnalyzer(binary, env)


def write_input_data(path: Path, name: str, rows: int, width: int, steps: int = 16, seed: int = 0) -> Path:
    """perf_analyzer's --input-data file: ``steps`` pieces of ``rows`` x ``width`` values around 10 (ETTh1-like)."""
    rng = np.random.default_rng(seed)
    data = [{name: {"content": (rng.standard_normal(rows * width) * 3 + 10).astype(np.float32).tolist(),
                    "shape": [rows, width]}} for _ in range(steps)]
    path.write_text(json.dumps({"data": data}))
    return path


def run(analyzer: PerfAnalyzer, model: str, url: str, protocol: str, data: Path, concurrency: int,
        sequence_length: int, measurement_ms: int = 2000, streaming: bool = True, timeout: float = 180,
        extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One perf_analyzer run in sequence mode: its figures (pieces/s, latencies in µs) and its own CPU seconds."""
    with tempfile.TemporaryDirectory(prefix="rtserve-perf-analyzer-") as folder:
        report = Path(folder) / "report.csv"
        command = [str(analyzer.binary), "-m", model, "-i", protocol, "-u", url, "--input-data", str(data),
                   "--concurrency-range", str(concurrency), "--sequence-length", str(sequence_length),
                   "--sequence-length-variation", "0", "--sequence-id-range", "1:1000000000",
                   "--measurement-interval", str(measurement_ms), "--max-trials", "5", "--stability-percentage", "20",
                   "-f", str(report), *(["--streaming"] if streaming else []), *extra]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(command, env=analyzer.env, capture_output=True, text=True, timeout=timeout)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0 or not report.exists():
            raise RuntimeError(f"perf_analyzer exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
        (row,) = list(csv.DictReader(report.open()))
    return {"pieces_per_second": float(row["Inferences/Second"]), "p50_us": int(row["p50 latency"]),
            "p99_us": int(row["p99 latency"]), "client_cpu_seconds": (after.ru_utime + after.ru_stime)
            - (before.ru_utime + before.ru_stime), "output": done.stdout}


def inference_count(base_url: str, model: str, headers: dict[str, str] | None = None) -> int:
    """The server's count of inferences of ``model`` (KServe v2's statistics extension, both servers)."""
    stats = httpx.get(f"{base_url}/v2/models/{model}/stats", headers=headers, timeout=30).json()
    return sum(int(entry.get("inference_count", 0)) for entry in stats["model_stats"])


def measure(analyzer: PerfAnalyzer, side: str, model: str, base_url: str, grpc_url: str, data: Path,
            processes: list[psutil.Process], args: argparse.Namespace, concurrency: int) -> dict[str, Any]:
    url = grpc_url if args.protocol == "grpc" else base_url.removeprefix("http://")
    cpu_before = sum(tree_cpu_seconds(process) for process in processes)
    count_before = inference_count(base_url, model)
    started = time.monotonic()
    try:
        figures = run(analyzer, model, url, args.protocol, data, concurrency, args.sequence_length,
                      args.measurement_ms, streaming=args.protocol == "grpc")
    except (RuntimeError, subprocess.TimeoutExpired) as error:  # kept in the report, with whether the server died
        alive = processes[0].is_running() and processes[0].status() != psutil.STATUS_ZOMBIE
        return {"server": side, "concurrency": concurrency, "error": str(error)[-500:],
                "server_alive": alive}
    seconds = time.monotonic() - started
    pieces = inference_count(base_url, model) - count_before
    cpu = sum(tree_cpu_seconds(process) for process in processes) - cpu_before
    return {"server": side, "concurrency": concurrency, "pieces_per_second": round(figures["pieces_per_second"], 1),
            "p50_ms": figures["p50_us"] / 1000, "p99_ms": figures["p99_us"] / 1000, "pieces": pieces,
            "server_cpu_ms_per_piece": round(1000 * cpu / max(pieces, 1), 3),
            "client_cpu_ms_per_piece": round(1000 * figures["client_cpu_seconds"] / max(pieces, 1), 3),
            "server_cores_busy": round(cpu / seconds, 2)}


def measure_each(concurrencies: list[int], at: Callable[[int], dict[str, Any]], died: str) -> list[dict[str, Any]]:
    """One server's rows (``at``: its row at a concurrency), a concurrency at a time, each printed as it comes; the
    first its server did not survive is the last (``died`` said after it)."""
    rows: list[dict[str, Any]] = []
    for concurrency in concurrencies:
        rows.append(at(concurrency))
        print(json.dumps(rows[-1]), flush=True)
        if rows[-1].get("server_alive") is False:
            print(died, flush=True)
            break
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.perf_analyzer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="rsa-etth1-h24")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--triton-venv", type=Path, default=None)
    parser.add_argument("--concurrency", default="16,32", help="comma-separated concurrent sequences")
    parser.add_argument("--sequence-length", type=int, default=16)
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--measurement-ms", type=int, default=4000)
    parser.add_argument("--only", choices=("rtserve", "triton"), default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)

    from loadtest.triton.repository import write_model
    from service.embedded_redis import EmbeddedRedis

    venv = triton_venv(args.triton_venv)
    analyzer = find_perf_analyzer(venv)
    if isinstance(analyzer, str):
        raise SystemExit(f"{analyzer}; {HOW_TO_GET_IT}")
    versions = sorted((args.repository / args.model).glob("*/manifest.json"))
    if not versions:
        raise SystemExit(f"no {args.model} in {args.repository} (make model-repository)")
    entry = versions[-1].parent
    manifest = json.loads((entry / "manifest.json").read_text())
    width = len(manifest["settings"]["variables"])
    work = Path(tempfile.mkdtemp(prefix="rtserve-perf-analyzer-"))
    rows: list[dict[str, Any]] = []
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    if args.only != "triton":
        with EmbeddedRedis(work / "redis") as redis:
            port, grpc_port = free_port(), free_port()
            server = Server.rtserve(args.repository, port, work / "rtserve.log", redis.url,
                                    {"RTSERVE_GRPC_PORT": str(grpc_port), "RTSERVE_LOG_LEVEL": "warning"})
            try:
                wait_ready(f"http://{HOST}:{port}/v2/health/ready", server)
                data = write_input_data(work / "rtserve.json", "ROWS", args.rows, width)
                processes = [psutil.Process(server.process.pid), psutil.Process(redis.pid)]
                at = functools.partial(measure, analyzer, "rtserve", args.model, server.url, f"{HOST}:{grpc_port}",
                                       data, processes, args)
                rows += measure_each(concurrencies, at, f"rtserve died; its log: {server.log_path}")
            finally:
                server.stop()
    if args.only != "rtserve":
        install = find_triton(venv)
        if isinstance(install, str):
            raise SystemExit(f"Triton side: {install}")
        model = write_model(work / "triton", entry, manifest, 0.0, 0)
        server = TritonServer(install, work / "triton", [model.name], work / "tritonserver.log", grpc=True)
        try:
            wait_ready(f"{server.url}/v2/models/{model.name}/ready", server)
            (piece_input, _), = model.piece_inputs
            data = write_input_data(work / "triton.json", piece_input, args.rows, width)
            at = functools.partial(measure, analyzer, "triton", model.name, server.url, server.grpc_url, data,
                                   [psutil.Process(server.process.pid)], args)
            rows += measure_each(concurrencies, at, f"tritonserver died; its log: {server.log_path}")
        finally:
            server.stop()
    print_table(rows, args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def wait_ready(url: str, server: Server, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise SystemExit(f"{url}: the server exited:\n{server.log_tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready within {timeout:.0f} s:\n{server.log_tail()}")


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"\nperf_analyzer, {args.protocol}{' --streaming' if args.protocol == 'grpc' else ''}, sequences of "
          f"{args.sequence_length} pieces of {args.rows} rows, {os.cpu_count()} cores shared by both servers and "
          "the client:")
    print("| server | concurrency | pieces/s | p50 ms | p99 ms | server CPU ms/piece | client CPU ms/piece |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            died = '' if row['server_alive'] else ' (the server died)'
            print(f"| {row['server']} | {row['concurrency']} | failed{died}"
                  " | | | | |")
            continue
        print(f"| {row['server']} | {row['concurrency']} | {row['pieces_per_second']} | {row['p50_ms']:.2f} | "
              f"{row['p99_ms']:.2f} | {row['server_cpu_ms_per_piece']} | {row['client_cpu_ms_per_piece']} |")


if __name__ == "__main__":
    sys.exit(main())
