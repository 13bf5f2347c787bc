"""The ``rtserve`` command: serve, train, eval, judgement, export, bench, and the client verbs classify, summarize,
forecast, session (calls to a running service through :mod:`rtserve.client`).

Training and evaluation live with each family's recipe (its record in :mod:`models.families`); this
module only dispatches, importing the heavy modules when they are asked for.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _trainable() -> list[str]:
    from models.families import families

    return [record.name for record in families() if record.recipe is not None]


def _recipe(name: str) -> Any:
    """The family's recipe module: ``train_main(argv)`` and ``eval_main(argv)``."""
    from models.families import UnknownFamily, family

    try:
        record = family(name)
    except UnknownFamily as error:
        raise SystemExit(f"rtserve: {error}") from None
    if record.recipe is None:
        raise SystemExit(f"rtserve: family {name!r} has no training recipe; the families with one are {_trainable()}")
    return record.part("recipe")


def _serve(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rtserve serve", description="Start the HTTP service (settings from "
                                     "RTSERVE_* variables, see the README).",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--host", help="overrides RTSERVE_HOST")
    parser.add_argument("--port", type=int, help="overrides RTSERVE_PORT")
    args = parser.parse_args(argv)
    from service.server import run

    run(host=args.host, port=args.port)
    return 0


def _train(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: rtserve train {{{','.join(_trainable())}}} [options]  (rtserve train <family> --help)")
        return 0 if argv else 2
    family, rest = argv[0], list(argv[1:])
    return int(_recipe(family).train_main([family, *rest]))


def _eval(argv: Sequence[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: rtserve eval <checkpoint folder or model-repository entry> --data <path> [options]")
        return 0 if argv else 2
    from pathlib import Path

    if not Path(argv[0]).is_dir():
        print(f"rtserve eval: {argv[0]} is not a checkpoint folder or a model-repository entry", file=sys.stderr)
        return 1
    if (Path(argv[0]) / "manifest.json").exists():  # an exported entry: scored through the serving path
        from rtserve.evaluate import main as evaluate_entry

        return int(evaluate_entry(list(argv)))
    from models.checkpoint import read_family

    family = read_family(argv[0])
    return int(_recipe(family).eval_main(list(argv)))


def _export(argv: Sequence[str]) -> int:
    from export.cli import main as export_main

    return int(export_main(list(argv)))


def _judgement(argv: Sequence[str]) -> int:
    from rtserve.judgement import main as judgement_main

    return int(judgement_main(list(argv)))


def _bench(argv: Sequence[str]) -> int:
    from loadtest.bench import main as bench_main

    return int(bench_main(list(argv)))


# ---- client verbs --------------------------------------------------------------------------------------


def _client_parser(prog: str, description: str, add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description, add_help=add_help,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--url", default=os.environ.get("RTSERVE_URL", "http://127.0.0.1:8000"),
                        help="the service (env RTSERVE_URL)")
    parser.add_argument("--api-key", default=os.environ.get("RTSERVE_API_KEY"),
                        help="API key, when the service has RTSERVE_API_KEYS (env RTSERVE_API_KEY)")
    parser.add_argument("--model", help="model name or name:version; unset: the task's default model")
    return parser


def _client(args: argparse.Namespace) -> Any:
    from rtserve.client import Client

    return Client(args.url, api_key=args.api_key or "")


def _read_text(path: str) -> str:
    return sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")


def _read_rows(path: str, columns: list[str] | None, last: int | None) -> list[list[float]]:
    """Rows of a CSV file: a header row is used for --columns and skipped; non-numeric columns (dates) dropped."""
    with (sys.stdin if path == "-" else open(path, newline="", encoding="utf-8")) as handle:
        table = [row for row in csv.reader(handle) if row]
    header: list[str] | None = None
    try:
        [float(cell) for cell in table[0][1:]]
    except ValueError:
        header, table = table[0], table[1:]
    if columns:
        if header is None:
            raise SystemExit("rtserve forecast: --columns needs a header row in the CSV file")
        missing = [name for name in columns if name not in header]
        if missing:
            raise SystemExit(f"rtserve forecast: no column {missing} in {header}")
        picked = [header.index(name) for name in columns]
    else:
        picked = [i for i, cell in enumerate(table[0]) if _is_number(cell)]
    rows = [[float(row[i]) for i in picked] for row in table]
    return rows[-last:] if last else rows


def _is_number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


def _print(answer: Any) -> None:
    print(json.dumps(answer, indent=2, ensure_ascii=False))


def _print_stream(stream: Any) -> dict[str, Any]:
    for text in stream:
        print(text, end="", flush=True)
    print()
    return stream.result


def _calling(verb: Any) -> Any:
    """Runs a client verb; an error answer or an unreachable service is one line on stderr, exit 1."""

    def run(argv: Sequence[str]) -> int:
        import httpx

        from rtserve.client import APIError

        try:
            return verb(argv)
        except APIError as error:
            print(f"rtserve: the service answered {error}", file=sys.stderr)
        except httpx.HTTPError as error:
            print(f"rtserve: cannot reach the service: {error}", file=sys.stderr)
        return 1

    return run


@_calling
def _classify(argv: Sequence[str]) -> int:
    parser = _client_parser("rtserve classify", "Classify a document (a text file, - for stdin).")
    parser.add_argument("file")
    args = parser.parse_args(argv)
    with _client(args) as client:
        _print(client.classify(_read_text(args.file), model=args.model))
    return 0


@_calling
def _summarize(argv: Sequence[str]) -> int:
    parser = _client_parser("rtserve summarize", "Summarize a document (a text file, - for stdin).")
    parser.add_argument("file")
    parser.add_argument("--stream", action="store_true", help="print the summary as it is generated")
    parser.add_argument("--max-length", type=int, help="most summary tokens (default: the model's rule)")
    parser.add_argument("--beam-size", type=int, help="beam width for free decoding, 1 = greedy (default: the "
                        "model's)")
    parser.add_argument("--decoding", choices=["sentence", "free"],
                        help="sentence: the document's own sentences the model scores highest; free: generated "
                        "text (default: the model's)")
    args = parser.parse_args(argv)
    text = _read_text(args.file)
    with _client(args) as client:
        if args.stream:
            _print_stream(client.summarize_stream(text, args.model, args.max_length, args.beam_size, args.decoding))
        else:
            _print(client.summarize(text, args.model, args.max_length, args.beam_size, args.decoding))
    return 0


@_calling
def _forecast(argv: Sequence[str]) -> int:
    parser = _client_parser("rtserve forecast", "Forecast the rows after a CSV file's rows (- for stdin).")
    parser.add_argument("csv")
    parser.add_argument("--columns", help="comma-separated column names, in the model's order (default: every "
                        "numeric column)")
    parser.add_argument("--last", type=int, help="send only the last N rows (default: all)")
    args = parser.parse_args(argv)
    rows = _read_rows(args.csv, args.columns.split(",") if args.columns else None, args.last)
    with _client(args) as client:
        _print(client.forecast(rows, model=args.model))
    return 0


@_calling
def _session(argv: Sequence[str]) -> int:
    common = _client_parser("rtserve session", "", add_help=False)
    parser = argparse.ArgumentParser(prog="rtserve session",
                                     description="Sessions: stream a long input piece by piece, or manage one.")
    verbs = parser.add_subparsers(dest="verb", required=True)
    stream = verbs.add_parser("stream", help="send a file through a new session in pieces, then finish",
                              parents=[common], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    stream.add_argument("file", help="text file (classify, summarize) or CSV file (forecast)")
    stream.add_argument("--task", choices=["classify", "summarize", "forecast"], help="the task (or --model)")
    stream.add_argument("--piece-chars", type=int, default=2000, help="characters per piece (text)")
    stream.add_argument("--piece-rows", type=int, default=24, help="rows per piece (CSV)")
    stream.add_argument("--stream", action="store_true", help="summaries: print the summary as it is generated")
    for name, text in (("status", "where a session stands"), ("finish", "finish a session: the final answer"),
                       ("delete", "delete a session")):
        verb = verbs.add_parser(name, help=text, parents=[common],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        verb.add_argument("session_id")
    args = parser.parse_args(argv)
    with _client(args) as client:
        if args.verb == "stream":
            if args.task is None and args.model is None:
                stream.error("name a --task or a --model")
            with client.session(task=args.task, model=args.model) as session:
                if session.info["task"] == "forecast":
                    rows = _read_rows(args.file, None, None)
                    for start in range(0, len(rows), args.piece_rows):
                        session.send(rows=rows[start : start + args.piece_rows])
                else:
                    text = _read_text(args.file)
                    for start in range(0, len(text), args.piece_chars):
                        session.send(text=text[start : start + args.piece_chars])
                print(f"session {session.id}: {session.seq} pieces sent", file=sys.stderr)
                if args.stream and session.info["task"] == "summarize":
                    _print_stream(session.finish_stream())
                else:
                    _print(session.finish())
        elif args.verb == "status":
            _print(client.resume(args.session_id).info)
        elif args.verb == "finish":
            _print(client.request("POST", f"/sessions/{args.session_id}/finish", {}))
        else:
            client.request("DELETE", f"/sessions/{args.session_id}")
    return 0


COMMANDS = {"serve": _serve, "train": _train, "eval": _eval, "judgement": _judgement, "export": _export,
            "bench": _bench,
            "classify": _classify, "summarize": _summarize, "forecast": _forecast, "session": _session}

USAGE = """usage: rtserve {serve,train,eval,judgement,export,bench,classify,summarize,forecast,session} [options]
  serve      start the HTTP service (settings from RTSERVE_* variables)
  train      train a model: rtserve train <family> --help
  eval       score a checkpoint or an exported model: rtserve eval <path> --data <path>
  judgement  score a filled blind-judgement sheet of summaries: rtserve judgement score FILE.json
  export     export a checkpoint to the model repository: rtserve export --help
  bench      start the service and measure it: rtserve bench --help
  classify   classify a text file with a running service: rtserve classify FILE [--url URL] [--api-key KEY]
  summarize  summarize a text file: rtserve summarize FILE [--stream]
  forecast   forecast after a CSV file's rows: rtserve forecast CSV [--columns A,B,...] [--last N]
  session    stream a file through a session, or status / finish / delete one: rtserve session --help"""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"rtserve: unknown command {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    from models.data.files import DataFileError

    try:
        return COMMANDS[argv[0]](argv[1:])
    except DataFileError as error:  # the user's file, not rtserve, needs the change: no traceback
        print(f"rtserve {argv[0]}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
