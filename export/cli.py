"""``rtserve export``: checkpoint folder(s) -> model-repository entries.

By default an entry holds the graphs the service will load for it: those of its serving backend
(``RTSERVE_MODEL_BACKENDS``, else ``RTSERVE_BACKEND``, else ONNX), so a repository built for the default
backend carries no TorchScript copy. ``--format`` asks for others. One readable line per checkpoint goes to stderr
as it starts and as it ends; stdout keeps one JSON object per entry written, for scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from models.cli_help import HelpFormatter

# What each serving backend loads from an entry; torch rebuilds the model from the entry's checkpoint/ folder.
BACKEND_FORMATS: dict[str, tuple[str, ...]] = {"onnx": ("onnx",), "torchscript": ("torchscript",), "torch": ()}
FORMATS = tuple(dict.fromkeys(f for formats in BACKEND_FORMATS.values() for f in formats))  # exporter.FORMATS


def served_formats(entry_name: str) -> tuple[str, ...]:
    """The graph formats the service loads for the entry ``entry_name``, read from the settings it reads."""
    try:
        per_model = json.loads(os.environ.get("RTSERVE_MODEL_BACKENDS") or "{}")
    except ValueError as error:
        raise ValueError(f"RTSERVE_MODEL_BACKENDS is not JSON ({error})") from None
    backend = str(per_model.get(entry_name) or os.environ.get("RTSERVE_BACKEND") or "onnx").strip().lower()
    if backend not in BACKEND_FORMATS:
        raise ValueError(f"the backend of {entry_name} is {backend!r}: one of {', '.join(BACKEND_FORMATS)}")
    return BACKEND_FORMATS[backend]


def entry_name(folder: Path, name: str | None) -> str:
    """The entry's name as the export names it: ``--name``, else the checkpoint's own, else its folder's."""
    if name:
        return name
    try:
        extras = json.loads((folder / "config.json").read_text()).get("extras", {})
    except (OSError, ValueError):
        extras = {}
    return str(extras.get("name") or folder.resolve().name)


def held_formats(entry: Path) -> set[str] | None:
    """The formats whose every graph the entry folder ``entry`` holds; None when it holds no manifest or checkpoint."""
    try:
        graphs = json.loads((entry / "manifest.json").read_text()).get("graphs", [])
    except (OSError, ValueError):
        return None
    if not (entry / "checkpoint").is_dir():
        return None
    return {form for form in FORMATS
            if all(form in graph.get("files", {}) and (entry / graph["files"][form]).is_file() for graph in graphs)}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="rtserve export", formatter_class=HelpFormatter,
        description="Export trained checkpoints to entries of a model repository (ONNX and/or TorchScript graphs, "
        "manifest, initial state, assets and the checkpoint). Progress goes to stderr; stdout has one JSON object "
        "per entry written.",
    )
    parser.add_argument("checkpoints", nargs="*", help="checkpoint folders (config.json + model.safetensors)")
    parser.add_argument("--all", metavar="DIR", help="export every checkpoint folder directly under DIR")
    parser.add_argument("--format", help=f"comma-separated, from {', '.join(FORMATS)} (default: what the service's "
                        "backend for the model loads: RTSERVE_MODEL_BACKENDS, else RTSERVE_BACKEND, else onnx; "
                        "the torch backend loads no graph; onnx with --fp16)")
    parser.add_argument("--out", default="model_repository", help="model repository folder")
    parser.add_argument("--name", help="entry name (one checkpoint only; default: the checkpoint's name)")
    parser.add_argument("--version", default="1", help="entry version")
    parser.add_argument("--fp16", action="store_true", help="fp16 graph for GPU serving (ONNX only)")
    parser.add_argument("--missing", action="store_true",
                        help="export only the checkpoints whose entry lacks a graph it would get (what `make serve` "
                        "runs: a repository exported for one backend gains the graphs of another when the settings "
                        "change)")
    parser.add_argument("--cpu-threads", type=int, default=None, metavar="N",
                        help="intra-op threads written into the manifest for CPU runs of every graph but a decode "
                        "graph (0: ONNX Runtime's pool of every core); default: timed on this machine, one thread "
                        "for a light graph, and a heavy graph's largest CPU batch where its rows cost more past "
                        "it. Set it when exporting on a machine other than the serving one, or a busy one (then "
                        "no batch is capped). RTSERVE_INTRA_OP_THREADS and RTSERVE_MODEL_MAX_BATCH_SIZES override "
                        "them when serving")
    args = parser.parse_args(list(argv))
    if args.cpu_threads is not None and args.cpu_threads < 0:
        parser.error("--cpu-threads is 0 (the pool) or more")
    folders = [Path(p) for p in args.checkpoints]
    if args.all:  # a path that is not what it should be: one line and exit status 1, as for any file
        if not Path(args.all).is_dir():
            raise SystemExit(f"rtserve export: --all {args.all}: no such folder")
        found = sorted(p.parent for p in Path(args.all).glob("*/config.json"))
        if not found:
            raise SystemExit(f"rtserve export: --all {args.all}: no checkpoint folder (one holding config.json) in it")
        folders += found
    if not folders:
        parser.error("name checkpoint folders or --all DIR")
    for folder in folders:
        if not (folder / "config.json").is_file():
            raise SystemExit(f"rtserve export: {folder} is not a checkpoint folder: it has no config.json")
    if args.name and len(folders) > 1:
        parser.error("--name needs exactly one checkpoint")
    plan = []
    for folder in folders:
        name = entry_name(folder, args.name)
        if args.format is not None:
            formats = tuple(part.strip() for part in args.format.split(",") if part.strip())
            unknown = sorted(set(formats) - set(FORMATS))
            if unknown:
                parser.error(f"--format {args.format}: unknown {', '.join(unknown)}; choose from {', '.join(FORMATS)}")
            if args.fp16 and formats != ("onnx",):
                parser.error("--fp16 is an ONNX option for GPU serving: export it with --format onnx")
        elif args.fp16:
            formats = ("onnx",)
        else:
            try:
                formats = served_formats(name)
            except ValueError as error:
                parser.error(f"{error} (or name the graphs with --format)")
        if args.missing and not args.fp16:
            held = held_formats(Path(args.out) / name / args.version)
            if held is not None and set(formats) <= held:
                continue
            # the entry is written afresh: keep the graphs it holds for another backend
            formats = tuple(dict.fromkeys([*(f for f in FORMATS if f in (held or ())), *formats]))
        plan.append((folder, name, formats))
    if not plan:
        print(f"rtserve export: every entry in {args.out}/ holds the graphs its backend loads", file=sys.stderr)
        return 0
    print(f"rtserve export: {len(plan)} checkpoint{'s' if len(plan) > 1 else ''} into {args.out}/", file=sys.stderr,
          flush=True)
    from export.exporter import export_checkpoint  # torch: after the line above, which a first run waits for

    for number, (folder, name, formats) in enumerate(plan, start=1):
        step = f"rtserve export: [{number}/{len(plan)}] {name}"
        graphs = ", ".join(formats) if formats else "no graphs (the torch backend reads the checkpoint)"
        print(f"{step}: {graphs} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        entry = export_checkpoint(folder, args.out, formats, args.name, args.version, args.fp16, args.cpu_threads)
        seconds = time.perf_counter() - started
        print(f"{step}: done in {seconds:.1f} s -> {entry}", file=sys.stderr, flush=True)
        print(json.dumps({"checkpoint": str(folder), "entry": str(entry), "formats": list(formats),
                          "seconds": round(seconds, 1)}), flush=True)
    return 0
