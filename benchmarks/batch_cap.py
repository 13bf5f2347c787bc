"""Two largest CPU batches of one model, or any two sets of its settings, side by side: the service's CPU per piece and
pieces/s under each.

    .venv/bin/python benchmarks/batch_cap.py [--model rmt-hyperpartisan] [--caps 16,32] [--sessions 32] [--repeats 6]
    .venv/bin/python benchmarks/batch_cap.py --model rsa-etth1-h24 --settings '{"default": {},
        "no company wait": {"RTSERVE_MAX_QUEUE_DELAY_MS": "0"}}'      # any two sets of settings, by label

Why: the export caps a heavy graph's CPU batch where a row costs more past it (export/exporter.py ``cpu_batch_cap``),
from the graph timed alone. This shows what the cap is worth to the service: a piece's CPU includes the hand-offs,
the commits and the waits that the graph alone does not see. For a forecaster (``--model rsa-etth1-h24``) it asks
the other question: whether a smaller batch, splitting the sessions' cohort in two, lets one cohort's step overlap
the other's trip through the event loop and Redis, and so serves more pieces a second.

``--settings`` compares two sets of the service's settings instead (environment variables, each set under its
label, over this process's environment; an empty set leaves the service as that environment configures it): the caps
are one such pair, and the wait for company (``RTSERVE_MAX_QUEUE_DELAY_MS``) another.

Method: one service per cap (``RTSERVE_MODEL_MAX_BATCH_SIZES`` for the model) or set of settings, both started at once
on one embedded Redis, each under its own key prefix, so that the alternation needs no restart; the idle one costs
next to nothing.
The bench's closed-loop client (:mod:`loadtest.closed_loop`, 2 processes) sends ``--sessions`` sessions at a time
over each session's stream (``--transport``: or as HTTP pieces, or binary frames) to one service, then to the other,
``--repeats`` times, the order swapped every repeat.
The bench's inputs: RMT, sessions of ``--pieces`` one-segment pieces (Hyperpartisan articles cut into whole
segments); RSA, ETTh1 rows, the look-back then ``--pieces`` pieces of 24 rows, ``--waves`` sessions after sessions in
the slots. Server CPU: each service's process tree (its graph's threads included), per piece answered. From each
service's own ``/metrics`` over the run (``rtserve_batch_size``, ``rtserve_step_duration_seconds``): the mean batch,
a step's wall time, and the share of the run its graph was stepping. Printed: every run, each side's medians, and the
median of the per-repeat ratios of the first side's CPU per piece to the second's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from loadtest.harness import Samples

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from loadtest import bench_inputs as inputs
    from loadtest.closed_loop import RTSERVE_TRANSPORTS, ClientPool, Target
    from loadtest.harness import Client, Server, free_port, server_environment, tree_cpu_seconds
    from loadtest.metrics import metric_delta, metric_sum
    from service.embedded_redis import EmbeddedRedis

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--model", default="rmt-hyperpartisan")
    parser.add_argument("--caps", default="16,32", help="two largest batches, comma-separated")
    parser.add_argument("--settings", type=json.loads, default=None,
                        help="two sets of settings to compare instead of caps, as JSON: {label: {RTSERVE_...: value}}")
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--transport", choices=tuple(RTSERVE_TRANSPORTS), default="stream",
                        help="pieces as HTTP requests or over each session's stream (rows as JSON or binary frames)")
    parser.add_argument("--pieces", type=int, default=None,
                        help="pieces per session (RMT: one-segment pieces, default 8; RSA: 24-row pieces after the "
                             "look-back, default 16)")
    parser.add_argument("--waves", type=int, default=None,
                        help="RSA: sessions after sessions in the slots, per run (default 8; RMT 1)")
    parser.add_argument("--repeats", type=int, default=6)
    options = parser.parse_args()
    entry = next((options.model_repository / options.model).glob("*/manifest.json")).parent
    manifest = json.loads((entry / "manifest.json").read_text())
    sides = sides_to_compare(options.caps, options.settings, manifest["name"])
    ref = f"{manifest['name']}:{manifest['version']}"
    if manifest["task"] == "classify":
        sessions = inputs.classify_sessions(entry, manifest, inputs.hyperpartisan_texts(options.data),
                                            options.sessions, options.pieces or 8)
        waves = options.waves or 1
    elif manifest["task"] == "forecast":
        settings = manifest["settings"]
        values = inputs.etth1_values(options.data, list(settings["variables"]))
        sessions = inputs.forecast_sessions(values, int(settings["lookback"]), options.sessions, 24,
                                            options.pieces or 16)
        waves = options.waves or 8
    else:
        raise SystemExit(f"{options.model} is neither a classifier nor a forecaster: its pieces are not steps")
    bodies = [session.pieces for session in sessions] * waves
    logs = Path(tempfile.mkdtemp(prefix="rtserve-batch-cap-"))
    labels = list(sides)
    figures: dict[str, list[tuple[float, float]]] = {label: [] for label in labels}
    with EmbeddedRedis() as redis:
        servers = {}
        for index, (label, settings) in enumerate(sides.items()):
            port = free_port()
            environment = server_environment(options.model_repository, port, redis.url) | settings | {
                "RTSERVE_REDIS_KEY_PREFIX": f"batch-cap-{index}"}
            servers[label] = Server([sys.executable, "-m", "rtserve.cli", "serve", "--host", "127.0.0.1", "--port",
                                     str(port)], environment, port, logs / f"side-{index}.log")
        pool = None
        try:
            async def ready() -> None:
                for server in servers.values():
                    client = Client(server.url, None, 2, 2.0)
                    await server.wait_ready(client, 900)
                    await client.close()

            asyncio.run(ready())
            pool = ClientPool(2)

            def run(label: str, chosen: list[list[bytes]]) -> tuple[float, float, str]:
                process = psutil.Process(servers[label].process.pid)
                before = scrape(servers[label].url)
                done = pool.run(Target(RTSERVE_TRANSPORTS[options.transport], servers[label].url, ref), chosen,
                                lambda: tree_cpu_seconds(process), False, min(len(chosen), options.sessions))
                if done.errors:
                    raise SystemExit(f"{label}: {done.errors[:3]}")
                delta = metric_delta(before, scrape(servers[label].url))
                rows, steps, seconds = (metric_sum(delta, name, model=ref) for name in (
                    "rtserve_batch_size_sum", "rtserve_batch_size_count", "rtserve_step_duration_seconds_sum"))
                steps_said = (f"mean batch {rows / steps:.1f}, a step {1000 * seconds / steps:.2f} ms, stepping "
                              f"{seconds / done.wall_seconds:.0%} of the run") if steps else "no step"
                return 1000 * done.server_cpu_seconds / done.pieces, done.pieces / done.wall_seconds, steps_said

            for label in labels:  # warm-up, untimed
                run(label, bodies[:2])
            for repeat in range(options.repeats):
                for label in labels if repeat % 2 == 0 else labels[::-1]:
                    time.sleep(1)
                    ms, rate, steps_said = run(label, bodies)
                    figures[label].append((ms, rate))
                    print(f"repeat {repeat + 1}, {label}: {ms:.3f} ms of server CPU per piece, {rate:.1f} pieces/s; "
                          f"{steps_said}", flush=True)
        finally:
            if pool is not None:
                pool.close()
            for server in servers.values():
                server.stop()
    for label in labels:
        print(f"{label}: median {statistics.median(ms for ms, _ in figures[label]):.3f} ms per piece, "
              f"{statistics.median(rate for _, rate in figures[label]):.1f} pieces/s")
    ratios = [first[0] / second[0] for first, second in zip(figures[labels[0]], figures[labels[1]], strict=True)]
    print(f"{options.model}, {options.sessions} sessions, {options.transport}: CPU per piece, {labels[0]} / "
          f"{labels[1]}, per repeat {[round(ratio, 3) for ratio in ratios]}, median {statistics.median(ratios):.3f}")


def sides_to_compare(caps: str, settings: object, model: str) -> dict[str, dict[str, str]]:
    """The two services' settings by label: ``settings`` as given (``--settings``), else the two ``caps`` of
    ``model``'s batch (``--caps``). A name that is not one of the service's settings is refused, not ignored (the
    service would start with its default and the comparison would compare nothing)."""
    from service.settings import Settings

    if settings is None:
        sizes = [int(cap) for cap in caps.split(",")]
        if len(sizes) != 2:
            raise SystemExit("--caps takes two batch sizes")
        return {f"cap {size}": {"RTSERVE_MODEL_MAX_BATCH_SIZES": json.dumps({model: size})} for size in sizes}
    if not isinstance(settings, dict) or len(settings) != 2 or not all(
            isinstance(side, dict) for side in settings.values()):
        raise SystemExit('--settings takes two labelled sets of settings: {"label": {"RTSERVE_...": "value"}, ...}')
    known = {f"RTSERVE_{name.upper()}" for name in Settings.model_fields}
    unknown = sorted({name for side in settings.values() for name in side} - known)
    if unknown:
        raise SystemExit(f"--settings: not a setting of the service: {', '.join(unknown)} (docs/settings.md)")
    return {str(label): {name: str(value) for name, value in side.items()} for label, side in settings.items()}


def scrape(url: str) -> Samples:
    """One scrape of a service's ``/metrics`` (the bench's client)."""
    from loadtest.harness import Client

    async def read() -> Samples:
        client = Client(url, None, 1, 2.0)
        try:
            return await client.metrics()
        finally:
            await client.close()

    return asyncio.run(read())


if __name__ == "__main__":
    main()
