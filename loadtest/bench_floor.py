"""The ``floor`` scenario of ``rtserve bench``: the service's CPU per piece over the floor server's.

The floor server (``benchmarks/floor_server.py``) does what a piece needs and nothing else: the same two
Redis round trips (the service's own scripts, the same state sizes), the same ``step.onnx`` at batch 1
with one intra-op thread, a JSON answer. Both servers run side by side on the same Redis, and the same
pieces go to each in turn:

- per task: RSA forecast pieces and RMT classify pieces (each completes exactly one segment);
- at 1 session (the sessions one after another) and at N (all at once), in blocks that go to one server and
  then to the other, which goes first alternating from block to block: at 1 session a block is one session's
  pieces, at N the next :data:`BLOCK_PIECES` pieces of every session. Each side's CPU is summed over its own
  blocks, so both sides are measured across the same seconds and the machine's drift (a third within
  minutes on a shared VM) falls on both alike;
- CPU of the server's processes (:func:`loadtest.harness.process_cpu_seconds`: the kernel's per-process CPU clock, the
  accounting ``/proc/<pid>/stat`` shows, in nanoseconds): the service's process tree (every front end and
  engine process with ``RTSERVE_WORKERS``), the floor's one process.
  Redis (the bench's, shared) is counted apart, per side, and is in neither ratio.

Sessions are opened before the timed span and finished and deleted after it: only pieces are counted.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest import bench_inputs as inputs
from loadtest.bench_inputs import SessionInput
from loadtest.harness import Client, in_turn, median
from loadtest.sessions import close_session, open_session, send_pieces

log = logging.getLogger("rtserve.bench")

BLOCK_PIECES = 4  # at N sessions, each block holds the next 4 pieces of every session

FLOOR_SERVER = Path(__file__).resolve().parents[1] / "benchmarks" / "floor_server.py"


def floor_command(repository: Path, models: Sequence[str], redis_url: str, host: str, port: int) -> list[str]:
    """``benchmarks/floor_server.py`` serving ``models`` of ``repository`` on the bench's Redis."""
    return [sys.executable, str(FLOOR_SERVER), "--model-repository", str(repository), "--redis-url", redis_url,
            "--host", host, "--port", str(port), "--models", ",".join(models)]


@dataclass(frozen=True)
class Side:
    """One server under comparison: its client, its model reference and how to read its CPU."""

    name: str
    client: Client
    cpu_seconds: Any  # () -> float


async def pieces_cpu(sides: Sequence[Side], model: str, sessions: list[SessionInput], concurrent: bool,
                     redis_cpu: Any) -> dict[str, dict[str, float]]:
    """Per side: server, Redis and client CPU and the wall time of every piece of ``sessions`` (opened before and
    closed after, untimed). The work is cut into blocks that go to each side in turn, the first side alternating
    per block, and each side's figures are summed over its own blocks: both sides are measured across the same
    seconds. A block is one session's pieces (one at a time) or the next :data:`BLOCK_PIECES` pieces of every
    session, all sessions at once (``concurrent``)."""
    ids = {side.name: [await open_session(side.client, model) for _ in sessions] for side in sides}
    await asyncio.sleep(0.05)
    length = max(len(session.pieces) for session in sessions)
    if concurrent:
        blocks = [[(index, begin, min(begin + BLOCK_PIECES, length)) for index in range(len(sessions))]
                  for begin in range(0, length, BLOCK_PIECES)]
    else:
        blocks = [[(index, 0, len(session.pieces))] for index, session in enumerate(sessions)]
    spent = {side.name: {"server": 0.0, "redis": 0.0, "client": 0.0, "wall": 0.0} for side in sides}
    for number, block in enumerate(blocks):
        for side in in_turn(number, *sides):
            server, redis, client, wall = side.cpu_seconds(), redis_cpu(), time.process_time(), time.perf_counter()
            await asyncio.gather(*(
                send_pieces(side.client, ids[side.name][index], SessionInput(sessions[index].pieces[begin:end]),
                            first=begin + 1)
                for index, begin, end in block
            ))
            totals = spent[side.name]
            totals["wall"] += time.perf_counter() - wall
            totals["server"] += side.cpu_seconds() - server
            totals["redis"] += redis_cpu() - redis
            totals["client"] += time.process_time() - client
    for side in sides:
        await asyncio.gather(*(close_session(side.client, session_id) for session_id in ids[side.name]))
    pieces = sum(len(s.pieces) for s in sessions)
    return {name: {
        "pieces": pieces,
        "server_cpu_ms_per_piece": 1000 * totals["server"] / pieces,
        "redis_cpu_ms_per_piece": 1000 * totals["redis"] / pieces,
        "client_cpu_ms_per_piece": 1000 * totals["client"] / pieces,
        "pieces_per_second": pieces / totals["wall"],
    } for name, totals in spent.items()}


async def compare(service: Side, floor: Side, model: str, sessions: list[SessionInput], counts: Sequence[int],
                  repeats: int, redis_cpu: Any, settle: Any) -> dict[str, Any]:
    """Per session count: each side's CPU per piece and the service / floor ratio (median of per-repeat ratios)."""
    await pieces_cpu((service, floor), model, sessions[:1], False, redis_cpu)  # warm-up, untimed
    results: dict[str, Any] = {}
    for count in counts:
        concurrent = count > 1
        chosen = sessions[:count] if concurrent else sessions  # 1: every session, one after another
        repeats_rows = []
        for repeat in range(repeats):
            await settle()
            row: dict[str, Any] = await pieces_cpu(in_turn(repeat, service, floor), model, chosen, concurrent,
                                                   redis_cpu)
            row["ratio"] = (row["service"]["server_cpu_ms_per_piece"] / row["floor"]["server_cpu_ms_per_piece"])
            log.info("  %s sessions, repeat %d: service %.2f ms, floor %.2f ms of server CPU per piece (%.2f)",
                     count, repeat + 1, row["service"]["server_cpu_ms_per_piece"],
                     row["floor"]["server_cpu_ms_per_piece"], row["ratio"])
            repeats_rows.append(row)
        summary: dict[str, Any] = {"sessions": count, "pieces": repeats_rows[0]["service"]["pieces"],
                                   "ratio": median([r["ratio"] for r in repeats_rows])}
        for name in ("service", "floor"):
            for key in repeats_rows[0][name]:
                if key != "pieces":
                    summary[f"{name}_{key}"] = median([r[name][key] for r in repeats_rows])
        summary["repeats"] = repeats_rows
        results[str(count)] = summary
    return results


def floor_sessions(bench: Any, task: str, count: int) -> list[SessionInput]:
    entry, manifest = bench.entry(task)
    if task == "classify":
        return inputs.classify_sessions(entry, manifest, inputs.hyperpartisan_texts(bench.data), count,
                                        bench.counts.pieces)
    settings = manifest["settings"]
    values = inputs.etth1_values(bench.data, list(settings["variables"]))
    return inputs.forecast_sessions(values, int(settings["lookback"]), count, bench.counts.rsa_piece_rows,
                                    bench.counts.floor_rsa_extra_pieces)
