"""When a batch runs and what joins it: the batching policy, one object the runners ask.

Both runners of a graph (:mod:`service.runtime.batcher`, stacked steps, and
:mod:`service.runtime.decode_loop`, one token of every live search) own a worker, a queue and a
backend; what they do *not* decide is policy. They ask their :class:`BatchingPolicy`:

- ``run_at``: the worker is free and calls are queued — run now, or wait (until when) for more?
- ``take``: which queued calls form the next batch;
- ``admit``: which waiting searches join the decode loop's resident batch at its next step.

:class:`ContinuousBatching` is the policy the service runs. Another (a fixed window, priorities,
a token budget) is a class with these three methods, passed to the runner; the loops stay as they are.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Hashable, Sequence
from typing import Protocol, TypeVar


class Queued(Protocol):
    """What a policy sees of a call waiting for the worker."""

    @property
    def rows(self) -> int: ...  # rows it adds to a batch

    @property
    def key(self) -> Hashable: ...  # calls stack only with calls of the same key (shapes and dtypes)

    @property
    def enqueued(self) -> float: ...  # time.perf_counter() at its arrival


Call = TypeVar("Call", bound=Queued)


class BatchingPolicy(Protocol):
    def run_at(self, queued: Sequence[Queued], last_rows: int, limit: int) -> float:
        """The worker is free and ``queued`` (oldest first) is not empty: the ``time.perf_counter()`` at which it
        runs them, asked again at every arrival (now or earlier: at once). ``last_rows``: the previous batch's
        rows; ``limit``: the most rows a batch holds."""
        ...

    def take(self, queued: Sequence[Call], limit: int) -> list[Call]:
        """The calls of the next batch, at most ``limit`` rows; the oldest call is always among them."""
        ...

    def admit(self, waiting: Sequence[int], resident_rows: int, limit: int) -> int:
        """How many of the waiting searches (their rows, oldest first) join a resident batch of ``resident_rows``
        rows at its next step, the oldest first; at most ``limit`` rows in all."""
        ...


class ContinuousBatching:
    """Never hold the worker idle, except for company the last batch promised.

    - A batch runs as soon as the worker is free; calls that arrive while it runs form the next batch.
    - Exception: when fewer rows are queued than the previous batch had, the worker waits, at most
      ``max_queue_delay`` after the oldest arrival, for the rest: the callers of the last batch (sessions
      stepping together, the segments of concurrent documents) usually come back together, and a batch
      that leaves them behind costs them a whole step. So a request that finds the worker free runs at
      once after a batch of one row (or none), and waits up to ``max_queue_delay`` after a larger batch
      when no one else comes; that batch of one then sets the expectation back to one.
    - A batch is the oldest call plus every queued call of the same key, oldest first, up to the limit;
      searches join the decode loop oldest first while their rows fit (none overtakes an older one).
    """

    def __init__(self, max_queue_delay: float) -> None:
        self.max_queue_delay = max_queue_delay  # seconds

    def run_at(self, queued: Sequence[Queued], last_rows: int, limit: int) -> float:
        if self.max_queue_delay <= 0 or sum(call.rows for call in queued) >= min(last_rows, limit):
            return time.perf_counter()
        return queued[0].enqueued + self.max_queue_delay

    def take(self, queued: Sequence[Call], limit: int) -> list[Call]:
        first = queued[0]
        batch, rows = [first], first.rows
        for call in itertools.islice(queued, 1, None):  # a deque: no slices
            if rows >= limit:
                break
            if call.key == first.key and rows + call.rows <= limit:
                batch.append(call)
                rows += call.rows
        return batch

    def admit(self, waiting: Sequence[int], resident_rows: int, limit: int) -> int:
        joining, rows = 0, resident_rows
        for search_rows in waiting:
            if rows + search_rows > limit:
                break
            joining, rows = joining + 1, rows + search_rows
        return joining
