"""``rtserve serve`` whose model graphs are slow: a real server process whose work outlasts a signal.

    python -m tests.slow_serve SECONDS --port PORT      (settings from the RTSERVE_* variables, as `rtserve serve`)

Every batch a graph runs (a forecast step, an encoder window, one decode step) first waits SECONDS on the event
loop: the service answers everything else as usual, only model work takes longer. Every call goes through its
runner's worker (a light graph's lone call would otherwise run on the loop, past the wait). One process (no
workers).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from service.runtime.batcher import DynamicBatcher
from service.runtime.graph_runner import GraphRunner
from service.server import run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("seconds", type=float, help="added before every batch of every graph")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    run_batch = GraphRunner._run_batch

    async def slow_run_batch(self: GraphRunner, *batch: Any, **options: Any) -> Any:
        await asyncio.sleep(args.seconds)
        return await run_batch(self, *batch, **options)

    GraphRunner._run_batch = slow_run_batch  # type: ignore[method-assign]
    batcher_init = DynamicBatcher.__init__

    def through_the_worker(self: DynamicBatcher, *options: Any, **named: Any) -> None:
        batcher_init(self, *options, **named)
        self.in_flight, self.whole_batches_on_loop = None, False

    DynamicBatcher.__init__ = through_the_worker  # type: ignore[method-assign]
    run(port=args.port)


if __name__ == "__main__":
    main()
