"""Several HTTP front ends on one port (``RTSERVE_WORKERS``) and one engine: what they share is made before
they start.

uvicorn's supervisor starts the front ends on one listening socket (the kernel hands each connection to one
of them), restarts a front end that dies and stops them all on SIGTERM. A front end parses, validates, talks
to Redis and runs the pipelines around the graphs; it keeps no session state of its own, so any front end
continues any session. Before they start, the parent process makes what must be one for all:

- **The engine.** One process (:mod:`service.runtime.engine`) loads every model once, with one batcher per
  graph, and runs the steps of every front end: rows from all of them share its batches. The front ends reach
  it over a Unix socket (``RTSERVE_ENGINE_SOCKET``); they start serving once it has loaded every model.
- **Redis.** Without ``RTSERVE_REDIS_URL`` the parent starts the embedded Redis and hands its URL to the
  front ends (each would otherwise start its own, and sessions would not cross them).
- **Metrics.** prometheus_client's multiprocess mode: every front end and the engine write their counters and
  histograms to files in one folder of their own (``RTSERVE_METRICS_DIR``, else a temporary one; an earlier
  run's files are deleted at start, any other ``*.db`` there is refused: :func:`clear_metrics_dir`), and
  ``/metrics``, whichever front end answers it, sums them (the engine's batch sizes and step times among them).
  Per-process families (``process_*``, ``python_info``) are not exported in this mode: they would describe
  only the front end that happened to answer the scrape.

The front ends and the engine ask the kernel for SIGTERM when the parent dies (``PR_SET_PDEATHSIG``), as the
embedded Redis does, so a killed parent leaves no process behind. The engine ignores SIGINT (Ctrl-C reaches
the whole process group) and stops on the parent's SIGTERM, after the front ends have drained.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

from service.embedded_redis import EmbeddedRedis
from service.settings import Settings

# prometheus_client's per-process files: <type>_<pid>.db, gauges as gauge_<mode>_<pid>.db
METRICS_FILE = re.compile(r"(counter|histogram|summary|gauge_[a-z]+)_\d+\.db")

log = logging.getLogger("rtserve")


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class MetricsDirError(RuntimeError):
    """RTSERVE_METRICS_DIR holds files that are not rtserve's metrics."""


def clear_metrics_dir(folder: Path) -> None:
    """Make ``folder`` and delete an earlier run's metric files (their counts must not be added to this run's).

    prometheus_client reads every ``*.db`` file in the folder as metrics, so the folder must be one of its
    own: any other ``*.db`` file is refused (with its name), never deleted.
    """
    folder.mkdir(parents=True, exist_ok=True)
    databases = sorted(folder.glob("*.db"))
    foreign = [path.name for path in databases if not METRICS_FILE.fullmatch(path.name)]
    if foreign:
        raise MetricsDirError(f"RTSERVE_METRICS_DIR={folder} holds files that are not rtserve's metrics "
                              f"({', '.join(foreign[:3])}); give the metrics a folder of their own")
    for stale in databases:
        stale.unlink()


ENGINE_START_SECONDS = 600.0  # the engine loads every model before its socket appears


@contextmanager
def shared_by_workers(settings: Settings) -> Iterator[None]:
    """Start what the front ends share and put it in the environment they inherit (``RTSERVE_REDIS_URL`` where
    Redis is embedded, ``RTSERVE_METRICS_DIR``, ``PROMETHEUS_MULTIPROC_DIR``, ``RTSERVE_ENGINE_SOCKET``); undone
    on exit (the engine stopped)."""
    with ExitStack() as stack:
        shared: dict[str, str] = {}
        metrics_dir = settings.metrics_dir
        if metrics_dir is None:
            metrics_dir = Path(stack.enter_context(TemporaryDirectory(prefix="rtserve-metrics-")))
        clear_metrics_dir(metrics_dir)  # first: a refused folder starts nothing
        if not settings.redis_url:
            stack.callback(log.info, "stopped embedded Redis")  # first in, last out: after the server stopped
            shared["RTSERVE_REDIS_URL"] = stack.enter_context(EmbeddedRedis(settings.embedded_redis_dir)).url
            log.info("started embedded Redis at %s for %d workers", shared["RTSERVE_REDIS_URL"], settings.workers)
        shared["RTSERVE_METRICS_DIR"] = shared["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        socket_path = Path(stack.enter_context(TemporaryDirectory(prefix="rtserve-engine-"))) / "engine.sock"
        before = {name: os.environ.get(name) for name in (*shared, "RTSERVE_ENGINE_SOCKET")}
        os.environ.update(shared)
        try:
            stack.enter_context(engine_process(socket_path))
            os.environ["RTSERVE_ENGINE_SOCKET"] = str(socket_path)  # the front ends', not the engine's
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


class EngineStartError(RuntimeError):
    """The engine process exited before it served (a model it cannot place, ...)."""


@contextmanager
def engine_process(socket_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The engine (``python -m service.runtime.engine_process``), once its socket is up; stopped (SIGTERM) on exit."""
    engine = subprocess.Popen([sys.executable, "-m", "service.runtime.engine_process", str(socket_path)])
    try:
        deadline = time.monotonic() + ENGINE_START_SECONDS
        while not socket_path.exists():
            if engine.poll() is not None:
                raise EngineStartError(f"the engine exited with {engine.returncode} before it served")
            if time.monotonic() > deadline:
                raise EngineStartError(f"the engine did not serve within {ENGINE_START_SECONDS:.0f} s")
            time.sleep(0.1)
        log.info("engine %d serving on %s", engine.pid, socket_path)
        yield engine
    finally:
        if engine.poll() is None:
            engine.terminate()
            try:
                engine.wait(timeout=30)
            except subprocess.TimeoutExpired:
                engine.kill()
                engine.wait()
