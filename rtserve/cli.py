"""The ``rtserve`` command: serve, train, eval, export, bench.

Training and evaluation live with each family's recipe in ``models/``; this
module only dispatches, importing the heavy modules when they are asked for.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# family -> module with train_main(argv) -> int and eval_main(argv) -> int
RECIPES = {
    "rsa": "models.training.forecasters",
    "rtransformer": "models.training.forecasters",
    "vanilla": "models.training.forecasters",
    "linear": "models.training.forecasters",
    "rmt": "models.training.rmt",
    "srformer": "models.training.srformer",
}


def _recipe(family: str) -> object:
    if family not in RECIPES:
        raise SystemExit(f"rtserve: unknown model family {family!r}; choose one of {sorted(RECIPES)}")
    return importlib.import_module(RECIPES[family])


def _serve(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rtserve serve", description="Start the HTTP service.")
    parser.add_argument("--host", help="overrides RTSERVE_HOST")
    parser.add_argument("--port", type=int, help="overrides RTSERVE_PORT")
    args = parser.parse_args(argv)
    from service.server import run

    run(host=args.host, port=args.port)
    return 0


def _train(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: rtserve train {{{','.join(RECIPES)}}} [options]  (rtserve train <family> --help)")
        return 0 if argv else 2
    family, rest = argv[0], list(argv[1:])
    return int(_recipe(family).train_main([family, *rest]))  # type: ignore[attr-defined]


def _eval(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: rtserve eval <checkpoint folder or model-repository entry> --data <path> [options]")
        return 0 if argv else 2
    from pathlib import Path

    if (Path(argv[0]) / "manifest.json").exists():  # an exported entry: scored through the serving path
        from rtserve.evaluate import main as evaluate_entry

        return int(evaluate_entry(list(argv)))
    from models.checkpoint import read_family

    family = read_family(argv[0])
    return int(_recipe(family).eval_main(list(argv)))  # type: ignore[attr-defined]


def _export(argv: Sequence[str]) -> int:
    from export.cli import main as export_main

    return int(export_main(list(argv)))


def _bench(argv: Sequence[str]) -> int:
    from loadtest.bench import main as bench_main

    return int(bench_main(list(argv)))


COMMANDS = {"serve": _serve, "train": _train, "eval": _eval, "export": _export, "bench": _bench}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: rtserve {serve,train,eval,export,bench} [options]")
        print("  serve    start the HTTP service (settings from RTSERVE_* variables)")
        print("  train    train a model: rtserve train <family> --help")
        print("  eval     score a checkpoint or an exported model: rtserve eval <path> --data <path>")
        print("  export   export a checkpoint to the model repository: rtserve export --help")
        print("  bench    start the service and measure it: rtserve bench --help")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
