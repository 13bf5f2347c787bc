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
(perf_analyzer), over the whole run, divided by the pieces the server counted (its statistics extension); the rows
each step ran (Triton: its statistics' inferences over executions; rtserve: ``rtserve_batch_size`` in its metrics);
and rtserve's CPU per piece split: its event loop's thread, and its Redis. What each server does per piece that the
other does not: :data:`loadtest.scenarios.triton.PER_PIECE`.

With ``--floor`` (gRPC), a third server is driven the same way: the gRPC floor (``benchmarks/grpc_floor.py``),
grpcio's asyncio server (the API rtserve's gRPC server runs on) answering each streamed request with rtserve's own
answer to a piece, captured from rtserve in the same run, and doing nothing else. Its CPU per piece is what grpcio and
protobuf cost in Python before any work, so that rtserve's figure splits into the transport's share and its own.
With all three, the run ends with **the budget** (:func:`budgets`): what Triton's CPU per piece leaves rtserve once the
parts no Python server on grpcio's asyncio API can skip are paid: the floor, the step (ONNX Runtime alone, on the
service's threads, at the rows per step Triton ran, timed in this process after the servers stopped:
:func:`step_cpu_ms_per_row`) and rtserve's Redis (the durability Triton does not give); beside it, what rtserve spends
on everything else (the session flow, the protocol's glue, the batching, the metrics).

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from loadtest.harness import HOST, Server, free_port, samples_of, thread_cpu_seconds, tree_cpu_seconds
from loadtest.metrics import metric_sum
from loadtest.triton.server import TritonServer, find_triton, triton_venv

GRPC_FLOOR = Path(__file__).resolve().parents[1] / "benchmarks" / "grpc_floor.py"
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
        extra: tuple[str, ...] = (), stability_percentage: int = 20) -> dict[str, Any]:
    """One perf_analyzer run in sequence mode: its figures (pieces/s, latencies in µs) and its own CPU seconds.
    ``stability_percentage``: how far apart (in %) its last three windows' figures may be for a measurement to count;
    a test that perf_analyzer runs (not what it measures) allows much, on a machine whose other work comes and goes."""
    with tempfile.TemporaryDirectory(prefix="rtserve-perf-analyzer-") as folder:
        report = Path(folder) / "report.csv"
        command = [str(analyzer.binary), "-m", model, "-i", protocol, "-u", url, "--input-data", str(data),
                   "--concurrency-range", str(concurrency), "--sequence-length", str(sequence_length),
                   "--sequence-length-variation", "0", "--sequence-id-range", "1:1000000000",
                   "--measurement-interval", str(measurement_ms), "--max-trials", "5",
                   "--stability-percentage", str(stability_percentage),
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


def inference_count(base_url: str, model: str, headers: dict[str, str] | None = None,
                    kind: str = "inference_count") -> int:
    """The server's count of inferences of ``model`` (KServe v2's statistics extension, both servers); with ``kind``
    ``execution_count``, Triton's count of the model's executions (its batches; rtserve counts requests there)."""
    stats = httpx.get(f"{base_url}/v2/models/{model}/stats", headers=headers, timeout=30).json()
    return sum(int(entry.get(kind, 0)) for entry in stats["model_stats"])


def rtserve_steps(base_url: str, model_ref: str) -> int:
    """rtserve's count of the steps (batches) its ``step`` graph of ``model_ref`` ran (:func:`steps_in` its
    metrics)."""
    return steps_in(httpx.get(f"{base_url}/metrics", timeout=30).text, model_ref)


def steps_in(text: str, model_ref: str) -> int:
    """The steps of ``model_ref``'s ``step`` graph in rtserve's metrics ``text``: ``rtserve_batch_size``'s count."""
    return int(metric_sum(samples_of(text), "rtserve_batch_size_count", model=model_ref, graph="step"))


def measure(analyzer: PerfAnalyzer, side: str, model: str, base_url: str, grpc_url: str, data: Path,
            processes: list[psutil.Process], args: argparse.Namespace, concurrency: int,
            count: Callable[[], int] | None = None, steps: Callable[[], int] | None = None,
            parts: Mapping[str, Callable[[], float]] | None = None) -> dict[str, Any]:
    """One server's row at ``concurrency``. ``count``: the server's count of inferences (default: its statistics
    over HTTP, :func:`inference_count`); ``steps``: its count of steps run (batches), for the rows per step;
    ``parts``: named parts of its CPU (seconds so far, each), given per piece."""
    url = grpc_url if args.protocol == "grpc" else base_url.removeprefix("http://")
    count = count or functools.partial(inference_count, base_url, model)
    parts = parts or {}
    cpu_before = sum(tree_cpu_seconds(process) for process in processes)
    parts_before = {name: read() for name, read in parts.items()}
    count_before = count()
    steps_before = steps() if steps is not None else 0
    started = time.monotonic()
    try:
        figures = run(analyzer, model, url, args.protocol, data, concurrency, args.sequence_length,
                      args.measurement_ms, streaming=args.protocol == "grpc")
    except (RuntimeError, subprocess.TimeoutExpired) as error:  # kept in the report, with whether the server died
        alive = processes[0].is_running() and processes[0].status() != psutil.STATUS_ZOMBIE
        return {"server": side, "concurrency": concurrency, "error": str(error)[-500:],
                "server_alive": alive}
    seconds = time.monotonic() - started
    pieces = count() - count_before
    cpu = sum(tree_cpu_seconds(process) for process in processes) - cpu_before
    row = {"server": side, "concurrency": concurrency, "pieces_per_second": round(figures["pieces_per_second"], 1),
           "p50_ms": figures["p50_us"] / 1000, "p99_ms": figures["p99_us"] / 1000, "pieces": pieces,
           "server_cpu_ms_per_piece": round(1000 * cpu / max(pieces, 1), 3),
           "client_cpu_ms_per_piece": round(1000 * figures["client_cpu_seconds"] / max(pieces, 1), 3),
           "server_cores_busy": round(cpu / seconds, 2)}
    if steps is not None:
        row["rows_per_step"] = round(pieces / max(steps() - steps_before, 1), 2)
    if parts:
        row["cpu_ms_per_piece_of"] = {name: round(1000 * (read() - parts_before[name]) / max(pieces, 1), 3)
                                      for name, read in parts.items()}
    return row


def measure_each(concurrencies: list[int], at: Callable[[int], dict[str, Any]], died: str,
                 restart: Callable[[], Callable[[int], dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """One server's rows (``at``: its row at a concurrency), a concurrency at a time, each printed as it comes. A
    concurrency its server did not survive is said (``died``), then with ``restart`` (a fresh server: its ``at``)
    tried once more, its row marked ``crashed_first``; without it, or when the second try crashes too, it is the
    last."""
    rows: list[dict[str, Any]] = []
    for concurrency in concurrencies:
        row = at(concurrency)
        print(json.dumps(row), flush=True)
        if row.get("server_alive") is False:
            print(died, flush=True)
            if restart is not None:
                at = restart()
                row = at(concurrency) | {"crashed_first": True}
                print(json.dumps(row), flush=True)
        rows.append(row)
        if row.get("server_alive") is False:
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
    parser.add_argument("--floor", action="store_true",
                        help="also drive the gRPC floor (benchmarks/grpc_floor.py: grpcio's asyncio server answering "
                             "each streamed request with rtserve's captured answer, nothing else)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.floor and (args.only == "triton" or args.protocol != "grpc"):
        parser.error("--floor answers with rtserve's captured answers over gRPC: run it with rtserve and "
                     "--protocol grpc")

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
                ref = f"{args.model}:{entry.name}"
                parts = {"event loop": functools.partial(thread_cpu_seconds, server.process.pid, server.process.pid),
                         "Redis": functools.partial(tree_cpu_seconds, processes[1])}
                at = functools.partial(measure, analyzer, "rtserve", args.model, server.url, f"{HOST}:{grpc_port}",
                                       data, processes, args, steps=functools.partial(rtserve_steps, server.url, ref),
                                       parts=parts)
                rows += measure_each(concurrencies, at, f"rtserve died; its log: {server.log_path}")
                if args.floor:
                    capture_answers(f"{HOST}:{grpc_port}", args.model, args.rows, width, work / "captured")
            finally:
                server.stop()
        if args.floor:
            rows += measure_floor(analyzer, args, work, data, concurrencies)
    if args.only != "rtserve":
        install = find_triton(venv)
        if isinstance(install, str):
            raise SystemExit(f"Triton side: {install}")
        model = write_model(work / "triton", entry, manifest, 0.0, 0)
        (piece_input, _), = model.piece_inputs
        data = write_input_data(work / "triton.json", piece_input, args.rows, width)
        servers: list[TritonServer] = []

        def start_triton() -> Callable[[int], dict[str, Any]]:
            """A fresh tritonserver (its log beside the last's), and its row at a concurrency."""
            log_path = work / f"tritonserver-{len(servers) + 1}.log"
            servers.append(server := TritonServer(install, work / "triton", [model.name], log_path, grpc=True))
            wait_ready(f"{server.url}/v2/models/{model.name}/ready", server)
            return functools.partial(measure, analyzer, "triton", model.name, server.url, server.grpc_url, data,
                                     [psutil.Process(server.process.pid)], args,
                                     steps=functools.partial(inference_count, server.url, model.name,
                                                             kind="execution_count"))

        try:
            rows += measure_each(concurrencies, start_triton(), f"tritonserver died; its logs: {work}/tritonserver-*",
                                 restart=start_triton)
        finally:
            for server in servers:
                server.stop()
    print_table(rows, args)
    found = budgets(rows, lambda batch: step_cpu_ms_per_row(entry, manifest, batch, args.rows))
    print_budgets(found)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "budgets": found}, indent=1))
    return 0


def step_cpu_ms_per_row(entry: Path, manifest: Mapping[str, Any], batch: int, rows: int, runs: int = 200) -> float:
    """CPU milliseconds per row of the entry's ``step`` graph alone at ``batch`` rows, as the service loads it (its
    backend and threads: ``load_backends``; Triton's side loads it alike): the state the entry starts from, pieces of
    ``rows`` values around 10 per row; this process's CPU time (the graph's threads included) over ``runs`` calls
    after a warm-up, best of three."""
    from service.runtime.backends import load_backends
    from service.runtime.pipeline import load_initial_state

    graph = next(g for g in manifest["graphs"] if g["name"] == "step")
    step = load_backends(entry, manifest, "onnx")["step"]
    state = load_initial_state(entry)
    rng = np.random.default_rng(0)
    inputs = {}
    for spec in graph["inputs"]:
        if spec["name"] in state:
            inputs[spec["name"]] = np.repeat(state[spec["name"]], batch, axis=0)
        else:  # a piece's tensor: (batch, rows, columns)
            shape = [batch if axis == "batch" else rows if isinstance(axis, str) else axis for axis in spec["shape"]]
            inputs[spec["name"]] = (rng.standard_normal(shape) * 3 + 10).astype(spec["dtype"])
    for _ in range(10):
        step.run(inputs)
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(runs):
            step.run(inputs)
        best = min(best, time.process_time() - started)
    return 1000 * best / runs / batch


def budgets(rows: list[dict[str, Any]], step_ms_per_row: Callable[[int], float]) -> list[dict[str, Any]]:
    """Per concurrency where rtserve, the floor and Triton all have a row: what Triton's CPU per piece leaves rtserve
    once the floor, the step (at Triton's rows per step: ``step_ms_per_row(batch)``) and rtserve's Redis are paid,
    against what rtserve spends beyond those same parts (module docstring). In ms per piece."""
    found = []
    for concurrency in sorted({row["concurrency"] for row in rows}):
        side = {row["server"]: row for row in rows if row["concurrency"] == concurrency and "error" not in row}
        if not {"rtserve", "grpc-floor", "triton"} <= side.keys() or "rows_per_step" not in side["triton"]:
            continue
        batch = max(1, round(side["triton"]["rows_per_step"]))
        step = step_ms_per_row(batch)
        redis = side["rtserve"].get("cpu_ms_per_piece_of", {}).get("Redis", 0.0)
        paid = side["grpc-floor"]["server_cpu_ms_per_piece"] + step + redis
        triton, rtserve = side["triton"]["server_cpu_ms_per_piece"], side["rtserve"]["server_cpu_ms_per_piece"]
        found.append({"concurrency": concurrency, "step_batch": batch, "step_ms": round(step, 3),
                      "floor_ms": side["grpc-floor"]["server_cpu_ms_per_piece"], "redis_ms": redis,
                      "paid_ms": round(paid, 3), "triton_ms": triton, "left_by_triton_ms": round(triton - paid, 3),
                      "rtserve_beyond_ms": round(rtserve - paid, 3)})
    return found


def print_budgets(found: list[dict[str, Any]]) -> None:
    if not found:
        return
    print("\nThe budget: what Triton's CPU per piece leaves rtserve once the floor (grpcio's asyncio server doing "
          "nothing), the step alone (at Triton's rows per step) and rtserve's Redis are paid, ms per piece:")
    print("| concurrency | floor | step (rows) | Redis | paid | Triton | left for rtserve's own work "
          "| rtserve spends there |")
    print("|---|---|---|---|---|---|---|---|")
    for entry in found:
        print(f"| {entry['concurrency']} | {entry['floor_ms']} | {entry['step_ms']} ({entry['step_batch']}) | "
              f"{entry['redis_ms']} | {entry['paid_ms']} | {entry['triton_ms']} | {entry['left_by_triton_ms']} | "
              f"{entry['rtserve_beyond_ms']} |")


def sequence_request(model: str, input_name: str, rows: np.ndarray, sequence_id: int, index: int, length: int) -> Any:
    """Piece ``index`` of a sequence of ``length`` as perf_analyzer sends it over gRPC: a ``ModelInferRequest`` of the
    rows as raw FP32, ``sequence_start`` on the first piece and ``sequence_end`` on the last."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, id=str(index + 1))
    request.inputs.add(name=input_name, datatype="FP32", shape=list(rows.shape))
    request.raw_input_contents.append(np.ascontiguousarray(rows, dtype="<f4").tobytes())
    request.parameters["sequence_id"].uint64_param = sequence_id
    request.parameters["sequence_start"].bool_param = index == 0
    request.parameters["sequence_end"].bool_param = index == length - 1
    return request


def capture_answers(target: str, model: str, rows: int, width: int, folder: Path) -> None:
    """What the gRPC floor answers with, taken from rtserve's gRPC server at ``target``: the model's metadata and
    configuration, and rtserve's answer to the 5th piece of a sequence of 6 (a running answer, with the forecast once
    the look-back is read), each a serialized message in ``folder`` (:data:`GRPC_FLOOR`'s ``--captured``)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    rng = np.random.default_rng(1)
    with grpc.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        metadata = stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=model))
        config = stub.ModelConfig(service_pb2.ModelConfigRequest(name=model))
        answers = [stub.ModelInfer(sequence_request(model, metadata.inputs[0].name,
                                                    rng.standard_normal((rows, width)) * 3 + 10, 1, index, 6))
                   for index in range(6)]
    folder.mkdir(parents=True, exist_ok=True)
    for name, message in (("metadata", metadata), ("config", config), ("answer", answers[4])):
        (folder / name).write_bytes(message.SerializeToString())


def grpc_inference_count(target: str, model: str) -> int:
    """A gRPC server's count of inferences of ``model`` (the statistics extension's ``ModelStatistics``)."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        statistics = stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name=model), timeout=10)
    return sum(entry.inference_count for entry in statistics.model_stats)


def measure_floor(analyzer: PerfAnalyzer, args: argparse.Namespace, work: Path, data: Path,
                  concurrencies: list[int]) -> list[dict[str, Any]]:
    """The gRPC floor's rows (:data:`GRPC_FLOOR`, answering with what :func:`capture_answers` took from rtserve),
    driven as the servers are, with rtserve's input ``data``."""
    port = free_port()
    target = f"{HOST}:{port}"
    server = Server([sys.executable, str(GRPC_FLOOR), "--port", str(port), "--captured", str(work / "captured")],
                    dict(os.environ), port, work / "grpc-floor.log")
    try:
        deadline = time.monotonic() + 60
        while True:  # it answers its statistics once it listens
            try:
                grpc_inference_count(target, args.model)
                break
            except Exception:
                if server.process.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the gRPC floor did not start:\n{server.log_tail()}") from None
                time.sleep(0.2)
        at = functools.partial(measure, analyzer, "grpc-floor", args.model, "", target, data,
                               [psutil.Process(server.process.pid)], args,
                               count=functools.partial(grpc_inference_count, target, args.model))
        return measure_each(concurrencies, at, f"the gRPC floor died; its log: {server.log_path}")
    finally:
        server.stop()


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
    print("| server | concurrency | pieces/s | p50 ms | p99 ms | server CPU ms/piece | of it | client CPU ms/piece "
          "| rows/step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "error" in row:
            died = '' if row['server_alive'] else ' (the server died)'
            print(f"| {row['server']} | {row['concurrency']} | failed{died}"
                  " | | | | | | |")
            continue
        again = " (a fresh server: the first try crashed it)" if row.get("crashed_first") else ""
        parts = ", ".join(f"{name} {ms}" for name, ms in row.get("cpu_ms_per_piece_of", {}).items())
        print(f"| {row['server']} | {row['concurrency']}{again} | {row['pieces_per_second']} | {row['p50_ms']:.2f} | "
              f"{row['p99_ms']:.2f} | {row['server_cpu_ms_per_piece']} | {parts} | {row['client_cpu_ms_per_piece']} "
              f"| {row.get('rows_per_step', '')} |")


if __name__ == "__main__":
    sys.exit(main())
