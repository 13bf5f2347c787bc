"""The engine process: ``python -m service.runtime.engine_process <socket>`` (:mod:`service.workers` starts it).

It loads every model of the repository (graphs and batchers) into one registry and serves it to every front end
(:class:`service.runtime.engine.Engine`) until the parent's SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

import uvloop

from service.collector import settle_after_startup
from service.devices import DeviceConfigError
from service.embedded_redis import die_with_parent
from service.logs import configure_logging
from service.loop_lag import LoopLag
from service.metrics import ServiceMetrics
from service.runtime.engine import Engine
from service.runtime.registry import ModelRegistry
from service.settings import Settings

log = logging.getLogger("rtserve.engine")


async def serve_engine(socket_path: Path) -> None:
    """Load every model (graphs and batchers), serve them on ``socket_path`` until SIGTERM."""
    settings = Settings()
    metrics = ServiceMetrics(multiprocess_dir=settings.metrics_dir)  # the front ends' /metrics sum its batches
    registry = ModelRegistry(settings, metrics, in_flight=lambda: engine.rows_in_flight)
    engine = Engine(registry)
    await registry.load_all()
    server = await engine.serve(socket_path)  # the socket appears once every model is loaded
    settle_after_startup()
    log.info("engine serving %d models on %s", len(registry.models), socket_path)
    loop_lag = LoopLag(observe=metrics.loop_lag.labels(loop="engine").observe)  # the one loop every front end feeds
    loop_lag.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await stop.wait()
    finally:
        loop_lag.stop()
        server.close()
        await registry.close()
        metrics.energy.close()
        socket_path.unlink(missing_ok=True)


def main() -> None:
    """The engine process (:mod:`service.workers` starts it)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent stops us after them
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format)
    try:
        uvloop.run(serve_engine(Path(sys.argv[1])))  # the front ends' loop (uvicorn's): a fifth less CPU per call
    except DeviceConfigError as error:
        raise SystemExit(f"rtserve engine: {error}") from None


if __name__ == "__main__":
    main()
