"""The GPU run's targets, read off its own reports (``benchmarks/gpu_run.sh`` appends this to its README.md).

    python benchmarks/gpu_summary.py REPORT_FOLDER FRONT_ENDS...

Per model of the sweep and per front-end count: capacity (the most pieces/s with p99 under 250 ms), the offline rate
of its step at the largest batch measured in the mode the service runs (``step-modes.json``), served / offline at
capacity (target >= 0.8), J/piece at capacity / at one session (target <= 0.1); and e2e / step at one session (target
<= 1.3) from the one-front-end run. A figure the run could not measure is said so, never guessed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def offline_rate(modes: dict[str, Any], model: str) -> float | None:
    record = modes.get(model.split(":")[0])
    if not record:
        return None
    step = record["graphs"].get("step")
    if not step:
        return None
    by_batch = step["rates"][step["mode"]]
    return max(by_batch.values()) if by_batch else None


def rows(report: Path, front_ends: list[str]) -> list[str]:
    modes_path = report / "step-modes.json"
    modes = json.loads(modes_path.read_text()) if modes_path.is_file() else {}
    lines = ["| front ends | model | capacity (pieces/s, sessions) | offline step, best batch (segments/s) | "
             "served / offline (>= 0.8) | J/piece at capacity / at 1 session (<= 0.1) |", "|---|---|---|---|---|---|"]
    for count in front_ends:
        path = report / f"workers-{count}.json"
        if not path.is_file():
            lines.append(f"| {count} | not measured (no {path.name}) | | | | |")
            continue
        sweep = json.loads(path.read_text())["scenarios"].get("sweep") or {}
        for model in (sweep.get("models") or {}).values():
            if "levels" not in model:
                lines.append(f"| {count} | {model.get('skipped', 'skipped')} | | | | |")
                continue
            best, offline = model.get("capacity"), offline_rate(modes, model["model"])
            served = best["pieces_per_second"] if best else None
            ratio = f"{served / offline:.2f}" if served and offline else "not measured"
            joules = model.get("joules_at_capacity_over_one")
            lines.append(f"| {count} | {model['model']} | "
                         + (f"{served:,.0f} at {best['sessions']}" if best else "none under 250 ms") + " | "
                         + (f"{offline:,.0f}" if offline else "not measured") + f" | {ratio} | "
                         + (f"{joules:.3f}" if joules is not None else "not measured (no NVML energy)") + " |")
    one = report / f"workers-{front_ends[0]}.json"
    e2e = json.loads(one.read_text())["scenarios"].get("e2e") if one.is_file() else None
    lines.append("")
    lines.append(f"e2e / step at one session (<= 1.3): {e2e['e2e_per_step']:.2f} ({e2e['piece_ms_median']:.2f} ms "
                 f"a piece, {e2e['step_ms_median']:.2f} ms the step alone)" if e2e else
                 "e2e / step at one session: not measured")
    return lines


def main() -> None:
    report, front_ends = Path(sys.argv[1]), sys.argv[2:] or ["1"]
    print("\n".join(rows(report, front_ends)))


if __name__ == "__main__":
    main()
