"""Several worker processes on one port (``RTSERVE_WORKERS``): what they share is made before they start.

Each worker is a whole replica: it loads every model, batches its own requests and keeps no session state of
its own, so any worker continues any session, as any replica does. uvicorn's supervisor starts the workers
on one listening socket (the kernel hands each connection to one of them), restarts a worker that dies and
stops them all on SIGTERM. Before it starts them, the parent process makes what must be one for all:

- **Redis.** Without ``RTSERVE_REDIS_URL`` the parent starts the embedded Redis and hands its URL to the
  workers (each would otherwise start its own, and sessions would not cross workers).
- **Metrics.** prometheus_client's multiprocess mode: every worker writes its counters and histograms to
  files in one folder of their own (``RTSERVE_METRICS_DIR``, else a temporary one; an earlier run's files are
  deleted at start, any other ``*.db`` there is refused: :func:`clear_metrics_dir`), and ``/metrics``,
  whichever worker answers it, sums them. Per-process families (``process_*``, ``python_info``) are not
  exported in this mode: they would describe only the worker that happened to answer the scrape.
- **Cores.** With ``RTSERVE_INTRA_OP_THREADS`` unset (0), each worker's graphs get an equal share of the
  cores (:func:`threads_per_worker`) instead of every worker's runtime taking all of them.

A worker asks the kernel for SIGTERM when the parent dies (``PR_SET_PDEATHSIG``), as the embedded Redis
does, so a killed parent leaves no worker behind serving on a socket nobody supervises.
"""

from __future__ import annotations

import logging
import os
import re
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


def threads_per_worker(settings: Settings) -> int:
    """Intra-op threads each worker's graphs use: the setting, or (0) a share of the cores with several workers."""
    if settings.intra_op_threads > 0 or settings.workers == 1:
        return settings.intra_op_threads
    return max(1, usable_cores() // settings.workers)


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


@contextmanager
def shared_by_workers(settings: Settings) -> Iterator[None]:
    """Start what the workers share and put it in the environment they inherit (``RTSERVE_REDIS_URL`` where
    Redis is embedded, ``RTSERVE_METRICS_DIR``, ``PROMETHEUS_MULTIPROC_DIR``, ``RTSERVE_INTRA_OP_THREADS``);
    undone on exit."""
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
        shared["RTSERVE_INTRA_OP_THREADS"] = str(threads_per_worker(settings))
        before = {name: os.environ.get(name) for name in shared}
        os.environ.update(shared)
        try:
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
