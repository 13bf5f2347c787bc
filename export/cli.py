"""``rtserve export``: checkpoint folder(s) -> model-repository entries."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from export.exporter import FORMATS, export_checkpoint


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="rtserve export",
        description="Export trained checkpoints to TorchScript / ONNX entries of a model repository.",
    )
    parser.add_argument("checkpoints", nargs="*", help="checkpoint folders (config.json + model.safetensors)")
    parser.add_argument("--all", metavar="DIR", help="export every checkpoint folder directly under DIR")
    parser.add_argument("--format", help=f"comma-separated, from {FORMATS} (default: both; onnx with --fp16)")
    parser.add_argument("--out", default="model_repository", help="model repository folder")
    parser.add_argument("--name", help="entry name (one checkpoint only; default: the checkpoint's name)")
    parser.add_argument("--version", default="1", help="entry version")
    parser.add_argument("--fp16", action="store_true", help="fp16 graph for GPU serving (ONNX only)")
    parser.add_argument("--cpu-threads", type=int, default=None, metavar="N",
                        help="intra-op threads written into the manifest for CPU runs of every graph but a decode "
                        "graph (0: ONNX Runtime's pool of every core); default: timed on this machine, one thread "
                        "for a light graph. Set it when exporting on a machine other than the serving one, or a "
                        "busy one. RTSERVE_INTRA_OP_THREADS overrides it when serving")
    args = parser.parse_args(list(argv))
    if args.cpu_threads is not None and args.cpu_threads < 0:
        parser.error("--cpu-threads is 0 (the pool) or more")
    # torch's ONNX exporter warns once per torchvision op it cannot register; rtserve uses none
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    folders = [Path(p) for p in args.checkpoints]
    if args.all:
        folders += sorted(p.parent for p in Path(args.all).glob("*/config.json"))
    if not folders:
        parser.error("name checkpoint folders or --all DIR")
    if args.name and len(folders) > 1:
        parser.error("--name needs exactly one checkpoint")
    requested = args.format or ("onnx" if args.fp16 else "onnx,torchscript")
    formats = tuple(part.strip() for part in requested.split(",") if part.strip())
    for folder in folders:
        started = time.perf_counter()
        entry = export_checkpoint(folder, args.out, formats, args.name, args.version, args.fp16, args.cpu_threads)
        seconds = time.perf_counter() - started
        print(json.dumps({"checkpoint": str(folder), "entry": str(entry), "seconds": round(seconds, 1)}))
        sys.stdout.flush()
    return 0
