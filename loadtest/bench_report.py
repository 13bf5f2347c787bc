"""The machine, the targets and the two outputs of ``rtserve bench``: a JSON object and a markdown table.

Targets are the runtime's (serve from the GPU, batch what arrives together, cut the per-piece overhead),
checked against ratios from one run. CPU targets are checked where NVML sees
no GPU, GPU targets where it sees one; every row says which.
"""

from __future__ import annotations

import json
import math
import operator
import os
import platform
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.machine_pace import PIECE_ROWS, STEP_ROWS


# ---- the machine ---------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_info(gpus: list[str]) -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "gpus": gpus,
    }


def machine_name(machine: Mapping[str, Any]) -> str:
    """``AMD EPYC, 2 cores`` or ``AMD EPYC, 16 cores, NVIDIA H100 80GB HBM3``."""
    parts = [str(machine["cpu"]), f"{machine['cores']} cores", *machine["gpus"]]
    return ", ".join(parts)


def without_trademarks(name: str) -> str:
    """A CPU's or GPU's name without its trademark signs: ``Intel(R) Xeon(R)`` -> ``Intel Xeon``."""
    return re.sub(r"\((R|TM)\)|[®™]", "", name, flags=re.IGNORECASE)


def machine_slug(machine: Mapping[str, Any]) -> str:
    """File-name form of the machine: ``amd-epyc-2c``, ``intel-xeon-processor-2c`` (no trademark signs) or
    ``nvidia-h100-80gb-hbm3``."""
    name = machine["gpus"][0] if machine["gpus"] else f"{machine['cpu']} {machine['cores']}c"
    return re.sub(r"[^a-z0-9]+", "-", without_trademarks(name).lower()).strip("-") or "machine"


# ---- targets -------------------------------------------------------------------------------------
def lookup(tree: Mapping[str, Any], *path: str) -> Any:
    """``tree[path[0]][path[1]]...``, or None where any step is missing."""
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


@dataclass(frozen=True)
class Target:
    metric: str  # what the row says
    path: tuple[str, ...]  # where the value is in the scenarios
    compare: str  # "<=" or ">="
    bound: float
    applies_to: str  # "cpu" or "gpu"

    def check(self, scenarios: Mapping[str, Any]) -> dict[str, Any]:
        value = lookup(scenarios, *self.path)
        holds = None
        if isinstance(value, int | float) and math.isfinite(value):
            holds = COMPARE[self.compare](value, self.bound)
        return {
            "metric": self.metric, "value": value, "target": f"{self.compare} {self.bound:g}",
            "applies_to": self.applies_to, "holds": holds,
        }


COMPARE: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge}


def targets_for(scenarios: Mapping[str, Any]) -> list[Target]:
    """The runtime's targets, at the session counts this run measured."""
    counts = sorted(int(n) for n in lookup(scenarios, "throughput") or {} if n.isdigit())
    targets = [
        Target("e2e / step, 1 session", ("e2e", "e2e_per_step"), "<=", 1.15, "cpu"),
        *(Target(f"served / offline, {n} sessions", ("throughput", str(n), "served_over_offline"), ">=", 0.95, "cpu")
          for n in counts),
        Target("different articles, decoding: concurrent / one at a time (decode tokens/s)", ("decode", "ratio"),
               ">=", 3, "cpu"),
        Target("RSA sessions: concurrent / one at a time (pieces/s)", ("rsa", "ratio"), ">=", 3, "cpu"),
        Target("Redis share of segment-route time, 1 session", ("e2e", "redis", "share"), "<=", 0.03, "cpu"),
    ]
    for task, label in (("forecast", "RSA"), ("classify", "RMT")):
        for n, run in (lookup(scenarios, "floor", task) or {}).items():
            if isinstance(run, Mapping) and "ratio" in run:
                targets.append(Target(f"{label} pieces: service / floor server CPU per piece, {n} session(s)",
                                      ("floor", task, n, "ratio"), "<=", 1.5, "cpu"))
    if counts:
        targets.append(Target(f"Redis share of segment-route time, {counts[0]} sessions",
                              ("throughput", str(counts[0]), "redis", "share"), "<=", 0.03, "cpu"))
        targets.append(Target(f"served / raw step throughput, {counts[-1]} sessions",
                              ("throughput", str(counts[-1]), "served_over_offline"), ">=", 0.8, "gpu"))
    targets.append(Target("models served from the GPU (fraction)", ("gpu", "fraction_on_gpu"), ">=", 1.0, "gpu"))
    for model, rows in (lookup(scenarios, "gpu", "models") or {}).items():
        targets.append(Target(f"{model}: J/segment at {rows['sessions_high']} sessions / at 1",
                              ("gpu", "models", model, "joules_ratio"), "<=", 0.1, "gpu"))
    return targets


def check_targets(scenarios: Mapping[str, Any], on_gpu: bool) -> list[dict[str, Any]]:
    here = "gpu" if on_gpu else "cpu"
    rows = []
    for target in targets_for(scenarios):
        row = target.check(scenarios)
        row["checked_here"] = target.applies_to == here
        rows.append(row)
    return rows


# ---- markdown ------------------------------------------------------------------------------------
def _number(value: Any) -> str:
    if value is None:
        return "not measured"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _holds(row: Mapping[str, Any]) -> str:
    if not row["checked_here"]:
        return f"({row['applies_to'].upper()} target)"
    return {True: "yes", False: "no", None: "not measured"}[row["holds"]]


def measurement_rows(scenarios: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The raw figures behind the ratios, one (label, value) each."""
    rows: list[tuple[str, Any]] = []
    e2e = scenarios.get("e2e") or {}
    if "e2e_per_step" in e2e:
        rows += [("1 session: piece latency, median (ms)", e2e["piece_ms_median"]),
                 ("1 session: offline step at batch 1, median (ms)", e2e["step_ms_median"]),
                 ("1 session: server-side step, mean (ms)", e2e["server_step_ms_mean"])]
    for n, run in (scenarios.get("throughput") or {}).items():
        if isinstance(run, Mapping) and "served_segments_per_second" in run:
            rows += [(f"{n} sessions: served segments/s", run["served_segments_per_second"]),
                     (f"{n} sessions: offline segments/s at batch {n}", run["offline_segments_per_second"]),
                     (f"{n} sessions: mean batch size", run["mean_batch_size"])]
    for n, run in (scenarios.get("latency") or {}).items():
        if isinstance(run, Mapping) and "p50_ms" in run:
            rows += [(f"{n} sessions: whole-session latency p50 / p90 / p99 (ms)",
                      f"{run['p50_ms']:.0f} / {run['p90_ms']:.0f} / {run['p99_ms']:.0f}")]
    articles = scenarios.get("articles") or {}
    if "ratio" in articles:
        rows += [(f"{articles['articles']} articles concurrently: decode tokens/s",
                  articles["concurrent_tokens_per_second"]),
                 ("the same one at a time: decode tokens/s", articles["sequential_tokens_per_second"])]
    decode = scenarios.get("decode") or {}
    if "ratio" in decode:
        rows += [(f"{decode['articles']} session finishes concurrently: decode tokens/s",
                  decode["concurrent_tokens_per_second"]),
                 ("the same one at a time: decode tokens/s", decode["sequential_tokens_per_second"])]
    if "ratio" in articles:
        rows.append(("one-shot /summarize (encoder included): concurrent / one at a time", articles["ratio"]))
    rsa = scenarios.get("rsa") or {}
    if "ratio" in rsa:
        rows += [(f"{rsa['sessions']} RSA sessions concurrently: pieces/s", rsa["concurrent_pieces_per_second"]),
                 ("the same one at a time: pieces/s", rsa["sequential_pieces_per_second"])]
    for name, unit in (("articles", "token"), ("decode", "token"), ("rsa", "piece")):
        rows += cpu_rows(name, unit, scenarios.get(name) or {})
    for task, label in (("forecast", "RSA"), ("classify", "RMT")):
        for n, run in (lookup(scenarios, "floor", task) or {}).items():
            if isinstance(run, Mapping) and "ratio" in run:
                service, floor = (f"{run[f'{side}_server_cpu_ms_per_piece']:.3g}" for side in ("service", "floor"))
                redis = " / ".join(f"{run[f'{side}_redis_cpu_ms_per_piece']:.3g}" for side in ("service", "floor"))
                rows.append((f"{label} pieces, {n} session(s): server CPU ms per piece, service / floor "
                             "(Redis: service / floor)", f"{service} / {floor} ({redis})"))
                rows.append((f"{label} pieces, {n} session(s): pieces/s, service / floor",
                             f"{run['service_pieces_per_second']:.3g} / {run['floor_pieces_per_second']:.3g}"))
    for model, gpu in (lookup(scenarios, "gpu", "models") or {}).items():
        for key in ("1", str(gpu["sessions_high"])):
            run = gpu[key]
            rows.append((f"{model}, {key} session(s): segments/s | J/segment",
                         f"{run['segments_per_second']:.3g} | {run['joules_per_segment']:.3g}"))
    return rows


def cpu_rows(name: str, unit: str, run: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Where a concurrent / one-at-a-time ratio's CPU went, and the ceiling it puts on the ratio."""
    if "ratio_ceiling" not in run:
        return []
    per_unit = " / ".join(f"{run[f'{kind}_server_cpu_ms_per_unit']:.3g} + {run[f'{kind}_client_cpu_ms_per_unit']:.3g}"
                          for kind in ("concurrent", "sequential"))
    busy = " / ".join(f"{run[f'{kind}_cores_busy']:.2f}" for kind in ("concurrent", "sequential"))
    return [(f"{name}: CPU ms per {unit}, service + client, concurrent / one at a time", per_unit),
            (f"{name}: cores busy (of {run['cores']}), concurrent / one at a time", busy),
            (f"{name}: ceiling of the ratio at the concurrent run's CPU per {unit}", run["ratio_ceiling"])]


def markdown(results: Mapping[str, Any]) -> str:
    machine = results["machine"]
    lines = [
        f"# rtserve bench — {machine_name(machine)}",
        "",
        f"Machine: {machine_name(machine)}; {machine['platform']}, Python {machine['python']}.",
        *pace_lines(machine.get("pace")),
        f"Command: `{results['command']}` ({results['started_at']}, {results['repeats']} repeats, medians).",
        f"Models: {', '.join(f'{task} `{ref}`' for task, ref in results['models'].items())}.",
        f"Settings: {', '.join(f'{k}={v}' for k, v in results['settings'].items())}.",
        "",
        "| metric | value | target | holds |",
        "|---|---|---|---|",
    ]
    for row in results["targets"]:
        lines.append(f"| {row['metric']} | {_number(row['value'])} | {row['target']} | {_holds(row)} |")
    for label, value in measurement_rows(results["scenarios"]):
        lines.append(f"| {label} | {_number(value)} | | |")
    lines += triton_section(results["scenarios"].get("triton") or {})
    lines += sweep_section(results["scenarios"].get("sweep") or {})
    notes = [f"- {name}: skipped — {reason}" for name, reason in results["skipped"].items()]
    notes += [f"- {name}: FAILED — {reason}" for name, reason in results.get("failed", {}).items()]
    notes += [f"- {note}" for note in results["notes"]]
    return "\n".join([*lines, "", *notes, ""]) if notes else "\n".join([*lines, ""])


def pace_lines(pace: Mapping[str, Any] | None) -> list[str]:
    """The machine's pace before and after the run (:mod:`loadtest.machine_pace`), as one line; none if not taken."""
    if not pace:
        return []
    before, after = pace["before"], pace["after"]
    line = (f"Pace, before / after the run: ten million Python additions {before['python_s']:.3g} / "
            f"{after['python_s']:.3g} s of CPU")
    if before.get("step_ms_per_row") is not None and after.get("step_ms_per_row") is not None:
        line += (f"; the forecaster's step alone (ONNX Runtime, one thread, {STEP_ROWS} pieces of {PIECE_ROWS} rows "
                 f"stacked) {before['step_ms_per_row']:.3g} / {after['step_ms_per_row']:.3g} ms of CPU a row")
    return [line + "."]


def _ratios(row: Mapping[str, Any], side: str, key: str) -> str:
    """``side``'s ratio to every Triton configuration (``a / b`` for two), or blank for a Triton row."""
    values = [ratio[key] for pair, ratio in row.get("ratios", {}).items() if pair.startswith(f"{side}/")]
    return " / ".join(f"{value:.3g}" for value in values)


def triton_section(run: Mapping[str, Any]) -> list[str]:
    """The side-by-side table of the ``triton`` scenario: per model, session count and transport."""
    if not run.get("models"):
        return []
    configurations = ", ".join(f"triton-{delay:g}ms" for delay in run["queue_delays_ms"])
    lines = [
        "",
        f"## rtserve beside Triton {run.get('triton_version', '')} (sequence batcher, python backend, the same "
        "step.onnx)",
        "",
        f"Closed loop, one client for both ({run['client_processes']} processes, asyncio + aiohttp, on the same "
        f"{run['cores']} cores as the servers): N sessions at a time each send their pieces in order, waiting for "
        "each answer, more sessions following in the N slots until a run lasts at least "
        f"{run.get('min_pieces', {}).get('forecast', 0):,} RSA pieces ({run.get('min_pieces', {}).get('classify', 0)} "
        "RMT). Server CPU: the server's whole process tree (rtserve with the bench's Redis; Triton with its "
        f"backend stubs). Ratios: rtserve / Triton ({configurations}; rtserve's binary row frames against Triton's "
        "binary tensor data, `-binary`), medians of per-repeat ratios. Mean batch: the pieces a step of the graph "
        "held (rtserve's /metrics, Triton's statistics extension). "
        "`*`: the client was the limit in a run (see the notes).",
        "",
        "| model | sessions | transport | pieces/s | p50 ms | p99 ms | server CPU ms/piece | client CPU ms/piece "
        "| mean batch | ratio pieces/s | ratio p50 | ratio p99 | ratio server CPU/piece |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model in run["models"].values():
        for side, reason in (model.get("unavailable") or {}).items():
            lines.append(f"| {model['model']} | all | {side} | {reason} | | | | | | | | | |")
        for count, row in model["sessions"].items():
            for side, figures in row["sides"].items():
                if "pieces_per_second" not in figures:
                    continue
                star = "*" if figures.get("client_limited") else ""
                cells = [model["model"], count, side, f"{figures['pieces_per_second']:.4g}{star}",
                         f"{figures['p50_ms']:.3g}", f"{figures['p99_ms']:.3g}",
                         f"{figures['server_cpu_ms_per_piece']:.3g}", f"{figures['client_cpu_ms_per_piece']:.3g}",
                         f"{figures['mean_batch_size']:.3g}" if "mean_batch_size" in figures else "",
                         *(_ratios(row, side, key) for key in ("pieces_per_second", "p50_ms", "p99_ms",
                                                               "server_cpu_ms_per_piece"))]
                lines.append("| " + " | ".join(cells) + " |")
    differences = []
    for model in run["models"].values():
        values = [value for row in model["sessions"].values()
                  for value in row["answers_max_abs_difference"].values() if value is not None]
        if values:
            differences.append(f"{model['model']} {max(values):.2g}")
    if differences:
        lines += ["", "Answers, max |rtserve - Triton| over each session's last piece, every session count and "
                  "configuration (the forecast; the class probabilities): " + ", ".join(differences) + "."]
    return lines


def sweep_section(run: Mapping[str, Any]) -> list[str]:
    """The capacity sweep's table: per model and session count, and each model's capacity."""
    models = {task: model for task, model in (run.get("models") or {}).items() if "levels" in model}
    if not models:
        return []
    lines = ["", "## Capacity sweep (rtserve over HTTP, closed loop)", "",
             f"{run['client_processes']} client processes, medians of {run.get('repeats', 1)} repeats per count. "
             "Capacity: the most pieces/s with p99 under 250 ms. `*`: the client was the limit (see the notes). "
             "Device busy: " + next((m["device_busy_source"] for m in models.values() if m.get("device_busy_source")),
                                    "not measured") + ".", "",
             "| model | sessions | pieces/s | p50 ms | p99 ms | mean batch | device busy | client CPU share "
             "| J/piece |",
             "|---|---|---|---|---|---|---|---|---|"]
    for model in models.values():
        for count, row in model["levels"].items():
            if "pieces_per_second" not in row:
                lines.append(f"| {model['model']} | {count} | failed: {row.get('stopped', '')} | | | | | | |")
                continue
            star = "*" if row.get("client_limited") else ""
            busy = f"{row['device_busy']:.0%}" if row.get("device_busy") is not None else ""
            joules = f"{row['joules_per_piece']:.3g}" if "joules_per_piece" in row else ""
            lines.append(f"| {model['model']} | {count} | {row['pieces_per_second']:.4g}{star} | {row['p50_ms']:.3g} "
                         f"| {row['p99_ms']:.3g} | {row['mean_batch_size']:.3g} | {busy} | "
                         f"{row['client_cpu_share']:.0%} | {joules} |")
    lines.append("")
    for model in models.values():
        best = model["capacity"]
        lines.append(f"- capacity of {model['model']}: " + (
            f"{best['pieces_per_second']:.4g} pieces/s at {best['sessions']} sessions" if best
            else "no count kept p99 under 250 ms") + (
            f"; J/piece at capacity / at 1 session: {model['joules_at_capacity_over_one']:.3g}"
            if "joules_at_capacity_over_one" in model else ""))
    return lines


def write_reports(results: Mapping[str, Any], json_path: Path, markdown_path: Path) -> str:
    """Write both files; returns the markdown."""
    text = markdown(results)
    for path in (json_path, markdown_path):
        path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    markdown_path.write_text(text)
    return text
