"""Every report of ``rtserve bench --only triton`` side by side: one row per report, the ratios its targets read.

    python -m loadtest.bench_runs docs/bench-*.json [--links-from docs]

Each row is one report (one run, one machine: ``AMD EPYC #3`` is the report ``-run3`` of that CPU), slowest machine
last: Triton's server CPU per RSA piece at 16 and 32 sessions (JSON rows; how fast the machine ran the same graph),
then rtserve / Triton, as the report gives them (medians of its per-repeat ratios): server CPU per RSA piece over a
stream, with binary row frames and over HTTP; RSA pieces/s over a stream at 32 sessions (binary frames after the
slash); server CPU per RMT piece over a stream; the machine's pace before and after the run, where the report took it
(:mod:`loadtest.machine_pace`: ten million Python additions, and the forecaster's step alone, CPU time each).
The last line gives each ratio's range over the reports. Reports without the Triton side are left out, and named.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtest.bench_report import without_trademarks

TRITON, TRITON_BINARY = "triton-0ms", "triton-0ms-binary"
CPU, RATE = "server_cpu_ms_per_piece", "pieces_per_second"
COLUMNS = ("machine", "Triton CPU ms per RSA piece, 16 / 32", "CPU vs Triton, stream: 16 / 32",
           "binary stream: 16 / 32", "HTTP: 16 / 32", "pieces/s vs Triton at 32, stream / binary",
           "RMT CPU vs Triton, stream: 16 / 32", "pace: Python s, before / after",
           "pace: step ms a row, before / after")


def ratio(model: Mapping[str, Any], sessions: int, side: str, key: str) -> float | None:
    """``side``'s ratio to its Triton configuration at ``sessions`` (JSON rows against JSON, binary against binary)."""
    row = model.get("sessions", {}).get(str(sessions))
    if row is None:
        return None
    triton = TRITON_BINARY if side.endswith("-binary") else TRITON
    return row.get("ratios", {}).get(f"{side}/{triton}", {}).get(key)


def triton_cpu(model: Mapping[str, Any], sessions: int) -> float | None:
    row = model.get("sessions", {}).get(str(sessions))
    return None if row is None else row["sides"].get(TRITON, {}).get(CPU)


def machine_label(report: Mapping[str, Any], path: Path) -> str:
    """``AMD EPYC #3``: the CPU (without its clock: the same model may report one or not), and the machine's number
    among the reports of that CPU (``-run3``; none: 1)."""
    cpu = re.sub(r"\bProcessor\b|@.*$", "", without_trademarks(report["machine"]["cpu"]))
    number = re.search(r"-run(\d+)$", path.stem)
    return f"{' '.join(cpu.split())} #{number.group(1) if number else 1}"


def summary(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The figures of one report's row; None when it has no Triton side for the forecaster."""
    models = ((report.get("scenarios") or {}).get("triton") or {}).get("models") or {}
    rsa, rmt = models.get("forecast"), models.get("classify") or {}
    if not rsa or triton_cpu(rsa, 16) is None:
        return None
    return {
        "triton_cpu": (triton_cpu(rsa, 16), triton_cpu(rsa, 32)),
        "stream": (ratio(rsa, 16, "rtserve-ws", CPU), ratio(rsa, 32, "rtserve-ws", CPU)),
        "binary": (ratio(rsa, 16, "rtserve-ws-binary", CPU), ratio(rsa, 32, "rtserve-ws-binary", CPU)),
        "http": (ratio(rsa, 16, "rtserve-http", CPU), ratio(rsa, 32, "rtserve-http", CPU)),
        "rate": (ratio(rsa, 32, "rtserve-ws", RATE), ratio(rsa, 32, "rtserve-ws-binary", RATE)),
        "rmt": (ratio(rmt, 16, "rtserve-ws", CPU), ratio(rmt, 32, "rtserve-ws", CPU)),
        "python_s": paces(report, "python_s"),
        "step_ms": paces(report, "step_ms_per_row"),
    }


def paces(report: Mapping[str, Any], key: str) -> tuple[float | None, float | None]:
    """The machine's pace ``key`` before and after the run; None where the report did not take it."""
    pace = report["machine"].get("pace") or {}
    return (pace.get("before") or {}).get(key), (pace.get("after") or {}).get(key)


def pair(values: Sequence[float | None], digits: int = 2) -> str:
    return " / ".join("–" if value is None else f"{value:.{digits}f}" for value in values)


def span(rows: list[dict[str, Any]], key: str) -> str:
    values = [value for row in rows for value in row[key] if value is not None]
    return f"{min(values):.2f}-{max(values):.2f}" if values else "–"


def table(reports: Sequence[Path], links_from: Path | None = None) -> str:
    rows, left_out = [], []
    for path in reports:
        report = json.loads(path.read_text())
        row = summary(report)
        if row is None:
            left_out.append(path.name)
            continue
        row["machine"] = machine_label(report, path)
        row["report"] = path.with_suffix(".md").name
        row["link"] = os.path.relpath(path.with_suffix(".md"), links_from) if links_from else None
        rows.append(row)
    rows.sort(key=lambda row: row["triton_cpu"][0])
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        name = f"[{row['machine']}]({row['link']})" if row["link"] else f"{row['machine']} ({row['report']})"
        cells = [name, pair(row["triton_cpu"]), pair(row["stream"]), pair(row["binary"]),
                 pair(row["http"]), pair(row["rate"]), pair(row["rmt"]), pair(row["python_s"]),
                 pair(row["step_ms"], digits=3)]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *textwrap.wrap(
        f"{len(rows)} reports. Ranges: over a stream {span(rows, 'stream')}, with binary frames "
        f"{span(rows, 'binary')}, over HTTP {span(rows, 'http')}; pieces/s over a stream at 32 sessions "
        f"{span(rows, 'rate')}; RMT over a stream {span(rows, 'rmt')}.", width=120, break_on_hyphens=False)]
    if left_out:
        lines.append(f"Without the Triton side: {', '.join(left_out)}.")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", type=Path, help="the JSON reports of rtserve bench")
    parser.add_argument("--links-from", type=Path, default=None,
                        help="link each report's markdown relative to this folder (the page the table goes in)")
    options = parser.parse_args(argv)
    print(table(options.reports, options.links_from))
    return 0


if __name__ == "__main__":
    sys.exit(main())
