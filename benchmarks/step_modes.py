"""Offline segments/s of each torch step graph per batch size, eagerly against captured CUDA graphs (and
``torch.compile``), and the record of the fastest mode in each entry (``step_modes.json``, which the service reads).

    python benchmarks/step_modes.py --repository model_repository --device cuda:0 --batches 1,8,32,128,256 --write

Method: per model of ``--models`` and per graph that is not a decode graph, the torch backend the service would load
(:class:`~service.runtime.backends.TorchBackend`, in ``--precision``) in each mode of ``--modes``, on the graph's
own random sample inputs at each batch size (host arrays in, host arrays out: the copies a served batch makes are
in the time). Per mode and batch: a warm-up of ``--warm-up`` calls (graphs: the capture), then calls for at least
``--seconds``; segments/s = rows x calls / wall time. With ``--write`` the fastest mode per graph
(:func:`service.runtime.step_modes.fastest`) and every rate go into ``<entry>/step_modes.json``. On a CPU
(``--device cpu``, a rehearsal) the graphs mode runs through the stand-in capture: it exercises the code, it
measures nothing a GPU would.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rate(backend: Any, inputs: dict[str, Any], rows: int, warm_up: int, seconds: float) -> float:
    import torch

    for _ in range(warm_up):
        backend.run(inputs)
    if backend.device.startswith("cuda"):
        torch.cuda.synchronize()
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds or calls < 3:
        backend.run(inputs)  # outputs come back to the host: each call ends synchronized
        calls += 1
    return rows * calls / elapsed


def measure_model(entry: Path, options: argparse.Namespace) -> tuple[dict[str, dict[str, dict[str, float]]],
                                                                      dict[str, str]]:
    import torch

    from models.serving.servable import build_servable
    from service.runtime.backends import TorchBackend
    from service.runtime.step_graphs import stand_in_capture

    manifest = json.loads((entry / "manifest.json").read_text())
    servable = build_servable(entry / "checkpoint", name=manifest["name"])
    rates: dict[str, dict[str, dict[str, float]]] = {}
    notes: dict[str, str] = {}
    for spec in manifest["graphs"]:
        if spec.get("axis_masks"):
            continue  # a decode graph runs eagerly (service.runtime.step_modes.choose)
        graph = servable.graph(spec["name"])
        generator = torch.Generator().manual_seed(0)
        by_mode: dict[str, dict[str, float]] = {}
        for mode in options.modes:
            capture = stand_in_capture if mode == "graphs" and not options.device.startswith("cuda") else None
            try:
                backend = TorchBackend(graph.module, spec, options.device, options.precision, mode,
                                       max(options.batches), capture)
                by_mode[mode] = {}
                for rows in options.batches:
                    inputs = {s.name: t.numpy() for s, t in zip(graph.inputs, graph.sample_inputs(rows, generator),
                                                                  strict=True)}
                    by_mode[mode][str(rows)] = rate(backend, inputs, rows, options.warm_up, options.seconds)
                    print(f"{manifest['name']} {spec['name']} {mode} batch {rows}: "
                          f"{by_mode[mode][str(rows)]:.1f} segments/s", flush=True)
                if backend.graphs is not None and backend.graphs.failure:
                    notes[spec["name"]] = f"graphs fell back to eager: {backend.graphs.failure}"
                    by_mode.pop(mode)
            except Exception as error:  # a mode this torch cannot run (compile without a compiler ...): said, skipped
                notes[spec["name"]] = f"{mode} failed: {type(error).__name__}: {str(error)[:300]}"
                by_mode.pop(mode, None)
                print(f"{manifest['name']} {spec['name']} {mode}: {notes[spec['name']]}", flush=True)
        rates[spec["name"]] = by_mode
    return rates, notes


def table(results: dict[str, dict[str, Any]], batches: list[int]) -> str:
    lines = ["| model | graph | mode | " + " | ".join(f"batch {b}" for b in batches) + " | chosen |",
             "|---|---|---|" + "---|" * len(batches) + "---|"]
    for model, record in results.items():
        for graph, measured in record["graphs"].items():
            for mode, by_batch in measured["rates"].items():
                cells = " | ".join(f"{by_batch[str(b)]:,.0f}" if str(b) in by_batch else "" for b in batches)
                chosen = "**yes**" if mode == measured["mode"] else ""
                lines.append(f"| {model} | {graph} | {mode} | {cells} | {chosen} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--models", default="all", help="comma-separated entry names (all: every entry)")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--modes", default="eager,graphs", help="of eager, graphs, compile")
    parser.add_argument("--batches", default="1,8,32,128,256")
    parser.add_argument("--seconds", type=float, default=1.0, help="per mode and batch")
    parser.add_argument("--warm-up", type=int, default=5)
    parser.add_argument("--write", action="store_true", help="write each entry's step_modes.json")
    parser.add_argument("--out-md", type=Path, help="also write the table here")
    parser.add_argument("--out-json", type=Path, help="and every model's record here")
    options = parser.parse_args()
    options.modes = [m.strip() for m in options.modes.split(",") if m.strip()]
    options.batches = [int(b) for b in options.batches.split(",")]
    import torch

    from service.runtime.step_modes import fastest, write_record

    device_name = torch.cuda.get_device_name(0) if options.device.startswith("cuda") else "cpu"
    results: dict[str, dict[str, Any]] = {}
    names = sorted(p.parent.parent.name for p in options.repository.glob("*/*/manifest.json")) \
        if options.models == "all" else [m.strip() for m in options.models.split(",") if m.strip()]
    for model in names:
        entries = sorted((options.repository / model).glob("*/manifest.json"))
        if not entries:
            print(f"{model}: not in {options.repository}, skipped", flush=True)
            continue
        entry = entries[-1].parent
        rates, notes = measure_model(entry, options)
        rates = {graph: by_mode for graph, by_mode in rates.items() if by_mode}
        if options.write and rates:
            results[model] = write_record(entry, device_name, torch.__version__, rates, notes)
        else:
            results[model] = {"graphs": {g: {"mode": fastest(m), "rates": m} for g, m in rates.items()}}
    text = (f"Offline segments/s per batch, torch {torch.__version__} on {device_name}, {options.precision} "
            f"(benchmarks/step_modes.py, {options.seconds:g} s per cell):\n\n" + table(results, options.batches))
    print(text)
    if options.out_md:
        options.out_md.parent.mkdir(parents=True, exist_ok=True)
        options.out_md.write_text(text + "\n")
    if options.out_json:
        options.out_json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
