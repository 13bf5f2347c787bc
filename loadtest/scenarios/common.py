"""What every scenario of ``rtserve bench`` shares: how much each sends (:class:`Counts`), the run's context
(:class:`Bench`: the client, the models measured, the service's CPU clock, what was skipped or failed), and
the concurrent / one-at-a-time comparison that ``articles``, ``decode`` and ``rsa`` make
(:func:`concurrent_vs_sequential`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.bench_floor import Side
from loadtest.harness import BenchError, Client, Span, Stopwatch, in_turn, median

log = logging.getLogger("rtserve.bench")


@dataclass(frozen=True)
class Counts:
    """How much each scenario sends."""

    e2e_sessions: int = 4  # one after another, `pieces` one-segment pieces each
    pieces: int = 8  # pieces per classify session (one segment each)
    sessions: tuple[int, ...] = (16, 32)  # concurrent classify sessions
    articles: int = 32
    article_chars: int | None = None  # None: whole articles
    rsa_sessions: int = 32
    rsa_piece_rows: int = 24
    rsa_extra_pieces: int = 4  # pieces after the look-back is filled, each answered with a forecast
    gpu_sessions: int = 32
    floor_sessions: int = 32  # the floor comparison: at 1 session (each in turn) and at this many at once
    floor_rsa_extra_pieces: int = 12  # more pieces per RSA session than `rsa`: CPU is read in 10 ms ticks
    settle_seconds: float = 0.2  # pause before each timed run: ONNX Runtime's idle threads stop spinning
    triton_sessions: tuple[int, ...] = (1, 16, 32)  # rtserve beside Triton: concurrent sessions
    triton_rsa_extra_pieces: int = 12  # RSA pieces after the look-back there (RMT: `pieces` one-segment pieces)
    # pieces a run of the Triton comparison lasts at least (its sessions follow one another in N slots): CPU is
    # read in 10 ms ticks, and 16 sessions' pieces take a fifth of a second
    triton_rsa_min_pieces: int = 4096
    triton_rmt_min_pieces: int = 64
    sweep_sessions: tuple[int, ...] = (1, 8, 32, 128, 512)  # the capacity sweep's session counts (--sweep-max)
    sweep_pieces: int = 8  # pieces per session in the sweep (RSA: after the look-back)


# a smoke test of the instrument, not a measurement
QUICK = Counts(e2e_sessions=1, pieces=2, sessions=(2, 4), articles=2, article_chars=400, rsa_sessions=3,
               rsa_piece_rows=8, rsa_extra_pieces=1, gpu_sessions=4, floor_sessions=3, floor_rsa_extra_pieces=1,
               settle_seconds=0.01, triton_sessions=(1, 2), triton_rsa_extra_pieces=1, triton_rsa_min_pieces=0,
               triton_rmt_min_pieces=0, sweep_sessions=(1, 4),
               sweep_pieces=2)


@dataclass
class Bench:
    """One run of the bench: what every scenario reads, and what they leave for the report."""

    client: Client
    repository: Path
    data: Path
    counts: Counts
    repeats: int
    intra_op_threads: int
    intra_op_spinning: bool
    models: dict[str, dict[str, Any]]  # task -> GET /models description of the model measured
    stopwatch: Stopwatch  # the service's and this client's CPU over each timed run
    floor: Side | None = None  # the floor server (scenario `floor`)
    url: str = ""  # the service's base URL
    api_key: str | None = None  # the service's first API key, when it has any
    options: Any = None  # the command's options (the scenarios' own flags: --triton-venv, --client-processes ...)
    log_folder: Path | None = None  # where the servers' logs go
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # scenario -> why it could not finish
    notes: list[str] = field(default_factory=list)

    def entry(self, task: str) -> tuple[Path, dict[str, Any]]:
        model = self.models[task]
        return self.repository / model["name"] / model["version"], model["manifest"]

    def ref(self, task: str) -> str:
        return f"{self.models[task]['name']}:{self.models[task]['version']}"

    async def settle(self) -> None:
        await asyncio.sleep(self.counts.settle_seconds)


DATASETS = {"classify": "hyperpartisan", "summarize": "bbc-news-summary", "forecast": "ETT-small"}


def why_not(bench: Bench, task: str, wanted: str) -> str | None:
    """Why the scenarios of ``task`` cannot run here, or None."""
    if task not in bench.models:
        return f"no {wanted} in the model repository"
    folder = bench.data / DATASETS[task]
    return None if folder.is_dir() else f"dataset not found at {folder} (--data)"


async def attempt(bench: Bench, scenarios: dict[str, Any], name: str, run: Coroutine[Any, Any, Any]) -> None:
    """Run one scenario; a failed request fails that scenario only, and the report says why."""
    try:
        scenarios[name] = await run
    except (BenchError, ValueError) as error:  # a failed request, or inputs the data cannot give
        log.error("%s failed: %s", name, error)
        bench.failed[name] = str(error)


async def concurrent_vs_sequential(
    bench: Bench, once: Callable[[bool], Awaitable[tuple[Span, int]]], unit: str = "tokens",
    count_key: str | None = "summary_tokens",
) -> dict[str, Any]:
    """``unit``/s of ``once(concurrent)`` -> (span, units) both ways, in alternating order, ``--repeats``
    times; medians. With each: the CPU per unit of the service and the client, the cores they kept busy,
    and the ceiling that CPU puts on the ratio. ``count_key`` also records each run's count of units."""
    cores = len(os.sched_getaffinity(0))
    repeats = []
    for repeat in range(bench.repeats):
        row: dict[str, Any] = {}
        for concurrent in in_turn(repeat, True, False):
            span, units = await once(concurrent)
            name = "concurrent" if concurrent else "sequential"
            row[f"{name}_{unit}_per_second"] = units / span.seconds
            row[f"{name}_server_cpu_ms_per_unit"] = 1000 * span.server_cpu_seconds / units
            row[f"{name}_client_cpu_ms_per_unit"] = 1000 * span.client_cpu_seconds / units
            row[f"{name}_cores_busy"] = (span.server_cpu_seconds + span.client_cpu_seconds) / span.seconds
            if count_key:
                row[f"{name}_{count_key}"] = units
        row["ratio"] = row[f"concurrent_{unit}_per_second"] / row[f"sequential_{unit}_per_second"]
        concurrent_cpu_ms = row["concurrent_server_cpu_ms_per_unit"] + row["concurrent_client_cpu_ms_per_unit"]
        row["ratio_ceiling"] = cores * (1000 / row[f"sequential_{unit}_per_second"]) / concurrent_cpu_ms
        log.info("  repeat %d: %.1f vs %.1f %s/s (ceiling of the ratio on %d cores: %.2f)", repeat + 1,
                 row[f"concurrent_{unit}_per_second"], row[f"sequential_{unit}_per_second"], unit, cores,
                 row["ratio_ceiling"])
        repeats.append(row)
    concurrent_rate = median([r[f"concurrent_{unit}_per_second"] for r in repeats])
    sequential_rate = median([r[f"sequential_{unit}_per_second"] for r in repeats])
    cpu = {key: median([r[key] for r in repeats]) for key in repeats[0]
           if key.endswith(("_cpu_ms_per_unit", "_cores_busy"))}
    return {
        f"concurrent_{unit}_per_second": concurrent_rate,
        f"sequential_{unit}_per_second": sequential_rate,
        "ratio": median([r["ratio"] for r in repeats]),
        "cores": cores,
        **cpu,
        "ratio_ceiling": median([r["ratio_ceiling"] for r in repeats]),
        "repeats": repeats,
    }
