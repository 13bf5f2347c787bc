"""fp16 and bf16 against fp32: how far each backend's outputs move when a model runs in lower precision.

    .venv/bin/rtserve export --all weights --out model_repository     # once
    .venv/bin/python benchmarks/precision_parity.py                    # every entry of model_repository/
    .venv/bin/python benchmarks/precision_parity.py model_repository/rsa-etth1-h24/1 --device cuda:0

Every graph of every entry runs on the graph's own random sample inputs (``Graph.sample_inputs``,
``--seeds`` draws of batch ``--batch``) through each backend in fp32 and in each lower precision
the backend supports, on one device. Printed per model, graph, backend and precision: the largest
absolute difference from that backend's fp32 over every floating output, and that difference
relative to the largest magnitude of the fp32 output it came from (masked log-probabilities,
<= -1e29, are left out of both). Integer outputs must match exactly (counted in ``int diffs``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from models.serving.servable import Graph, build_servable
from service.devices import BACKEND_PRECISIONS, DeviceConfigError
from service.runtime.backends import BACKENDS, load_backends

MASKED = -1e29  # log-probabilities at or below are masked entries (NEG = -1e30)


def differences(reference: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> tuple[float, float, int]:
    """Largest abs difference, the largest abs difference / max |reference| per output, and exact
    mismatches: integer outputs that differ, masked log-probabilities that came back unmasked."""
    worst_abs, worst_rel, int_diffs = 0.0, 0.0, 0
    for name, ref in reference.items():
        out = got[name]
        if not np.issubdtype(ref.dtype, np.floating):
            int_diffs += int((ref != out).sum())
            continue
        keep = ref > MASKED
        int_diffs += int((out[~keep] > -6e4).sum())  # fp16 ONNX graphs clamp -1e30 to -65504: still masked
        if not keep.any():
            continue
        diff = np.abs(ref[keep].astype(np.float64) - out[keep].astype(np.float64))
        worst = float(np.nan_to_num(diff, nan=np.inf).max())
        worst_abs = max(worst_abs, worst)
        worst_rel = max(worst_rel, worst / max(float(np.abs(ref[keep]).max()), 1e-12))
    return worst_abs, worst_rel, int_diffs


def sample(graph: Graph, batch: int, seed: int) -> dict[str, np.ndarray]:
    tensors = graph.sample_inputs(batch, torch.Generator().manual_seed(seed))
    return {spec.name: tensor.numpy() for spec, tensor in zip(graph.inputs, tensors, strict=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("entries", nargs="*", help="model-repository entries (default: model_repository/*/*)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help=f"comma-separated subset of {','.join(BACKENDS)} (torch alone: a GPU host without "
                        "onnxruntime-gpu)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    backends = [name for name in args.backends.split(",") if name]
    if unknown := sorted(set(backends) - set(BACKENDS)):
        parser.error(f"unknown backends {unknown}; choose from {','.join(BACKENDS)}")
    torch.set_num_threads(args.threads)
    entries = [Path(p) for p in args.entries] or sorted(
        p.parent for p in Path("model_repository").glob("*/*/manifest.json")
    )
    print(f"torch {torch.__version__}, device {args.device}, batch {args.batch}, {args.seeds} seeds")
    print(f"{'model':<24} {'graph':<14} {'backend':<12} {'prec':<5} {'max abs':>10} {'max rel':>10} {'exact':>6}")
    rows = []
    for entry in entries:
        manifest = json.loads((entry / "manifest.json").read_text())
        servable = build_servable(entry / "checkpoint")
        samples = {graph.name: [sample(graph, args.batch, seed) for seed in range(args.seeds)]
                   for graph in servable.graphs}
        for backend in backends:
            reference = load_backends(entry, manifest, backend, args.threads, args.device, "fp32")
            expected = {g: [reference[g].run(inputs) for inputs in draws] for g, draws in samples.items()}
            for precision in ("fp16", "bf16"):
                if precision not in BACKEND_PRECISIONS[backend]:
                    continue
                try:
                    lowered = load_backends(entry, manifest, backend, args.threads, args.device, precision)
                except (DeviceConfigError, RuntimeError) as error:  # a graph the runtime cannot lower
                    print(f"{manifest['name']:<24} {'*':<14} {backend:<12} {precision:<5} fails to load: {error}")
                    continue
                for graph, draws in samples.items():
                    try:
                        results = [differences(ref, lowered[graph].run(inputs))
                                   for ref, inputs in zip(expected[graph], draws, strict=True)]
                    except Exception as error:  # noqa: BLE001 - report and go on with the next graph
                        print(f"{manifest['name']:<24} {graph:<14} {backend:<12} {precision:<5} fails: "
                              f"{type(error).__name__}: {str(error).splitlines()[0][:120]}")
                        rows.append({"model": manifest["name"], "graph": graph, "backend": backend,
                                     "precision": precision, "error": str(error).splitlines()[0]})
                        continue
                    worst_abs = max(r[0] for r in results)
                    worst_rel = max(r[1] for r in results)
                    int_diffs = sum(r[2] for r in results)
                    rows.append({"model": manifest["name"], "graph": graph, "backend": backend, "precision": precision,
                                 "max_abs": worst_abs, "max_rel": worst_rel, "int_diffs": int_diffs})
                    print(f"{manifest['name']:<24} {graph:<14} {backend:<12} {precision:<5} {worst_abs:>10.3g} "
                          f"{worst_rel:>10.3g} {int_diffs:>6}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
