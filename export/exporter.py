"""Servable -> model-repository entry: ``<out>/<name>/<version>/``.

An entry holds, for every graph of the servable:

- ``<graph>.onnx`` (checked with ``onnx.checker``, loaded once by ONNX Runtime
  with full graph optimization) and/or ``<graph>.ts`` (TorchScript, traced);
- ``manifest.json``: task, family, version, source checkpoint hash, serving
  settings, every graph's input/output names, dtypes, shapes and dynamic
  axes, its CPU threads and largest CPU batch (timed here), and the state spec;
- ``initial_state.safetensors``: ``init_state(1)`` (learned initial memory, zeros, ...);
- ``assets/`` (tokenizer, ...), and ``checkpoint/`` (the source checkpoint,
  so the eager backend can rebuild the model without the training data).

The service discovers models from this folder alone.
"""

from __future__ import annotations

import datetime as dt
import inspect
import json
import logging
import shutil
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from models.checkpoint import CONFIG_FILE, WEIGHTS_FILE, load_checkpoint
from models.onnx_fp16 import to_float16
from models.segment import TensorSpec
from models.serving.servable import Graph, Servable, build_servable

log = logging.getLogger(__name__)

FORMATS = ("onnx", "torchscript")
MANIFEST_FILE = "manifest.json"
ONNX_OPSET = 18  # for the tracing exporter; the dynamo exporter picks its own
INITIAL_STATE_FILE = "initial_state.safetensors"  # init_state(1), batch axis of 1
MANIFEST_SCHEMA = 1


def graph_files(graph_name: str) -> dict[str, str]:
    return {"onnx": f"{graph_name}.onnx", "torchscript": f"{graph_name}.ts"}


def dynamic_shapes(graph: Graph) -> tuple[Any, ...]:
    """``torch.export`` dynamic shapes from the graph's symbolic axes, shaped like ``forward``'s signature."""
    per_input = [
        {axis: torch.export.Dim.DYNAMIC for axis, size in enumerate(spec.shape) if isinstance(size, str)} or None
        for spec in graph.inputs
    ]
    shapes: list[Any] = []
    index = 0
    for parameter in inspect.signature(graph.module.forward).parameters.values():
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            shapes.append(tuple(per_input[index:]))
            index = len(per_input)
        else:
            shapes.append(per_input[index])
            index += 1
    return tuple(shapes)


def export_onnx(graph: Graph, path: Path, fp16: bool = False) -> None:
    import onnx

    generator = torch.Generator().manual_seed(0)
    sample = graph.sample_inputs(2, generator)
    names = {"input_names": [spec.name for spec in graph.inputs], "output_names": [spec.name for spec in graph.outputs]}
    # torch's ONNX exporter warns once per torchvision op it cannot register; rtserve uses none
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if graph.onnx_exporter == "dynamo":
            program = torch.onnx.export(
                graph.module, sample, dynamic_shapes=dynamic_shapes(graph), dynamo=True, verbose=False, **names
            )
            assert program is not None
            program.save(str(path))
        else:  # the tracing exporter, for graphs torch.export cannot take yet
            torch.onnx.export(
                graph.module, sample, str(path), dynamic_axes=graph.dynamic_axes(), dynamo=False,
                opset_version=ONNX_OPSET, **names,
            )
    model = onnx.load(str(path))
    if fp16:
        model = to_float16(model, keep_io_types=False)
        onnx.save(model, str(path))
    onnx.checker.check_model(model, full_check=True)


def export_torchscript(graph: Graph, path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    sample = graph.sample_inputs(2, generator)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript; still supported
        traced = torch.jit.trace(graph.module, sample, check_trace=False)
        traced.save(str(path))


def _check_onnxruntime_loads(path: Path) -> list[str]:
    """The providers of a plain CPU session of the written graph: the file loads in ONNX Runtime."""
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_providers()


LIGHT_GRAPH_MS = 2.0  # a graph that one thread runs in less than this, for a batch of one, may be light
BATCHED_ROWS = 16  # ... if every core runs neither one row nor this many clearly faster:
POOL_SPEEDUP = 1.5  # ... at least this many times as fast


def thread_milliseconds(path: Path, graph: Graph, rows: int, runs: int,
                        threads: tuple[int, ...] = (1, 0)) -> list[float]:
    """The median time of ``runs`` runs of the written graph on its own sample inputs of ``rows`` rows, for each of
    ``threads`` intra-op thread counts (default: one thread, then ONNX Runtime's default pool on every core),
    none spinning, after a warm-up run each. The sessions take turns run by run, so that the machine's drift
    falls on all alike."""
    sessions = [timing_session(path, count) for count in threads]
    feed = feed_of(sessions[0], graph, graph.sample_inputs(rows, torch.Generator().manual_seed(0)))
    times: list[list[float]] = [[] for _ in sessions]
    for session in sessions:
        session.run(None, feed)
    for _ in range(runs):
        for session, timings in zip(sessions, times, strict=True):
            started = time.perf_counter()
            session.run(None, feed)
            timings.append(time.perf_counter() - started)
    return [1000 * statistics.median(timings) for timings in times]


def timing_session(path: Path, threads: int) -> Any:
    """An ONNX Runtime CPU session of the written graph on ``threads`` intra-op threads (0: the pool), not
    spinning, as the service runs it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def feed_of(session: Any, graph: Graph, sample: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """The session's inputs from the graph's positional ``sample`` (an input the optimized graph dropped is left
    out)."""
    inputs = {spec.name: tensor.numpy() for spec, tensor in zip(graph.inputs, sample, strict=True)}
    return {node.name: inputs[node.name] for node in session.get_inputs()}


def light_graph_threads(path: Path, graph: Graph) -> int:
    """The intra-op threads the written graph should run with on a CPU: 1 for a *light* graph, which one thread
    runs on a batch of one in under :data:`LIGHT_GRAPH_MS`, and which every core runs less than
    :data:`POOL_SPEEDUP` times as fast on a batch of one or of :data:`BATCHED_ROWS` rows: the pool's wake-ups
    between ops would cost more CPU than they save time (an RSA step on 2 cores: 0.54 against 0.87 ms of CPU
    at one row, no faster; 4.8 against 6.4 ms at 16 rows, for 11 % less time; docs/serving.md).

    0, ONNX Runtime's default, otherwise, and always where the sample inputs do not show the served work:
    for an autoregressive decode graph (``axis_masks``), whose batches hold many rows that each read a whole
    document's memory (on every core, 32 BBC summaries at once decode 1.6 times as fast as on one), and for a
    graph served far larger than sampled (``sized_like_served`` False: the summarizer's output layer, folded
    for a document's 1,000 or so candidates, runs 1.4-1.9 times as fast on 2 cores as on one).

    Timed here, on the exporting machine (:func:`thread_milliseconds`: one thread and the pool in turns,
    medians of 30 runs each); the margin keeps a busy machine's noise from tipping a light graph to the pool."""
    if graph.axis_masks or not graph.sized_like_served:
        return 0
    if thread_milliseconds(path, graph, 1, 1, threads=(1,))[0] > 10 * LIGHT_GRAPH_MS:  # plainly heavy: no more
        return 0
    one, pool = thread_milliseconds(path, graph, 1, 30)
    if one >= LIGHT_GRAPH_MS or one >= POOL_SPEEDUP * pool:
        return 0
    one, pool = thread_milliseconds(path, graph, BATCHED_ROWS, 30)
    return 1 if one < POOL_SPEEDUP * pool else 0


BATCH_SIZES = (4, 8, 16, 32)  # the batch sizes a heavy graph is timed at (32: the service's largest CPU batch)
BATCH_TIMING_RUNS = 7  # calls timed at each size, taking turns: the median's noise stays below the sizes' differences


def cpu_ms_per_row(path: Path, graph: Graph, threads: int, sizes: tuple[int, ...] = BATCH_SIZES,
                   runs: int = BATCH_TIMING_RUNS) -> dict[int, float]:
    """CPU milliseconds per row of the written graph at each batch size in ``sizes``, on ``threads`` intra-op
    threads (0: ONNX Runtime's pool), not spinning: the process's CPU time (the pool's threads included), median of
    ``runs`` calls at each size, the sizes taking turns so that the machine's drift falls on all alike. The inputs
    are shaped as served (``served_inputs``, else the sample)."""
    session = timing_session(path, threads)
    make = graph.served_inputs or graph.sample_inputs
    feeds = {size: feed_of(session, graph, make(size, torch.Generator().manual_seed(0))) for size in sizes}
    for feed in feeds.values():
        session.run(None, feed)  # warm-up
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(runs):
        for size in sizes:
            started = time.process_time()
            session.run(None, feeds[size])
            times[size].append(time.process_time() - started)
    return {size: 1000 * statistics.median(spent) / size for size, spent in times.items()}


def batch_cap(ms_per_row: dict[int, float]) -> int | None:
    """The batch size whose row costs least (the larger of two that cost the same); None when that is the largest
    size timed (no cap)."""
    cheapest = min(ms_per_row, key=lambda size: (ms_per_row[size], -size))
    return None if cheapest == max(ms_per_row) else cheapest


def cpu_batch_cap(path: Path, graph: Graph, threads: int) -> tuple[int | None, dict[int, float] | None]:
    """The largest batch the written graph should run on a CPU (None: the service's default), and its cost per row
    by batch size (None: not timed).

    Only a heavy graph is timed (not light: ``threads`` 0), with inputs shaped as served, and never a decode graph or
    one served far larger than sampled. Its batches stop at the size whose row costs least: on a CPU a heavy step's
    batch buys nothing but a cheaper row (the same rows in two half batches take as long in all, and the first
    half's answers come sooner), and a step whose intermediate tensors outgrow the CPU's caches costs more a row past
    some size (an RMT segment on a 2-core AMD EPYC: 18.4, 19.2, 20.6 and 21.4 ms of CPU a row at 4, 8, 16 and 32
    rows). A light graph's batch is not capped: around its step, each batch costs the service a round trip to Redis
    and a hand-off, which a larger batch shares.

    Timed here, on the exporting machine (:func:`cpu_ms_per_row`), as the threads are: what to use when the
    exporting machine is the serving one and idle; RTSERVE_MODEL_MAX_BATCH_SIZES overrides it."""
    if graph.axis_masks or not graph.sized_like_served or threads == 1:
        return None, None
    costs = cpu_ms_per_row(path, graph, threads)
    return batch_cap(costs), costs


def write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A safetensors file created as every other file of an entry is (mode 0666 less the umask): the library's own
    writer makes it 0600, which leaves it unreadable to a service run by another user."""
    path.write_bytes(save({name: tensor.detach().contiguous() for name, tensor in tensors.items()}))


def export_servable(
    servable: Servable,
    checkpoint_folder: Path,
    out: Path,
    formats: tuple[str, ...] = FORMATS,
    version: str = "1",
    fp16: bool = False,
    cpu_threads: int | None = None,
) -> Path:
    """Write the repository entry of ``servable``; returns its folder. ``cpu_threads``: the intra-op threads
    written for every graph but a decode graph (0: ONNX Runtime's pool), and no CPU batch cap; None: both timed here
    (:func:`light_graph_threads`, :func:`cpu_batch_cap`), which is what to use when the exporting machine is the
    serving one and idle."""
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown export formats {sorted(unknown)}; choose from {FORMATS}")
    if fp16 and set(formats) != {"onnx"}:
        raise ValueError("fp16 is an ONNX option for GPU serving: export it with --format onnx")

    def spec_dict(spec: TensorSpec) -> dict[str, Any]:
        """fp16 graphs take and return float16 wherever the fp32 graph has float32 (state included)."""
        document = spec.as_dict()
        if fp16 and document["dtype"] == "float32":
            document["dtype"] = "float16"
        return document
    entry = out / servable.name / version
    if entry.exists():
        shutil.rmtree(entry)
    entry.mkdir(parents=True)
    graphs: list[dict[str, Any]] = []
    for graph in servable.graphs:
        files = graph_files(graph.name)
        written, threads = {}, 0
        cap: int | None = None
        costs: dict[int, float] | None = None
        if "onnx" in formats:
            export_onnx(graph, entry / files["onnx"], fp16=fp16)
            _check_onnxruntime_loads(entry / files["onnx"])
            written["onnx"] = files["onnx"]
            if fp16 or graph.axis_masks:
                threads = 0
            elif cpu_threads is not None:
                threads = cpu_threads
            else:
                threads = light_graph_threads(entry / files["onnx"], graph)
                cap, costs = cpu_batch_cap(entry / files["onnx"], graph, threads)
        if "torchscript" in formats:
            export_torchscript(graph, entry / files["torchscript"])
            written["torchscript"] = files["torchscript"]
        graphs.append(
            {
                "name": graph.name,
                "files": written,
                "inputs": [spec_dict(spec) for spec in graph.inputs],
                "outputs": [spec_dict(spec) for spec in graph.outputs],
                "dynamic_axes": {k: {str(a): n for a, n in v.items()} for k, v in graph.dynamic_axes().items() if v},
                "state_outputs": graph.state_outputs,
                "axis_masks": graph.axis_masks,
                "onnx_exporter": graph.onnx_exporter if "onnx" in written else None,
                "intra_op_threads": threads,  # on a CPU, unless RTSERVE_INTRA_OP_THREADS says otherwise
                # on a CPU, unless RTSERVE_MODEL_MAX_BATCH_SIZES says otherwise; and what it was chosen from
                "cpu_max_batch_size": cap,
                "cpu_ms_per_row": None if costs is None else {str(size): round(ms, 3) for size, ms in costs.items()},
            }
        )
    assets = {}
    if servable.assets or servable.tensor_assets:
        (entry / "assets").mkdir()
    for key, source in servable.assets.items():
        shutil.copyfile(source, entry / "assets" / Path(source).name)
        assets[key] = f"assets/{Path(source).name}"
    for key, tensors in servable.tensor_assets.items():
        write_tensors(entry / "assets" / f"{key}.safetensors", tensors)
        assets[key] = f"assets/{key}.safetensors"
    initial = {name: tensor.detach().contiguous() for name, tensor in servable.init_state().items()}
    if fp16:
        initial = {name: t.half() if t.dtype == torch.float32 else t for name, t in initial.items()}
    write_tensors(entry / INITIAL_STATE_FILE, initial)
    (entry / "checkpoint").mkdir()
    for file_name in (CONFIG_FILE, WEIGHTS_FILE):  # the entry's own modes, whatever the training run's were
        shutil.copyfile(checkpoint_folder / file_name, entry / "checkpoint" / file_name)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "name": servable.name,
        "version": version,
        "task": servable.task,
        "family": servable.family,
        "precision": "fp16" if fp16 else "fp32",
        "source_checkpoint_sha256": load_checkpoint(checkpoint_folder).sha256(),
        "exported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
        "settings": _with_metrics(servable.settings, checkpoint_folder),
        "state_spec": [spec_dict(spec) for spec in servable.state_spec],
        "graphs": graphs,
        "assets": assets,
    }
    (entry / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return entry


METRICS_FILE = "metrics.json"


def _with_metrics(settings: dict, checkpoint_folder: Path) -> dict:
    """The servable's settings; where its checkpoint carries no measured scores (the classifier and the summarizer
    were scored after training, by ``rtserve eval``), those of ``metrics.json`` beside the checkpoint."""
    extra = checkpoint_folder / METRICS_FILE
    if settings.get("metrics") or not extra.exists():
        return settings
    return {**settings, "metrics": json.loads(extra.read_text())}


def export_checkpoint(
    checkpoint_folder: str | Path,
    out: str | Path,
    formats: tuple[str, ...] = FORMATS,
    name: str | None = None,
    version: str = "1",
    fp16: bool = False,
    cpu_threads: int | None = None,
) -> Path:
    checkpoint_folder = Path(checkpoint_folder)
    servable = build_servable(checkpoint_folder, name=name)
    return export_servable(servable, checkpoint_folder, Path(out), formats, version, fp16, cpu_threads)
