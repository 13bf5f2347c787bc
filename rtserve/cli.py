"""The ``rtserve`` command: serve, train, eval, judgement, export, bench, and the client verbs classify, summarize,
forecast, session (calls to a running service through :mod:`rtserve.client`).

Training and evaluation live with each family's recipe (its record in :mod:`models.families`); this
module only dispatches, importing the heavy modules when they are asked for.

A user's mistake (a file that is missing, unreadable or of the wrong kind, a flag the service refuses, a service
that is not there) is one line on stderr, ``rtserve <command>: ...``, and exit status 1; ``--debug`` or
``RTSERVE_DEBUG=1`` shows its traceback instead. Anything else is a fault of rtserve's and keeps its traceback.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.cli_help import HelpFormatter


class CommandError(Exception):
    """A mistake the user can put right (a file, a flag): its message is the one line the command prints."""


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
    from service.settings import Settings

    default = {name: Settings.model_fields[name].default for name in ("host", "port")}
    parser = argparse.ArgumentParser(prog="rtserve serve", description="Start the HTTP service (settings from "
                                     "RTSERVE_* variables, see the README).", formatter_class=HelpFormatter)
    parser.add_argument("--host", help=f"interface to bind (default: RTSERVE_HOST, else {default['host']})")
    parser.add_argument("--port", type=int, help=f"TCP port (default: RTSERVE_PORT, else {default['port']})")
    args = parser.parse_args(argv)
    from service.server import run

    run(host=args.host, port=args.port)
    return 0


def _train(argv: Sequence[str]) -> int:
    if argv and not argv[0].startswith("-"):
        family, rest = argv[0], list(argv[1:])
        return int(_recipe(family).train_main([family, *rest]))
    from models.families import families

    parser = argparse.ArgumentParser(prog="rtserve train", formatter_class=HelpFormatter,
                                     usage="rtserve train FAMILY [options]",
                                     description="Train a model; a family's options: rtserve train FAMILY --help.")
    tasks = ", ".join(f"{record.name} ({record.task})" for record in families() if record.recipe is not None)
    parser.add_argument("family", choices=_trainable(), metavar="FAMILY", help=f"the model family (its task): {tasks}")
    parser.parse_args(argv)  # --help: the families, exit 0; anything else here lacks the family: exit 2
    return 2


def _eval(argv: Sequence[str]) -> int:
    if not argv or argv[0].startswith("-"):
        from rtserve.evaluate import main as evaluate_entry

        return int(evaluate_entry(list(argv)))  # --help: its options (and where a checkpoint's are); else exit 2
    if not Path(argv[0]).is_dir():
        raise CommandError(f"{argv[0]} is not a checkpoint folder or a model-repository entry")
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


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return value


def _client_parser(prog: str, description: str, add_help: bool = True, model: str | None = None
                   ) -> argparse.ArgumentParser:
    """A client verb's parser: the service's address and key, ``--model`` when the verb runs a model (``model``:
    what it defaults to)."""
    parser = argparse.ArgumentParser(prog=prog, description=description, add_help=add_help,
                                     formatter_class=HelpFormatter)
    parser.add_argument("--url", default=os.environ.get("RTSERVE_URL", "http://127.0.0.1:8000"),
                        help="the service (env RTSERVE_URL)")
    parser.add_argument("--api-key", default=os.environ.get("RTSERVE_API_KEY"),
                        help="API key, when the service has RTSERVE_API_KEYS (default: RTSERVE_API_KEY)")
    if model is not None:
        parser.add_argument("--model", help=f"model name or name:version (default: {model})")
    parser.add_argument("--debug", action="store_true", help="show an error's traceback (or RTSERVE_DEBUG=1)")
    return parser


def _client(args: argparse.Namespace) -> Any:
    from rtserve.client import Client

    return Client(args.url, api_key=args.api_key or "")


def _read_text(path: str) -> str:
    """A UTF-8 file's text (``-``: stdin), or one line saying why not."""
    name = "stdin" if path == "-" else path
    data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise CommandError(f"{name} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}): "
                           "give a text file (.txt, .csv), saved as UTF-8") from None
    if not text.strip():
        raise CommandError(f"{name} is empty")
    return text


# ---- a CSV file's rows, matched to a forecaster's variables -------------------------------------------


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


@dataclass
class Table:
    """A CSV file as read: its header (None when its first row holds data) and each row with its line number."""

    name: str
    header: list[str] | None
    rows: list[tuple[int, list[str]]]

    def column(self, index: int) -> str:
        return repr(self.header[index]) if self.header else f"{index + 1}"


def _read_table(text: str, name: str) -> Table:
    """The rows of a CSV file's ``text``; the first row is a header when it holds no number where the next row
    holds numbers (a data row with a value missing is still data)."""
    rows: list[tuple[int, list[str]]] = []
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        for cells in reader:
            if any(cell.strip() for cell in cells):
                rows.append((reader.line_num, cells))
    except csv.Error as error:
        raise CommandError(f"{name}, line {reader.line_num}: not CSV ({error})") from None
    if not rows:
        raise CommandError(f"{name} holds no rows")
    first = rows[0][1]
    numeric = [i for i, cell in enumerate((rows[1] if len(rows) > 1 else rows[0])[1]) if _number(cell) is not None]
    header = None
    if not any(i < len(first) and _number(first[i]) is not None for i in numeric):
        header, rows = [cell.strip() for cell in first], rows[1:]
    if not numeric or not rows:
        raise CommandError(f"{name} holds no rows of numbers: a forecast reads a CSV file, one row a time step "
                           "(oldest first), with a header row naming the model's variables")
    return Table(name, header, rows)


def _find(table: Table, name: str) -> int | None:
    """The header column called ``name`` (case and surrounding spaces aside); two such columns are refused."""
    assert table.header is not None
    found = [i for i, cell in enumerate(table.header) if cell.casefold() == name.strip().casefold()]
    if len(found) > 1:
        raise CommandError(f"{table.name}: {len(found)} columns are called {name!r} "
                           f"({', '.join(repr(table.header[i]) for i in found)}, columns "
                           f"{', '.join(str(i + 1) for i in found)}): rename all but the one to read")
    return found[0] if found else None


def _columns(table: Table, variables: list[str], model: str, columns: str | None) -> list[int]:
    """The file's column for each of the model's variables, in the model's order: the header's names matched to the
    variables' (default), or ``--columns`` (the file's names for them, in the model's order)."""
    wanted = ", ".join(variables)
    if table.header is None:
        if columns:
            raise CommandError(f"--columns names header columns, and {table.name} has no header row")
        numeric = [i for i, cell in enumerate(table.rows[0][1]) if _number(cell) is not None]
        if len(numeric) != len(variables):
            raise CommandError(f"{table.name} has no header row and {len(numeric)} numeric columns; {model} reads "
                               f"{len(variables)} variables: add a header row naming them ({wanted})")
        print(f"rtserve forecast: {table.name} has no header row: its {len(numeric)} numeric columns are read as "
              f"{wanted}, in that order", file=sys.stderr)
        return numeric
    if columns is None:
        found = {variable: _find(table, variable) for variable in variables}
        missing = [variable for variable, index in found.items() if index is None]
        if missing:
            raise CommandError(f"{table.name} has no column for {model}'s variable{'s' if len(missing) > 1 else ''} "
                               f"{', '.join(missing)} (it reads {wanted}; the file has {', '.join(table.header)}): "
                               "name the file's columns for its variables, in its order, with --columns")
        picked = [index for index in found.values() if index is not None]
        if len(set(picked)) < len(picked):
            raise CommandError(f"{table.name}: one column matches two of {model}'s variables ({wanted}); name the "
                               "file's columns for them with --columns")
        return picked
    names = [name.strip() for name in columns.split(",")]
    if "" in names or len(names) != len(variables):
        raise CommandError(f"--columns names {len([n for n in names if n])} columns; {model} reads {len(variables)} "
                           f"variables, in this order: {wanted}")
    picked = []
    folded = [variable.casefold() for variable in variables]
    for place, name in enumerate(names):
        index = _find(table, name)
        if index is None:
            raise CommandError(f"--columns: {table.name} has no column {name!r} (its columns: "
                               f"{', '.join(table.header)})")
        if index in picked:
            raise CommandError(f"--columns names the column {table.header[index]!r} twice")
        if name.casefold() in folded and folded.index(name.casefold()) != place:
            raise CommandError(f"--columns puts {name!r} where {model} reads {variables[place]!r}, but {name!r} is "
                               f"its variable {folded.index(name.casefold()) + 1}: list the file's columns in the "
                               f"model's order ({wanted}), or leave --columns out to match them by name")
        picked.append(index)
    return picked


def _rows(table: Table, picked: list[int], last: int | None) -> list[list[float]]:
    rows = table.rows[-last:] if last else table.rows
    values = []
    for line, cells in rows:
        row = []
        for index in picked:
            cell = cells[index].strip() if index < len(cells) else ""
            value = _number(cell)
            if value is None or not math.isfinite(value):
                raise CommandError(f"{table.name}, line {line}, column {table.column(index)}: {cell!r} is not a "
                                   "finite number")
            row.append(value)
        values.append(row)
    return values


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)


def _served_model(client: Any, model: str | None, task: str | None) -> dict[str, Any]:
    """The service's description (GET /models) of the model ``model`` names (``name``: its latest version;
    ``name:version``), or of the task's default model."""
    models = client.models()
    loaded = ", ".join(f"{m['name']}:{m['version']} ({m['task']})" for m in models) or "none"
    if model is None:
        chosen = [m for m in models if m["task"] == task and m["default"]]
        if not chosen:
            raise CommandError(f"the service at {client.url} has no {task} model (its models: {loaded})")
        return chosen[0]
    name, _, version = model.partition(":")
    chosen = [m for m in models if m["name"] == name and (not version or m["version"] == version)]
    if not chosen:
        raise CommandError(f"the service at {client.url} has no model {model!r} (its models: {loaded})")
    described = max(chosen, key=lambda m: _version_key(m["version"]))
    if task is not None and described["task"] != task:
        raise CommandError(f"{model} is a {described['task']} model, not a {task} model")
    return described


def _ref(described: dict[str, Any]) -> str:
    return f"{described['name']}:{described['version']}"


def _forecast_rows(table: Table, described: dict[str, Any], columns: str | None, last: int | None
                   ) -> list[list[float]]:
    """The table's rows for the forecaster ``described`` (GET /models), each holding its variables in its order."""
    settings = described.get("manifest", {}).get("settings", {})
    variables = list(settings.get("variables") or described.get("value_range") or [])
    if not variables:
        raise CommandError(f"{_ref(described)} does not say which variables a row holds (GET /models)")
    return _rows(table, _columns(table, variables, _ref(described), columns), last)


def _print(answer: Any) -> None:
    print(json.dumps(answer, indent=2, ensure_ascii=False))


def _print_stream(stream: Any) -> dict[str, Any]:
    """Prints a summary as it arrives, then, on stderr, how much of the document the model read."""
    for text in stream:
        print(text, end="", flush=True)
    print()
    result = stream.result or {}
    read, total = result.get("tokens_read"), result.get("tokens_total")
    if result.get("truncated"):
        print(f"(read {read:,} of {total:,} tokens: the model reads the first {read:,}; the rest was not "
              "summarized)", file=sys.stderr)
    elif total is not None:
        print(f"(read all {total:,} tokens)", file=sys.stderr)
    return result


def _classify(argv: Sequence[str]) -> int:
    parser = _client_parser("rtserve classify", "Classify a document (a text file, - for stdin).",
                            model="the service's default classifier")
    parser.add_argument("file", help="UTF-8 text file, - for stdin")
    args = parser.parse_args(argv)
    text = _read_text(args.file)
    with _client(args) as client:
        _print(client.classify(text, model=args.model))
    return 0


def _summarize(argv: Sequence[str]) -> int:
    parser = _client_parser("rtserve summarize", "Summarize a document (a text file, - for stdin). The answer says "
                            "how much of it the model read (tokens_read of tokens_total, truncated); with --stream, "
                            "on stderr after the summary.", model="the service's default summarizer")
    parser.add_argument("file", help="UTF-8 text file, - for stdin")
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


COLUMNS_HELP = ("the file's columns to read as the model's variables, in the model's order (GET /models: "
                "manifest.settings.variables), for a header that names them otherwise (default: the columns named as "
                "the variables, case aside, in any order)")


def _forecast(argv: Sequence[str]) -> int:
    parser = _client_parser(
        "rtserve forecast", "Forecast the rows after a CSV file's rows (- for stdin), one row a time step, oldest "
        "first. The header row's names are matched to the model's variables (case and surrounding spaces aside) and "
        "each row is sent in the model's order; other columns (a date ...) are left out. A variable without a "
        "column, or a name that two columns answer to, is refused. A file without a header row must hold the "
        "model's variables alone, in its order.", model="the service's default forecaster")
    parser.add_argument("csv", help="CSV file with a header row, - for stdin")
    parser.add_argument("--columns", metavar="A,B,...", help=COLUMNS_HELP)
    parser.add_argument("--last", type=_positive, metavar="N", help="send only the last N rows (default: all)")
    args = parser.parse_args(argv)
    table = _read_table(_read_text(args.csv), "stdin" if args.csv == "-" else args.csv)
    with _client(args) as client:
        described = _served_model(client, args.model, "forecast")
        _print(client.forecast(_forecast_rows(table, described, args.columns, args.last), model=_ref(described)))
    return 0


def _how_sent(session: Any) -> str:
    """``over its stream`` (with the reconnects it took, by reason) or ``over HTTP``."""
    if session.transport == "http":
        return "over HTTP"
    reconnects = session.reconnects
    if not reconnects:
        return "over its stream"
    reasons = ", ".join(f"{count} x {reason}" for reason, count in reconnects.most_common())
    return f"over its stream ({sum(reconnects.values())} reconnects: {reasons})"


def _session(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="rtserve session", formatter_class=HelpFormatter,
                                     description="Sessions: stream a long input piece by piece, or manage one.")
    verbs = parser.add_subparsers(dest="verb", required=True)
    stream = verbs.add_parser(
        "stream", help="send a file through a new session in pieces, then finish", formatter_class=HelpFormatter,
        parents=[_client_parser("rtserve session", "", add_help=False, model="the task's default model")],
        description="Send a file through a new session in pieces, then finish it and print the final answer. The "
        "pieces go over the session's stream (a WebSocket that reconnects and resumes by itself when its replica "
        "restarts or Redis is briefly away), or one HTTP request each with --transport http. A CSV file's columns are "
        "matched to the forecaster's variables as `rtserve forecast` matches them.")
    stream.add_argument("file", help="UTF-8 text file (classify, summarize) or CSV file (forecast), - for stdin")
    stream.add_argument("--task", choices=["classify", "summarize", "forecast"],
                        help="the task (default: the --model's)")
    stream.add_argument("--piece-chars", type=_positive, default=2000, metavar="N", help="characters per piece (text)")
    stream.add_argument("--piece-rows", type=_positive, default=24, metavar="N", help="rows per piece (CSV)")
    stream.add_argument("--columns", metavar="A,B,...", help="forecasts: " + COLUMNS_HELP)
    stream.add_argument("--stream", action="store_true", help="summaries: print the summary as it is generated")
    stream.add_argument("--transport", choices=["stream", "http"], default="stream",
                        help="how the pieces travel: the session's stream (a WebSocket; it reconnects and resumes by "
                        "itself, and falls back to HTTP where the service does not offer it) or one HTTP request each")
    for verb_name, says in (("status", "where a session stands"), ("finish", "finish a session: the final answer"),
                            ("delete", "delete a session")):
        verb = verbs.add_parser(verb_name, help=says, description=says[0].upper() + says[1:] + ".",
                                parents=[_client_parser("rtserve session", "", add_help=False)],
                                formatter_class=HelpFormatter)
        verb.add_argument("session_id", help="the session's id")
    args = parser.parse_args(argv)
    if args.verb == "stream":
        if args.task is None and args.model is None:
            stream.error("name a --task or a --model")
        content, source = _read_text(args.file), "stdin" if args.file == "-" else args.file
        table = _read_table(content, source) if args.task == "forecast" else None  # the file's mistakes come first
    with _client(args) as client:
        if args.verb == "stream":
            described = _served_model(client, args.model, args.task) if args.model or args.task == "forecast" else None
            task = described["task"] if described else args.task
            rows: list[list[float]] = []
            if task == "forecast":
                assert described is not None  # a forecast session is named by --task forecast or a forecaster
                rows = _forecast_rows(table or _read_table(content, source), described, args.columns, None)
            elif args.columns:
                raise CommandError(f"--columns names a CSV file's columns, for forecasts; this is a {task} session")
            with client.session(task=args.task, model=_ref(described) if described else None,
                                transport=args.transport) as session:
                if task == "forecast":
                    for start in range(0, len(rows), args.piece_rows):
                        session.send(rows=rows[start : start + args.piece_rows])
                else:
                    for start in range(0, len(content), args.piece_chars):
                        session.send(text=content[start : start + args.piece_chars])
                print(f"session {session.id}: {session.seq} pieces sent {_how_sent(session)}", file=sys.stderr)
                if args.stream and task == "summarize":
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
  session    stream a file through a session, or status / finish / delete one: rtserve session --help
A mistake (a file, a flag, the service's address) is one line on stderr and exit status 1; --debug (anywhere
on the line) or RTSERVE_DEBUG=1 shows its traceback."""


def _service_address(error: Exception) -> str:
    try:
        url = error.request.url  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):  # an httpx error raised before its request was made
        return os.environ.get("RTSERVE_URL", "the service's address")
    return f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}"


def _settings_error(error: BaseException) -> str | None:
    """A service setting (an ``RTSERVE_*`` variable) the service refuses, named as the variable."""
    if type(error).__name__ != "ValidationError" or getattr(error, "title", None) != "Settings":
        return None
    return "; ".join(f"RTSERVE_{'_'.join(map(str, item['loc'])).upper()}: {item['msg']} (it is {item['input']!r})"
                     for item in error.errors())  # type: ignore[attr-defined]


def _one_line(error: BaseException) -> str | None:
    """The line a user's mistake is told in, or None for a fault of rtserve's own (shown with its traceback)."""
    import httpx

    from models.data.files import DataFileError
    from rtserve.client import APIError

    if isinstance(error, CommandError | DataFileError):  # the user's file or flag needs the change
        return str(error)
    if isinstance(error, APIError):
        return f"the service answered {error}"
    change = "set the address with --url URL or RTSERVE_URL"
    if isinstance(error, httpx.UnsupportedProtocol | httpx.InvalidURL):
        return f"the service's address must be http://HOST:PORT or https://... ({error}): {change}"
    if isinstance(error, httpx.TimeoutException):
        return f"the service at {_service_address(error)} did not answer in time ({type(error).__name__})"
    if isinstance(error, httpx.HTTPError):
        return (f"cannot reach the service at {_service_address(error)} ({error}): is it running (rtserve serve, "
                f"make serve)? If it is elsewhere, {change}")
    settings = _settings_error(error)
    if settings is not None:
        return settings
    if isinstance(error, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({error.reason} at byte {error.start})"
    if isinstance(error, OSError) and error.filename is not None:
        reasons = {FileNotFoundError: "no such file or folder", IsADirectoryError: "a folder, not a file",
                   NotADirectoryError: "not a folder", PermissionError: "permission denied"}
        return f"{error.filename}: {reasons.get(type(error), error.strerror)}"
    if isinstance(error, FileNotFoundError):  # raised with a sentence of its own (a folder that is not a checkpoint)
        return str(error)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("RTSERVE_DEBUG", "").strip() not in ("", "0", "false", "no")
    argv = [arg for arg in argv if arg != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"rtserve: unknown command {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except KeyboardInterrupt:
        if debug:
            raise
        print(file=sys.stderr)
        return 130
    except Exception as error:
        line = None if debug else _one_line(error)
        if line is None:
            raise
        print(f"rtserve {argv[0]}: {line}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
